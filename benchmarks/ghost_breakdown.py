"""Where the ghost-norm overhead goes: forward/backward seconds of variants of the floor.

In one process, on B TruthfulQA answers of SmolLM2 (median of --repeats after a warm-up):
- floor: forward + backward with every weight frozen (activation gradients only);
- floor+keep: the same, with every Linear input kept alive as ghost norms keep it;
- floor+gradhooks: the same, with an empty tensor hook on every Linear output;
- ghost: ``GhostNorms`` (norms computed in the backward hooks), with the seconds spent inside
  those hooks by layer type (the Gram products of Linear layers, the norm layers' rule) and in
  the norms left for after the backward (the tied embedding/lm_head weight).

    python benchmarks/ghost_breakdown.py --batch 16
"""

from __future__ import annotations

import argparse
import statistics


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    import time

    import torch

    from isouq.data.qa import load_dataset
    from isouq.ghost.engine import GhostNorms
    from isouq.models import load_model
    from isouq.runtime import tune_allocator
    from isouq.sequences import collate, encode, summarize, token_probs

    tune_allocator()
    torch.set_num_threads(a.threads)
    m, tok, _ = load_model(a.model)
    items = load_dataset("truthfulqa", limit=None)[: a.batch]
    b = collate(encode(tok, [[{"role": "user", "content": it.question}] for it in items],
                       [" " + it.answers[0] for it in items]), tok.pad_token_id or 0, side="left")
    params = dict(m.named_parameters())

    def floor(keep: bool = False, hooks: bool = False):
        for p in m.parameters():
            p.requires_grad_(False)
        emb = m.get_input_embeddings()
        hs = [emb.register_forward_hook(lambda mod, i, o: o.detach().requires_grad_(True))]
        kept: list = []

        def on_linear(mod, i, o):
            if keep:
                kept.append(i[0].detach())
            if hooks and o.requires_grad:
                o.register_hook(lambda g: None)

        if keep or hooks:
            hs += [mod.register_forward_hook(on_linear) for mod in m.modules()
                   if isinstance(mod, torch.nn.Linear)]
        try:
            t0 = time.perf_counter()
            p, mask = token_probs(m, b)
            t1 = time.perf_counter()
            summarize(p, mask)[0].sum().backward()
            return t1 - t0, time.perf_counter() - t1
        finally:
            for h in hs:
                h.remove()
            for p in m.parameters():
                p.requires_grad_(True)

    in_hooks: dict[str, float] = {}
    now, norms = GhostNorms._maybe_now, GhostNorms._norms

    def timed_now(self, call):
        t = time.perf_counter()
        now(self, call)
        key = type(call.module).__name__
        in_hooks[key] = in_hooks.get(key, 0.0) + time.perf_counter() - t

    def timed_norms(self, *args):
        t = time.perf_counter()
        out = norms(self, *args)
        in_hooks["after backward"] = in_hooks.get("after backward", 0.0) + time.perf_counter() - t
        return out

    GhostNorms._maybe_now, GhostNorms._norms = timed_now, timed_norms

    def ghost():
        with GhostNorms(m, params, warn=False) as g, torch.enable_grad():
            t0 = time.perf_counter()
            p, mask = token_probs(m, b)
            t1 = time.perf_counter()
            g.backward_detailed(summarize(p, mask)[0])
            return t1 - t0, time.perf_counter() - t1

    variants = {"floor": floor, "floor+keep": lambda: floor(keep=True),
                "floor+gradhooks": lambda: floor(hooks=True), "ghost": ghost}
    times: dict[str, list] = {k: [] for k in variants}
    for rep in range(a.repeats + 1):
        for name, f in variants.items():
            t = f()
            if rep:  # the first round warms up
                times[name].append(t)
        if rep == 0:  # its first calls also check the norm layers' fused path: not counted
            in_hooks.clear()
    for name, ts in times.items():
        fwd = statistics.median(t[0] for t in ts)
        bwd = statistics.median(t[1] for t in ts)
        print(f"{name:>16}: forward {fwd:.2f} s, backward {bwd:.2f} s, total {fwd + bwd:.2f} s")
    runs = a.repeats  # the hooks' seconds are summed over the ghost runs after the warm-up
    for key, sec in sorted(in_hooks.items(), key=lambda kv: -kv[1]):
        print(f"  ghost norms of {key}: {sec / runs:.3f} s per batch")


if __name__ == "__main__":
    main()
