"""Matrix-product flops of one batch's ghost norms, with and without shared input Grams.

Counts, not times (exact on a busy machine): torch's ``FlopCounterMode`` counts the flops of every
matrix product (mm, bmm, ...) in a forward + backward of B TruthfulQA answers of SmolLM2:

- floor: every weight frozen, activation gradients only (what autograd needs anyway);
- ghost, shared: ``GhostNorms`` as scoring runs it (layers reading one input share its Gram and
  one cost rule, ``ghost/shared.py``);
- ghost, unshared: ``GhostNorms(share_grams=False)``, every parameter on its own;
- ghost, blocks2: shared, each symmetric Gram from its 3 blocks on and above the diagonal
  (``factors.GRAM_BLOCKS`` = 2).

ghost − floor is what the norms themselves multiply (Grams, materialized blocks); the output
splits it by product (bmm: Grams and blocks; mm/addmm: the model's own). Element-wise work and
the Grams' inner products (vecdot) are not counted. Beside the flops, ``held_mib``: what the
engine still holds in its cache of layer inputs and their Grams when the backward ends (the
per-parameter path keeps them to the end; the shared path releases each group when it is
done). ``--prompt-tokens L`` leads each question with few-shot context to about L tokens (the
cost rule's choices depend on T):

    python benchmarks/ghost_flops.py --batch 4 --out benchmarks/results
    python benchmarks/ghost_flops.py --batch 2 --prompt-tokens 256 --out benchmarks/results
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--prompt-tokens", type=int, default=None, metavar="L")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=None, help="folder for ghost_flops[_tL].json")
    a = ap.parse_args()
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from floor import activation_gradients_only  # benchmarks/floor.py
    from isouq.ghost import factors
    from isouq.ghost.engine import GhostNorms
    from isouq.models import load_model
    from isouq.sequences import collate, encode, summarize, token_probs
    from score_sequences import load_pairs  # benchmarks/score_sequences.py

    torch.set_num_threads(a.threads)
    model, tok, info = load_model(a.model)
    prompts, answers = load_pairs(a.batch, tok, a.prompt_tokens)
    b = collate(encode(tok, prompts, answers), tok.pad_token_id or 0, side="left")
    params = dict(model.named_parameters())

    def floor():
        with activation_gradients_only(model):
            p, mask = token_probs(model, b)
            summarize(p, mask)[0].sum().backward()

    held: dict[str, float] = {}

    def ghost(share: bool, blocks: int = 1, name: str = ""):
        def run():
            factors.GRAM_BLOCKS = blocks
            with GhostNorms(model, params, warn=False, share_grams=share) as g, \
                    torch.enable_grad():
                norms = g._norms

                def at_end(*args, **kw):  # the cache of inputs and Grams as the backward ends
                    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()
                                for pair in g._cache.values() for t in pair}
                    held[name] = sum(storages.values()) / 2**20
                    return norms(*args, **kw)

                g._norms = at_end
                p, mask = token_probs(model, b)
                g.backward_detailed(summarize(p, mask)[0])  # as score_sequences calls it
        return run

    counts = {}
    for name, fn in (("floor", floor), ("ghost_shared", ghost(True, 1, "ghost_shared")),
                     ("ghost_unshared", ghost(False, 1, "ghost_unshared")),
                     ("ghost_blocks2", ghost(True, 2, "ghost_blocks2"))):
        fn()  # untimed first call: the norm layers' formula checks run once
        with FlopCounterMode(display=False) as fc:
            fn()
        by_op = {str(op).split(".")[-1]: int(n)
                 for op, n in fc.get_flop_counts().get("Global", {}).items()}
        counts[name] = {"total": int(fc.get_total_flops()), "by_op": by_op}
        if name in held:
            counts[name]["held_mib"] = held[name]
    floor_total = counts["floor"]["total"]
    doc = {"model": info.name, "batch": a.batch, "tokens_padded": int(b.input_ids.shape[1]),
           "prompt_tokens": a.prompt_tokens, "counts": counts,
           "norms_shared": counts["ghost_shared"]["total"] - floor_total,
           "norms_unshared": counts["ghost_unshared"]["total"] - floor_total,
           "norms_blocks2": counts["ghost_blocks2"]["total"] - floor_total}
    for k in ("shared", "blocks2"):  # the norms' products saved against the unshared path
        doc[f"saved_fraction_{k}"] = (1 - doc[f"norms_{k}"] / doc["norms_unshared"]
                                      if doc["norms_unshared"] else 0.0)
    for name, c in counts.items():
        mib = f"  held at the end {c['held_mib']:.1f} MiB" if "held_mib" in c else ""
        print(f"{name:>15}: {c['total'] / 1e9:10.2f} GFLOP  {c['by_op']}{mib}")
    print(f"norms (ghost − floor), batch {a.batch}, T = {doc['tokens_padded']}: unshared "
          f"{doc['norms_unshared'] / 1e9:.2f} GFLOP, shared {doc['norms_shared'] / 1e9:.2f} "
          f"({100 * doc['saved_fraction_shared']:.1f}% fewer), blocks2 "
          f"{doc['norms_blocks2'] / 1e9:.2f} ({100 * doc['saved_fraction_blocks2']:.1f}% fewer)")
    if a.out:
        out = Path(a.out)
        out.mkdir(parents=True, exist_ok=True)
        stem = "ghost_flops" + (f"_t{a.prompt_tokens}" if a.prompt_tokens else "")
        (out / f"{stem}.json").write_text(json.dumps(doc, indent=2))


if __name__ == "__main__":
    main()
