"""Archive finished polygraph_eval chunks under results/ and gather them into one kept results
file per (dataset, model).

    python scripts/polygraph/collect.py --chunks results/polygraph/chunks/triviaqa__smollm2 \
        [--archive .cache/polygraph_runs/.../chunk-003 --data-chunk .cache/polygraph_data/.../chunk-003] \
        --data .cache/polygraph_data/triviaqa-chat-n500-s0-c24 --dataset triviaqa --model smollm2 \
        --limit 500 --config configs/polygraph/polygraph_eval.yaml \
        --out results/polygraph/polygraph__triviaqa__smollm2.json

``--archive`` reads a finished chunk's saved UEManager (``ue_manager_seed1``: estimations,
generation metrics, greedy texts and tokens) and its ``polygraph_eval.log`` (``log_time``:
seconds of every stat calculator and estimator per batch) and keeps them as
``--chunks/chunk-KKK.json`` under results/ (a few tens of KB), so a run on a fresh checkout
resumes from what is committed. Then every archived chunk is gathered: per question its key,
question, greedy answer, quality (LM-Polygraph's accuracy and ROUGE-L) and every estimator's
uncertainty; LM-Polygraph's UE metrics over all finished questions, computed by its own classes
as ``UEManager.eval_ue`` does (PRR, PRR at 50% rejection, both normalized by oracle and random,
isotonic PCC, ECE); and the cost per answer of each estimator from the same runs: the seconds
of the calculators it needs (its dependency closure, LM-Polygraph's shared greedy generation
apart) plus its own, over the chunks that kept their seconds. Runs in .venv-polygraph (needs
LM-Polygraph).

Once the kept file is complete it holds every answer, so the archived chunks give theirs up
(``compact``: each chunk keeps its seconds and its questions' keys, and names the kept file
that holds the rows); a later gathering reads them from there. ``--compact`` alone does it for
a complete kept file collected before (standard library and numpy only):

    python scripts/polygraph/collect.py --compact \
        --chunks results/polygraph/chunks/triviaqa__smollm2__n500-s0-c24 \
        --out results/polygraph/polygraph__triviaqa__smollm2.json
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


def paused_during(chunk: Path, pauses: Path | None, stamps: list[str]) -> str | None:
    """Why the chunk's seconds do not count, if the background runs were stopped while it ran
    (``scripts/quiet.sh`` logs each stop in ``pauses`` as "START END", seconds since the epoch;
    a line "START END shared" marks a time other work ran beside the run, unstopped);
    else None. The chunk ran from its ``started`` mark (else 10 minutes before its first logged
    line) to its ``done`` mark (else now)."""
    if pauses is None or not pauses.exists():
        return None
    if (chunk / "started").exists():
        start = float((chunk / "started").read_text().split()[0])
    elif stamps:
        start = time.mktime(time.strptime(stamps[0].split(",")[0], "%Y-%m-%d %H:%M:%S")) - 600
    else:
        return None
    end = (chunk / "done").stat().st_mtime if (chunk / "done").exists() else time.time()
    for line in pauses.read_text().splitlines():
        a, b, *why = line.split()
        a, b = float(a), float(b)
        if a < end and b > start:
            span = (f"from {time.strftime('%H:%M:%S', time.localtime(a))} "
                    f"to {time.strftime('%H:%M:%S', time.localtime(b))}")
            if why == ["shared"]:
                return f"other work shared the machine with the run {span}"
            return f"the run was stopped {span} while something was timed (scripts/quiet.sh)"
    return None


def load_rows(data: Path) -> dict[str, list]:
    """The prepared chunk's columns (``key``, ``input``, ``output``) from its datasets folder."""
    import datasets

    return datasets.Dataset.load_from_disk(str(data)).to_dict()


def archive_chunk(chunk: Path, rows: dict[str, list], batch_size: int, out: Path,
                  untimed: str | None = None, pauses: Path | None = None) -> dict:
    """One finished polygraph_eval chunk as a small JSON kept under ``results/`` (what a later
    run on a fresh checkout resumes from; the chunk's UEManager and log stay in the git-ignored
    run folder).

    Args:
        chunk: the chunk's run folder (``ue_manager_seed1``, ``polygraph_eval.log``, ``done``).
        rows: the prepared chunk's columns (:func:`load_rows`).
        batch_size: the config's ``batch_size`` (how the log's per-batch lines split).
        out: the JSON to write.
        untimed: why this chunk's seconds do not count (e.g. the run was stopped for a while
            mid-chunk): they are left out, so the chunk adds no cost.
        pauses: ``scripts/quiet.sh``'s log of stops; a chunk that ran during one is untimed.

    Returns:
        ``{"chunk", "questions": [per question: key, question, references, answer, n_tokens,
        answer_ids, quality, ue, isouq_mean_prob], "batches": [[answers, {calculator or estimator:
        seconds}]], "seconds": {name: total seconds}, "logged": [first, last timestamp]}``.
    """
    import torch

    from isouq.runio import dumps

    man = torch.load(chunk / "ue_manager_seed1", weights_only=False)
    if man.get("state") == "failed":
        raise SystemExit(f"{chunk}: polygraph_eval marked this chunk failed")
    inputs = list(man["stats"]["input_texts"])
    if len(inputs) == 2 * len(rows):  # a config that also lists input_texts in save_stats
        inputs = list(dict.fromkeys(inputs))
    if inputs != list(rows["input"]):
        raise SystemExit(f"{chunk}: its inputs are not those of its prepared chunk")
    n = len(inputs)
    texts, tokens = man["stats"]["greedy_texts"], man["stats"]["greedy_tokens"]
    ests = {name: list(v) for (level, name), v in man["estimations"].items() if level == "sequence"}
    gens = {name: list(v) for (level, name), v in man["gen_metrics"].items()}
    mean_prob = list(man["stats"].get("isouq_mean_prob", []))
    questions = []
    for i in range(n):
        questions.append({
            "key": rows["key"][i],
            "question": rows["input"][i].split("Question: ", 1)[-1].removesuffix("\nAnswer:"),
            "references": list(rows["output"][i])[:5], "answer": texts[i],
            "n_tokens": len(tokens[i]),
            # the greedy token ids as generated (the end-of-sequence token included when the
            # model produced it): what a later pass over the same answers scores
            "answer_ids": [int(t) for t in tokens[i]],
            "quality": {g: float(v[i]) for g, v in gens.items()},
            "ue": {e: (float(v[i]) if np.isfinite(v[i]) else None) for e, v in ests.items()},
            **({"isouq_mean_prob": float(mean_prob[i])} if mean_prob else {}),
        })
    sec, stamps = log_seconds(chunk / "polygraph_eval.log")
    sizes = [min(batch_size, n - i) for i in range(0, n, batch_size)]
    batches = [[size, {k: v[b] for k, v in sec.items() if len(v) == len(sizes)}]
               for b, size in enumerate(sizes)]
    started = (chunk / "started").read_text().split() if (chunk / "started").exists() else []
    doc = {"chunk": chunk.name, "questions": questions, "batches": batches,
           "seconds": {k: round(sum(v), 4) for k, v in sec.items()}, "logged": stamps,
           # OMP_NUM_THREADS of the run (None: not recorded; "" : unset, every core)
           "threads": started[1] if len(started) > 1 else ("" if started else None)}
    untimed = untimed or paused_during(chunk, pauses, stamps)
    if untimed:
        doc |= {"batches": [], "seconds": {}, "note": f"seconds not kept: {untimed}"}
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    tmp.write_text(dumps(doc, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    tmp.replace(out)
    return doc


def chunk_rows(doc: dict, kept: Path) -> list[dict]:
    """An archived chunk's question rows: its own, or, once compacted, the kept file's rows of
    its keys (SystemExit when the kept file lacks one of them)."""
    if doc.get("questions") is not None:
        return doc["questions"]
    if not kept.exists():
        raise SystemExit(f"{doc['chunk']}: its answers are kept in {kept}, which is missing; "
                         "restore it from git (git checkout -- FILE)")
    by_key = {q["key"]: q for q in json.loads(kept.read_text(encoding="utf-8"))["questions"]}
    missing = [k for k in doc["question_keys"] if k not in by_key]
    if missing:
        raise SystemExit(f"{doc['chunk']}: {kept} lacks {len(missing)} of its answers "
                         f"({missing[0]}, ...); restore it from git")
    return [by_key[k] for k in doc["question_keys"]]


def compact(chunks_dir: Path, kept: Path) -> int:
    """Move the answers of a complete kept file's archived chunks into it alone: each chunk
    file keeps everything but its rows, plus their keys and the kept file's name. A chunk is
    compacted only when the kept file holds exactly its rows. Returns the chunks compacted.

    Raises SystemExit when the kept file is not complete or differs from a chunk's rows."""
    doc = json.loads(kept.read_text(encoding="utf-8"))
    if not doc.get("complete"):
        raise SystemExit(f"{kept} is not complete: its chunks keep their answers until it is")
    def same(a, b) -> bool:  # NaN is NaN here (json.loads makes a new float of each)
        return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)

    by_key = {q["key"]: q for q in doc["questions"]}
    todo = {}   # every chunk is checked before any is written
    for path in sorted(chunks_dir.glob("chunk-*.json")):
        chunk = json.loads(path.read_text(encoding="utf-8"))
        rows = chunk.get("questions")
        if rows is None:
            continue
        if not all(same(by_key.get(r["key"]), r) for r in rows):
            raise SystemExit(f"{path}: its answers differ from {kept}'s; collect again first")
        todo[path] = chunk | {"questions": None, "question_keys": [r["key"] for r in rows],
                              "questions_in": kept.name}
    for path, chunk in todo.items():
        path.write_text(json.dumps(chunk, ensure_ascii=False) + "\n", encoding="utf-8")
    return len(todo)


def collect(chunks_dir: Path, data: Path, dataset: str, model: str, limit: int,
            config_path: Path, out: Path, prereg: Path | None = None) -> dict:
    """The kept results of one (dataset, model) from its archived chunks (``archive_chunk``):
    per question rows, LM-Polygraph's UE metrics over them and the cost per answer."""
    config = load_config(config_path)
    questions, estimations, quality = [], defaultdict(list), defaultdict(list)
    seconds, chunks = defaultdict(float), []
    batches: list[tuple[int, dict[str, float]]] = []  # (answers, {name: seconds}) per batch
    timed = 0  # answers whose chunk kept its per-batch seconds
    for path in sorted(chunks_dir.glob("chunk-*.json")):
        doc = json.loads(path.read_text(encoding="utf-8"))
        rows = chunk_rows(doc, out)
        questions += rows
        for e in rows[0]["ue"]:
            estimations[e] += [np.nan if r["ue"].get(e) is None else r["ue"][e] for r in rows]
        for g in rows[0]["quality"]:
            quality[g] += [r["quality"][g] for r in rows]
        if doc.get("batches"):
            timed += len(rows)
            for k, v in doc["seconds"].items():
                seconds[k] += v
            batches += [(size, t) for size, t in doc["batches"]]
        chunks.append({"chunk": doc["chunk"], "questions": len(rows), "logged": doc.get("logged"),
                       "threads": doc.get("threads"),
                       "seconds": round(sum(doc["seconds"].values()), 2)
                       if doc.get("batches") else None})
    if not questions:
        raise SystemExit(f"no archived chunk under {chunks_dir}")
    from isouq.models.files import sha256_file
    from isouq.runio import dumps, machine_label

    n = len(questions)

    def per_answer(total: float) -> float | None:
        """Seconds per answer over the chunks that kept their seconds (None: no such chunk)."""
        return total / timed if timed else None

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
        cost[est] = {"s_per_answer": per_answer(sum(seconds.get(c, 0.0) for c in own)
                                                + seconds.get(est, 0.0)),
                     "median_batch_s_per_answer": float(np.median(per_batch)) if per_batch
                     else None,
                     "calculators": own, "estimator_s_per_answer": per_answer(seconds.get(est, 0.0))}
    isouq_names = [e for e in estimations if e.startswith("Isouq")]
    doc = {
        "kind": "isouq-polygraph",
        "dataset": dataset, "model": model, "n_questions": n, "target_questions": limit,
        "complete": n >= limit,
        "estimators": list(estimations), "isouq_estimators": isouq_names,
        "quality_metrics": list(quality),
        "lm_polygraph_metrics": ue_metrics(estimations, quality),
        "accuracy": {g: float(np.mean(v)) for g, v in quality.items()},
        "cost": {"answers_timed": timed,
                 "generation_s_per_answer": per_answer(seconds.get(GENERATION, 0.0)),
                 "generation_median_batch_s_per_answer": float(np.median(
                     [t.get(GENERATION, 0.0) / size for size, t in batches])) if batches else None,
                 "note": "s_per_answer: total seconds / answers (every process's first-batch "
                         "warm-up included); median_batch_s_per_answer: the median over batches; "
                         "answers_timed: the answers of the chunks that kept their seconds",
                 "estimators": cost,
                 "calculator_seconds": {k: round(v, 3) for k, v in sorted(seconds.items())},
                 "machine": machine_label()},
        "settings": {k: config.get(k) for k in ("batch_size", "max_new_tokens",
                                                 "generation_params", "multiref",
                                                 "generation_metrics", "load_from_disk")},
        "left_out": config.get("isouq_left_out"),
        "config": str(config_path), "data": str(data),
        **({"preregistration": {"path": str(prereg), "sha256": sha256_file(prereg)}}
           if prereg is not None else {}),
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
    if doc["complete"]:
        compact(chunks_dir, out)
    return doc


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--chunks", required=True,
                    help="the archived chunks' folder (results/polygraph/chunks/DATASET__MODEL)")
    ap.add_argument("--archive", help="a finished chunk's run folder: archive it into --chunks "
                    "first (needs --data-chunk)")
    ap.add_argument("--data-chunk", help="the prepared datasets folder of --archive's chunk")
    ap.add_argument("--untimed", metavar="WHY", help="archive --archive's chunk without its "
                    "seconds (it adds no cost), saying why")
    ap.add_argument("--pauses", default="runs/pauses.log", help="scripts/quiet.sh's log of "
                    "stops: a chunk that ran during one keeps no seconds")
    ap.add_argument("--compact", action="store_true", help="only move the answers of the "
                    "complete kept file --out out of its chunks (--chunks)")
    ap.add_argument("--data")
    ap.add_argument("--dataset")
    ap.add_argument("--model")
    ap.add_argument("--limit", type=int)
    ap.add_argument("--config", default="configs/polygraph/polygraph_eval.yaml")
    ap.add_argument("--out", required=True)
    ap.add_argument("--prereg", help="the pre-registration file (configs/preregistration/) "
                    "whose SHA-256 the kept file carries")
    a = ap.parse_args(argv)
    if a.compact:
        print(f"{a.out}: {compact(Path(a.chunks), Path(a.out))} chunk(s) compacted")
        return 0
    missing = [f"--{k}" for k in ("data", "dataset", "model", "limit") if getattr(a, k) is None]
    if missing:
        ap.error(f"{', '.join(missing)} required (or --compact)")
    if a.archive:
        chunk = Path(a.archive)
        batch_size = int(load_config(Path(a.config)).get("batch_size", 1))
        archive_chunk(chunk, load_rows(Path(a.data_chunk)), batch_size, Path(a.chunks) / f"{chunk.name}.json",
                      a.untimed, Path(a.pauses))
    collect(Path(a.chunks), Path(a.data), a.dataset, a.model, a.limit, Path(a.config), Path(a.out),
            Path(a.prereg) if a.prereg else None)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
