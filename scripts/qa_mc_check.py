"""Check kept TruthfulQA MC1 rows on the real model they were made with.

Usage: python scripts/qa_mc_check.py results/qa_mc/mc1_truthfulqa__smollm2.jsonl smollm2 5

For N random rows: the chosen option's epistemic against the loop method (one autograd backward
per answer, no ghost norms) and every option's p̄ against its own forward pass without padding.
Prints the largest relative differences.
"""

from __future__ import annotations

import random
import sys

import torch

from isouq.llm.prompts import encode_prompt
from isouq.models import load_model
from isouq.runio import latest_by_key, read_jsonl
from isouq.runtime import configure
from isouq.sequences import score_sequences


def main(path: str, name: str, n: int) -> None:
    configure()
    rows = latest_by_key(read_jsonl(path))
    random.seed(1)
    pick = random.sample(rows, min(n, len(rows)))
    model, tok, _ = load_model(name)
    worst_e = worst_p = 0.0
    for r in pick:
        s = score_sequences(model, tok, [r["prompt"]], [r["options"][r["chosen"]]], method="loop")
        e = float(s.epistemic[0])
        worst_e = max(worst_e, abs(e - r["scores"]["epistemic"]) / e)
        p_ids = encode_prompt(tok, r["prompt"])
        for j, o in enumerate(r["options"]):
            c_ids = tok(o, add_special_tokens=False)["input_ids"]
            with torch.no_grad():
                logits = model(input_ids=torch.tensor([p_ids + c_ids])).logits[0].double()
            pr = torch.softmax(logits, -1)
            pbar = sum(float(pr[len(p_ids) - 1 + t, i]) for t, i in enumerate(c_ids)) / len(c_ids)
            worst_p = max(worst_p, abs(pbar - r["option_mean_prob"][j]) / pbar)
        print(r["key"], "epistemic: row", r["scores"]["epistemic"], "loop", e, flush=True)
    print(f"{name}: {len(pick)} rows; largest relative difference: epistemic {worst_e:.2e}, "
          f"option p̄ {worst_p:.2e}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
