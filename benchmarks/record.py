"""Where a benchmark's results go: one JSON file with the machine it ran on."""

from __future__ import annotations

import json
import os
import platform
import subprocess
from pathlib import Path


def machine() -> dict:
    """torch version, threads, CPU and core count of this process's machine."""
    import torch

    return {"torch": torch.__version__, "threads": torch.get_num_threads(),
            "cpu": platform.processor() or platform.machine(), "cpu_count": os.cpu_count()}


def save_json(path: str | None, meta: dict, **payload) -> None:
    """Write ``{"meta": machine() | meta, **payload}`` to ``path`` (nothing when None)."""
    if not path:
        return
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w") as f:
        json.dump({"meta": {**machine(), **meta}, **payload}, f, indent=1)


def source_commit(src: Path) -> str | None:
    """The short commit of the checkout at ``src`` (None outside a git checkout)."""
    res = subprocess.run(["git", "-C", str(src), "rev-parse", "--short", "HEAD"],
                         capture_output=True, text=True)
    return res.stdout.strip() or None
