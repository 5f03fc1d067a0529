"""Where predicted-class scoring of the ResNet spends its time beyond the floor.

On the ResNet-10 of ``classifiers.py`` (BatchNorm, eval mode), per setting, the mean
milliseconds per ``score_classifier(..., classes="predicted", check_independent=False)``
call over --repeats calls after a warm-up, split into the time inside the ghost rules by layer
type (Conv2d, BatchNorm, Linear: the per-example gradient factors), inside the squared norms
(``factors.sq_norms``), and the rest (forward, activation backward, hooks); beside them the
floor (forward + activation-only backward of the same scalar) and the one-example forward that
``check_independent=True`` adds.

    python benchmarks/classifier_breakdown.py --out benchmarks/results/classifier_breakdown_cpu.json
"""

from __future__ import annotations

import argparse
import collections
import time

import torch
from torch import nn

from classifiers import _trained_like, floor, resnet
from record import save_json


def _ms(fn, repeats: int) -> float:
    fn()
    t = time.perf_counter()
    for _ in range(repeats):
        fn()
    return 1e3 * (time.perf_counter() - t) / repeats


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None, help="JSON file for the results")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--threads", type=int, default=None)
    a = ap.parse_args()

    import isouq
    from isouq.ghost import engine, registry
    from isouq.runtime import tune_allocator

    registry._load_builtin()
    tuned = tune_allocator()
    if a.threads:
        torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    spent: collections.Counter = collections.Counter()

    def timed(name, fn):
        def run(*args):
            t = time.perf_counter()
            try:
                return fn(*args)
            finally:
                spent[name] += time.perf_counter() - t
        return run

    rows = []
    for size, batch in ((32, 32), (224, 8)):
        x = torch.randn(batch, 3, size, size)
        model = _trained_like(resnet(10, imagenet_stem=size >= 64))
        with torch.no_grad():
            cls = model(x).argmax(1)
        layers = {"Conv2d": nn.Conv2d, "BatchNorm": nn.BatchNorm2d, "Linear": nn.Linear}
        keys = {name: next(k for k in cls_.__mro__ if k in registry._BY_TYPE)  # registered class
                for name, cls_ in layers.items()}
        saved = {name: registry._BY_TYPE[k] for name, k in keys.items()}
        norms = engine.sq_norms

        def score(model=model, x=x, batch=batch):
            return isouq.score_classifier(model, x, classes="predicted", batch_size=batch,
                                          check_independent=False)

        row = {"input": f"{size}x{size}", "batch": batch,
               "floor_ms": _ms(lambda model=model, x=x, cls=cls: floor(model, x, cls), a.repeats),
               "check_ms": _ms(lambda model=model, x=x: model(x[:1]), a.repeats)}
        try:  # wrap each rule where the registry keeps it, and the norms where the engine calls them
            for name, k in keys.items():
                r = saved[name]
                registry._BY_TYPE[k] = registry.Rule(timed(name, r.contributions), r.name,
                                                     r.subclasses, r.composite, r.applies)
            engine.sq_norms = timed("sq_norms", norms)
            score()  # warm-up
            spent.clear()
            t = time.perf_counter()
            for _ in range(a.repeats):
                score()
            total = 1e3 * (time.perf_counter() - t) / a.repeats
            parts = {k: 1e3 * v / a.repeats for k, v in spent.items()}
            spent.clear()
        finally:
            engine.sq_norms = norms
            for name, k in keys.items():
                registry._BY_TYPE[k] = saved[name]
        row["isouq_nocheck_ms"] = total
        row.update({f"{k}_rule_ms" if k in layers else f"{k}_ms": v for k, v in parts.items()})
        row["rest_ms"] = total - sum(parts.values())
        row = {k: round(v, 2) if isinstance(v, float) else v for k, v in row.items()}
        rows.append(row)
        print(row, flush=True)
    save_json(a.out, {"benchmark": "classifier_breakdown", "repeats": a.repeats, "malloc_tuned": tuned},
              rows=rows)


if __name__ == "__main__":
    main()
