"""The docs' measured tables and numbers, from the kept result files (repository tooling).

``python tools/docs_tables.py --check`` exits 1 naming what is stale; ``--write`` rewrites it;
``--list``, ``--show NAME``. A **table** is ``docs/tables/NAME.md``, included by a page with
``--8<-- "NAME.md"``; a **value** is a number in a sentence of README.md or docs/*.md, between
``<!-- value: NAME -->`` and ``<!-- /value -->`` on one line. Functions render numbers only
(cells, ranges, counts); people write the sentences. Nothing here runs a model.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from pathlib import Path

TABLES_DIR, MISSING = "docs/tables", "–"
VALUE = re.compile(r"(<!--\s*value:\s*([\w.-]+)\s*-->)(.*?)(<!--\s*/value\s*-->)")
FENCE, CODE = re.compile(r"^ {0,3}(`{3,}|~{3,})"), re.compile(r"(`+[^`]*?`+)")
TABLES: dict = {}  # name -> (kept files read, relative to the root; function root -> Markdown)
VALUES: dict = {}  # name -> (kept files read; function root -> one short line)

def _add(registry: dict, name: str, sources: tuple, fn):
    if name in TABLES or name in VALUES:
        raise ValueError(f"{name!r}: the name is registered twice")
    registry[name] = (sources, fn)
    return fn

def table(name: str, *sources: str):
    """Decorator: ``fn(root) -> Markdown table`` as ``docs/tables/NAME.md``, reading ``sources``."""
    return lambda fn: _add(TABLES, name, sources, fn)

def value(name: str, *sources: str):
    """Decorator: ``fn(root) -> one short line`` shown between the value markers named NAME."""
    return lambda fn: _add(VALUES, name, sources, fn)

def render(name: str, root=".") -> str:
    """Table ``name`` from the files under ``root``, ending with one newline."""
    if name not in TABLES:
        raise KeyError(f"no table named {name!r} (--list shows them)")
    return TABLES[name][1](Path(root)).rstrip("\n") + "\n"

def render_value(name: str, root=".") -> str:
    """Value ``name``: one short line without markers."""
    if name not in VALUES:
        raise KeyError(f"no value named {name!r} (--list shows them)")
    text = str(VALUES[name][1](Path(root)))
    if not text.strip() or "\n" in text or "<!--" in text:
        raise ValueError(f"value {name!r} rendered {text!r}: one non-empty line, no comment")
    return text

def pages(root=".") -> list[Path]:
    """The pages that may hold values: README.md and docs/*.md."""
    return [p for p in [Path(root) / "README.md", *sorted((Path(root) / "docs").glob("*.md"))]
            if p.exists()]

def values_of(text: str, make=None) -> tuple[str, list[tuple[int, str, str]]]:
    """(``text`` with each value's shown text replaced by ``make(name)`` when given, [(1-based
    line, name, shown text)]), reading no value in a code fence or inline code."""
    lines, found, fence = text.splitlines(keepends=True), [], None
    for i, line in enumerate(lines):
        m = FENCE.match(line)
        if m and (fence is None or line.strip().startswith(fence)):
            fence = m[1] if fence is None else None
        elif fence is None and "<!--" in line:
            parts = CODE.split(line)
            for j in range(0, len(parts), 2):
                found += [(i + 1, v[2], v[3]) for v in VALUE.finditer(parts[j])]
                parts[j] = VALUE.sub(lambda v: v[1] + make(v[2]) + v[4], parts[j]) if make else parts[j]
            lines[i] = "".join(parts)
    return "".join(lines), found

def _sweep(root: Path, write: bool) -> list[str]:
    out, made = [], {}
    for name, (sources, _) in TABLES.items():
        path, new = root / TABLES_DIR / f"{name}.md", render(name, root)
        old = path.read_text("utf-8") if path.exists() else None
        if old != new:
            out.append(f"{TABLES_DIR}/{name}.md: {'stale' if old else 'missing'} ({', '.join(sources)})")
            if write:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(new, "utf-8")
    for page in pages(root):
        text = page.read_text("utf-8")
        new, found = values_of(text, lambda n: made.setdefault(n, render_value(n, root)))
        out += [f"{page.relative_to(root).as_posix()}:{line}: value {name} is {shown!r}, the files "
                f"give {made[name]!r}" for line, name, shown in found if shown != made[name]]
        if write and new != text:
            page.write_text(new, "utf-8")
    return out

def check(root=".") -> list[str]:
    """One message per table file or value that differs from what its files give."""
    return _sweep(Path(root), write=False)

def write(root=".") -> list[str]:
    """Rewrite every stale table file and value; one message each."""
    return _sweep(Path(root), write=True)

def kept(root: Path, rel: str, index: int = 0) -> str:
    """The ``index``-th Markdown table of a kept file that the script of the result wrote."""
    tables = re.findall(r"(?m)^(?:\|.*\|[ \t]*(?:\n|$))+", (root / rel).read_text("utf-8"))
    return tables[index] if len(tables) > index else ""

def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python tools/docs_tables.py")
    act = ap.add_mutually_exclusive_group(required=True)
    act.add_argument("--check", action="store_true", help="exit 1 if anything is stale")
    act.add_argument("--write", action="store_true", help="rewrite what is stale")
    act.add_argument("--list", action="store_true", help="every table and value, with its files")
    act.add_argument("--show", metavar="NAME", help="print one table or value")
    ap.add_argument("--root", default=".", help="the repository root (default: .)")
    a = ap.parse_args(argv)
    try:
        if a.list:
            for kind, reg in (("table", TABLES), ("value", VALUES)):
                print(*(f"{kind} {n}: {', '.join(s)}" for n, (s, _) in reg.items()), sep="\n")
            return 0
        if a.show:
            print((render_value if a.show in VALUES else render)(a.show, a.root).rstrip())
            return 0
        messages = write(a.root) if a.write else check(a.root)
    except (KeyError, ValueError, FileNotFoundError) as e:
        print(f"docs_tables: {e.args[0] if e.args else e}", file=sys.stderr)
        return 2
    for m in messages:
        print(m)
    return 1 if a.check and messages else 0

# --------------------------------------------------------------------------- formats

def sig(x, n: int = 3) -> str:
    """``x`` to ``n`` significant digits, thousands separated, minus as −; None/NaN as –."""
    if x is None or isinstance(x, bool) or not math.isfinite(float(x)):
        return MISSING
    if float(x) == 0:
        return "0"
    d = n - 1 - math.floor(math.log10(abs(float(x))))
    if round(x, d) != 0 and math.floor(math.log10(abs(round(x, d)))) != n - 1 - d:
        d -= 1  # 9.996 → 10.0
    return f"{round(float(x), d):,.{max(d, 0)}f}".replace("-", "−")

def fixed(x, digits: int = 2) -> str:
    """``x`` with ``digits`` decimals, minus as −; None/NaN as –."""
    ok = x is not None and math.isfinite(float(x))
    return f"{float(x):,.{digits}f}".replace("-", "−") if ok else MISSING

def span(values, fmt=sig) -> str:
    """``lo–hi`` as ``fmt`` writes the ends; one value when they are equal."""
    vals = [float(v) for v in values]
    if not vals:
        raise ValueError("a range over no values")
    lo, hi = fmt(min(vals)), fmt(max(vals))
    return lo if lo == hi else f"{lo}–{hi}"

def minus(text) -> str:
    """A cell a report formatted, with its minus signs as −."""
    return re.sub(r"(?<![\w])-(?=\d)", "−", str(text))

def ci(r, key: str = "auroc", digits: int = 2) -> str:
    """``value [low, high]`` of ``key`` (or ``key_auroc``), with (``key_``)``ci_low``/``ci_high``."""
    lo, hi = (f"{key}_ci_low", f"{key}_ci_high") if f"{key}_ci_low" in r else ("ci_low", "ci_high")
    v = r[f"{key}_auroc"] if f"{key}_auroc" in r else r[key]
    return minus(f"{fixed(v, digits)} [{fixed(r[lo], digits)}, {fixed(r[hi], digits)}]")

def pct(x) -> str:
    return f"{sig(100 * x, 2)}%"

def cell(v) -> str:  # a float to 3 significant digits, a string as the report wrote it
    return sig(v) if isinstance(v, float) else MISSING if v is None else minus(v)

def grid(columns, rows) -> str:
    columns = list(columns)
    return "\n".join([f"| {' | '.join(columns)} |", "|" + "---|" * len(columns),
                      *(f"| {' | '.join(map(str, r))} |" for r in rows)])

def columns(rows, spec: dict) -> str:
    """A table of ``rows``: header → a row's key (shown by ``cell``) or a function of the row."""
    return grid(spec, [[f(r) if callable(f) else cell(r.get(f)) for f in spec.values()]
                       for r in rows])

def load(root: Path, rel: str):
    if not (root / rel).is_file():
        raise FileNotFoundError(f"{rel}: a kept file the docs read is missing")
    return json.loads((root / rel).read_text("utf-8"))

def section(root: Path, rel: str, sid: str) -> dict:
    return next(s["tables"] for s in load(root, rel)["sections"] if s["id"] == sid)

def by(rows, *keys) -> dict:
    return {tuple(r[k] for k in keys): r for r in rows}

SHORT = {"smollm2": "SmolLM2", "gemma3-270m": "Gemma", "qwen2.5-coder-0.5b": "Qwen",
         "qwen2.5-coder-1.5b": "Qwen 1.5B"}
DATASETS = {"triviaqa": "TriviaQA", "truthfulqa": "TruthfulQA"}

def setting(model: str, dataset: str) -> str:
    return f"{SHORT.get(model, model)} × {DATASETS.get(dataset, dataset)}"


# =========================================================================== speed and memory
B = "benchmarks/results/"
SEQ, PAPER, SERVE = B + "score_sequences.json", B + "paper_sizes_cuda_bf16.json", B + "serve_load.json"

@table("score_sequences", SEQ)
def _score_sequences(root):
    d = load(root, SEQ)
    s = by(d["rows"], "batch", "method")
    return grid(["batch", "forward only", "floor", "fwd + full bwd", "loop (paper)", "ghost (isouq)",
                 "loop / ghost", "ghost / floor (rounds)"], [
        [q["batch"], *(f"{sig(s[(q['batch'], m)]['seconds_per_answer'])} s" for m in (
            "forward", "floor", "full_backward", "loop", "ghost")), f"{sig(q['loop/ghost'])}×",
         f"{sig(q['ghost/floor'])} ({q['ghost/floor by round']})"] for q in d["ratios"]])

@table("blocks_cost", B + "blocks.json")
def _blocks_cost(root):
    def ratio(t):
        return lambda r: f"{fixed(r[t])} [{fixed(r[t + '_min'])}–{fixed(r[t + '_max'])}]"
    return columns(load(root, B + "blocks.json")["rows"], {
        "batch": "batch", "rounds": "rounds", "summed s/answer": "ghost_s_per_answer",
        "blocks / summed [rounds]": ratio("blocks_over_ghost"),
        "hidden / summed": ratio("hidden_over_ghost"), "both / summed": ratio(
            "blocks_hidden_over_ghost"), "summed path's own spread": lambda r: pct(r["ghost_spread"])})

for _name, _rel in (("long_prompts", B + "long_prompts.md"), ("peer_opacus", B + "peer_opacus_b16_t128.md"),
                    ("calibrate_walks", "results/calibrate_check/walks.md")):
    table(_name, _rel)(lambda root, rel=_rel: kept(root, rel, 0))

def _verdict(root: Path, rel: str) -> str:  # a kept verdict as isouq report shows it
    from isouq.study.report.polygraph import verdict_table
    rows = verdict_table(load(root, rel))
    return grid(rows[0], [r.values() for r in rows]) if rows else ""

for _name, _rel in (("design_verdict", "results/polygraph/verdict/verdict.json"),
                    ("prereg_verdict", "results/polygraph_prereg_v4/verdict/verdict.json"),
                    ("prereg_tasks_verdict", "results/polygraph_tasks_prereg_v3/verdict/verdict.json")):
    table(_name, _rel)(lambda root, rel=_rel: _verdict(root, rel))

@table("classifiers_cpu", B + "classifiers_cpu_quiet.json")
def _classifiers_cpu(root):
    return columns(load(root, B + "classifiers_cpu_quiet.json")["rows"], {
        "input, batch, classes": lambda r: f"{r['input']}, N={r['batch']}, C={r['classes']}",
        "floor s": "floor_s", "training step / floor": "train_step_over_floor",
        "isouq / floor": "isouq_over_floor", "isouq / training step": "isouq_over_train_step",
        "Opacus / isouq (GroupNorm twin)": "opacus_gn_over_isouq_gn",
        "peak MiB floor / isouq / Opacus": lambda r: " / ".join(f"{r[k]:.0f}" for k in (
            "floor_peak_mib", "isouq_peak_mib", "opacus_gn_peak_mib"))})

@table("paper_sizes", PAPER)
def _paper_sizes(root):
    keys = ("model", "params_B", "batch", "floor s/answer", "full_backward s/answer",
            "ghost s/answer", "ghost/floor", "ghost/(fwd+full bwd)", "ghost peak GiB",
            "paper s/answer")
    return columns(load(root, PAPER)["table"], {k: k for k in keys})

@table("memory_plan", B + "memory_plan.json")
def _memory_plan(root):
    groups: dict = {}
    for r in load(root, B + "memory_plan.json")["rows"]:
        groups.setdefault((r["role"], r["model"], r["method"], r["dtype"]), []).append(r["ratio"])
    return grid(["rows", "model", "method", "dtype", "configurations", "predicted / measured"],
                [[*k, len(v), span(v, fixed)] for k, v in sorted(
                    groups.items(), key=lambda kv: (kv[0][0] != "calibrate", kv[0]))])

@table("serve_load", SERVE)
def _serve_load(root):
    d = load(root, SERVE)
    big = str(d["meta"]["max_batch"])
    return columns(d["results"], {
        "endpoint": lambda r: f"`{r['endpoint']}`", "clients": "clients",
        "answers/s": "answers_per_s", f"ceiling at batch 1 / {big} / {big} by length": lambda r:
        " / ".join(cell(r["ceiling"].get(k, {}).get("answers_per_s")) for k in
                   ("1", big, big + "_by_length")),
        "p50 / p95 s": lambda r: f"{sig(r['p50_s'])} / {sig(r['p95_s'])}",
        "429s": "refused_429", "answers per batch": "answers_per_batch"})

@table("serve_split", SERVE, B + "serve_load_one_pass.json")
def _serve_split(root):
    one = by(load(root, B + "serve_load_one_pass.json")["results"], "endpoint", "clients")
    return columns(load(root, SERVE)["results"], {
        "endpoint": lambda r: f"`{r['endpoint']}`", "clients": "clients",
        "one pass per batch: answers/s": lambda r: sig(one[(r["endpoint"], r["clients"])][
            "answers_per_s"]), "passes by length: answers/s": "answers_per_s"})


# =========================================================================== LM-Polygraph, trust
PG = "results/polygraph"
PG_REPORT = PG + "/report/report.json"
#: the cost table's columns: header → the column of the report's cost table
COST = {"greedy generation (shared)": "greedy generation (shared)", "isouq (four scores, one "
        "backward)": "IsouqEpistemic", "MSP": "MaximumSequenceProbability", "mean token entropy":
        "MeanTokenEntropy", "PMI": "MeanPointwiseMutualInformation", "PTrue": "PTrue", "CSL": "CSL"}

def _pg(root: Path) -> dict:
    return section(root, PG_REPORT, "lm-polygraph-benchmark")

def _rankable(r) -> bool:
    return not str(r.get("verdict", "")).startswith("not rankable")

@table("polygraph_ranks", PG_REPORT)
def _polygraph_ranks(root):
    rows = []
    for r in _pg(root)["ranks"]:
        rows.append([setting(r["model"], r["dataset"]), r["quality"], f"{r['n']} ({r['answers']})",
                     *([r["isouq best"], minus(r["its PRR [95% CI]"]),
                        f"{r['rank (of estimators)']} [{r['rank 95% CI']}]", r["best LM-Polygraph"],
                        minus(r["its PRR"]), minus(r["difference [95% CI]"])] if _rankable(r)
                       else [MISSING, "not rankable", *[MISSING] * 4])])
    return grid(["model × dataset", "quality", "n", "isouq's best", "its PRR [95% CI]",
                 "rank [95% CI]", "best LM-Polygraph", "its PRR", "difference [95% CI]"], rows)

@table("polygraph_cost", PG_REPORT)
def _polygraph_cost(root):
    return columns(_pg(root)["cost"], {"model × dataset": lambda r: setting(r["model"], r[
        "dataset"]), **COST})

def _point(text) -> float:
    return float(re.split(r"[\[(]", str(text))[0].replace("−", "-"))

def _heads() -> dict:
    from isouq.study.analysis.learned_heads import PROBE, STACKED
    from isouq.study.report.polygraph import REFERENCE_HEAD
    return {REFERENCE_HEAD: "block head", PROBE: "hidden-state probe", STACKED.name: "stacked head"}

def _vs_msp(h) -> str:  # a head against MSP's map: Δ PRR [95% CI] (one fold seed: no verdict)
    why = h.get("note") or ("not counted" if not h["counted"] else None if h["rankable"] else "< 30")
    return (minus(f"{fixed(h['delta'], 3)} [{fixed(h['ci_low'], 3)}, {fixed(h['ci_high'], 3)}]")
            + (f" ({why})" if why else "")) if "delta" in h else why

@table("trust_answers", PG_REPORT)
def _trust_answers(root):
    from isouq.study.analysis.learned_heads import CONTROL
    pg, rows, est = _pg(root), [], {}
    heads = by([h for h in pg["heads"] if h["against"] == CONTROL.name], "model", "dataset",
               "quality", "head")
    for r in pg["estimators"]:
        est.setdefault((r["model"], r["dataset"], r["quality"]), {})[r["estimator"]] = r
    for key in (k for k in by(pg["ranks"], "model", "dataset", "quality").items() if _rankable(k[1])):
        named = est[key[0]]
        one = max((v for e, v in named.items() if e.startswith("★ Isouq")),
                  key=lambda v: _point(v["PRR [95% CI]"]))
        rows.append([setting(*key[0][:2]), key[0][2], minus(named["MaximumSequenceProbability"][
            "PRR [95% CI]"]), f"{one['estimator'][2:]}: {minus(one['PRR [95% CI]'])}", *(
            _vs_msp(h) if h else MISSING for h in (heads.get((*key[0], n)) for n in _heads())),
            sig(one.get("s / answer"))])
    return grid(["model × dataset", "quality", "MSP", "isouq's best single score", *(
        f"{n}: Δ PRR vs MSP's map" for n in _heads().values()), "isouq s / answer"], rows)

QA_LONG, SPAN_HEAD = "results/qa_long/results.json", "results/qa_long/span_head.json"
SPAN_SCORES = {"span aleatoric": "aleatoric", "span epistemic": "epistemic",
               "span epistemic_log": "epistemic_log", "span 1 − p̄": "1 − p̄",
               "span 1 − min p": "1 − min p"}

def _cells(rows) -> list[tuple[str, str]]:
    """(setting, model) of ``rows``: composed before generated, models in SHORT's order."""
    return sorted({(r["setting"], r["model"]) for r in rows}, key=lambda k: (
        k[0] != "composed", list(SHORT).index(k[1]) if k[1] in SHORT else 9, k[1]))

@table("trust_sentences", QA_LONG)
def _trust_sentences(root):
    from isouq.defaults import SPAN_SCORE
    auroc, rows = load(root, QA_LONG)["tables"]["auroc"], []
    for st, m in _cells(auroc):
        mine = {r["score"]: r for r in auroc if (r["setting"], r["model"]) == (st, m)}
        spans = {SPAN_SCORES[k]: r for k, r in mine.items() if k in SPAN_SCORES}
        best = max(spans, key=lambda k: spans[k]["auroc"])
        rows.append([f"{SHORT[m]} {st}", spans[SPAN_SCORE]["n"], ci(spans[SPAN_SCORE]),
                     f"{best}: {ci(spans[best])}", ci(spans["1 − p̄"]), ci(mine["whole 1 − p̄"])])
    return grid(["model, setting", "sentences", f"default: span {SPAN_SCORE}", "best span score",
                 "span 1 − p̄", "whole answer 1 − p̄"], rows)

@table("trust_span_head", SPAN_HEAD)
def _trust_span_head(root):
    doc = load(root, SPAN_HEAD)
    return columns(sorted(doc["rows"], key=lambda r: (r["setting"], r["model"])), {
        "model, setting": lambda r: f"{SHORT[r['model']]} {r['setting']}",
        "sentences": "sentences", "span head": lambda r: minus(ci(r, "head")),
        f"span {doc['default']}": lambda r: minus(ci(r, "default")),
        "Δ (head − default)": lambda r: minus(ci(r, "delta")), "verdict": "verdict"})


# =========================================================================== the study's evidence
R = "results/"
QA_REPORT, EVIDENCE, CAL = R + "report/report.json", R + "report_evidence/report.json", \
    R + "calibration/summary/results.json"
VI = R + "scaling_vi_fan_in/results.json"

@table("validation", R + "validation/results.json")
def _validation(root):
    d = load(root, R + "validation/results.json")
    paper = by(d["paper"]["epistemic"], "problem")
    return columns([r for r in d["tables"]["epistemic"] if r["class"] in ("all", "overall")], {
        "problem": "problem", "GN vs HMC Spearman ρ (mean ± std over seeds)": lambda r:
        f"{fixed(r['gn_rho'], 3)} ± {fixed(r['gn_rho_std'], 3)}", "seeds": "n_seeds",
        "paper": lambda r: cell(paper[(r["problem"],)]["gn_rho"])})

@table("scaling_ladder", R + "scaling/results.json", VI)
def _scaling_ladder(root):
    d = load(root, R + "scaling/results.json")
    t = [by(x, "n_params") for x in (d["tables"]["hmc"], d["paper"]["hmc"], load(root, VI)["tables"]["vi"])]
    return grid(["parameters", "GN vs HMC ρ", "paper", "GN vs VI ρ (fan-in prior)"], [
        [f"{k[0]:,}", *(fixed(x.get(k, {}).get("gn_rho")) for x in t)] for k in sorted({*t[0], *t[2]})])

@table("qa_study_raw_auroc", QA_REPORT)
def _qa_study_raw_auroc(root):
    """Raw AUROC [95% interval] of each score for correctness, oriented as a confidence; the arrow
    is the raw score's direction: ↑ higher with correct answers, ↓ with wrong ones, – neither."""
    raw = by(section(root, QA_REPORT, "qa-study")["raw_auroc"], "dataset", "model", "score")
    arrow = {"higher = correct": "↑", "higher = wrong": "↓", "none": "–"}
    scores = ("mean_prob", "epistemic", "epistemic_log", "aleatoric")
    return grid(["dataset", "model", "answers", "p̄", *scores[1:]], [
        [DATASETS[k[0]], SHORT[k[1]], raw[(*k, "mean_prob")]["n"], *(
            f"{ci(raw[(*k, sc)])} {arrow[raw[(*k, sc)]['score_direction']]}" for sc in scores)]
        for k in sorted({k[:2] for k in raw}, reverse=True)])

@table("qa_evidence", EVIDENCE)
def _qa_evidence(root):
    rows = [r for sid in ("qa-evidence-mc", "qa-evidence-short") for r in section(
        root, EVIDENCE, sid)["raw_pooled"] if r["score"] in ("epistemic", "epistemic_log",
                                                             "mean_prob", "p_true")]
    return columns(rows, {"setting": lambda r: {"truthfulqa_mc1": "TruthfulQA MC1"}.get(
        r["dataset"], "TriviaQA short"), "score (as a confidence)": lambda r: r["score"] if r[
            "oriented"] == "as is" else f"−{r['score']}", "raw AUROC, pooled over models": ci})

@table("calibration_crossfit", CAL)
def _calibration_crossfit(root):
    return columns(load(root, CAL)["tables"]["calibrations"], {k: k for k in (
        "model", "dataset", "labels", "n", "correct", "saved", "isouq head vs reference", "ECE",
        "log-loss", "base log-loss", "AUROC", "threshold (α=0.7)", "coverage")})

@table("hmc_cost", R + "scaling/cost.json")
def _hmc_cost(root):
    return columns(load(root, R + "scaling/cost.json")["projection"], {
        "size": lambda r: f"MLP({r['width']},{r['width']})", "parameters": lambda r:
        f"{r['n_params']:,}", "ms / leapfrog step": "ms_per_step", "steps / iteration":
        "steps_per_iteration", "wall hours, 2 cores": "wall_hours_2_cores", "CPU-hours": "cpu_hours"})


# =========================================================================== values (numbers only)
_seq = lambda root: load(root, SEQ)["ratios"]  # noqa: E731
_LONG = tuple(B + f"score_sequences_t{t}.json" for t in (256, 1024, 2048))
value("cpu_ghost_over_floor", SEQ)(lambda root: span((q["ghost/floor"] for q in _seq(root)), fixed))
value("cpu_loop_over_ghost", SEQ)(lambda root: span((q["loop/ghost"] for q in _seq(root)),
                                                    lambda x: sig(x, 2)) + "×")
value("long_loop_over_ghost", *_LONG)(lambda root: span((load(root, rel)["ratios"][0]["loop/ghost"]
                                                          for rel in _LONG), lambda x: sig(x, 2)) + "×")
value("paper_full_b64", PAPER)(lambda root: ", ".join(
    f"{r['ghost/(fwd+full bwd)']:.3g} ({r['model']})" for r in load(root, PAPER)["table"]
    if r["batch"] == 64))
value("gpu_tests_passed", B + "gpu_check_tests_h200.log")(lambda root: re.search(
    r"(\d+) passed", (root / B / "gpu_check_tests_h200.log").read_text("utf-8"))[1])
HP, SP = B + "half_precision.json", B + "spans_cpu.json"
value("half_bf16_error", HP)(lambda root: pct(load(root, HP)["dtypes"]["bfloat16"]["ghost_vs_f32_median"]))
value("half_fp16_error", HP)(lambda root: pct(load(root, HP)["dtypes"]["float16"]["ghost_vs_f32_median"]))
value("models_ghost_over_floor", *(B + f"score_sequences_{t}.json" for t in ("fp32", "4bit", "lora8")))(
    lambda root: span((q["ghost/floor"] for t in ("fp32", "4bit", "lora8") for q in load(
        root, B + f"score_sequences_{t}.json")["ratios"] if q["batch"] == 16), fixed))
value("serve_ceiling_spread", SERVE)(lambda root: "±" + pct(max(
    (max(v) - min(v)) / (max(v) + min(v)) for v in ([r["1"]["answers_per_s"] for r in load(
        root, SERVE)["ceiling"]["/v1/score"]["runs"]],))))
value("serve_loadavg", SERVE, B + "serve_load_one_pass.json")(lambda root: " and ".join(
    fixed(load(root, rel)["meta"]["loadavg_start"][0]) for rel in (B + "serve_load_one_pass.json",
                                                                   SERVE)))
value("serve_score_rate", SERVE)(lambda root: span(r["answers_per_s"] for r in load(root, SERVE)[
    "results"] if r["endpoint"] == "/v1/score"))
value("classifiers_over_train", B + "classifiers_cpu_quiet.json")(lambda root: span(
    (r["isouq_over_train_step"] for r in load(root, B + "classifiers_cpu_quiet.json")["rows"]), fixed))
value("spans_over_whole", SP)(lambda root: sig(load(root, SP)["retain_over_whole"], 2) + "×")
value("spans_loop_over", SP)(lambda root: sig(load(root, SP)["loop_over_retain"], 2) + "×")
value("polygraph_isouq_cost", PG_REPORT)(lambda root: span(
    _point(r["IsouqEpistemic"]) for r in _pg(root)["cost"]) + " s")
value("polygraph_1p5b_correct", PG_REPORT)(lambda root: ", ".join(
    f"{r['answers'].split()[0]} of {r['n']} ({DATASETS[r['dataset']]})" for r in _pg(root)["ranks"]
    if r["model"] == "qwen2.5-coder-1.5b" and r["quality"] == "accuracy"))
for _name, _rel in (("prereg_judged", "results/polygraph_prereg_v4/verdict/verdict.json"),
                    ("prereg_tasks_judged", "results/polygraph_tasks_prereg_v3/verdict/verdict.json")):
    value(_name, _rel)(lambda root, rel=_rel: "{answer_sets_judged} of {answer_sets_expected}".format(
        **load(root, rel)))
value("qa_pbar_raw_auroc", QA_REPORT)(lambda root: span((r["auroc"] for r in section(
    root, QA_REPORT, "qa-study")["raw_auroc"] if r["score"] == "mean_prob"), fixed))
value("qa_judge_kappa", QA_REPORT)(lambda root: span((r["kappa"] for r in section(
    root, QA_REPORT, "qa-study")["label_agreement"] if r["labels"] == "judge"), fixed))
value("qa_judge_correct", QA_REPORT)(lambda root: span((r["positive"] / r["n"] for r in section(
    root, QA_REPORT, "qa-study")["label_agreement"] if r["labels"] == "judge"),
    lambda x: f"{100 * x:.0f}") + "%")
value("mc1_gradient_raw_auroc", EVIDENCE)(lambda root: span((r["auroc"] for r in section(
    root, EVIDENCE, "qa-evidence-mc")["raw_auroc"] if r["score"] in ("epistemic", "epistemic_log")),
    fixed))
value("short_epistemic_raw_auroc", EVIDENCE)(lambda root: span((r["auroc"] for r in section(
    root, EVIDENCE, "qa-evidence-short")["raw_auroc"] if r["score"] == "epistemic"), fixed))
value("calibration_rows", CAL)(lambda root: span((r["n"] for r in load(root, CAL)["tables"][
    "calibrations"]), lambda x: f"{x:,.0f}"))


if __name__ == "__main__":
    sys.exit(main())
