"""What semantic entropy's clustering costs with an LLM entailment judge, three ways, side by side.

On the kept QA runs' cached samples (``results/qa/cache/*.samples.jsonl``), clusters each
question's K answers with the same judge model:

- ``both_whole``: both directions of every compared pair asked (Farquhar's and LM-Polygraph's
  loops), every prompt encoded whole;
- ``one_first_whole``: answer ⊨ rep asked only when rep ⊨ answer leaves equivalence possible
  (``semantic_clusters``), prompts encoded whole;
- ``one_first_shared``: as above, with a batch's common prompt beginning encoded once
  (left-padded batches; ``option_probs(pack=False)``);
- ``one_first_packed``: as above, with each call's prompts packed without padding after their
  common beginning, which is kept between a question's rounds (``packed_logits``; isouq's
  default).

Reports judge calls and wall-clock per question for each, the ratio to the first way run, and
whether the clusters and every entailment label are identical to the first way's (they must be
for ``one_first_whole``; the shared and packed ways differ from it only by float rounding of
the logits). Writes JSON to --out.

    python benchmarks/semantic_entropy_cost.py --n 4
    python benchmarks/semantic_entropy_cost.py --rows results/qa/qa_truthfulqa__smollm2.jsonl \
        --n 3 --ways one_first_shared one_first_packed --out benchmarks/results/packing.json
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path


def both_directions(questions, answers, judge, strict=True):
    """Greedy clustering asking both directions of each pair, every round batched."""
    from isouq.study.qa.baselines.semantic_entropy import equivalent

    uniq = [list(dict.fromkeys(a)) for a in answers]
    cid = [[None] * len(u) for u in uniq]
    n_next = [0] * len(uniq)
    while True:
        items, owners = [], []
        for q, u in enumerate(uniq):
            free = [i for i in range(len(u)) if cid[q][i] is None]
            if not free:
                continue
            cid[q][free[0]], n_next[q] = n_next[q], n_next[q] + 1
            for i in free[1:]:
                items += [(questions[q], u[free[0]], u[i]), (questions[q], u[i], u[free[0]])]
                owners.append((q, i, cid[q][free[0]]))
        if not items:
            break
        labels = judge.labels(items)
        for n, (q, i, c) in enumerate(owners):
            if equivalent(labels[2 * n], labels[2 * n + 1], strict):
                cid[q][i] = c
    return [[cid[q][uniq[q].index(s)] for s in a] for q, a in enumerate(answers)]


WAYS = {  # name: (both directions, shared prefix, packed)
    "both_whole": (True, False, False),
    "one_first_whole": (False, False, False),
    "one_first_shared": (False, True, False),
    "one_first_packed": (False, True, True),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default="results/qa/qa_triviaqa__smollm2.jsonl",
                    help="a kept QA run (its questions); samples are read from its cache/")
    ap.add_argument("--n", type=int, default=4, help="questions (the run's first n)")
    ap.add_argument("--judge-model", default="qwen2.5-coder-1.5b")
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--ways", nargs="+", default=list(WAYS), choices=list(WAYS),
                    help="ways to run, in order; ratios are to the first")
    ap.add_argument("--out", default="benchmarks/results/semantic_entropy_cost.json")
    a = ap.parse_args()
    import torch

    from isouq.models import load_model
    from isouq.runio import read_jsonl
    from isouq.study.qa.baselines.semantic_entropy import LLMEntailment, semantic_clusters
    from isouq.study.qa.runner import _sampled_from

    if a.threads:
        torch.set_num_threads(a.threads)
    rows_path = Path(a.rows)
    rows = read_jsonl(rows_path)[: a.n]
    tag = rows_path.stem.removeprefix("qa_")
    cache = {d["key"]: d for d in read_jsonl(rows_path.parent / "cache" / f"{tag}.samples.jsonl")}
    questions = [r["question"] for r in rows]
    answers = [_sampled_from(cache[r["key"]]).texts for r in rows]
    model, tok, _ = load_model(a.judge_model)

    res, clusters, labels = {}, {}, {}
    for name in a.ways:
        both, share, pack = WAYS[name]
        judge = LLMEntailment(model, tok, name=a.judge_model, batch_size=a.batch_size,
                              share_prefix=share, pack=pack)
        t0 = time.perf_counter()
        clusters[name] = (both_directions(questions, answers, judge) if both else
                          semantic_clusters(questions, answers, judge)[0])
        secs = time.perf_counter() - t0
        labels[name] = dict(judge.cache)
        res[name] = {"calls_per_question": judge.calls / len(rows),
                     "seconds_per_question": secs / len(rows)}
        print(name, res[name], flush=True)
    first = a.ways[0]
    for name, r in res.items():
        r[f"speedup_vs_{first}"] = res[first]["seconds_per_question"] / r["seconds_per_question"]
        r[f"same_clusters_as_{first}"] = clusters[name] == clusters[first]
        common = labels[name].keys() & labels[first].keys()
        r[f"labels_as_{first}"] = (f"{sum(labels[name][k] == labels[first][k] for k in common)}"
                                   f" of {len(common)} pairs")
    out = {"rows": str(rows_path), "n_questions": len(rows), "judge_model": a.judge_model,
           "batch_size": a.batch_size, "threads": torch.get_num_threads(),
           "distinct_answers_per_question": [len(set(s)) for s in answers],
           "clusters_per_question": {k: [max(c) + 1 for c in v] for k, v in clusters.items()},
           "ways": res}
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(out["ways"], indent=2))


if __name__ == "__main__":
    main()
