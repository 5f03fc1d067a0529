"""Scripts, benchmarks, tools and config files outside the package, imported from their files."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]


def module(path: str | Path, name: str | None = None, *, register: bool = False) -> ModuleType:
    """The module of the file at ``path``.

    Args:
        path: the file, relative to the repository root or absolute.
        name: the module's name (default: the file's stem).
        register: also put it in ``sys.modules`` under ``name`` (a dataclass looks its module
            up there), or return the one already there.

    Returns:
        The executed module.
    """
    path = ROOT / path
    name = name or path.stem
    if register and name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    if register:
        sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod
