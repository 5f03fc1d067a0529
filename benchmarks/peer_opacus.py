"""Benchmark: isouq's per-example gradient norms beside Opacus's ghost clipping, on one LLM.

The same untied GPT-NeoX-style causal LM (built from a local config, seeded; no download), the
same batch of B random sequences of T tokens whose last A tokens are the "answer", and the same
per-example scalar sᵢ = p̄ᵢ (mean probability of the answer's tokens). Each method gives the B
per-example ‖∇θ sᵢ‖² over every parameter:

- floor: forward + backward with every weight frozen (activation gradients only) — no
  per-example method can be cheaper;
- isouq: ``GhostNorms`` (Gram or materialize per layer and batch; one backward);
- opacus_ghost: Opacus ``GradSampleModuleFastGradientClipping(use_ghost_clipping=True)``, its
  per-sample norms (ghost norms for Linear and Embedding, per-sample gradients for LayerNorm);
- opacus_fgc: the same with ``use_ghost_clipping=False`` (fast gradient clipping: per-sample
  gradients materialized layer by layer, then their norms).

Each method runs in its own subprocess (so peak RSS is its own) and reports the median seconds
of --repeats after a warm-up and its peak RSS; the parent checks that every method's norms agree
with isouq's (max relative difference) and writes JSON + Markdown to --out.

    python benchmarks/peer_opacus.py --batch 16 --length 128 --out benchmarks/results
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

METHODS = ("floor", "isouq", "opacus_ghost", "opacus_fgc")


def build(a):
    """The model (float32, eval-equivalent: no dropout) and the batch of token ids."""
    import torch
    import transformers as tf

    torch.manual_seed(a.seed)
    cfg = tf.GPTNeoXConfig(vocab_size=a.vocab, hidden_size=a.hidden,
                           num_hidden_layers=a.layers, num_attention_heads=a.heads,
                           intermediate_size=4 * a.hidden, max_position_embeddings=a.length,
                           tie_word_embeddings=False, attention_dropout=0.0, hidden_dropout=0.0,
                           use_cache=False)
    model = tf.GPTNeoXForCausalLM(cfg)
    ids = torch.randint(0, a.vocab, (a.batch, a.length), generator=torch.Generator().manual_seed(1))
    return model, ids


def mean_answer_prob(logits, ids, answer: int):
    """(B,) p̄ᵢ: mean probability of the last ``answer`` tokens, each predicted from before."""
    import torch

    lp = torch.log_softmax(logits[:, -answer - 1:-1].float(), dim=-1)
    tok = ids[:, -answer:]
    return lp.gather(-1, tok[..., None])[..., 0].exp().mean(dim=1)


def run_one(method: str, a) -> dict:
    import torch

    torch.set_num_threads(a.threads)
    model, ids = build(a)
    base_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss

    def floor():
        from floor import activation_gradients_only

        with activation_gradients_only(model):
            mean_answer_prob(model(ids).logits, ids, a.answer).sum().backward()
        return None

    def isouq():
        from isouq import GhostNorms

        with GhostNorms(model.eval(), dict(model.named_parameters())) as ghost:
            return ghost.backward(mean_answer_prob(model(ids).logits, ids, a.answer))

    gsm = None
    if method.startswith("opacus"):
        from opacus.grad_sample import GradSampleModuleFastGradientClipping

        # Opacus records in train mode only (no dropout here: the same function as eval)
        gsm = GradSampleModuleFastGradientClipping(
            model.train(), batch_first=True, loss_reduction="sum", strict=False,
            use_ghost_clipping=method == "opacus_ghost")

    def opacus():
        out = gsm(ids)
        mean_answer_prob(out.logits, ids, a.answer).sum().backward()
        norms = gsm.get_norm_sample()
        gsm.zero_grad(set_to_none=True)
        return norms ** 2

    fn = opacus if gsm is not None else locals()[method]
    sq = fn()  # warm-up
    times = []
    for _ in range(a.repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return {"method": method, "seconds": statistics.median(times), "repeats": a.repeats,
            "peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
            "peak_rss_over_model_gib": (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
                                        - base_rss) / 2**20,
            "n_params": sum(p.numel() for p in model.parameters()),
            "sq_norms": None if sq is None else [float(x) for x in sq.detach()]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--length", type=int, default=128, help="tokens per sequence")
    ap.add_argument("--answer", type=int, default=16, help="answer tokens at the end")
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--vocab", type=int, default=16384)
    ap.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        print(json.dumps(run_one(a.child, a)))
        return
    rows = []
    for m in a.methods:
        cmd = [sys.executable, __file__, "--child", m] + [
            x for k in ("batch", "length", "answer", "hidden", "layers", "heads", "vocab",
                        "repeats", "seed", "threads") for x in (f"--{k}", str(getattr(a, k)))]
        run = subprocess.run(cmd, capture_output=True, text=True)
        if run.returncode != 0:
            rows.append({"method": m, "error": run.stderr.strip().splitlines()[-1]})
            print(f"{m:>13}: failed: {rows[-1]['error']}", flush=True)
            continue
        rows.append(json.loads(run.stdout.strip().splitlines()[-1]))
        print(f"{m:>13}: {rows[-1]['seconds']:.3f} s per batch, peak RSS "
              f"{rows[-1]['peak_rss_gib']:.2f} GiB", flush=True)
    by = {r["method"]: r for r in rows if "error" not in r}
    ref = by.get("isouq", {}).get("sq_norms")
    for r in by.values():
        if ref and r.get("sq_norms"):
            r["max_rel_diff_vs_isouq"] = max(abs(x - y) / max(abs(y), 1e-30)
                                             for x, y in zip(r["sq_norms"], ref, strict=True))
        if "floor" in by:
            r["over_floor"] = r["seconds"] / by["floor"]["seconds"]
        if "isouq" in by:
            r["over_isouq"] = r["seconds"] / by["isouq"]["seconds"]
    doc = {"benchmark": "peer_opacus", "settings": {k: v for k, v in vars(a).items()
                                                     if k not in ("child", "out", "methods")},
           "n_params": next((r["n_params"] for r in by.values()), None),
           "machine": platform.processor() or platform.machine(), "cpus": os.cpu_count(),
           "versions": versions(), "rows": rows}
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = f"peer_opacus_b{a.batch}_t{a.length}"
    (out / f"{stem}.json").write_text(json.dumps(doc, indent=1))
    lines = [f"# isouq vs Opacus ghost clipping: B={a.batch}, T={a.length}, A={a.answer}, "
             f"{doc['n_params']:,} parameters (GPT-NeoX-style, untied), {a.threads} threads", "",
             "| method | s / batch | × floor | × isouq | peak RSS GiB | max rel. diff vs isouq |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['method']} | failed: {r['error']} | | | | |")
            continue
        lines.append(f"| {r['method']} | {r['seconds']:.3f} | {r.get('over_floor', 0):.2f} | "
                     f"{r.get('over_isouq', 0):.2f} | {r['peak_rss_gib']:.2f} | "
                     f"{r.get('max_rel_diff_vs_isouq', float('nan')):.1e} |")
    (out / f"{stem}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def versions() -> dict:
    import importlib.metadata as md

    return {p: md.version(p) for p in ("torch", "transformers", "opacus")}


if __name__ == "__main__":
    main()
