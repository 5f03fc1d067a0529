"""Gather finished polygraph_eval chunks into one kept results file per (dataset, model).

    python scripts/polygraph/collect.py --runs .cache/polygraph_runs/triviaqa__smollm2 \
        --data .cache/polygraph_data/triviaqa-chat-n500-s0 --dataset triviaqa --model smollm2 \
        --limit 500 --config configs/polygraph/polygraph_eval.yaml \
        --out results/polygraph/polygraph__triviaqa__smollm2.json

Reads each chunk's saved UEManager (``ue_manager_seed1``: estimations, generation metrics,
greedy texts and tokens) and its ``polygraph_eval.log`` (``log_time``: seconds of every stat
calculator and estimator per batch), and writes: per question its key, question, greedy
answer, quality (LM-Polygraph's accuracy and ROUGE-L) and every estimator's uncertainty;
LM-Polygraph's UE metrics over all finished questions, computed by its own classes as
``UEManager.eval_ue`` does (PRR, PRR at 50% rejection, both normalized by oracle and random,
isotonic PCC, ECE); and the cost per answer of each estimator from the same run: the seconds
of the calculators it needs (its dependency closure, LM-Polygraph's shared greedy generation
apart) plus its own. Runs in .venv-polygraph (needs LM-Polygraph).
"""

from __future__ import annotations

import argparse
import json
import platform
import re
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

GENERATION = "GreedyProbsCalculator"
LOG_LINE = re.compile(r"^\[(?P<ts>[\d\- :,]+)\]\[[^\]]*\]\[INFO\] - Done calculating (?P<name>.+) in "
                      r"(?P<sec>[\d.eE+-]+) secs$")
OBJ = re.compile(r"^<[\w.]*\.(\w+) object at 0x[0-9a-f]+>$")


def log_seconds(log: Path) -> tuple[dict[str, list[float]], list[str]]:
    """({name: seconds of each call, batch by batch}, [first, last timestamp]) of a
    polygraph_eval log (``log_time``)."""
    sec, stamps = defaultdict(list), []
    for line in log.read_text(encoding="utf-8", errors="replace").splitlines():
        m = LOG_LINE.match(line.strip())
        if not m:
            continue
        name = m["name"]
        obj = OBJ.match(name)
        sec[obj.group(1) if obj else name].append(float(m["sec"]))
        stamps.append(m["ts"])
    return dict(sec), [stamps[0], stamps[-1]] if stamps else []


def dependency_closure(config: dict) -> dict[str, list[str]]:
    """{estimator name: the stat calculators it needs}, from LM-Polygraph's own registrations
    (what ``UEManager.init`` orders) and the config's extra calculators."""
    from lm_polygraph.defaults.register_default_stat_calculators import (
        register_default_stat_calculators,
    )
    from lm_polygraph.utils.factory_estimator import FactoryEstimator

    containers = register_default_stat_calculators("Whitebox")
    by_stat = {}
    for sc in containers:
        for s in sc.stats:
            by_stat[s] = (sc.name, list(sc.dependencies))
    for sc in config.get("stat_calculators", []):
        if isinstance(sc, dict):
            for s in sc["stats"]:
                by_stat[s] = (sc["name"], list(sc["dependencies"]))
    out = {}
    factory = FactoryEstimator()
    for e in config["estimators"]:
        est = factory(e["name"], e.get("cfg") or {})
        need, todo = [], list(est.stats_dependencies)
        seen = set()
        while todo:
            stat = todo.pop()
            if stat in seen:
                continue
            seen.add(stat)
            calc, deps = by_stat[stat]
            if calc not in need:
                need.append(calc)
            todo.extend(deps)
        out[str(est)] = need
    return out


def load_config(path: Path) -> dict:
    from omegaconf import OmegaConf

    cfg = OmegaConf.load(path)
    return OmegaConf.to_container(cfg, resolve=False)


def ue_metrics(estimations: dict[str, list], quality: dict[str, list]) -> dict:
    """LM-Polygraph's UE metrics, as UEManager.eval_ue computes them."""
    from lm_polygraph.ue_metrics import ECE, IsotonicPCC, PredictionRejectionArea
    from lm_polygraph.ue_metrics.ue_metric import get_random_scores, normalize_metric
    from lm_polygraph.utils.manager import _delete_nans

    metrics = [PredictionRejectionArea(), PredictionRejectionArea(max_rejection=0.5),
               IsotonicPCC(), ECE(normalize=True)]
    out: dict = defaultdict(dict)
    for gen, values in quality.items():
        values = np.asarray(values, dtype=float)
        for m in metrics:
            if "prr" in str(m):
                oracle = m(-values, values)
                rand = get_random_scores(m, values)
            for est, ue in estimations.items():
                u, q = _delete_nans(np.asarray(ue, dtype=float), values)
                cell = out[est].setdefault(gen, {})
                if len(u) == 0:
                    cell[str(m)] = None
                    continue
                v = float(m(u, q))
                cell[str(m)] = v if np.isfinite(v) else None
                if "prr" in str(m):
                    o, r = (oracle, rand) if len(u) == len(values) else (m(-q, q), get_random_scores(m, q))
                    nv = float(normalize_metric(v, o, r))
                    cell[f"{m}_normalized"] = nv if np.isfinite(nv) else None
    return dict(out)


def versions() -> dict:
    from importlib.metadata import version

    out = {"python": platform.python_version()}
    for d in ("lm-polygraph", "torch", "transformers", "isouq", "datasets"):
        try:
            out[d] = version(d)
        except Exception:  # noqa: BLE001
            out[d] = None
    return out


def collect(runs: Path, data: Path, dataset: str, model: str, limit: int, config_path: Path,
            out: Path) -> dict:
    import datasets
    import torch

    from isouq.runio import dumps, machine_label

    config = load_config(config_path)
    questions, estimations, quality = [], defaultdict(list), defaultdict(list)
    seconds, chunks = defaultdict(float), []
    batches: list[tuple[int, dict[str, float]]] = []  # (answers, {name: seconds}) per batch
    bs = int(config.get("batch_size", 1))
    for chunk in sorted(runs.glob("chunk-*")):
        if not (chunk / "done").exists() or not (chunk / "ue_manager_seed1").exists():
            continue
        man = torch.load(chunk / "ue_manager_seed1", weights_only=False)
        if man.get("state") == "failed":
            continue
        rows = datasets.Dataset.load_from_disk(str(data / chunk.name))
        inputs = list(man["stats"]["input_texts"])
        if len(inputs) == 2 * len(rows):  # a config that also lists input_texts in save_stats
            inputs = list(dict.fromkeys(inputs))
        if inputs != list(rows["input"]):
            raise SystemExit(f"{chunk}: its inputs are not those of {data / chunk.name}")
        n = len(inputs)
        texts, tokens = man["stats"]["greedy_texts"], man["stats"]["greedy_tokens"]
        ests = {name: list(v) for (level, name), v in man["estimations"].items()
                if level == "sequence"}
        gens = {name: list(v) for (level, name), v in man["gen_metrics"].items()}
        extra = {k: list(man["stats"][k]) for k in ("isouq_seconds", "isouq_mean_prob")
                 if k in man["stats"]}
        for i in range(n):
            questions.append({
                "key": rows["key"][i], "question": rows["input"][i].split("Question: ", 1)[-1]
                .removesuffix("\nAnswer:"),
                "references": list(rows["output"][i])[:5], "answer": texts[i],
                "n_tokens": len(tokens[i]),
                "quality": {g: float(v[i]) for g, v in gens.items()},
                "ue": {e: (float(v[i]) if np.isfinite(v[i]) else None) for e, v in ests.items()},
                **({"isouq_mean_prob": float(extra["isouq_mean_prob"][i])}
                   if "isouq_mean_prob" in extra else {}),
            })
        for e, v in ests.items():
            estimations[e] += v
        for g, v in gens.items():
            quality[g] += v
        sec, stamps = log_seconds(chunk / "polygraph_eval.log")
        for k, v in sec.items():
            seconds[k] += sum(v)
        sizes = [min(bs, n - i) for i in range(0, n, bs)]
        for b, size in enumerate(sizes):
            batches.append((size, {k: v[b] for k, v in sec.items() if len(v) == len(sizes)}))
        chunks.append({"chunk": chunk.name, "questions": n, "logged": stamps,
                       "seconds": round(sum(map(sum, sec.values())), 2)})
    if not questions:
        raise SystemExit(f"no finished chunk under {runs}")
    n = len(questions)
    needs = dependency_closure(config)
    # an estimator may name itself after its first call ("AttentionScore (layer=15)")
    for name in estimations:
        if name not in needs:
            same = [k for k in needs if k.split(" (")[0] == name.split(" (")[0]
                    and k not in estimations]
            if len(same) == 1:
                needs[name] = needs.pop(same[0])
    cost = {}
    for est, calcs in needs.items():
        own = [c for c in calcs if c != GENERATION]
        per_batch = [(sum(t.get(c, 0.0) for c in own) + t.get(est, 0.0)) / size
                     for size, t in batches]
        cost[est] = {"s_per_answer": (sum(seconds.get(c, 0.0) for c in own)
                                      + seconds.get(est, 0.0)) / n,
                     "median_batch_s_per_answer": float(np.median(per_batch)) if per_batch
                     else None,
                     "calculators": own, "estimator_s_per_answer": seconds.get(est, 0.0) / n}
    isouq_names = [e for e in estimations if e.startswith("Isouq")]
    doc = {
        "kind": "isouq-polygraph",
        "dataset": dataset, "model": model, "n_questions": n, "target_questions": limit,
        "complete": n >= limit,
        "estimators": list(estimations), "isouq_estimators": isouq_names,
        "quality_metrics": list(quality),
        "lm_polygraph_metrics": ue_metrics(estimations, quality),
        "accuracy": {g: float(np.mean(v)) for g, v in quality.items()},
        "cost": {"generation_s_per_answer": seconds.get(GENERATION, 0.0) / n,
                 "generation_median_batch_s_per_answer": float(np.median(
                     [t.get(GENERATION, 0.0) / size for size, t in batches])) if batches else None,
                 "note": "s_per_answer: total seconds / answers (every process's first-batch "
                         "warm-up included); median_batch_s_per_answer: the median over batches",
                 "estimators": cost,
                 "calculator_seconds": {k: round(v, 3) for k, v in sorted(seconds.items())},
                 "machine": machine_label()},
        "settings": {k: config.get(k) for k in ("batch_size", "max_new_tokens",
                                                 "generation_params", "multiref",
                                                 "generation_metrics", "load_from_disk")},
        "left_out": config.get("isouq_left_out"),
        "config": str(config_path), "data": str(data),
        "model_export": json.loads((Path(".cache/polygraph_models") / model
                                    / "isouq_export.json").read_text())
        if (Path(".cache/polygraph_models") / model / "isouq_export.json").exists() else None,
        "versions": versions(), "chunks": chunks,
        "collected": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "questions": questions,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    tmp.write_text(dumps(doc, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    tmp.replace(out)
    print(f"{out}: {n} questions ({'complete' if n >= limit else f'partial, {n} of {limit}'})")
    return doc


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--dataset", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--limit", type=int, required=True)
    ap.add_argument("--config", default="configs/polygraph/polygraph_eval.yaml")
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    collect(Path(a.runs), Path(a.data), a.dataset, a.model, a.limit, Path(a.config), Path(a.out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
