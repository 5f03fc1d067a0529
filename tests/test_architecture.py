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
                    "_version", "param_sets", "quantized", "choices", "scores", "defaults")),
    ("edges", ("models", "data", "tokens", "llm")),
    ("estimators", ("params", "per_example", "covariance", "engines", "ghost",
                    "estimators", "blocks", "passes", "spans", "prepare", "sequences",
                    "memory_plan", "hidden", "capture")),
    ("evaluation", ("evaluation", "calibration", "calibration_choice", "probe")),
    ("study: reference posteriors", ("study", "study.reference")),
    ("study: experiments", ("study.experiments",)),
    ("study: analysis", ("study.analysis",)),
    ("study: reports", ("study.report",)),
    ("study: QA pipelines", ("study.qa",)),
    ("application", ("ask", "demo", "cli", "score_run", "calibrate_run", "calibration_check",
                     "serve", "__main__", "integrations", "")),
]
LIBRARY = {"foundation", "edges", "estimators", "evaluation"}
#: what a user runs (the commands, ``isouq ask``/``score``/``calibrate``/``serve``, the public
#: API, the plugins): it may run the study wing's code, but imports none of it at module level
PRODUCT = ("cli", "ask", "demo", "score_run", "calibrate_run", "calibration_check", "serve",
           "integrations", "")
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


def _module_level(tree: ast.Module):
    """The nodes of ``tree`` that run when the module is imported: everything but the bodies of
    functions (and of ``if TYPE_CHECKING:``)."""
    todo = list(tree.body)
    while todo:
        node = todo.pop()
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            continue
        if isinstance(node, ast.If) and ast.unparse(node.test) in ("TYPE_CHECKING",
                                                                   "typing.TYPE_CHECKING"):
            todo.extend(node.orelse)
            continue
        yield node
        todo.extend(ast.iter_child_nodes(node))


def imports(name: str, path: Path, *, top_level: bool = False) -> set[str]:
    """isouq modules ``path`` imports, at any depth (function-level imports included), or with
    ``top_level`` only those its import runs."""
    pkg = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found = set()
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in _module_level(tree) if top_level else ast.walk(tree):
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
    from isouq.errors import MissingExtraError

    try:
        importlib.import_module(name)
    except MissingExtraError as e:  # a plugin's module that needs an extra not installed here
        pytest.skip(str(e))


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


def test_the_product_imports_the_study_wing_only_where_it_runs_it():
    """The commands, ``ask``, the runners and the server import no ``isouq.study`` module at
    module level: a handler or a function imports what it runs when it runs it."""
    wrong = [f"{name} imports {target} at module level" for name, path in modules()
             if top(name) in PRODUCT
             for target in imports(name, path, top_level=True) if top(target).startswith("study")]
    assert not wrong, "\n".join(wrong)


def test_top_level_imports_are_told_from_function_level_ones(tmp_path):
    """The check above sees a module-level import, in a class body or under ``try`` too, and
    lets a function's own import and a ``TYPE_CHECKING`` one pass."""
    path = tmp_path / "m.py"
    path.write_text("from typing import TYPE_CHECKING\n"
                    "import isouq.errors\n"
                    "try:\n    from isouq.study import experiments\nexcept ImportError:\n    pass\n"
                    "class C:\n    from isouq.study.report import build\n"
                    "if TYPE_CHECKING:\n    from isouq.study.qa import runner\n"
                    "def f():\n    from isouq.study.analysis import cost\n")
    got = imports("isouq.m", path, top_level=True)
    assert got == {"isouq.errors", "isouq.study.experiments", "isouq.study.report.build"}
    assert "isouq.study.analysis.cost" in imports("isouq.m", path)


def test_no_modules_import_each_other_in_a_circle():
    """No circle of imports between isouq's modules (module-level and function-level imports
    alike): a circle means two modules that cannot be read, tested or moved apart."""
    graph = {name: {t for t in imports(name, path) if t != name}
             for name, path in modules()}
    index, low, stack, on, circles = {}, {}, [], set(), []

    def visit(v):  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in graph:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                circles.append(sorted(comp))

    for v in graph:
        if v not in index:
            visit(v)
    assert not circles, "\n".join(" <-> ".join(c) for c in circles)
