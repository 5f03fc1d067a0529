"""study/reference/ and the toy networks sit below study/experiments/: no import runs back up."""

from __future__ import annotations

import ast
from pathlib import Path

import isouq

SRC = Path(isouq.__file__).parent


def _imported(path: Path) -> set[str]:
    """Absolute module names a file imports (relative imports resolved against its package)."""
    pkg = ".".join(path.relative_to(SRC.parent).with_suffix("").parts[:-1])
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = pkg.split(".")[: len(pkg.split(".")) - (node.level - 1)] if node.level else []
            mod = ".".join([*base, *([node.module] if node.module else [])])
            out |= {mod} | {f"{mod}.{a.name}" for a in node.names}
    return out


def test_resolver_sees_relative_imports():
    f = SRC / "study" / "reference" / "hmc.py"
    assert "isouq.models.toy" in _imported(f) and "isouq.errors" in _imported(f)


def test_reference_and_toy_never_import_experiments():
    files = [*sorted((SRC / "study" / "reference").glob("*.py")), SRC / "models" / "toy.py"]
    assert len(files) > 5  # the folder is where this test looks
    bad = {f.name: sorted(m for m in _imported(f) if m.startswith("isouq.study.experiments"))
           for f in files}
    assert not {k: v for k, v in bad.items() if v}
    toy = _imported(SRC / "models" / "toy.py")
    assert not any(m.startswith("isouq.study.reference") for m in toy)
