"""Half precision: ghost norms in bfloat16/float16 against one backward per answer, same dtype,
and against the float32 loop (the reference), on the same answers.

    python benchmarks/half_precision.py --model smollm2 --n 16 --out benchmarks/results
    python benchmarks/half_precision.py --config DIR --device cuda --tag cuda   # a GPU

(``--config DIR``: random weights of a saved config and tokenizer, ``random_weights.py``.)

Writes ``OUT/half_precision.json``: per dtype, the largest and median relative difference of
ghost from the same-dtype loop, and each method's median / largest relative error against the
float32 loop and its Spearman ρ with it. ``ghost_b1`` is ghost with one answer per batch: it
sees the same half-precision forward as the loop (one unpadded answer), so ghost_b1 against
the loop isolates what the ghost arithmetic itself adds, and ghost against ghost_b1 what the
batched (padded) half-precision forward changes.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--n", type=int, default=16)
    ap.add_argument("--dtypes", nargs="+", default=["bfloat16", "float16"])
    ap.add_argument("--config", default=None, metavar="DIR",
                    help="random weights of the config (and tokenizer) saved in DIR")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--tag", default=None, help="suffix of the result file's name")
    ap.add_argument("--out", default="benchmarks/results")
    a = ap.parse_args()
    import torch
    from scipy.stats import spearmanr

    from answers import truthfulqa_answers  # benchmarks/answers.py, beside this script
    from isouq import score_sequences
    from isouq.models import load_model
    from isouq.runtime import configure

    configure()
    if a.config:
        from random_weights import random_model  # benchmarks/random_weights.py

        model, tok, name, _ = random_model(a.config, device=a.device)
    else:
        model, tok, _ = load_model(a.model)
        name = a.model
    model.to(a.device)
    torch.backends.cuda.matmul.allow_tf32 = False  # the float32 reference stays float32
    prompts, answers = truthfulqa_answers(tok, a.n)
    ref = score_sequences(model, tok, prompts, answers, method="loop", batch_size=a.n).epistemic

    def rel(x, y):
        return ((x - y).abs() / y.abs()).double()

    device = torch.cuda.get_device_name() if a.device.startswith("cuda") else a.device
    doc = {"benchmark": "half_precision", "model": name, "device": device, "n": a.n,
           "dtypes": {}}
    import copy

    for name in a.dtypes:
        m = copy.deepcopy(model).to(getattr(torch, name))  # rounded from the float32 weights
        g = score_sequences(m, tok, prompts, answers, method="ghost", batch_size=a.n).epistemic
        g1 = score_sequences(m, tok, prompts, answers, method="ghost", batch_size=1).epistemic
        lo = score_sequences(m, tok, prompts, answers, method="loop", batch_size=a.n).epistemic
        d, d1, db = rel(g, lo), rel(g1, lo), rel(g, g1)
        doc["dtypes"][name] = {
            "ghost_vs_loop_max": float(d.max()), "ghost_vs_loop_median": float(d.median()),
            "ghost_b1_vs_loop_max": float(d1.max()), "ghost_b1_vs_loop_median": float(d1.median()),
            "ghost_vs_ghost_b1_max": float(db.max()),
            "ghost_vs_ghost_b1_median": float(db.median()),
            **{f"{k}_vs_f32_{s}": float(getattr(rel(v, ref), s)())
               for k, v in (("ghost", g), ("ghost_b1", g1), ("loop", lo))
               for s in ("median", "max")},
            "ghost_spearman_f32": float(spearmanr(g, ref).statistic),
            "loop_spearman_f32": float(spearmanr(lo, ref).statistic),
        }
        print(name, json.dumps(doc["dtypes"][name]), flush=True)
        del m
    Path(a.out).mkdir(parents=True, exist_ok=True)
    path = Path(a.out) / f"half_precision{'_' + a.tag if a.tag else ''}.json"
    path.write_text(json.dumps(doc, indent=1), encoding="utf-8")
    print(f"-> {path}")


if __name__ == "__main__":
    main()
