"""Where a benchmark's results go: one JSON file with the machine it ran on."""

from __future__ import annotations

import json
import os
import platform


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
