"""Honest packaging: the core runs on torch and numpy, every import is declared, and a command
whose extra is missing names the extra (``pip install 'isouq[llm]'``)."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "isouq"
tomllib = pytest.importorskip("tomllib")

# every optional top-level module isouq imports somewhere (the extras' packages)
OPTIONAL = ["scipy", "sklearn", "statsmodels", "matplotlib", "threadpoolctl", "transformers", "tokenizers",
            "huggingface_hub", "gguf", "accelerate", "safetensors", "jax", "jaxlib", "numpyro",
            "datasets", "laplace", "peft", "bitsandbytes", "fastapi", "uvicorn",
            "prometheus_client", "pydantic", "lm_polygraph", "PIL"]
# Imported only where its absence is handled (the comparison skipped), and deliberately in no
# extra: laplace-torch (a peer baseline of `experiment classifiers`; it pulls torchvision from
# PyPI, whose CUDA build breaks `import transformers` beside the CPU torch of constraints.txt).
# (Hugging Face `datasets` is declared: the `data` extra, outside `all`.)
UNDECLARED_OK = {"laplace"}
IMPORT_TO_DIST = {"sklearn": "scikit-learn", "lm_polygraph": "lm-polygraph", "PIL": "pillow"}

BLOCKER = f"""
import importlib.abc, sys
BLOCKED = set({OPTIONAL!r})
class Hide(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
sys.meta_path.insert(0, Hide())
sys.path.insert(0, {str(ROOT / "src")!r})
"""


def run_hidden(code: str) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter where every optional package looks uninstalled."""
    return subprocess.run([sys.executable, "-c", BLOCKER + code], capture_output=True, text=True,
                          timeout=300, cwd=ROOT)


def pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text("utf-8"))


def dist_name(req: str) -> str:
    for sep in "<>=!~[; ":
        req = req.split(sep)[0]
    return req.strip().lower()


def test_core_imports_and_scores_with_torch_and_numpy_alone():
    r = run_hidden("""
import importlib, torch
from torch import nn
for m in ["isouq", "isouq.estimators", "isouq.sequences", "isouq.ghost", "isouq.covariance",
          "isouq.params", "isouq.scores", "isouq.per_example", "isouq.errors", "isouq.cli",
          "isouq.models", "isouq.data", "isouq.runio", "isouq.score_run", "isouq.ask"]:
    importlib.import_module(m)
import isouq
model = nn.Sequential(nn.Linear(2, 4), nn.Tanh(), nn.Linear(4, 3))
x = torch.randn(5, 2)
s = isouq.score_classifier(model, x)
assert s.epistemic.shape == (5, 3)
with isouq.GhostNorms(model, dict(model.named_parameters())) as g:
    sq = g.backward(torch.softmax(model(x), -1)[:, 0])
assert sq.shape == (5,)
for m in BLOCKED:
    assert m not in sys.modules, m
print("core ok")
""")
    assert r.returncode == 0 and "core ok" in r.stdout, r.stderr[-4000:]


COMMANDS = [
    (["ask", "Who wrote Hamlet?"], "llm"),
    (["score", "pairs.jsonl", "--out", "scores.jsonl"], "llm"),
    (["demo"], "llm"),
    (["demo", "--toy"], "report"),
    (["report", "results/qa", "--out", "report"], "report"),
    (["qa", "run", "--out", "qa"], "llm,report"),
    (["experiment", "validation", "--out", "v"], "reference,report"),
    (["experiment", "proxy-bias-text", "--out", "v"], "llm,report"),
    (["serve"], "llm,serve"),
]


@pytest.fixture(scope="module")
def hidden_cli() -> dict:
    """Each command's exit status and stderr, run in one interpreter without the extras."""
    r = run_hidden(f"""
import contextlib, io, json
from isouq.cli import main
out = {{}}
for argv, _ in {COMMANDS!r}:
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = main(argv)
    out[" ".join(argv)] = [code, err.getvalue()]
print(json.dumps(out))
""")
    assert r.returncode == 0, r.stderr[-4000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("argv, extra", COMMANDS)
def test_a_command_without_its_extra_names_it(argv, extra, hidden_cli):
    code, err = hidden_cli[" ".join(argv)]
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and f"pip install 'isouq[{extra}]'" in lines[0], err
    assert lines[0].startswith(f"isouq: error: isouq {argv[0]}"), lines[0]


def test_commands_of_the_core_run_without_extras():
    r = run_hidden("from isouq.cli import main; sys.exit(main(['models']))")
    assert r.returncode == 0 and "smollm2" in r.stdout, r.stderr[-3000:]


def test_every_third_party_import_is_declared():
    """Each top-level module the package imports is torch/numpy/tqdm or in an extra."""
    meta = pyproject()["project"]
    core = {dist_name(d) for d in meta["dependencies"]}
    extras = {name: {dist_name(d) for d in deps}
              for name, deps in meta["optional-dependencies"].items()}
    declared = core | set().union(*extras.values())
    assert core == {"torch", "numpy", "tqdm"}
    found: dict[str, str] = {}
    for f in SRC.rglob("*.py"):
        for node in ast.walk(ast.parse(f.read_text("utf-8"))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module] if isinstance(node, ast.ImportFrom) and node.level == 0
                     and node.module else [])
            for n in names:
                top = n.split(".")[0]
                if top not in sys.stdlib_module_names and top != "isouq":
                    found.setdefault(top, str(f.relative_to(ROOT)))
    for top, where in sorted(found.items()):
        if top in UNDECLARED_OK:
            continue
        assert IMPORT_TO_DIST.get(top, top) in declared, f"{where} imports {top}, not declared"
        assert top in OPTIONAL + ["torch", "numpy", "tqdm"], f"{where}: add {top} to OPTIONAL"
    assert extras["all"] == {"isouq"}  # isouq[every extra but data, polygraph and torchao]
    inside = meta["optional-dependencies"]["all"][0].split("[", 1)[1].rstrip("]").split(",")
    assert set(inside) == set(extras) - {"all", "data", "polygraph", "torchao"}


def test_the_cli_checks_the_modules_its_extras_install():
    """cli.EXTRA_MODULES (what a command checks) matches what each extra declares."""
    from isouq.cli import EXTRA_MODULES

    extras = pyproject()["project"]["optional-dependencies"]
    for extra, modules in EXTRA_MODULES.items():
        dists = {dist_name(d) for d in extras[extra]}
        assert {IMPORT_TO_DIST.get(m, m) for m in modules} == dists, extra


def test_setup_installs_every_extra():
    """What the tests need: `all`, and torchao (outside `all`) for its exactness tests."""
    assert '-e ".[all,torchao]"' in (ROOT / "scripts" / "setup.sh").read_text("utf-8")
