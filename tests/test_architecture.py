"""The house reads one way: every module imports, and no lower layer imports a higher one.

Layers, lowest first (docs/architecture.md): the library — foundation → models and data (the
edges) → estimators (the core) → LLM prompts and generation → evaluation metrics and
calibration —, then the study wing (``isouq.study``: reference posteriors → experiments →
analysis → reports → QA pipelines), then the application (CLI, ask, serve, runners). A module
may import its own layer and the ones below. ``from isouq import __version__`` is allowed anywhere.
"""

import ast
import importlib
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
LAYERS = [
    ("foundation", ("errors", "runio", "runtime", "distributed", "methods", "answer_row",
                    "_version", "param_sets", "quantized")),
    ("edges", ("models", "data")),
    ("estimators", ("scores", "params", "per_example", "covariance", "engines", "ghost", "estimators",
                    "sequences", "spans", "memory_plan")),
    ("llm", ("llm",)),
    ("evaluation", ("evaluation", "calibration")),
    ("study: reference posteriors", ("study", "study.reference")),
    ("study: experiments", ("study.experiments",)),
    ("study: analysis", ("study.analysis",)),
    ("study: reports", ("study.report",)),
    ("study: QA pipelines", ("study.qa",)),
    ("application", ("ask", "demo", "cli", "score_run", "calibrate_run", "serve", "__main__",
                     "integrations", "")),
]
LIBRARY = {"foundation", "edges", "estimators", "llm", "evaluation"}
RANK = {top: i for i, (_, tops) in enumerate(LAYERS) for top in tops}


def modules() -> list[tuple[str, Path]]:
    out = []
    for p in sorted((SRC / "isouq").rglob("*.py")):
        parts = list(p.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out.append((".".join(parts), p))
    return out


def top(module: str) -> str:
    """The room a module lives in: ``isouq.ghost.linear`` → ``ghost``, ``isouq.study.qa.mc`` →
    ``study.qa``."""
    parts = module.split(".")
    if len(parts) > 2 and parts[1] == "study":
        return f"study.{parts[2]}"
    return parts[1] if len(parts) > 1 else ""


def imports(name: str, path: Path) -> set[str]:
    """isouq modules ``path`` imports, at any depth (function-level imports included)."""
    pkg = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg.split(".")[: len(pkg.split(".")) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target == "isouq" and [a.name for a in node.names] == ["__version__"]:
                continue
            if target == "isouq" or target.startswith("isouq."):
                subs = [f"{target}.{a.name}" for a in node.names
                        if (SRC / f"{target}.{a.name}".replace(".", "/")).exists()
                        or (SRC / (f"{target}.{a.name}".replace(".", "/") + ".py")).exists()]
                found |= set(subs) or {target}
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("isouq")}
    return found


@pytest.mark.parametrize("name", [m for m, _ in modules() if not m.endswith("__main__")])
def test_every_module_imports(name):  # (__main__ runs the CLI when imported)
    importlib.import_module(name)


def test_every_module_has_a_layer():
    missing = sorted({top(m) for m, _ in modules()} - set(RANK))
    assert not missing, f"give {missing} a layer in LAYERS and docs/architecture.md"


def test_no_lower_layer_imports_a_higher_one():
    wrong = []
    for name, path in modules():
        for target in imports(name, path):
            if RANK[top(target)] > RANK[top(name)]:
                wrong.append(f"{name} ({LAYERS[RANK[top(name)]][0]}) imports {target} "
                             f"({LAYERS[RANK[top(target)]][0]})")
    assert not wrong, "\n".join(wrong)


def test_the_library_never_imports_the_study_wing():
    """What users import (the library layers) stands without the paper's study apparatus."""
    wrong = [f"{name} imports {target}" for name, path in modules()
             if LAYERS[RANK[top(name)]][0] in LIBRARY
             for target in imports(name, path) if top(target).startswith("study")]
    assert not wrong, "\n".join(wrong)
