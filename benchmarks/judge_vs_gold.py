"""How good are the correctness labels? The LLM judge against hand labels, per prompt style.

Reads gold rows (``results/qa/gold/*.gold.jsonl``: question, answer, references, optional
incorrect_references (TruthfulQA), gold_correct, labelled by a person) and asks the judge model
about each answer with every prompt style;
reports positives, true/false positives, accuracy and Cohen's κ against the gold labels, and
each p(yes). Writes JSON to --out.

    python benchmarks/judge_vs_gold.py --styles strict farquhar2024
    python benchmarks/judge_vs_gold.py --gold results/qa/gold/truthfulqa__smollm2.gold.jsonl \
        --sample 40 --seed 7 --styles contrast strict farquhar2024 \
        --out benchmarks/results/judge_vs_gold_truthfulqa.json
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gold", default="results/qa/gold/triviaqa__smollm2.gold.jsonl")
    ap.add_argument("--judge-model", default="qwen2.5-coder-1.5b")
    ap.add_argument("--styles", nargs="+", default=["strict", "farquhar2024"])
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--sample", type=int, default=None,
                    help="judge a random sample of this many gold rows (as `isouq qa label --sample`)")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--out", default="benchmarks/results/judge_vs_gold.json")
    a = ap.parse_args()
    import torch

    from isouq.models import load_model
    from isouq.runio import read_jsonl
    from isouq.study.qa.hand_labels import sample_rows
    from isouq.study.qa.judge import LLMJudge, cohen_kappa

    if a.threads:
        torch.set_num_threads(a.threads)
    gold = read_jsonl(a.gold, missing_ok=False)
    gold = sample_rows(gold, a.sample, a.seed)
    y = [bool(g["gold_correct"]) for g in gold]
    model, tok, _ = load_model(a.judge_model)
    res = {"gold": a.gold, "sample": a.sample, "seed": a.seed if a.sample else None,
           "n": len(gold), "gold_positive": sum(y), "judge": a.judge_model,
           "date": time.strftime("%Y-%m-%d %H:%M"), "styles": {}}
    for style in a.styles:
        judge = LLMJudge(model, tok, name=a.judge_model, prompt=style)
        t0 = time.time()
        got = judge.judge([g["question"] for g in gold], [g["answer"] for g in gold],
                          [g["references"] for g in gold],
                          [g.get("incorrect_references", []) for g in gold])
        pred = [v.correct for v in got]
        pairs = list(zip(pred, y, strict=True))
        res["styles"][style] = {
            "positive": sum(pred), "true_positive": sum(p and t for p, t in pairs),
            "false_positive": sum(p and not t for p, t in pairs),
            "accuracy": sum(p == t for p, t in pairs) / len(y),
            "kappa": cohen_kappa(pred, y), "p_yes": [round(v.p_yes, 3) for v in got],
            "seconds": round(time.time() - t0, 1)}
        print(style, {k: v for k, v in res["styles"][style].items() if k != "p_yes"}, flush=True)
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(res, indent=2))


if __name__ == "__main__":
    main()
