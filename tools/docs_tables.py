"""The measured tables and numbers of the user docs, generated from the kept result files.

Repository tooling, not part of the installed package: run it from the repository root as

    python tools/docs_tables.py --check   # exit 1, naming each stale table or value
    python tools/docs_tables.py --write   # regenerate every marked table and value
    python tools/docs_tables.py --list    # the registered tables and values, with their files
    python tools/docs_tables.py --show NAME

A page of ``docs/`` (or ``README.md``) marks what is generated with HTML comments, which the
site and GitHub do not show.

A **table** is a block of lines::

    <!-- table: NAME -->
    | generated | table |
    |---|---|
    <!-- /table -->

A **value** is a fragment of prose on one line::

    ghost costs <!-- value: cpu_short_ghost_over_floor -->1.03–1.20<!-- /value -->× the floor

Everything between the markers belongs to the generator: ``NAME`` is a key of :data:`TABLES`
(a function that reads kept JSON or text files, its ``sources`` relative to the repository
root, and returns a Markdown table) or of :data:`VALUES` (the same, returning a short string:
a number, a range, a count). So a number so marked is its file's number, and it cannot drift
from its file unnoticed: ``tests/report/test_docs_tables.py`` runs the check on the real docs.

To add one: a function ``def _name(root: Path) -> str`` under ``@register("name", "kept/file",
...)`` (a table) or ``@value("name", "kept/file", ...)`` (a value), in the section of the page
that shows it, then the markers where the page shows it.

This module reads result files only; it never runs a model or an experiment.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import statistics
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from isouq.runio import latest_by_key, markdown_grid, read_jsonl
from isouq.study.report.polygraph import REFERENCE_HEAD

OPEN = re.compile(r"^\s*<!--\s*table:\s*(?P<name>[A-Za-z0-9_.-]+)\s*-->\s*$")
CLOSE = re.compile(r"^\s*<!--\s*/table\s*-->\s*$")
VALUE_OPEN = re.compile(r"<!--\s*value:\s*(?P<name>[A-Za-z0-9_.-]+)\s*-->")
VALUE_CLOSE = re.compile(r"<!--\s*/value\s*-->")
FENCE = re.compile(r"^ {0,3}(?P<ticks>`{3,}|~{3,})")
#: what may come before a value marker that Markdown would still read as an HTML block start
LINE_START = re.compile(r"\s*(?:(?:[>*+-]|\d+[.)])\s+)*")
MISSING = "–"
COMMAND = "python tools/docs_tables.py"


@dataclass(frozen=True)
class DocTable:
    """One generated table or value: its name, the kept files it reads, and the function that
    renders it (repository root → Markdown table, or → one line of text for a value)."""

    name: str
    sources: tuple[str, ...]
    render: Callable[[Path], str]
    doc: str = ""


#: the generated tables, by name
TABLES: dict[str, DocTable] = {}
#: the generated values (fragments of prose), by name
VALUES: dict[str, DocTable] = {}


def _registrar(registry: dict[str, DocTable], kind: str):
    def decorator(name: str, *sources: str):
        def add(fn: Callable[[Path], str]) -> Callable[[Path], str]:
            if name in TABLES or name in VALUES:
                raise ValueError(f"{kind} {name!r}: the name is registered twice")
            registry[name] = DocTable(name, tuple(sources), fn, (fn.__doc__ or "").strip())
            return fn
        return add
    return decorator


#: Decorator: add ``fn(root) -> markdown table`` to :data:`TABLES` under ``name``.
register = _registrar(TABLES, "table")
#: Decorator: add ``fn(root) -> str`` (one line, no HTML comment) to :data:`VALUES` under ``name``.
value = _registrar(VALUES, "value")


def render(name: str, root: str | Path = ".") -> str:
    """The Markdown of table ``name`` from the files under ``root`` (ends with one newline)."""
    if name not in TABLES:
        raise KeyError(f"no generated table named {name!r} ({COMMAND} --list shows them)")
    return TABLES[name].render(Path(root)).rstrip("\n") + "\n"


def render_value(name: str, root: str | Path = ".") -> str:
    """The text of value ``name`` from the files under ``root``: one line, no markers."""
    if name not in VALUES:
        raise KeyError(f"no generated value named {name!r} ({COMMAND} --list shows them)")
    text = str(VALUES[name].render(Path(root)))
    if "\n" in text or "<!--" in text or "-->" in text or not text.strip():
        raise ValueError(f"value {name!r} rendered {text!r}: a value is one non-empty line "
                         "without HTML comments")
    return text


# --------------------------------------------------------------------------- number formats


def sig(x, n: int = 3) -> str:
    """``x`` to ``n`` significant digits, fixed-point, thousands separated (1,260; 0.0869;
    200); None or NaN as ``–``."""
    if x is None or isinstance(x, bool):
        return MISSING
    x = float(x)
    if not math.isfinite(x):
        return MISSING
    if x == 0:
        return "0"
    e = math.floor(math.log10(abs(x)))
    d = n - 1 - e
    r = round(x, d)
    if r != 0 and math.floor(math.log10(abs(r))) != e:  # 9.996 → 10.0: one digit fewer
        d -= 1
        r = round(x, d)
    return f"{r:,.{max(d, 0)}f}".replace("-", "−")


def fixed(x, digits: int) -> str:
    """``x`` with ``digits`` decimals (a minus sign as −); None or NaN as ``–``."""
    if x is None or not math.isfinite(float(x)):
        return MISSING
    return f"{float(x):,.{digits}f}".replace("-", "−")


def span(values: Iterable[float], fmt: Callable[[float], str]) -> str:
    """``lo–hi`` of ``values`` as ``fmt`` writes each end; one value (or equal ends) alone."""
    vals = [float(v) for v in values]
    if not vals:
        raise ValueError("a range over no values")
    lo, hi = fmt(min(vals)), fmt(max(vals))
    return lo if lo == hi else f"{lo}–{hi}"


def count(n: int) -> str:
    """An integer with thousands separated (1,000)."""
    return f"{int(n):,}"


def interval(r: Mapping, digits: int = 3) -> str:
    """``auroc [ci_low, ci_high]`` of a row."""
    return (f"{fixed(r['auroc'], digits)} [{fixed(r['ci_low'], digits)}, "
            f"{fixed(r['ci_high'], digits)}]")


def _json(root: Path, rel: str):
    path = root / rel
    try:
        return json.loads(path.read_text("utf-8"))
    except FileNotFoundError:
        raise FileNotFoundError(f"{rel}: the kept file a generated table reads is missing") from None


def _text(root: Path, rel: str) -> str:
    try:
        return (root / rel).read_text("utf-8")
    except FileNotFoundError:
        raise FileNotFoundError(f"{rel}: the kept file a generated value reads is missing") from None


def _grid(columns: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    return markdown_grid(list(columns), [list(r) for r in rows])


# --------------------------------------------------------------------------- block markers


@dataclass(frozen=True)
class Block:
    """A marked block of a page: the table's name, the 0-based line of its opening marker and
    of its closing marker."""

    name: str
    open_line: int
    close_line: int


def find_blocks(text: str, where: str = "<text>") -> list[Block]:
    """The marked blocks of a page, in order; a marker without its partner, or a block inside a
    block, is a ``ValueError`` naming the line."""
    blocks, start = [], None
    for i, line in enumerate(text.splitlines()):
        m = OPEN.match(line)
        if m:
            if start is not None:
                raise ValueError(f"{where}:{i + 1}: table block opened inside the block of "
                                 f"line {start[1] + 1}; close that one first (<!-- /table -->)")
            start = (m["name"], i)
        elif CLOSE.match(line):
            if start is None:
                raise ValueError(f"{where}:{i + 1}: <!-- /table --> with no <!-- table: NAME --> "
                                 "before it")
            blocks.append(Block(start[0], start[1], i))
            start = None
    if start is not None:
        raise ValueError(f"{where}:{start[1] + 1}: <!-- table: {start[0]} --> is never closed "
                         "(add <!-- /table --> after the table)")
    return blocks


def block_body(markdown: str) -> list[str]:
    """The lines a block holds between its markers: the table's lines (an HTML comment line
    next to a table is read apart from it, on the site and on GitHub)."""
    return markdown.strip("\n").splitlines()


def _trimmed(lines: list[str]) -> list[str]:
    """``lines`` without blank lines at either end (a block may keep a blank line around its
    table: the content is what counts)."""
    lo, hi = 0, len(lines)
    while lo < hi and not lines[lo].strip():
        lo += 1
    while hi > lo and not lines[hi - 1].strip():
        hi -= 1
    return lines[lo:hi]


def replace_blocks(text: str, make: Callable[[str], str],
                   where: str = "<text>") -> tuple[str, list[Block]]:
    """``text`` with every marked block's content replaced by ``make(name)``, and the blocks
    whose content changed (stale ones). Lines outside the blocks are kept byte for byte."""
    lines = text.splitlines(keepends=True)
    newline = "\r\n" if lines and lines[0].endswith("\r\n") else "\n"
    out: list[str] = []
    stale: list[Block] = []
    at = 0
    for b in find_blocks(text, where):
        out += lines[at:b.open_line + 1]
        body = lines[b.open_line + 1:b.close_line]
        new = block_body(make(b.name))
        if _trimmed([ln.rstrip("\r\n") for ln in body]) != new:
            stale.append(b)
            out += [ln + newline for ln in new]
        else:
            out += body
        at = b.close_line
    out += lines[at:]
    return "".join(out), stale


# --------------------------------------------------------------------------- value markers


@dataclass(frozen=True)
class Fragment:
    """A marked value of a page: its name, the 0-based line, and the character range of its
    content within that line (between the end of ``<!-- value: NAME -->`` and the start of
    ``<!-- /value -->``)."""

    name: str
    line: int
    start: int
    end: int


def find_values(text: str, where: str = "<text>") -> list[Fragment]:
    """The marked values of a page, in order. Each opens and closes on one line; an opening
    marker without its closing one on that line, a closing marker with none before it, or a
    value inside a value is a ``ValueError`` naming the line."""
    out, fence = [], None
    for i, line in enumerate(text.splitlines()):
        m = FENCE.match(line)
        if m and (fence is None or m["ticks"][0] == fence[0] and len(m["ticks"]) >= len(fence)):
            fence = m["ticks"] if fence is None else None  # a code fence opens or closes
            continue
        if fence is not None:
            continue
        line = _without_code(line)
        at = 0
        while True:
            o, c = VALUE_OPEN.search(line, at), VALUE_CLOSE.search(line, at)
            if o is None and c is None:
                break
            if o is None or (c is not None and c.start() < o.start()):
                raise ValueError(f"{where}:{i + 1}: <!-- /value --> with no <!-- value: NAME --> "
                                 "before it on the line")
            if c is None:
                raise ValueError(f"{where}:{i + 1}: <!-- value: {o['name']} --> is not closed on "
                                 "its line (a value is one line: add <!-- /value --> after it)")
            inner = VALUE_OPEN.search(line, o.end(), c.start())
            if inner is not None:
                raise ValueError(f"{where}:{i + 1}: value {inner['name']!r} opened inside value "
                                 f"{o['name']!r}; close that one first (<!-- /value -->)")
            if LINE_START.fullmatch(line[:o.start()]):
                raise ValueError(f"{where}:{i + 1}: a line (or list item) begins with "
                                 f"<!-- value: {o['name']} -->: Markdown reads a line that begins "
                                 "with <!-- as an HTML block; put a word before it")
            out.append(Fragment(o["name"], i, o.end(), c.start()))
            at = c.end()
    return out


def _without_code(line: str) -> str:
    """``line`` with its inline code spans (`` `…` ``) blanked out, same length: a marker shown
    as code is not a marker."""
    return re.sub(r"(`+)(.+?)\1", lambda m: " " * len(m[0]), line)


def replace_values(text: str, make: Callable[[str], str],
                   where: str = "<text>") -> tuple[str, list[Fragment]]:
    """``text`` with every marked value's content replaced by ``make(name)``, and the values
    whose content changed (stale ones). Everything outside the values is kept byte for byte."""
    lines = text.splitlines(keepends=True)
    stale: list[Fragment] = []
    by_line: dict[int, list[Fragment]] = {}
    for f in find_values(text, where):
        by_line.setdefault(f.line, []).append(f)
    for i, frags in by_line.items():
        line = lines[i]
        for f in reversed(frags):  # right to left: earlier offsets stay valid
            new = make(f.name)
            if line[f.start:f.end] != new:
                stale.append(f)
                line = line[:f.start] + new + line[f.end:]
        lines[i] = line
    stale.sort(key=lambda f: (f.line, f.start))
    return "".join(lines), stale


# --------------------------------------------------------------------------- pages


def pages(root: str | Path = ".") -> list[Path]:
    """The pages that may hold generated tables and values: README.md, CHANGELOG.md and
    docs/*.md."""
    root = Path(root)
    return [p for p in [root / "README.md", root / "CHANGELOG.md",
                        *sorted((root / "docs").glob("*.md"))] if p.exists()]


def _sweep(root: Path, write: bool) -> list[str]:
    tables: dict[str, str] = {}
    values: dict[str, str] = {}

    def make_table(name: str) -> str:
        if name not in tables:
            tables[name] = render(name, root)
        return tables[name]

    def make_value(name: str) -> str:
        if name not in values:
            values[name] = render_value(name, root)
        return values[name]

    verb = "rewritten" if write else "differs from"
    messages = []
    for page in pages(root):
        rel = page.relative_to(root).as_posix()
        text = page.read_text("utf-8")
        new, stale = replace_blocks(text, make_table, rel)
        for b in stale:
            messages.append(f"{rel}:{b.open_line + 1}: table {b.name} {verb} "
                            f"{', '.join(TABLES[b.name].sources)}")
        old_lines = new.splitlines(keepends=True)
        new, stale_values = replace_values(new, make_value, rel)
        for f in stale_values:
            was = old_lines[f.line][f.start:f.end]
            messages.append(f"{rel}:{f.line + 1}: value {f.name} {verb} "
                            f"{', '.join(VALUES[f.name].sources)} (page: {was!r}, files: "
                            f"{values[f.name]!r})")
        if write and new != text:
            page.write_text(new, "utf-8")
    return messages


def check(root: str | Path = ".") -> list[str]:
    """One message per marked table or value whose content is not what its files give (empty:
    all current)."""
    return _sweep(Path(root), write=False)


def write(root: str | Path = ".") -> list[str]:
    """Regenerate every marked table and value in place; one message per one rewritten."""
    return _sweep(Path(root), write=True)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog=COMMAND,
        description="Regenerate (--write) or verify (--check) the tables and values of README.md "
                    "and docs/*.md marked <!-- table: NAME --> … <!-- /table --> and "
                    "<!-- value: NAME -->…<!-- /value -->.")
    act = ap.add_mutually_exclusive_group(required=True)
    act.add_argument("--check", action="store_true",
                     help="exit 1 if a marked table or value is stale")
    act.add_argument("--write", action="store_true", help="rewrite every marked table and value")
    act.add_argument("--show", metavar="NAME", help="print one table or value (any registered name)")
    act.add_argument("--list", action="store_true",
                     help="the registered tables and values and their files")
    ap.add_argument("--root", default=".", help="the repository root (default: .)")
    a = ap.parse_args(argv)
    try:
        if a.list:
            for kind, registry in (("table", TABLES), ("value", VALUES)):
                for t in registry.values():
                    print(f"{kind} {t.name}: {', '.join(t.sources)}")
            return 0
        if a.show:
            if a.show in VALUES:
                print(render_value(a.show, a.root))
            else:
                print(render(a.show, a.root), end="")
            return 0
        messages = write(a.root) if a.write else check(a.root)
    except (KeyError, ValueError, FileNotFoundError) as e:
        print(f"docs_tables: {e.args[0] if e.args else e}", file=sys.stderr)
        return 2
    for m in messages:
        print(m)
    if a.check and messages:
        print(f"{len(messages)} stale table(s) or value(s): run {COMMAND} --write",
              file=sys.stderr)
        return 1
    return 0


# =========================================================================== the tables
# Speed and memory (docs/performance.md)

SCORE_SEQUENCES = "benchmarks/results/score_sequences.json"


def _rows_by(d: Mapping, *keys: str) -> dict:
    return {tuple(r[k] for k in keys): r for r in d["rows"]}


def _batches(d: Mapping) -> dict[int, tuple[dict, dict]]:
    """{batch: (its rows by method, its ratio row)} of a ``benchmarks/score_sequences.py`` file,
    batches in order."""
    by = _rows_by(d, "batch", "method")
    ratios = {r["batch"]: r for r in d["ratios"]}
    return {b: ({m: r for (bb, m), r in by.items() if bb == b}, ratios[b])
            for b in sorted({b for b, _ in by})}


@register("score_sequences", SCORE_SEQUENCES)
def _score_sequences(root: Path) -> str:
    """Seconds per answer of every method, SmolLM2 on a 2-core CPU, median of the rounds."""
    rows = []
    for batch, (s, rq) in _batches(_json(root, SCORE_SEQUENCES)).items():
        rows.append([
            str(batch), *(f"{sig(s[m]['seconds_per_answer'])} s"
                          for m in ("forward", "floor", "full_backward", "loop")),
            f"**{sig(s['ghost']['seconds_per_answer'])} s**", f"**{sig(rq['loop/ghost'])}×**",
            f"{sig(rq['ghost/floor'])} ({rq['ghost/floor by round']})",
            f"{fixed(s['ghost']['peak_rss_gib'], 1)} GiB ({fixed(s['floor']['peak_rss_gib'], 1)})",
        ])
    return _grid(["batch", "forward only", "floor (fwd + activation-only bwd)", "fwd + full bwd",
                  "loop (paper)", "**ghost (isouq)**", "loop / ghost", "ghost / floor (by round)",
                  "peak RSS ghost (floor)"], rows)


GHOST_FLOPS = ("benchmarks/results/ghost_flops.json", "benchmarks/results/ghost_flops_t256.json")


@register("ghost_flops", *GHOST_FLOPS)
def _ghost_flops(root: Path) -> str:
    """Matrix-product flops of the norms (ghost − floor) per path, and what the engine holds as
    the backward ends (``benchmarks/ghost_flops.py``; counted, not timed)."""
    def gflop(x: float) -> str:
        return f"{sig(x / 1e9)} GFLOP"

    def saved(x: float) -> str:
        return "same" if x == 0 else f"−{100 * x:.1f}%"

    rows = []
    for rel in GHOST_FLOPS:
        d, c = _json(root, rel), _json(root, rel)["counts"]
        rows.append([
            f"{d['tokens_padded']} (batch {d['batch']})", gflop(c["floor"]["total"]),
            gflop(d["norms_unshared"]),
            f"{gflop(d['norms_shared'])} ({saved(d['saved_fraction_shared'])})",
            f"{gflop(d['norms_blocks2'])} ({saved(d['saved_fraction_blocks2'])})",
            f"{fixed(c['ghost_unshared']['held_mib'], 1)} MiB / "
            f"{sig(c['ghost_shared']['held_mib'])}"])
    return _grid(["SmolLM2, tokens per row", "floor", "norms, per parameter", "norms, shared",
                  "norms, shared + 2 blocks", "inputs and Grams held as the backward ends, per "
                  "parameter / shared"], rows)


MODELS_CPU = {"float32": "benchmarks/results/score_sequences_fp32.json",
              "bitsandbytes 4-bit (NF4, `--quantize 4bit`)": "benchmarks/results/score_sequences_4bit.json",
              "float32 + LoRA rank 8 on every projection": "benchmarks/results/score_sequences_lora8.json"}


@register("models_cpu", *MODELS_CPU.values())
def _models_cpu(root: Path) -> str:
    """SmolLM2 as people score it — float32, quantized to 4 bits on load, under a LoRA adapter —
    at batch 16 on the CPU: ghost against its own floor and the per-answer loop."""
    rows = []
    for kind, rel in MODELS_CPU.items():
        s, rq = _batches(_json(root, rel))[16]
        loop = s["loop"]
        weights = s["ghost"].get("weights_gib")
        rows.append([
            kind, f"{sig(s['floor']['seconds_per_answer'])} s",
            f"**{sig(s['ghost']['seconds_per_answer'])} s**", f"**{sig(rq['ghost/floor'])}**",
            f"{sig(loop['seconds_per_answer'])} s" + (f" ({loop['loop_params']})"
                                                       if loop.get("loop_params") else ""),
            f"**{sig(rq['loop/ghost'])}×**",
            "" if weights is None else f"{fixed(weights, 2)} GiB",
            f"{fixed(s['ghost']['peak_rss_scoring_gib'], 2)} GiB"])
    return _grid(["model", "floor", "**ghost**", "ghost / floor", "loop", "loop / ghost",
                  "weights as stored", "peak RSS of ghost while scoring"], rows)


SERVE_LOAD = "benchmarks/results/serve_load.json"


@register("serve_load", SERVE_LOAD)
def _serve_load(root: Path) -> str:
    """``isouq serve`` in steady state (``benchmarks/serve_load.py``): per endpoint and number
    of clients, answers/s beside the in-process ceiling of the same run (the mean of the
    ceiling runs before and after the level), latency, 429s and the batches it ran."""
    d = _json(root, SERVE_LOAD)
    big = str(d["meta"]["max_batch"])
    rows = []
    for r in d["results"]:
        c = r["ceiling"]
        by_length = c.get(f"{big}_by_length", {}).get("answers_per_s")
        rows.append([f"`{r['endpoint']}`", str(r["clients"]), sig(r["answers_per_s"]),
                     f"{sig(c['1']['answers_per_s'])} / {sig(c[big]['answers_per_s'])} / "
                     f"{MISSING if by_length is None else sig(by_length)}",
                     f"{fixed(r['vs_ceiling_batch_1'], 2)} / {fixed(r['vs_ceiling_max_batch'], 2)}",
                     f"{sig(r['p50_s'])} / {sig(r['p95_s'])}", sig(r["p95_over_batch_s"]),
                     str(r["refused_429"]), sig(r["answers_per_batch"]),
                     fixed(r["model_busy"], 2), fixed(r["other_cores"], 2)])
    return _grid(["endpoint", "clients", "answers/s",
                  f"ceiling at batch 1 / {big} / {big} by length (answers/s)",
                  f"vs ceiling 1 / {big}",
                  "p50 / p95 s", "p95 / one full batch", "429s", "answers per batch",
                  "model busy", "other cores"], rows)


SERVE_ONE_PASS = "benchmarks/results/serve_load_one_pass.json"


@register("serve_split", SERVE_LOAD, SERVE_ONE_PASS)
def _serve_split(root: Path) -> str:
    """The server scoring each batch in one pass against the passes of least predicted time
    (``prepare.split_padded``): two runs of ``benchmarks/serve_load.py``, each level's
    answers/s and its ratio to the in-process ceiling at ``--max-batch`` of its own run."""
    one, split = _json(root, SERVE_ONE_PASS), _json(root, SERVE_LOAD)
    big = str(split["meta"]["max_batch"])
    before = {(r["endpoint"], r["clients"]): r for r in one["results"]}
    rows = []
    for r in split["results"]:
        b = before.get((r["endpoint"], r["clients"]))
        if b is None:
            continue
        rows.append([f"`{r['endpoint']}`", str(r["clients"]),
                     f"{sig(b['answers_per_s'])} ({fixed(b['vs_ceiling_max_batch'], 2)})",
                     f"{sig(r['answers_per_s'])} ({fixed(r['vs_ceiling_max_batch'], 2)})"])
    return _grid(["endpoint", "clients", f"one pass per batch: answers/s (vs ceiling {big})",
                  f"passes by length: answers/s (vs ceiling {big})"], rows)


@register("serve_targets", SERVE_LOAD)
def _serve_targets(root: Path) -> str:
    """The targets ``benchmarks/serve_load.py`` checks, what the kept run measured, met or not."""
    d = _json(root, SERVE_LOAD)
    rows = []
    for name, t in d["targets"].items():
        m = t["measured"]
        shown = (" → ".join(f"{sig(v)} ({k})" for k, v in m.items()) if isinstance(m, dict)
                 else sig(m))
        rows.append([name.replace("_", " "), t["goal"], shown, "met" if t["met"] else "**missed**"])
    return _grid(["target", "goal", "measured", ""], rows)


@value("serve_ceiling_spread", SERVE_LOAD)
def _v_serve_ceiling_spread(root: Path) -> str:
    """How much the in-process ceiling of ``/v1/score`` moved between the kept run's ceiling
    runs (at batch 1 and at ``--max-batch``): the noise every ratio to it carries."""
    d = _json(root, SERVE_LOAD)
    runs = d["ceiling"]["/v1/score"]["runs"]
    out = []
    for b in ("1", str(d["meta"]["max_batch"])):
        v = [r[b]["answers_per_s"] for r in runs]
        out.append(f"{sig(min(v))}–{sig(max(v))} answers/s at batch {b} "
                   f"(±{100 * (max(v) - min(v)) / (max(v) + min(v)):.0f}%)")
    return " and ".join(out) + f" over its {len(runs)} ceiling runs"


SERVE_ONE_CLIENT = "benchmarks/results/serve_load_one_client.json"


@value("serve_one_client_runs", SERVE_LOAD, SERVE_ONE_PASS, SERVE_ONE_CLIENT)
def _v_serve_one_client_runs(root: Path) -> str:
    """One client's ``/v1/score`` answers/s over the ceiling at batch 1, in the kept run, the
    one-pass run (a batch of one is one pass in both: the same code path) and the one-client
    run whose ceiling is the median of 3 rounds."""
    def one(rel: str) -> float:
        return next(r["vs_ceiling_batch_1"] for r in _json(root, rel)["results"]
                    if r["endpoint"] == "/v1/score" and r["clients"] == 1)
    return (f"{fixed(one(SERVE_LOAD), 2)} in the kept run, {fixed(one(SERVE_ONE_PASS), 2)} in "
            f"the one-pass run and {fixed(one(SERVE_ONE_CLIENT), 2)} in a one-client run with "
            "3 ceiling rounds")


@register("serve_memory", SERVE_LOAD)
def _serve_memory(root: Path) -> str:
    """The predicted peak of one batch (``isouq.memory_plan``) at the kept run's model, per
    batch size and row length, and the server's measured peak RSS over the run."""
    m = _json(root, SERVE_LOAD)["memory"]
    rows = [[str(p["batch"]), str(p["tokens"]), str(p["answer_tokens"]),
             f"{fixed(p['predicted_peak_gib'], 1)} GiB"] for p in m["predicted"]]
    rows.append(["the run's server, measured", "", "", f"{fixed(m['server_peak_rss_gib'], 1)} "
                 "GiB peak RSS"])
    return _grid(["--max-batch", "tokens per row (prompt + answer)", "answer tokens",
                  "predicted peak"], rows)


SPANS_CPU = "benchmarks/results/spans_cpu.json"
SPANS_ALONE = {m: f"benchmarks/results/spans_cpu_{m}.json"
               for m in ("whole", "spans_retain", "spans_rows", "whole_loop")}


@register("spans_cpu", SPANS_CPU, *SPANS_ALONE.values())
def _spans_cpu(root: Path) -> str:
    """Span scores against the whole answer and the per-span loop (``benchmarks/spans.py``):
    wall and CPU seconds of one run; peak memory of each method alone in a process."""
    d = _json(root, SPANS_CPU)
    wall, cpu = d["seconds"], d["cpu_seconds"]
    alone = {m: _json(root, rel) for m, rel in SPANS_ALONE.items() if (root / rel).exists()}
    labels = {"whole": "whole answers, no spans (ghost)",
              "spans_retain": "**spans, ghost (the default: 1 forward + 6 backwards)**",
              "spans_rows": "spans, rows (`span_strategy=\"rows\"`, 4 answers = 24 rows per pass)",
              "spans_loop": "spans, loop (`method=\"per_example\"`: one backward per row)"}
    rows = []
    for m, label in labels.items():
        peak = alone.get(m, {}).get("peak_rss_gib")
        rows.append([label, fixed(wall[m], 1), fixed(cpu[m], 1), sig(wall[m] / wall["whole"]),
                     sig(wall["spans_loop"] / wall[m]) if m != "whole" else "",
                     "" if peak is None else f"{fixed(peak, 2)} GiB"])
    return _grid(["", "wall s", "CPU s", "wall / whole", "loop wall / this",
                  "peak RSS (alone)"], rows)


GHOST_VARIANTS = ("benchmarks/results/score_sequences_variants.json",
                  "benchmarks/results/score_sequences_t256_variants.json")


@register("ghost_variants", *GHOST_VARIANTS)
def _ghost_variants(root: Path) -> str:
    """The ghost engine's paths side by side: shared input Grams (the default), per parameter
    (``ISOUQ_GHOST_SHARE_GRAMS=0``) and symmetric Grams from 2 blocks
    (``ISOUQ_GHOST_GRAM_BLOCKS=2``), seconds per answer, median of the rounds."""
    rows = []
    for rel in GHOST_VARIANTS:
        for batch, (s, rq) in _batches(_json(root, rel)).items():
            rows.append([str(batch), str(s["ghost"]["tokens_padded"]),
                         f"{sig(s['floor']['seconds_per_answer'])} s",
                         f"{sig(s['ghost']['seconds_per_answer'])} s",
                         f"{sig(s['ghost_unshared']['seconds_per_answer'])} s",
                         f"{sig(s['ghost_blocks2']['seconds_per_answer'])} s",
                         f"{sig(rq['ghost/floor'])} ({rq['ghost/floor by round']})"])
    return _grid(["batch", "tokens per row", "floor", "ghost, shared (default)",
                  "ghost, per parameter", "ghost, shared + 2 blocks", "ghost / floor (by round)"],
                 rows)


GHOST_LAUNCHES = ("benchmarks/results/ghost_launches_before.json",
                  "benchmarks/results/ghost_launches.json")


@register("ghost_launches", *GHOST_LAUNCHES)
def _ghost_launches(root: Path) -> str:
    """The operations (kernels on a GPU) one ghost batch of 16 runs beyond the floor's, and
    its host synchronizations, for the paper's architectures at their depth (narrow): the
    engine before and after, counted in one run (``benchmarks/ghost_launches.py``)."""
    before, after = (_json(root, rel) for rel in GHOST_LAUNCHES)
    rows = []
    for b, a in zip(before["table"], after["table"], strict=True):
        rows.append([b["model"], str(b["layers"]), f"{b['floor ops']:,}",
                     f"{b['ghost − floor']:,} → **{a['ghost − floor']:,}**",
                     f"{fixed(b['per layer'], 1)} → {fixed(a['per layer'], 1)}",
                     f"{b['host syncs ghost − floor']} → {a['host syncs ghost − floor']}"])
    return _grid(["model", "layers", "floor: operations per batch",
                  f"ghost − floor ({before['commit']} → {after['commit']})", "per layer",
                  "host synchronizations, ghost − floor"], rows)


SCORE_SEQUENCES_WARM3 = "benchmarks/results/score_sequences_warm3.json"


@register("score_sequences_warm3", SCORE_SEQUENCES_WARM3)
def _score_sequences_warm3(root: Path) -> str:
    """floor and ghost only, three untimed calls before seven timed ones per process."""
    rows = []
    for batch, (s, rq) in _batches(_json(root, SCORE_SEQUENCES_WARM3)).items():
        f, g = s["floor"], s["ghost"]
        rows.append([str(batch), f"{sig(f['seconds_per_answer'])} s",
                     f"**{sig(g['seconds_per_answer'])} s**",
                     f"**{sig(rq['ghost/floor'])}** ({rq['ghost/floor by round']})",
                     f"{fixed(g['peak_rss_gib'], 1)} GiB ({fixed(f['peak_rss_gib'], 1)})"])
    return _grid(["batch", "floor", "**ghost**", "ghost / floor (by round)",
                  "peak RSS ghost (floor)"], rows)


#: the before/after run of ``benchmarks/score_sequences_ab.py`` (``--tag absolute``): seconds per
#: answer of ghost, the library's floor and the independent floor (plain transformers) per side
SCORE_SEQUENCES_AB = "benchmarks/results/score_sequences_ab_absolute.json"
#: what the table calls each thing the run measured
_AB_LABELS = {"ghost": "**ghost**, s/answer", "floor": "floor (isouq's `token_probs`), s/answer",
              "hf_floor": "floor (transformers only), s/answer",
              "ghost/floor": "ghost / floor (isouq)", "ghost/hf_floor": "ghost / floor (transformers only)"}


@register("score_sequences_ab", SCORE_SEQUENCES_AB)
def _score_sequences_ab(root: Path) -> str:
    """ghost, the library's floor and the independent floor of an earlier commit and of the later
    code, run in turn round by round (``benchmarks/score_sequences_ab.py``): seconds per answer
    and their ratios, median (min–max over rounds); beside every ratio the noise (the independent
    floor's (max − min) / median over rounds: each side's, both sides' for after / before)."""
    d = _json(root, SCORE_SEQUENCES_AB)

    def pct(x: float) -> str:
        return f"{100 * x:.0f}%"

    rows = []
    for s in d["summary"]:
        for name, label in _AB_LABELS.items():
            ratio = "/" in name
            by_side = s["ratios" if ratio else "seconds_per_answer"]
            cells = []
            for side in ("before", "after"):
                m = by_side[side][name]
                cells.append(f"{sig(m['median'])} ({sig(m['min'])}–{sig(m['max'])})"
                             + (f"; noise {pct(s['noise'][side])}" if ratio else ""))
            ab = s["after/before"][name]
            cells.append(f"**{sig(ab['ratio'])}**; noise {pct(ab['noise'])}: "
                         + ("inside" if ab["inside_noise"] else "beyond"))
            rows.append([str(s["batch"]), label, *cells])
    return _grid(["batch", "measured", f"before ({d['before']})", f"after ({d['after']})",
                  "after / before"], rows)


LONG_PROMPTS = tuple(f"benchmarks/results/score_sequences_t{t}.json" for t in (64, 256, 1024, 2048))


@register("long_prompts", *LONG_PROMPTS)
def _long_prompts(root: Path) -> str:
    """Seconds per answer against the prompt length (few-shot context), SmolLM2, 2 threads."""
    rows = []
    for rel in LONG_PROMPTS:
        d = _json(root, rel)
        by = {r["method"]: r for r in d["rows"]}
        rq = d["ratios"][0]
        f, g, lo = by["floor"], by["ghost"], by["loop"]
        rows.append([f"{g['tokens_padded']:,}", str(g["batch"]), f"{sig(f['seconds_per_answer'])} s",
                     f"**{sig(g['seconds_per_answer'])} s**", f"{sig(lo['seconds_per_answer'])} s",
                     f"**{sig(rq['loop/ghost'], 2)}×**", sig(rq["ghost/floor"]),
                     " / ".join(fixed(r["peak_rss_gib"], 1) for r in (f, g, lo))])
    return _grid(["tokens per row", "batch", "floor", "**ghost**", "loop", "loop / ghost",
                  "ghost / floor", "peak RSS (GiB) floor / ghost / loop"], rows)


CUDA = "benchmarks/results/score_sequences_cuda.json"
CUDA_SYNC = "benchmarks/results/score_sequences_cuda_after_sync_fix.json"
CUDA_BF16 = "benchmarks/results/score_sequences_cuda_bf16.json"


def _ms(x: float) -> str:
    return f"{sig(1000 * x)} ms"


@register("score_sequences_cuda", CUDA, CUDA_SYNC)
def _score_sequences_cuda(root: Path) -> str:
    """H200, float32: forward and loop from the first file, floor and ghost from the second."""
    first, ours = _rows_by(_json(root, CUDA), "batch", "method"), _rows_by(
        _json(root, CUDA_SYNC), "batch", "method")
    rows = []
    for batch in sorted({b for b, _ in ours}):
        fw, lo = first[(batch, "forward")], first[(batch, "loop")]
        f, g = ours[(batch, "floor")], ours[(batch, "ghost")]
        sf, sg, sl = f["seconds_per_answer"], g["seconds_per_answer"], lo["seconds_per_answer"]
        rows.append([str(batch), _ms(fw["seconds_per_answer"]), _ms(sf), _ms(sl),
                     f"**{_ms(sg)}**", f"**{sig(sl / sg, 2)}×**", sig(sg / sf),
                     f"{fixed(g['peak_rss_gib'], 1)} ({fixed(f['peak_rss_gib'], 1)})"])
    return _grid(["batch", "forward", "floor", "loop (paper)", "**ghost**", "loop / ghost",
                  "ghost / floor", "peak GiB ghost (floor)"], rows)


@register("score_sequences_cuda_bf16", CUDA_BF16, CUDA)
def _score_sequences_cuda_bf16(root: Path) -> str:
    """H200, bfloat16 beside float32 of the same engine (both files)."""
    half, full = _rows_by(_json(root, CUDA_BF16), "batch", "method"), _rows_by(
        _json(root, CUDA), "batch", "method")
    rows = []
    for batch in sorted({b for b, _ in half}):
        for dtype, by in (("float32", full), ("bfloat16", half)):
            f, g = by[(batch, "floor")], by[(batch, "ghost")]
            rows.append([str(batch), dtype, _ms(f["seconds_per_answer"]),
                         _ms(g["seconds_per_answer"]),
                         sig(g["seconds_per_answer"] / f["seconds_per_answer"]),
                         f"{fixed(g['peak_rss_gib'], 1)} ({fixed(f['peak_rss_gib'], 1)})"])
    return _grid(["batch", "dtype", "floor", "ghost", "ghost / floor", "peak GiB ghost (floor)"],
                 rows)


PEER_OPACUS = "benchmarks/results/peer_opacus_b16_t128.json"


@register("peer_opacus", PEER_OPACUS)
def _peer_opacus(root: Path) -> str:
    """isouq's GhostNorms beside Opacus's ghost and fast gradient clipping (CPU, 2 threads)."""
    names = {"floor": "floor (fwd + activation-only bwd)", "isouq": "**isouq `GhostNorms`**",
             "opacus_ghost": "Opacus ghost clipping", "opacus_fgc": "Opacus fast gradient clipping"}
    rows = []
    for r in _json(root, PEER_OPACUS)["rows"]:
        bold = r["method"] == "isouq"
        s = f"{r['seconds']:.3f}"
        diff = r.get("max_rel_diff_vs_isouq")
        rows.append([names.get(r["method"], r["method"]), f"**{s}**" if bold else s,
                     f"**{r['over_floor']:.2f}**" if bold else f"{r['over_floor']:.2f}",
                     f"{r['over_isouq']:.2f}", f"{r['peak_rss_gib']:.2f} GiB",
                     f"{diff:.1e}" if diff else ""])
    return _grid(["method", "s / batch", "× floor", "× isouq", "peak RSS",
                  "‖gᵢ‖² vs isouq (max rel. diff.)"], rows)


MEMORY_REPEAT = "benchmarks/results/memory_repeat_ghost.json"


@register("memory_repeat", MEMORY_REPEAT)
def _memory_repeat(root: Path) -> str:
    """Resident memory after each of repeated ghost calls on the same answers."""
    trace = _json(root, MEMORY_REPEAT)["trace"]
    return _grid(["call", *(str(t["call"]) for t in trace)],
                 [["RSS (GiB)", *(f"{t['rss_gib']:.2f}" for t in trace)],
                  ["live tensors", *(str(t["live_tensors"]) for t in trace)]])


MEMORY_PLAN = "benchmarks/results/memory_plan.json"


@register("memory_plan", MEMORY_PLAN)
def _memory_plan(root: Path) -> str:
    """Predicted against measured working memory of ``score_sequences`` per configuration."""
    rows = sorted(_json(root, MEMORY_PLAN)["rows"],
                  key=lambda r: (r["role"] != "calibrate", r["model"], r["method"], r["dtype"],
                                 r["batch"], r["length"]))
    return _grid(["model", "role", "method", "dtype", "N", "L", "measured MiB", "predicted MiB",
                  "ratio"],
                 [[r["model"], r["role"], r["method"], r["dtype"], str(r["batch"]),
                   str(r["length"]), f"{r['measured_mib']:,.1f}", f"{r['predicted_mib']:,.1f}",
                   f"{r['ratio']:.2f}"] for r in rows])


PAPER_SIZES = "benchmarks/results/paper_sizes_cuda_bf16.json"
PAPER_SIZES_COLUMNS = ("model", "params_B", "batch", "floor s/answer", "full_backward s/answer",
                       "ghost s/answer", "ghost/floor", "ghost/(fwd+full bwd)", "ghost peak GiB",
                       "paper s/answer")


@register("paper_sizes", PAPER_SIZES)
def _paper_sizes(root: Path) -> str:
    """The paper's four LLM architectures (random weights, bfloat16, one GPU): floor, forward +
    full backward and ghost per batch size, 3 significant digits (``format(x, ".3g")``)."""
    def cell(v) -> str:
        if isinstance(v, str):
            return v
        if isinstance(v, int) and not isinstance(v, bool):
            return str(v)
        return MISSING if v is None else format(float(v), ".3g")

    rows = [[cell(r.get(c)) for c in PAPER_SIZES_COLUMNS]
            for r in _json(root, PAPER_SIZES)["table"]]
    return _grid(PAPER_SIZES_COLUMNS, rows)


# --------------------------------------------------------------------------- the scaling study

HMC_COST = "results/scaling/cost.json"
SCALING = "results/scaling/results.json"


@register("hmc_cost_measured", HMC_COST)
def _hmc_cost_measured(root: Path) -> str:
    """Short HMC runs and bare gradients per width, as ``scripts/hmc_cost.py`` measured them."""
    rows = [[f"MLP({m['width']},{m['width']})", f"{m['n_params']:,}", sig(m["gradient_ms"]),
             sig(m["sampler_ms_per_step"]), sig(m["sampler_ms_per_step"] / m["gradient_ms"]),
             sig(m["short_run_steps_per_iteration"])]
            for m in _json(root, HMC_COST)["measured"]]
    return _grid(["size", "D", "gradient ms", "sampler ms / leapfrog step",
                  "step / gradient", "steps / iteration (30 warmup iterations)"], rows)


@register("hmc_cost_projection", HMC_COST)
def _hmc_cost_projection(root: Path) -> str:
    """The projected cost of a full size (2,000 iterations, 2 chains) from the same file."""
    rows = [[f"MLP({p['width']},{p['width']})", f"{p['n_params']:,}", sig(p["ms_per_step"]),
             sig(p["steps_per_iteration"]), sig(p["wall_hours_2_cores"]), sig(p["cpu_hours"])]
            for p in _json(root, HMC_COST)["projection"]]
    return _grid(["size", "D", "ms / step", "steps / iteration", "wall hours (2 cores)",
                  "CPU-hours"], rows)


@register("hmc_in_progress", SCALING)
def _hmc_in_progress(root: Path) -> str:
    """The last progress record of an HMC size still sampling (``hmc_in_progress``)."""
    rows = [[r["model"], f"{r['n_params']:,}", r["status"], r["iterations"],
             sig(r["hours_so_far"]), sig(r["ms_per_leapfrog_step"]),
             sig(r["hours_left_at_recent_rate"]), r["as_of"]]
            for r in _json(root, SCALING)["tables"].get("hmc_in_progress", [])]
    return _grid(["size", "D", "status", "iterations", "hours so far", "ms / leapfrog step",
                  "hours left at the recent rate", "recorded"], rows)


# --------------------------------------------------------------------------- results.md

VALIDATION = "results/validation/results.json"
VI_FAN_IN = "results/scaling_vi_fan_in/results.json"
PROXY_2D = "results/proxy_bias_2d/results.json"
PROXY_TEXT = "results/proxy_bias_text/results.json"
QA_REPORT = "results/report/report.json"
QA_ROWS = "results/qa"
# The paper's Table 3 (tab:qa-results): mean AUROC over Llama 2 7B, Llama 3.2 3B, OLMo 1B and
# Phi-4, 300 bootstrap runs. Not a kept file: the paper's own numbers, for comparison.
PAPER_QA = {"truthfulqa": {"Epi. & Alea.": 0.63, "Alea.": 0.60, "Epi.": 0.55, "P(True)": 0.55,
                           "Sem. Ent.": 0.54, "Naive Ent.": 0.51},
            "triviaqa": {"Epi. & Alea.": 0.61, "Alea.": 0.60, "Epi.": 0.52, "P(True)": 0.69,
                         "Sem. Ent.": 0.55, "Naive Ent.": 0.52}}
QA_METHODS = ("Epi. & Alea.", "Alea.", "Epi.", "p̄", "P(True)", "Sem. Ent.", "Naive Ent.")
QA_HEADERS = ("Epi. & Alea.", "Alea.", "Epi.", "p̄", "P(True)", "SE", "naive entropy")
DATASETS = {"truthfulqa": "TruthfulQA", "triviaqa": "TriviaQA"}
MODELS = {"smollm2": "SmolLM2-135M", "gemma3-270m": "Gemma 3 270M",
          "qwen2.5-coder-0.5b": "Qwen2.5-Coder-0.5B"}


def _by(rows: Iterable[Mapping], *keys: str) -> dict:
    return {tuple(r[k] for k in keys) if len(keys) > 1 else r[keys[0]]: r for r in rows}


def _paper(x) -> str:
    return f"{x:g}".replace("-", "−")


def _section(report: Mapping, sid: str) -> Mapping:
    for s in report["sections"]:
        if s["id"] == sid:
            return s["tables"]
    raise KeyError(f"{QA_REPORT} has no section {sid!r}")


def _validation_rows(root: Path) -> tuple[dict, dict, dict, dict]:
    v = _json(root, VALIDATION)
    ours = _by([r for r in v["tables"]["epistemic"] if r["class"] in ("all", "overall")], "problem")
    paper = _by(v["paper"]["epistemic"], "problem")
    return ours, paper, _by(v["tables"]["hessian"], "problem"), _by(v["paper"]["hessian"], "problem")


def _scaling_rows(root: Path) -> tuple[dict, dict]:
    s = _json(root, SCALING)
    return _by(s["tables"]["hmc"], "n_params"), _by(s["paper"]["hmc"], "n_params")


def _qa_mean_auroc(root: Path) -> dict:
    return _by(_section(_json(root, QA_REPORT), "qa-study")["auroc"], "method")


@register("results_headline", VALIDATION, SCALING, VI_FAN_IN, PROXY_2D, PROXY_TEXT, QA_REPORT)
def _results_headline(root: Path) -> str:
    """Our headline numbers beside the paper's (docs/results.md)."""
    ours, paper, _, _ = _validation_rows(root)
    hmc, paper_hmc = _scaling_rows(root)
    vi = [r["gn_rho"] for r in _json(root, VI_FAN_IN)["tables"]["vi"]]
    vi_n = [r["n_params"] for r in _json(root, VI_FAN_IN)["tables"]["vi"]]
    p2 = _json(root, PROXY_2D)
    d2, d2p = _by(p2["tables"]["symmetry"], "problem"), _by(p2["paper"]["symmetry"], "problem")
    pt = _json(root, PROXY_TEXT)
    ct, ctp = (_by(pt["tables"]["correlation_vs_full"], "covariance"),
               _by(pt["paper"]["correlation_vs_full"], "covariance"))
    qa = _qa_mean_auroc(root)
    rows = []
    for problem, what in (("binary_linear", "binary linear"), ("binary_xor", "XOR"),
                          ("binary_rings", "binary rings"),
                          ("multiclass_clusters", "4-class clusters"),
                          ("multiclass_rings", "4-class rings"),
                          ("multiclass_spirals", "4-class spirals"),
                          ("regression_linear", "linear regression"),
                          ("regression_nonlinear", "nonlinear regression")):
        r = ours[problem]
        val = (f"{fixed(r['gn_rho'], 2)} ± {fixed(r['gn_rho_std'], 2)}" if r["gn_rho_std"] >= 0.005
               else fixed(r["gn_rho"], 3))
        rows.append([f"GN vs HMC Spearman ρ, {what} (mean of {r['n_seeds']} seeds)",
                     _paper(paper[problem]["gn_rho"]), val, f"`{Path(VALIDATION).parent}`"])
    sizes = (17412, 67588, 266244)
    rows.append(["GN vs HMC Spearman ρ, MLPs of " + " / ".join(f"{n:,}" for n in sizes)
                 + " parameters", " / ".join(_paper(paper_hmc[n]["gn_rho"]) for n in sizes),
                 " / ".join(fixed(hmc[n]["gn_rho"], 2) for n in sizes),
                 f"`{Path(SCALING).parent}`"])
    rows.append([f"GN vs VI Spearman ρ, {min(vi_n):,} to {max(vi_n) / 1e6:.2f}M parameters "
                 "(fan-in prior)", "≥ 0.96", f"{fixed(min(vi), 3)}–{fixed(max(vi), 3)}",
                 f"`{Path(VI_FAN_IN).parent}`"])
    probs = ("linear", "xor", "rings")
    rows.append(["proxy bias 2D, Cohen's d of log(U_A/U_B): linear, XOR, rings",
                 ", ".join(fixed(d2p[p]["cohens_d"], 1) for p in probs),
                 ", ".join(fixed(d2[p]["cohens_d"], 1) for p in probs), f"`{Path(PROXY_2D).parent}`"])
    covs = ("representative", "identity")
    rows.append(["proxy bias text, Spearman ρ vs full Hessian: representative, identity",
                 ", ".join(fixed(ctp[c]["spearman"], 3) for c in covs),
                 ", ".join(fixed(ct[c]["spearman"], 3) for c in covs),
                 f"`{Path(PROXY_TEXT).parent}`"])
    rows.append(["TruthfulQA AUROC, Epi. & Alea. (mean over models, judge labels)",
                 f"{_paper(PAPER_QA['truthfulqa']['Epi. & Alea.'])} (four models, 1B–14B)",
                 f"{fixed(qa['Epi. & Alea.']['truthfulqa'], 2)} (three models, 135M–630M; "
                 "see below)", f"`{QA_ROWS}`"])
    rows.append(["TruthfulQA AUROC, p̄ (mean token probability; same rows)", "–",
                 fixed(qa["p̄"]["truthfulqa"], 2), f"`{QA_ROWS}`"])
    return _grid(["what", "paper", "isouq", "kept run"], rows)


@register("readme_results", VALIDATION, SCALING, VI_FAN_IN, PROXY_2D, PROXY_TEXT, QA_REPORT)
def _readme_results(root: Path) -> str:
    """The README's table of our numbers beside the paper's."""
    ours, paper, hess, hess_p = _validation_rows(root)
    hmc, paper_hmc = _scaling_rows(root)
    vi = _json(root, VI_FAN_IN)["tables"]["vi"]
    p2 = _json(root, PROXY_2D)
    d2, d2p = _by(p2["tables"]["symmetry"], "problem"), _by(p2["paper"]["symmetry"], "problem")
    pt = _json(root, PROXY_TEXT)
    ct, ctp = (_by(pt["tables"]["correlation_vs_full"], "covariance"),
               _by(pt["paper"]["correlation_vs_full"], "covariance"))
    qa = _qa_mean_auroc(root)
    problems = ("binary_linear", "binary_xor", "multiclass_clusters", "regression_linear")
    weak = ("binary_rings", "multiclass_rings", "multiclass_spirals", "regression_nonlinear")
    n_seeds = ours["binary_linear"]["n_seeds"]

    def rng(h):
        return f"{sig(h['eig_min'], 3)}–{sig(h['eig_max'], 3)}"

    sizes = (17412, 67588, 266244)
    rows = [
        ["GN vs HMC Spearman ρ: binary linear, XOR, 4-class clusters, linear regression "
         f"(mean of {n_seeds} seeds)", ", ".join(_paper(paper[p]["gn_rho"]) for p in problems),
         ", ".join(fixed(ours[p]["gn_rho"], 2 if ours[p]["gn_rho"] < 0.99 else 3)
                   for p in problems)],
        ["GN vs HMC Spearman ρ: binary rings, 4-class rings, 4-class spirals, nonlinear "
         f"regression (mean of {n_seeds} seeds)", ", ".join(_paper(paper[p]["gn_rho"]) for p in weak),
         ", ".join(fixed(ours[p]["gn_rho"], 2) for p in weak)],
        [f"Hessian eigenvalue range, linear / nonlinear regression (mean of {n_seeds} seeds)",
         " / ".join(f"{hess_p[p]['eig_min']:,.0f}–{hess_p[p]['eig_max']:,.0f}"
                    for p in ("regression_linear", "regression_nonlinear")),
         " / ".join(rng(hess[p]) for p in ("regression_linear", "regression_nonlinear"))],
        ["GN vs HMC Spearman ρ, MLPs of " + " / ".join(f"{n:,}" for n in sizes)
         + " parameters (scaling ladder)", " / ".join(_paper(paper_hmc[n]["gn_rho"]) for n in sizes),
         " / ".join(fixed(hmc[n]["gn_rho"], 2) for n in sizes)],
        [f"GN vs mean-field VI Spearman ρ, {min(r['n_params'] for r in vi):,} to "
         f"{max(r['n_params'] for r in vi) / 1e6:.2f}M parameters (fan-in prior)", "≥ 0.96",
         f"{fixed(min(r['gn_rho'] for r in vi), 3)}–{fixed(max(r['gn_rho'] for r in vi), 3)}"],
        ["proxy bias 2D, Cohen's d of log(U_A/U_B): linear, XOR, rings",
         ", ".join(fixed(d2p[p]["cohens_d"], 1) for p in ("linear", "xor", "rings")),
         ", ".join(fixed(d2[p]["cohens_d"], 1) for p in ("linear", "xor", "rings"))],
        ["proxy bias text, Spearman ρ with the full Hessian: representative proxy, identity",
         ", ".join(fixed(ctp[c]["spearman"], 3) for c in ("representative", "identity")),
         ", ".join(fixed(ct[c]["spearman"], 3) for c in ("representative", "identity"))],
        ["TruthfulQA AUROC (mean over models; judge labels): Epi. & Alea., p̄",
         f"{_paper(PAPER_QA['truthfulqa']['Epi. & Alea.'])}, – (four 1B–14B models)",
         f"{fixed(qa['Epi. & Alea.']['truthfulqa'], 2)}, {fixed(qa['p̄']['truthfulqa'], 2)} "
         "(three 135M–630M models)"],
    ]
    return _grid(["what", "paper", "isouq"], rows)


@register("qa_study_auroc", QA_REPORT)
def _qa_study_auroc(root: Path) -> str:
    """Mean AUROC over the three models with the judge's labels, beside the paper's Table 3."""
    qa = _qa_mean_auroc(root)
    rows = [[DATASETS[ds], *(fixed(qa[m][ds], 2) for m in QA_METHODS)] for ds in DATASETS]
    for ds in DATASETS:
        p = PAPER_QA[ds]
        rows.append([f"paper, {DATASETS[ds]} (Llama 2 7B, Llama 3.2 3B, OLMo 1B, Phi-4)",
                     *(fixed(p[m], 2) if m in p else MISSING for m in QA_METHODS)])
    return _grid(["dataset", *QA_HEADERS], rows)


@register("qa_study_auroc_per_model", QA_REPORT, QA_ROWS)
def _qa_study_auroc_per_model(root: Path) -> str:
    """AUROC per model and dataset with the judge's labels; n and correct from the rows."""
    per = _section(_json(root, QA_REPORT), "qa-study")["auroc_per_model"]
    rows = []
    for ds in DATASETS:
        for model in MODELS:
            r = next((x for x in per if x["dataset"] == ds and x["model"] == model), None)
            if r is None:
                continue
            qa_rows = latest_by_key(read_jsonl(root / QA_ROWS / f"qa_{ds}__{model}.jsonl"))
            n, correct = len(qa_rows), sum(bool(x.get("correct")) for x in qa_rows)
            vals = [r.get(m) for m in QA_METHODS]
            best = max(v for v in vals if v is not None)
            rows.append([MODELS[model], DATASETS[ds], f"{n} ({correct})",
                         *(MISSING if v is None else
                           f"**{fixed(v, 2)}**" if v == best else fixed(v, 2) for v in vals)])
    return _grid(["model", "dataset", "answers (correct)", *QA_HEADERS], rows)


# --------------------------------------------------------------------------- qa-evidence.md

EVIDENCE = "results/report_evidence/report.json"
EVIDENCE_SETTINGS = (("qa-evidence-mc", "TruthfulQA MC1", "MC1"),
                     ("qa-evidence-short", "TriviaQA short", "TriviaQA"))
EVIDENCE_MODELS = {"smollm2": ("SmolLM2-135M-Instruct", "SmolLM2"),
                   "gemma3-270m": ("Gemma 3 270M", "Gemma"),
                   "qwen2.5-coder-0.5b": ("Qwen2.5-Coder-0.5B-Instruct", "Qwen")}
#: short names of every model a benchmark table shows (the evidence models and the larger ones
#: of the LM-Polygraph run)
SHORT_NAMES = {**{k: v[1] for k, v in EVIDENCE_MODELS.items()},
               "qwen2.5-coder-1.5b": "Qwen 1.5B"}
EVIDENCE_SCORES = {"epistemic": "−epistemic ‖∇θ p̄‖²",
                   "epistemic_log": "−epistemic_log ‖∇θ log p̄‖²", "mean_prob": "p̄",
                   "aleatoric": "−aleatoric", "max_prob": "max option probability",
                   "option_entropy": "−option entropy", "p_true": "P(True)",
                   "naive_entropy": "−naive entropy", "semgrad": "−SemGrad",
                   "lm_head_grad": "−lm_head gradient", "hybridgrad": "−HybridGrad"}


@register("qa_evidence_counts", EVIDENCE)
def _qa_evidence_counts(root: Path) -> str:
    """Questions and correct answers per setting and model."""
    report = _json(root, EVIDENCE)
    rows = []
    for sid, setting, _ in EVIDENCE_SETTINGS:
        counts = _by(_section(report, sid)["counts"], "model")
        for model, (name, _) in EVIDENCE_MODELS.items():
            if model in counts:
                c = counts[model]
                rows.append([setting, name, str(c["n"]),
                             f"{c['correct']} ({100 * c['accuracy']:.1f}%)"])
    return _grid(["setting", "model", "questions", "correct"], rows)


@register("qa_evidence_raw_auroc", EVIDENCE)
def _qa_evidence_raw_auroc(root: Path) -> str:
    """Raw AUROC of each score oriented as a confidence, 95% bootstrap interval, per model and
    pooled, for both settings."""
    report = _json(root, EVIDENCE)
    columns, cells = [], {}
    for sid, _, short in EVIDENCE_SETTINGS:
        t = _section(report, sid)
        for model, (_, name) in EVIDENCE_MODELS.items():
            columns.append(f"{name} {short}")
            for r in t["raw_auroc"]:
                if r["model"] == model:
                    cells[(r["score"], columns[-1])] = interval(r)
        columns.append(f"pooled {short}")
        for r in t["raw_pooled"]:
            cells[(r["score"], columns[-1])] = interval(r)
    rows = [[label, *(cells.get((score, c), MISSING) for c in columns)]
            for score, label in EVIDENCE_SCORES.items()
            if any((score, c) in cells for c in columns)]
    return _grid(["score", *columns], rows)


# --------------------------------------------------------------------------- qa long
# (docs/qa-evidence.md, "Long answers: every sentence labelled")

QA_LONG = "results/qa_long/results.json"
QA_LONG_SETTINGS = ("composed", "generated")


def _long_order(rows: Iterable[Mapping]) -> list[tuple[str, str]]:
    """(setting, model) pairs of ``rows`` in the settings' and the models' order."""
    models = list(EVIDENCE_MODELS)
    have = {(r["setting"], r["model"]) for r in rows}
    return sorted(have, key=lambda k: (QA_LONG_SETTINGS.index(k[0]) if k[0] in QA_LONG_SETTINGS
                                       else 9, models.index(k[1]) if k[1] in models else 9,
                                       k[1]))


@register("qa_long_counts", QA_LONG)
def _qa_long_counts(root: Path) -> str:
    """Answers scored of those planned (and written but skipped: an empty short answer),
    labelled sentences and wrong ones, per setting and model of ``isouq qa long``, then per model
    over both settings."""
    t = _json(root, QA_LONG)["tables"]
    counts = {(c["setting"], c["model"]): c for c in t.get("counts", [])}
    prog = {(p["setting"], p["model"]): p for p in t.get("progress", [])}
    rows, total = [], {}
    for key in _long_order(t.get("progress", [])):
        p, c = prog[key], counts.get(key, {})
        scored = p.get("scored", p["written"])
        rows.append([p["setting"], EVIDENCE_MODELS.get(p["model"], (p["model"],))[0],
                     f"{scored} of {p['planned']}" + (" (partial)" if p["partial"] else ""),
                     str(p.get("skipped", 0)), str(c.get("sentences", 0)), str(c.get("wrong", 0)),
                     str(p["sentences_dropped"])])
        m = total.setdefault(p["model"], [0, 0, 0, 0, 0])
        for i, v in enumerate((scored, p.get("skipped", 0), c.get("sentences", 0),
                               c.get("wrong", 0), p["sentences_dropped"])):
            m[i] += v
    for model, (scored, skipped, sentences, wrong, dropped) in total.items():
        rows.append(["**both**", EVIDENCE_MODELS.get(model, (model,))[0], str(scored), str(skipped),
                     f"**{sentences:,}**", f"{wrong:,}", str(dropped)])
    return _grid(["setting", "model", "answers scored", "skipped (empty short answer)",
                  "labelled sentences", "wrong", "sentences dropped"], rows)


@register("qa_long_auroc", QA_LONG)
def _qa_long_auroc(root: Path) -> str:
    """AUROC of each score for the wrong sentences [95% interval, bootstrap over answers], per
    setting and model of ``isouq qa long``, and pooled over the models of a setting."""
    t = _json(root, QA_LONG)["tables"]
    cells, columns = {}, []
    for st, m in _long_order(t.get("auroc", [])):
        columns.append(f"{EVIDENCE_MODELS.get(m, (m, m))[1]} {st}")
        for r in t["auroc"]:
            if (r["setting"], r["model"]) == (st, m):
                cells[(r["score"], columns[-1])] = interval(r)
    for st in QA_LONG_SETTINGS:
        pooled = [r for r in t.get("pooled", []) if r["setting"] == st]
        if pooled:
            columns.append(f"pooled {st}")
            for r in pooled:
                cells[(r["score"], columns[-1])] = interval(r)
    scores = list(dict.fromkeys(r["score"] for r in t.get("auroc", [])))
    rows = [[s, *(cells.get((s, c), MISSING) for c in columns)] for s in scores]
    return _grid(["score", *columns], rows)


# --------------------------------------------------------------------------- polygraph.md
# (the LM-Polygraph benchmark: results/polygraph/, rendered by isouq report)

POLYGRAPH = "results/polygraph"
POLYGRAPH_REPORT = "results/polygraph/report/report.json"
#: the cost table's columns: a label and the estimators it stands for (``isouq``: the file's
#: ``isouq_estimators``; a name ending in ``*``: every estimator whose name begins so, e.g. each
#: layer's AttentionScore); a cell shows each different value once
POLYGRAPH_COST_GROUPS = (
    ("isouq (all four, one backward per batch)", ("isouq",)),
    ("MSP, perplexity, RAUQ", ("MaximumSequenceProbability", "Perplexity", "RAUQ")),
    ("mean token entropy", ("MeanTokenEntropy",)),
    ("PMI", ("MeanPointwiseMutualInformation",)),
    ("PTrue", ("PTrue",)),
    ("AttentionScore", ("AttentionScore*",)),
    ("CSL", ("CSL",)),
)
#: seconds per answer below which a cost cell says only ``< POLYGRAPH_NEGLIGIBLE``
POLYGRAPH_NEGLIGIBLE = 0.002


def _minus(text: str) -> str:
    """A formatted cell of the report with its minus signs as −."""
    return re.sub(r"(?<![\w])-(?=\d)", "−", str(text))


def _setting(model: str, dataset: str) -> str:
    return f"{SHORT_NAMES.get(model, model)} × {DATASETS.get(dataset, dataset)}"


@register("polygraph_ranks", POLYGRAPH_REPORT)
def _polygraph_ranks(root: Path) -> str:
    """isouq's best estimator among LM-Polygraph's by PRR, per setting and quality metric, with
    the bootstrap intervals of the kept report (``isouq report results/polygraph``)."""
    rows = []
    for r in _section(_json(root, POLYGRAPH_REPORT), "lm-polygraph-benchmark")["ranks"]:
        n = f"{r['n']} ({r['answers']})"
        if "isouq best" not in r or str(r.get("verdict", "")).startswith("not rankable"):
            rows.append([_setting(r["model"], r["dataset"]), r["quality"], n, MISSING,
                         "not rankable", *[MISSING] * 4])
            continue
        rows.append([_setting(r["model"], r["dataset"]), r["quality"], n, r["isouq best"],
                     _minus(r["its PRR [95% CI]"]),
                     f"{r['rank (of estimators)']} [{r['rank 95% CI']}]",
                     r["best LM-Polygraph"], _minus(r["its PRR"]),
                     _minus(r["difference [95% CI]"])])
    return _grid(["model × dataset", "quality", "n", "isouq's best", "its PRR [95% CI]",
                  "rank [95% CI]", "best LM-Polygraph", "its PRR", "difference [95% CI]"], rows)


def _polygraph_docs(root: Path) -> list[dict]:
    """The kept benchmark files, models in the docs' order, TriviaQA before TruthfulQA."""
    from isouq.study.report.polygraph import load_polygraph, polygraph_files

    folder = root / POLYGRAPH
    if not folder.is_dir():
        raise FileNotFoundError(f"{POLYGRAPH}: the kept folder a generated table reads is "
                                "missing")
    docs = [load_polygraph(p) for p in polygraph_files(folder)]
    models, datasets = list(SHORT_NAMES), ["triviaqa", "truthfulqa"]
    return sorted(docs, key=lambda d: (
        models.index(d["model"]) if d["model"] in models else len(models), d["model"],
        datasets.index(d["dataset"]) if d["dataset"] in datasets else len(datasets),
        d["dataset"]))


def _polygraph_cost_cell(doc: Mapping, names: Sequence[str]) -> str:
    """Seconds per answer of the estimators ``names`` stands for: total (median over batches),
    3 significant digits; ``< POLYGRAPH_NEGLIGIBLE`` when every one is below it."""
    def stands_for(e: str, n: str) -> bool:
        if n == "isouq":
            return e in doc.get("isouq_estimators", ())
        return e.startswith(n[:-1]) if n.endswith("*") else e == n

    cost = doc.get("cost", {}).get("estimators", {})
    ests = [e for e in doc["estimators"] if e in cost and any(stands_for(e, n) for n in names)]
    if not ests:
        return MISSING
    totals = [cost[e].get("s_per_answer") for e in ests]
    if all(t is not None and t < POLYGRAPH_NEGLIGIBLE for t in totals):
        return f"< {POLYGRAPH_NEGLIGIBLE:g}"
    return " / ".join(dict.fromkeys(
        _seconds_cell(cost[e].get("s_per_answer"), cost[e].get("median_batch_s_per_answer"))
        for e in ests))


def _seconds_cell(total, median) -> str:
    """``total (median)``, 3 significant digits."""
    return f"{sig(total)} ({sig(median)})"


@register("polygraph_cost", POLYGRAPH)
def _polygraph_cost(root: Path) -> str:
    """Seconds per answer of LM-Polygraph's shared greedy generation and, beyond it, of each
    estimator (the median over batches in brackets), from the kept benchmark files' ``cost``."""
    rows = [[_setting(d["model"], d["dataset"]),
             _seconds_cell(d["cost"].get("generation_s_per_answer"),
                           d["cost"].get("generation_median_batch_s_per_answer")),
             *(_polygraph_cost_cell(d, names) for _, names in POLYGRAPH_COST_GROUPS)]
            for d in _polygraph_docs(root)]
    return _grid(["model × dataset", "greedy generation (shared)",
                  *(label for label, _ in POLYGRAPH_COST_GROUPS)], rows)


@register("polygraph_verdict", POLYGRAPH_REPORT)
def _polygraph_verdict(root: Path) -> str:
    """The kept report's verdict on the LM-Polygraph benchmark and its note on what is partial
    (if any), one row each."""
    report = _json(root, POLYGRAPH_REPORT)
    notes = next(s["notes"] for s in report["sections"] if s["id"] == "lm-polygraph-benchmark")
    rows = [[n.split(":", 1)[0].lower(), n.split(":", 1)[1].strip()] for n in notes
            if n.startswith(("Verdict:", "PARTIAL:"))]
    return _grid(["", "the kept report says"], rows)


#: the quality metric of the scores' table (accuracy ranks nothing when no answer is correct)
POLYGRAPH_SCORES_QUALITY = "ROUGE-L"


@register("polygraph_scores", POLYGRAPH_REPORT)
def _polygraph_scores(root: Path) -> str:
    """Each of isouq's four scores per setting: its rank by PRR among every estimator of the run
    (LM-Polygraph's and isouq's) with its PRR and 95% interval, on ROUGE-L."""
    rows: dict[tuple, dict] = {}
    names: list[str] = []
    per_setting: dict[tuple, int] = {}
    for r in _section(_json(root, POLYGRAPH_REPORT), "lm-polygraph-benchmark")["estimators"]:
        if r["quality"] != POLYGRAPH_SCORES_QUALITY:
            continue
        key = (r["model"], r["dataset"])
        per_setting[key] = per_setting.get(key, 0) + 1
        if r["estimator"].startswith("★ "):
            name = r["estimator"][2:]
            names += [] if name in names else [name]
            rows.setdefault(key, {})[name] = (r["rank"], r["PRR [95% CI]"])
    out = []
    for key, cells in rows.items():
        n = per_setting[key]
        out.append([_setting(*key), *(f"{cells[e][0]} of {n}: {_minus(cells[e][1])}"
                                      if e in cells else MISSING for e in names)])
    return _grid(["model × dataset", *names], out)



# --------------------------------------------------------------------------- performance.md: blocks
BLOCKS = "benchmarks/results/blocks.json"


@register("blocks_cost", BLOCKS)
def _blocks_cost(root: Path) -> str:
    """The block profile and the hidden states against the summed ghost path, interleaved in
    one process (``benchmarks/blocks.py``): seconds per answer, the ratio per round (median,
    min–max) and the spread of the summed path's own rounds."""
    doc = _json(root, BLOCKS)

    def ratio(r, tag):
        if f"{tag}_over_ghost" not in r:
            return MISSING
        return (f"{_two(r[f'{tag}_over_ghost'])} [{_two(r[f'{tag}_over_ghost_min'])}–"
                f"{_two(r[f'{tag}_over_ghost_max'])}]")

    rows = [[str(r["batch"]), str(r["rounds"]), sig(r["ghost_s_per_answer"]),
             *(sig(r[k]) if k in r else MISSING for k in (
                 "ghost_blocks_s_per_answer", "ghost_hidden_s_per_answer",
                 "ghost_blocks_hidden_s_per_answer")),
             ratio(r, "blocks"), ratio(r, "hidden"), ratio(r, "blocks_hidden"),
             f"{100 * r['ghost_spread']:.0f}%"]
            for r in doc["rows"]]
    return _grid(["batch", "rounds", "summed s/answer", "with blocks", "with hidden states",
                  "with both", "blocks / summed [min–max over rounds]",
                  "hidden / summed", "both / summed", "summed path's spread"], rows)


# --------------------------------------------------------------------------- trust.md
# (Which score should I trust? whole answers in LM-Polygraph's harness, sentences of qa long)

#: the span scores of ``isouq qa long``'s AUROC table, as the trust page names them
TRUST_SPAN_SCORES = {"span aleatoric": "aleatoric", "span epistemic": "epistemic",
                     "span epistemic_log": "epistemic_log", "span 1 − p̄": "1 − p̄",
                     "span 1 − min p": "1 − min p"}
#: the learned head the trust page shows (the most the harness gives it to read), the one the
#: report holds the supervised anchors against
TRUST_HEAD = REFERENCE_HEAD


@register("trust_sentences", QA_LONG)
def _trust_sentences(root: Path) -> str:
    """Per setting × model of ``isouq qa long``: the AUROC for the wrong sentences [95%
    interval] of the default span score (``isouq.defaults.SPAN_SCORE``), of the best single span
    score there, of the span's 1 − p̄ and of the whole answer's 1 − p̄."""
    from isouq.defaults import SPAN_SCORE

    t = _json(root, QA_LONG)["tables"]
    rows = []
    for st, m in _long_order(t.get("auroc", [])):
        mine = {r["score"]: r for r in t["auroc"] if (r["setting"], r["model"]) == (st, m)}
        spans = {TRUST_SPAN_SCORES[k]: r for k, r in mine.items() if k in TRUST_SPAN_SCORES}
        best = max(spans, key=lambda k: spans[k]["auroc"])
        rows.append([f"{EVIDENCE_MODELS.get(m, (m, m))[1]} {st}", str(spans[SPAN_SCORE]["n"]),
                     interval(spans[SPAN_SCORE], 2), f"{best}: {interval(spans[best], 2)}",
                     interval(spans["1 − p̄"], 2),
                     interval(mine["whole 1 − p̄"], 2) if "whole 1 − p̄" in mine else MISSING])
    return _grid(["model, setting", "sentences", f"default: span {SPAN_SCORE}",
                  "best single span score", "span 1 − p̄", "whole answer 1 − p̄"], rows)


SPAN_HEAD = "results/qa_long/span_head.json"


@register("trust_span_head", SPAN_HEAD)
def _trust_span_head(root: Path) -> str:
    """A learned span head, cross-fitted by answer, against the default span score: AUROC for
    the wrong sentences of each, their difference [95% intervals over resampled answers]."""
    doc = _json(root, SPAN_HEAD)

    def cell(v, lo, hi, digits=2):
        return f"{fixed(v, digits)} [{fixed(lo, digits)}, {fixed(hi, digits)}]"

    rows = [[f"{SHORT_NAMES.get(r['model'], r['model'])} {r['setting']}", str(r["sentences"]),
             cell(r["head"], r["head_ci_low"], r["head_ci_high"]),
             cell(r["default_auroc"], r["default_ci_low"], r["default_ci_high"]),
             _minus(cell(r["delta"], r["delta_ci_low"], r["delta_ci_high"])), r["verdict"]]
            for r in sorted(doc["rows"], key=lambda r: (r["setting"], r["model"]))]
    return _grid(["model, setting", "sentences", "span head", f"span {doc['default']}",
                  "Δ (head − default)", "verdict"], rows)


def _point(cell: str) -> float:
    """The value before the interval of a report cell (``0.123 [0.1, 0.2]``)."""
    return float(str(cell).split("[")[0].strip().replace("−", "-"))


@register("trust_answers", POLYGRAPH_REPORT)
def _trust_answers(root: Path) -> str:
    """Per rankable model × dataset × quality metric of the LM-Polygraph benchmark: the PRR
    [95% interval] of isouq's best single score, of its learned block head (cross-fitted) with its
    difference to MSP, of MSP, of the best LM-Polygraph estimator and of the supervised anchor
    (a probe on the hidden state, with its difference to MSP), with the seconds per answer each
    costs beyond the shared greedy generation, and of the stacked head (isouq's scores, MSP and
    the probe's logit)."""
    from isouq.study.analysis.learned_heads import PROBE, STACKED
    from isouq.study.report.polygraph import ANCHOR_MARK, OURS_MARK

    sec = _section(_json(root, POLYGRAPH_REPORT), "lm-polygraph-benchmark")

    def head_rows(name: str) -> dict:
        return {(r["model"], r["dataset"], r["quality"]): r for r in sec.get("heads", [])
                if r["head"] == name}

    heads, probes, stacks = head_rows(TRUST_HEAD), head_rows(PROBE), head_rows(STACKED.name)
    ranked = {(r["model"], r["dataset"], r["quality"]) for r in sec["ranks"]
              if "isouq best" in r and not str(r.get("verdict", "")).startswith("not rankable")}
    by: dict[tuple, list[dict]] = {}
    for r in sec["estimators"]:
        by.setdefault((r["model"], r["dataset"], r["quality"]), []).append(r)
    out = []
    for key, rows in by.items():
        if key not in ranked:
            continue
        named = {r["estimator"]: r for r in rows}
        singles = [r for e, r in named.items() if e.startswith("★ Isouq")]
        theirs = [r for e, r in named.items() if not e.startswith((OURS_MARK, ANCHOR_MARK))]
        best_ours = max(singles, key=lambda r: _point(r["PRR [95% CI]"]))
        best_theirs = max(theirs, key=lambda r: _point(r["PRR [95% CI]"]))
        msp = named.get("MaximumSequenceProbability")
        h, pr, st = heads.get(key), probes.get(key), stacks.get(key)

        def cost(r):
            return MISSING if r is None or r.get("s / answer") is None else sig(r["s / answer"])

        def vs_msp(r):
            return f"{_minus(r['PRR [95% CI]'])}; Δ {_minus(r['Δ PRR vs MSP'])}" if r else MISSING

        out.append([_setting(key[0], key[1]), key[2],
                    f"{best_ours['estimator'][2:]}: {_minus(best_ours['PRR [95% CI]'])}",
                    vs_msp(h), _minus(msp["PRR [95% CI]"]) if msp else MISSING,
                    f"{best_theirs['estimator']}: {_minus(best_theirs['PRR [95% CI]'])}",
                    vs_msp(pr), vs_msp(st),
                    f"{cost(best_ours)} / {cost(msp)} / {cost(best_theirs)}"])
    return _grid(["model × dataset", "quality", "isouq's best single score",
                  f"learned head ({TRUST_HEAD}), Δ vs MSP", "MSP",
                  "best LM-Polygraph estimator", "hidden-state probe (anchor), Δ vs MSP",
                  "isouq scores + MSP + probe (stacked), Δ vs MSP",
                  "s / answer (isouq / MSP / best)"], out)


@value("trust_heads_verdict", POLYGRAPH_REPORT)
def _v_trust_heads_verdict(root: Path) -> str:
    """The kept report's verdict on the learned heads against MSP (or that none is kept)."""
    report = _json(root, POLYGRAPH_REPORT)
    notes = next(s["notes"] for s in report["sections"] if s["id"] == "lm-polygraph-benchmark")
    said = [n for n in notes if n.startswith("Learned P(correct)")]
    return said[0] if said else ("the kept report holds no learned head yet "
                                 "(scripts/polygraph/heads.py, then isouq report)")


# The prose of docs/trust.md's whole-answer section: each count, setting and difference read
# from the kept report's heads table (and, for the probe's choices, the heads files).
POLYGRAPH_HEADS = "results/polygraph/heads/*.json"
POLYGRAPH_PROBES = "results/polygraph/features/*.probe.json"
#: LM-Polygraph's quality metric names, by the report's names
QUALITY_METRICS = {"ROUGE-L": "Rouge_rougeL", "accuracy": "Accuracy"}
#: the head on isouq's scores and MSP's quantity without the block profile
#: (``isouq.study.analysis.learned_heads.HEADS``)
SCORES_AND_MSP = "isouq scores + MSP"


def _head_rows(root: Path, head: str) -> list[dict]:
    """The kept report's rows of ``head`` against MSP (every setting, judged or not)."""
    rows = _section(_json(root, POLYGRAPH_REPORT), "lm-polygraph-benchmark").get("heads", [])
    return [r for r in rows if r["head"] == head]


def _transferred_rows(root: Path, head: str) -> list[dict]:
    """The kept report's rows of ``head`` trained on the model's other dataset, both ways."""
    return [r for d in DATASETS for r in _head_rows(root, f"{head} (trained on {d})")]


def _named(rows: Sequence[Mapping], trained: bool = False, delta: bool = False) -> str:
    """The settings of ``rows`` in words (model × dataset quality[, trained on the other]
    [: the row's Δ PRR vs MSP])."""
    def one(r: Mapping) -> str:
        name = f"{_setting(r['model'], r['dataset'])} {r['quality']}"
        if trained and "(trained on " in r["head"]:
            other = r["head"].rsplit("(trained on ", 1)[1].rstrip(")")
            name += f", trained on {DATASETS.get(other, other)}"
        if delta:
            name += f": {_minus(r['Δ PRR vs MSP'])}"
        return name
    return "; ".join(one(r) for r in rows)


def _against(root: Path, head: str, other: str = "MSP", names: str = "ahead below",
             trained: bool = False) -> tuple[int, str]:
    """How many settings ``head`` is judged in against ``other``, and the verdict in words:
    ahead / within noise / below, naming the settings of the verdicts in ``names``."""
    return _verdicts_said(_head_rows(root, head), other, names, trained)


def _verdicts_said(rows: Sequence[Mapping], other: str = "MSP", names: str = "ahead below",
                   trained: bool = False, delta: bool = False) -> tuple[int, str]:
    """How many of ``rows`` are judged against ``other``, and their verdicts in words, naming
    the settings of the verdicts in ``names`` (with their Δ PRR vs MSP when ``delta``)."""
    from isouq.study.report.polygraph import verdict_groups

    groups = dict(zip(("ahead", "within", "below"), verdict_groups(rows, other), strict=True))

    def part(word: str, label: str) -> str:
        g = groups[word]
        said = f"{label} in {len(g)}"
        return (f"{said} ({_named(g, trained, delta)})" if g and word in names.split()
                else said)

    n = sum(map(len, groups.values()))
    return n, (f"{part('ahead', 'ahead beyond noise')}, {part('within', 'within noise')} and "
               f"{part('below', 'below')}")


def _meets_goal(rows: Sequence[Mapping]) -> bool:
    """Issue 50's goal over a head's rows against MSP: judged somewhere, never below MSP beyond
    noise, and ahead beyond noise in most (more than half) of the settings it is judged in."""
    from isouq.study.report.polygraph import verdict_counts

    ahead, within, below = verdict_counts(rows)
    n = ahead + within + below
    return bool(n) and not below and 2 * ahead > n


@value("trust_goal", POLYGRAPH_REPORT)
def _v_trust_goal(root: Path) -> str:
    """Which cross-fitted heads meet issue 50's goal against MSP over the rankable settings:
    never below beyond noise and ahead beyond noise in most (more than half)."""
    from isouq.study.analysis.learned_heads import HEADS, STACKED

    met, short = [], []
    for head in (STACKED.name, *HEADS):
        (met if _meets_goal(_head_rows(root, head)) else short).append(head)
    if not met:
        return "met by no head on the kept run"
    return (f"met on the kept run by {', '.join(f'“{h}”' for h in met)}"
            + (f" and not by {', '.join(f'“{h}”' for h in short)}" if short else ""))


@value("trust_control_below", POLYGRAPH_REPORT)
def _v_trust_control_below(root: Path) -> str:
    """How often MSP's own map, cross-fitted (the control), is below MSP beyond noise, and its
    largest loss (what cross-fitting itself costs a score)."""
    from isouq.study.analysis.learned_heads import CONTROL
    from isouq.study.report.polygraph import verdict_groups

    ahead, within, below = verdict_groups(_head_rows(root, CONTROL.name))
    n = len(ahead) + len(within) + len(below)
    worst = min((_point(r["Δ PRR vs MSP"]) for r in ahead + within + below), default=0.0)
    return (f"in {len(below)} of the {n} settings (its PRR at most "
            f"{_minus(fixed(-worst, 3))} below MSP's)")


@value("trust_single_above_msp", POLYGRAPH_REPORT)
def _v_trust_single_above_msp(root: Path) -> str:
    """The rankable settings where isouq's best single score has a higher PRR than MSP (point
    estimates), named, with that score."""
    from isouq.study.report.polygraph import HEAD_VERDICTS

    sec = _section(_json(root, POLYGRAPH_REPORT), "lm-polygraph-benchmark")
    ranked = {(r["model"], r["dataset"], r["quality"]) for r in _head_rows(root, TRUST_HEAD)
              if r["verdict"] in HEAD_VERDICTS}
    above = []
    for key in sorted(ranked):
        named = {r["estimator"]: r for r in sec["estimators"]
                 if (r["model"], r["dataset"], r["quality"]) == key}
        singles = [r for e, r in named.items() if e.startswith("★ Isouq")]
        best = max(singles, key=lambda r: _point(r["PRR [95% CI]"]))
        msp = named["MaximumSequenceProbability"]
        if _point(best["PRR [95% CI]"]) > _point(msp["PRR [95% CI]"]):
            above.append(f"{_setting(key[0], key[1])} {key[2]} ({best['estimator'][2:]}: "
                         f"{_minus(best['PRR [95% CI]'])} against {_minus(msp['PRR [95% CI]'])})")
    return (f"in {len(above)} of the {len(ranked)} rankable settings"
            + (f": {'; '.join(above)}" if above else ""))


@value("trust_stacked_vs_msp", POLYGRAPH_REPORT)
def _v_trust_stacked_vs_msp(root: Path) -> str:
    """The stacked head (cross-fitted) against MSP over the rankable settings, naming them."""
    from isouq.study.analysis.learned_heads import STACKED

    n, said = _against(root, STACKED.name)
    return f"over the {n} rankable settings, {said}"


@value("trust_stacked_vs_block", POLYGRAPH_REPORT)
def _v_trust_stacked_vs_block(root: Path) -> str:
    """The stacked head against the block head on the same answers."""
    from isouq.study.analysis.learned_heads import STACKED

    n, said = _against(root, STACKED.name, TRUST_HEAD, names="below")
    return f"over the {n}, {said}"


@value("trust_backward_heads_vs_msp", POLYGRAPH_REPORT)
def _v_trust_backward_heads_vs_msp(root: Path) -> str:
    """The heads on the one backward alone (the block head, isouq's scores + MSP) against MSP."""
    n, block = _against(root, TRUST_HEAD)
    _, scores = _against(root, SCORES_AND_MSP)
    return f"over the {n}, the block head is {block}; \"{SCORES_AND_MSP}\" is {scores}"


@value("trust_largest_stacked_gain", POLYGRAPH_REPORT)
def _v_trust_largest_stacked_gain(root: Path) -> str:
    """The setting where the stacked head's PRR is furthest ahead of MSP, its difference and
    the block head's there [95% intervals]."""
    from isouq.study.analysis.learned_heads import STACKED
    from isouq.study.report.polygraph import HEAD_VERDICTS

    judged = [r for r in _head_rows(root, STACKED.name) if r["verdict"] in HEAD_VERDICTS]
    best = max(judged, key=lambda r: _point(r["Δ PRR vs MSP"]))
    key = (best["model"], best["dataset"], best["quality"])
    block = next(r for r in _head_rows(root, TRUST_HEAD)
                 if (r["model"], r["dataset"], r["quality"]) == key)
    return (f"on {_named([best])} the stacked head's PRR is {_minus(best['Δ PRR vs MSP'])} "
            f"ahead of MSP's, the block head's {_minus(block['Δ PRR vs MSP'])}")


@value("trust_triviaqa_heads", POLYGRAPH_REPORT)
def _v_trust_triviaqa_heads(root: Path) -> str:
    """On TriviaQA, where MSP is strong: the stacked and the block head's differences to MSP
    where ahead beyond noise, over TriviaQA's rankable settings."""
    from isouq.study.analysis.learned_heads import STACKED
    from isouq.study.report.polygraph import verdict_groups

    def said(head: str, label: str) -> str:
        rows = [r for r in _head_rows(root, head) if r["dataset"] == "triviaqa"]
        ahead, within, below = verdict_groups(rows)
        out = f"{label} is ahead of MSP beyond noise in {len(ahead)}"
        if ahead:
            out += " (" + "; ".join(f"{_named([r])}: {_minus(r['Δ PRR vs MSP'])}"
                                    for r in ahead) + ")"
        return out, len(ahead) + len(within) + len(below)

    stacked, n = said(STACKED.name, "the stacked head")
    block, _ = said(TRUST_HEAD, "the block head")
    return f"over TriviaQA's {n} rankable settings, {stacked}, {block}"


@value("trust_probe_vs_msp", POLYGRAPH_REPORT)
def _v_trust_probe_vs_msp(root: Path) -> str:
    """The supervised anchor (a probe on the hidden state) against MSP."""
    from isouq.study.analysis.learned_heads import PROBE

    n, said = _against(root, PROBE, names="below")
    return f"over the {n} settings, {said}"


@value("trust_probe_vs_block", POLYGRAPH_REPORT)
def _v_trust_probe_vs_block(root: Path) -> str:
    """The probe against the block head on the same answers, naming where either is ahead."""
    from isouq.study.analysis.learned_heads import PROBE

    n, said = _against(root, PROBE, TRUST_HEAD)
    return f"over the {n}, {said}"


def _chosen(root: Path, head: str) -> list[tuple[str, str]]:
    """Over the rankable settings with kept heads files: (each fold's choice of ``head``, the
    probe's middle layer there as ``hidden_states[k]``), folds too small to fit left out."""
    from isouq.study.report.polygraph import HEAD_VERDICTS

    out = []
    for r in _head_rows(root, TRUST_HEAD):
        if r["verdict"] not in HEAD_VERDICTS:
            continue
        name = f"{r['dataset']}__{r['model']}"
        heads = _json(root, f"{POLYGRAPH}/heads/{name}.json")
        states = _json(root, f"{POLYGRAPH}/features/{name}.probe.json")["states"]
        middle = re.search(r"hidden_states\[([^\]]*)\]", states).group(1).split(", ")[1]
        for c in heads["metrics"][QUALITY_METRICS[r["quality"]]]["chosen"].get(head, []):
            if "too few" not in c:
                out.append((c, f"hidden_states[{middle}]"))
    return out


@value("trust_probe_depth", POLYGRAPH_REPORT, POLYGRAPH_HEADS, POLYGRAPH_PROBES)
def _v_trust_probe_depth(root: Path) -> str:
    """In how many of the probe's folds (over the rankable settings) its inner cross-validation
    picked the middle of its depths (half-way up the model)."""
    from isouq.study.analysis.learned_heads import PROBE

    folds = _chosen(root, PROBE)
    return f"{sum(f'{mid},' in c for c, mid in folds)} of the {len(folds)} folds"


@value("trust_stack_reads_probe", POLYGRAPH_REPORT, POLYGRAPH_HEADS)
def _v_trust_stack_reads_probe(root: Path) -> str:
    """In how many of the stacked head's folds its selection kept the probe's logit."""
    from isouq.study.analysis.learned_heads import STACKED

    folds = _chosen(root, STACKED.name)
    return f"{sum('hidden' in c for c, _ in folds)} of the {len(folds)} folds"


@value("trust_transfer_backward_heads", POLYGRAPH_REPORT)
def _v_trust_transfer_backward_heads(root: Path) -> str:
    """The heads that read MSP's quantity, trained on the model's other dataset, against MSP."""
    from isouq.study.report.polygraph import verdict_counts

    def said(head: str) -> str:
        ahead, within, below = verdict_counts(_transferred_rows(root, head))
        return (f"ahead of MSP in {ahead} of {ahead + within + below} settings, within noise "
                f"in {within} and below in {below}")

    return f"\"{SCORES_AND_MSP}\" is {said(SCORES_AND_MSP)}; the block head, {said(TRUST_HEAD)}"


@value("trust_transfer_stacked", POLYGRAPH_REPORT)
def _v_trust_transfer_stacked(root: Path) -> str:
    """The stacked head transferred between datasets against MSP, naming where it is below,
    and the transferred block head below MSP in the same settings."""
    from isouq.study.analysis.learned_heads import STACKED
    from isouq.study.report.polygraph import verdict_groups

    stacked = _transferred_rows(root, STACKED.name)
    ahead, within, below = verdict_groups(stacked)
    where = {(r["model"], r["dataset"], r["quality"]) for r in ahead + within + below}
    block_below = [r for r in verdict_groups(_transferred_rows(root, TRUST_HEAD))[2]
                   if (r["model"], r["dataset"], r["quality"]) in where]
    said = f"over {len(where)} rankable settings: ahead of MSP in {len(ahead)}, within noise in " \
           f"{len(within)}, below in {len(below)}"
    if below:
        said += f" ({_named(below, trained=True)})"
    return said + f"; the block head transferred is below in {len(block_below)} of the same"


POLYGRAPH_FRESH = "results/polygraph/fresh/qwen2.5-coder-1.5b.json"


@value("trust_fresh_answers", POLYGRAPH_FRESH)
def _v_trust_fresh_answers(root: Path) -> str:
    """The stacked and the block head against MSP on the questions answered after the stacked
    head was fixed (``scripts/polygraph/fresh.py``): which questions, per head the verdicts
    over the rankable settings, naming the ahead and below ones with their Δ, and whether the
    stacked head meets the goal there (as ``trust_goal`` judges it)."""
    from isouq.study.analysis.learned_heads import STACKED

    rows = _json(root, POLYGRAPH_FRESH)["rows"]

    def said(head: str) -> str:
        n, text = _verdicts_said([r for r in rows if r["head"] == head], delta=True)
        return f"over {n} rankable settings, {text}"

    met = _meets_goal([r for r in rows if r["head"] == STACKED.name])
    return (f"questions {rows[0]['questions']} of each dataset, the stacked head against MSP: "
            f"{said(STACKED.name)}; the block head: {said(TRUST_HEAD)}. On these answers the "
            f"stacked head {'meets' if met else 'does not meet'} the goal")


@value("trust_largest_model_labels", POLYGRAPH_REPORT)
def _v_trust_largest_model_labels(root: Path) -> str:
    """Questions and right answers of the largest model (Qwen2.5-Coder 1.5B) in the kept report,
    and whether its run is partial."""
    model = "qwen2.5-coder-1.5b"
    report = _json(root, POLYGRAPH_REPORT)
    ranks = [r for r in _section(report, "lm-polygraph-benchmark")["ranks"]
             if r["model"] == model and r["quality"] == "accuracy"]
    said = "; ".join(f"{DATASETS[r['dataset']]}: {r['n']} questions, {r['answers']}"
                     for r in sorted(ranks, key=lambda r: r["dataset"]))
    notes = next(s["notes"] for s in report["sections"] if s["id"] == "lm-polygraph-benchmark")
    partial = any(n.startswith("PARTIAL") and model in n for n in notes)
    return said + (" (a partial run)" if partial else "")


# =========================================================================== the values
# Speed on the CPU: the headline of README.md, docs/index.md and docs/performance.md, as ranges
# over every kept run of benchmarks/score_sequences.py on the 2-core CPU.

SCORE_SEQUENCES_RUNS = "benchmarks/results/score_sequences*.json"
#: rows of at most this many tokens (padded) are "short" (TruthfulQA answers, 69–74 tokens);
#: rows of at least LONG_TOKENS are "long" (few-shot context)
SHORT_TOKENS, LONG_TOKENS = 128, 256


def _cpu_ratio_rows(root: Path) -> list[dict]:
    """One entry per (kept CPU run, batch) of ``benchmarks/score_sequences.py``: its file, batch,
    tokens per row, ``ghost/floor`` (median of the rounds) and ``loop/ghost`` (where the run
    has the loop). A CPU run is a file with ``ratios`` whose machine has 2 CPUs."""
    out = []
    for path in sorted(root.glob(SCORE_SEQUENCES_RUNS)):
        d = json.loads(path.read_text("utf-8"))
        if "ratios" not in d or d.get("machine", {}).get("cpus") != 2:
            continue
        tokens = {r["batch"]: r["tokens_padded"] for r in d["rows"] if r["method"] == "ghost"}
        for r in d["ratios"]:
            if r["batch"] in tokens:
                out.append({"file": path.name, "batch": r["batch"], "tokens": tokens[r["batch"]],
                            "ghost/floor": r.get("ghost/floor"), "loop/ghost": r.get("loop/ghost")})
    if not out:
        raise FileNotFoundError(f"{SCORE_SEQUENCES_RUNS}: no kept CPU run of "
                                "benchmarks/score_sequences.py")
    return out


def _short(root: Path) -> list[dict]:
    return [r for r in _cpu_ratio_rows(root) if r["tokens"] < SHORT_TOKENS and r["batch"] >= 16]


def _long(root: Path) -> list[dict]:
    return [r for r in _cpu_ratio_rows(root) if r["tokens"] >= LONG_TOKENS]


def _two(x: float) -> str:
    return fixed(x, 2)


def _one(x: float) -> str:
    return fixed(x, 1)


@value("cpu_short_tokens", SCORE_SEQUENCES_RUNS)
def _v_cpu_short_tokens(root: Path) -> str:
    """Tokens per row (padded) of the short-row CPU runs."""
    return span((r["tokens"] for r in _short(root)), count)


@value("cpu_short_batches", SCORE_SEQUENCES_RUNS)
def _v_cpu_short_batches(root: Path) -> str:
    """Batch sizes of the short-row CPU runs."""
    return span((r["batch"] for r in _short(root)), count)


@value("cpu_short_runs", SCORE_SEQUENCES_RUNS)
def _v_cpu_short_runs(root: Path) -> str:
    """How many (run, batch) measurements the short-row ranges cover, in how many files."""
    rows = _short(root)
    return f"{len(rows)} measurements in {len({r['file'] for r in rows})} kept runs"


@value("cpu_short_loop_over_ghost", SCORE_SEQUENCES_RUNS)
def _v_cpu_short_loop_over_ghost(root: Path) -> str:
    """loop / ghost over the short-row CPU runs that timed the loop."""
    return span((r["loop/ghost"] for r in _short(root) if r["loop/ghost"]), _one) + "×"


@value("cpu_short_ghost_over_floor", SCORE_SEQUENCES_RUNS)
def _v_cpu_short_ghost_over_floor(root: Path) -> str:
    """ghost / floor (each run's median over its rounds) over the short-row CPU runs."""
    return span((r["ghost/floor"] for r in _short(root)), _two)


@value("cpu_long_tokens", SCORE_SEQUENCES_RUNS)
def _v_cpu_long_tokens(root: Path) -> str:
    """Tokens per row of the long-row CPU runs."""
    return span((r["tokens"] for r in _long(root)), count)


@value("cpu_long_loop_over_ghost", SCORE_SEQUENCES_RUNS)
def _v_cpu_long_loop_over_ghost(root: Path) -> str:
    """loop / ghost over the long-row CPU runs that timed the loop."""
    return span((r["loop/ghost"] for r in _long(root) if r["loop/ghost"]), _one) + "×"


@value("cpu_long_ghost_over_floor", SCORE_SEQUENCES_RUNS)
def _v_cpu_long_ghost_over_floor(root: Path) -> str:
    """ghost / floor over the long-row CPU runs."""
    return span((r["ghost/floor"] for r in _long(root)), _two)


@value("cpu_main_by_round", SCORE_SEQUENCES, SCORE_SEQUENCES_WARM3)
def _v_cpu_main_by_round(root: Path) -> str:
    """ghost / floor of every round of the first two tables of docs/performance.md."""
    by_round = [float(x) for rel in (SCORE_SEQUENCES, SCORE_SEQUENCES_WARM3)
                for r in _json(root, rel)["ratios"] for x in r["ghost/floor by round"].split(",")]
    return span(by_round, _two)


@value("cpu_ghost_over_full_backward", SCORE_SEQUENCES)
def _v_cpu_ghost_over_full_backward(root: Path) -> str:
    """ghost / (forward + full backward), seconds per answer, per batch of the first table."""
    return span((s["ghost"]["seconds_per_answer"] / s["full_backward"]["seconds_per_answer"]
                 for s, _ in _batches(_json(root, SCORE_SEQUENCES)).values()), _two)


def _ab_by_batch(root: Path, fmt: Callable[[dict], str]) -> str:
    """``fmt(summary row)`` per batch size of the before/after run: "… at batch 16 and … at
    batch 32"."""
    return " and ".join(f"{fmt(s)} at batch {s['batch']}"
                        for s in _json(root, SCORE_SEQUENCES_AB)["summary"])


@value("ab_runs", SCORE_SEQUENCES_AB)
def _v_ab_runs(root: Path) -> str:
    """The before/after run's commits, rounds and timed calls, and the 1-minute load average
    around its runs."""
    d = _json(root, SCORE_SEQUENCES_AB)
    load = span((x for r in d["runs"] for x in r["load_1min"]), _two)
    return (f"{d['before']} against {d['after']}, {d['rounds']} rounds of {d['repeats']} timed "
            f"calls of each after {d['warmups']} untimed; 1-minute load average {load}")


@value("ab_ghost_after_over_before", SCORE_SEQUENCES_AB)
def _v_ab_ghost(root: Path) -> str:
    """ghost's seconds per answer, after / before, per batch size."""
    return _ab_by_batch(root, lambda s: _two(s["after/before"]["ghost"]["ratio"]))


@value("ab_hf_floor_after_over_before", SCORE_SEQUENCES_AB)
def _v_ab_hf_floor(root: Path) -> str:
    """The independent floor's seconds per answer, after / before, per batch size."""
    return _ab_by_batch(root, lambda s: _two(s["after/before"]["hf_floor"]["ratio"]))


@value("ab_ghost_over_hf_floor_after_over_before", SCORE_SEQUENCES_AB)
def _v_ab_ghost_over_hf_floor(root: Path) -> str:
    """ghost / independent floor, after / before, per batch size."""
    return _ab_by_batch(root, lambda s: _two(s["after/before"]["ghost/hf_floor"]["ratio"]))


@value("ab_noise", SCORE_SEQUENCES_AB)
def _v_ab_noise(root: Path) -> str:
    """The independent floor's (max − min) / median over both sides' rounds, per batch size."""
    return _ab_by_batch(root, lambda s: f"{100 * s['noise']['both']:.0f}%")


@value("ab_all_inside_noise", SCORE_SEQUENCES_AB)
def _v_ab_all_inside(root: Path) -> str:
    """Whether every after / before of the run is inside the noise, in words."""
    beyond = [f"{name} at batch {s['batch']}" for s in _json(root, SCORE_SEQUENCES_AB)["summary"]
              for name, ab in s["after/before"].items() if not ab["inside_noise"]]
    return ("every after / before is inside the noise" if not beyond else
            "beyond the noise: " + ", ".join(beyond))


def _pct(x: float, n: int = 2) -> str:
    """A fraction as a percent, ``n`` significant digits (0.0194 → 1.9%)."""
    return f"{sig(100 * x, n)}%"


@value("cpu_b1_ghost_s", "benchmarks/results/score_sequences_b1.json")
def _v_cpu_b1_ghost_s(root: Path) -> str:
    """ghost's seconds per answer at batch 1 and 16 (``score_sequences_b1.json``)."""
    s = _batches(_json(root, "benchmarks/results/score_sequences_b1.json"))
    return " and ".join(f"{sig(s[b][0]['ghost']['seconds_per_answer'])} s per answer at batch {b}"
                        for b in sorted(s))


@value("peer_opacus_ghost_over_isouq", PEER_OPACUS)
def _v_peer_opacus_speed(root: Path) -> str:
    """Opacus ghost clipping's seconds over isouq's (``peer_opacus``)."""
    rows = _by(_json(root, PEER_OPACUS)["rows"], "method")
    return f"{rows['opacus_ghost']['over_isouq']:.2f}×"


@value("peer_opacus_memory", PEER_OPACUS)
def _v_peer_opacus_memory(root: Path) -> str:
    """Peak RSS of isouq against Opacus ghost clipping."""
    rows = _by(_json(root, PEER_OPACUS)["rows"], "method")
    return (f"{rows['isouq']['peak_rss_gib']:.2f} against "
            f"{rows['opacus_ghost']['peak_rss_gib']:.2f} GiB")


BUCKETING = "benchmarks/results/bucketing_cpu.json"


@value("bucketing", BUCKETING)
def _v_bucketing(root: Path) -> str:
    """What sorting by length did (``benchmarks/bucketing.py``)."""
    d = _json(root, BUCKETING)
    return (f"cuts padding from {_pct(d['padding_share_input_order'])} to "
            f"{_pct(d['padding_share_bucketed'], 1)} of the tokens and raises throughput "
            f"{fixed(d['speedup'], 2)}×, from {fixed(d['answers_per_s_input_order'], 1)} to "
            f"{fixed(d['answers_per_s_bucketed'], 1)} answers per second ({d['n']} answers, "
            f"batch {d['batch']})")


@value("bucketing_answers_per_s", BUCKETING)
def _v_bucketing_rate(root: Path) -> str:
    """Answers per second with and without length bucketing."""
    d = _json(root, BUCKETING)
    return (f"{fixed(d['answers_per_s_bucketed'], 1)} SmolLM2 answers per second with length "
            f"bucketing ({fixed(d['answers_per_s_input_order'], 1)} without")


MEMORY_REPEAT_BEFORE = "benchmarks/results/memory_repeat_ghost_before_fix.json"


@value("memory_repeat_before_fix", MEMORY_REPEAT_BEFORE)
def _v_memory_repeat_before(root: Path) -> str:
    """Growth per call of the run before the leak fix."""
    t = _json(root, MEMORY_REPEAT_BEFORE)["trace"]
    tensors = {b["live_tensors"] - a["live_tensors"] for a, b in zip(t, t[1:], strict=False)}
    gib = [b["rss_gib"] - a["rss_gib"] for a, b in zip(t, t[1:], strict=False)]
    return (f"+{span(tensors, count)} live tensors and +{span(gib, _two)} GiB a call")


SOAK = ("benchmarks/results/soak_20000_part1.json", "benchmarks/results/soak_20000_part2.json",
        "benchmarks/results/soak_20000.json")


@register("soak_windows", *SOAK)
def _soak_windows(root: Path) -> str:
    """Peak resident memory of each soak run by 1,024-row window of the input (the window of
    the rows written so far, from each run's ``trace`` of (seconds, rows, RSS bytes)); equal
    neighbours merged."""
    rows = []
    for rel in SOAK:
        d = _json(root, rel)
        peak: dict[int, float] = {}
        for _, written, rss in d["trace"]:
            w = written // 1024
            peak[w] = max(peak.get(w, 0.0), rss / 2**30)
        cells, run = [], []
        for w in sorted(peak):
            if run and fixed(peak[run[-1]], 2) == fixed(peak[w], 2) and w == run[-1] + 1:
                run.append(w)
                continue
            if run:
                cells.append(run)
            run = [w]
        cells.append(run)
        text = ", ".join((f"{c[0]}–{c[-1]}: {fixed(peak[c[0]], 2)} each" if len(c) > 1
                          else f"{c[0]}: {fixed(peak[c[0]], 2)}") for c in cells)
        rows.append([f"{count(d['rows_before'])}–{count(d['rows_before'] + d['rows_scored_now'])}",
                     text])
    return _grid(["rows of this run", "window (rows ÷ 1,024): peak RSS (GiB)"], rows)


@value("soak_runs", *SOAK)
def _v_soak_runs(root: Path) -> str:
    """Where each run of the soak started and what it wrote, and whether the last finished."""
    runs = [_json(root, rel) for rel in SOAK]
    parts = [f"{count(r['rows_before'])} rows before it, {count(r['rows_scored_now'])} scored"
             for r in runs]
    last = runs[-1]
    return (f"{'; '.join(parts)}; the last run reports the file "
            f"{'finished' if last['finished'] else 'not finished'} at {count(last['rows'])} rows")


@value("soak_last_run", SOAK[-1])
def _v_soak_last(root: Path) -> str:
    """Rows, seconds and rate of the last soak run."""
    d = _json(root, SOAK[-1])
    return (f"{count(d['rows_scored_now'])} rows in {d['elapsed_s']:,.0f} s "
            f"({fixed(d['rows_per_s'], 2)} rows/s)")


@value("soak_first_rate", SOAK[0])
def _v_soak_first(root: Path) -> str:
    """Rate of the first soak run."""
    return f"{fixed(_json(root, SOAK[0])['rows_per_s'], 2)} rows/s"


HALF_CPU = "benchmarks/results/half_precision.json"
HALF_CUDA = "benchmarks/results/half_precision_cuda.json"


@register("half_precision_cpu", HALF_CPU)
def _half_precision_cpu(root: Path) -> str:
    """Relative error of ‖∇θ p̄‖² against the float32 loop, and Spearman ρ of the answers'
    ranking with it, per dtype and method (``benchmarks/half_precision.py``)."""
    rows = []
    for dtype, d in _json(root, HALF_CPU)["dtypes"].items():
        for key, label, rho in (("ghost", "ghost (float32 terms), batch of 16", "ghost_spearman_f32"),
                                ("ghost_b1", "ghost, one answer per batch", None),
                                ("loop", f"loop (autograd in {dtype})", "loop_spearman_f32")):
            rows.append([dtype, label, _pct(d[f"{key}_vs_f32_median"]),
                         _pct(d[f"{key}_vs_f32_max"]), fixed(d[rho], 3) if rho else MISSING])
    return _grid(["dtype", "method", "median rel. error", "max rel. error", "Spearman ρ"], rows)


@register("half_precision_same_dtype", HALF_CPU)
def _half_precision_same_dtype(root: Path) -> str:
    """Answer by answer: ghost alone against the same-dtype loop, and ghost batched against
    ghost alone."""
    rows = []
    for dtype, d in _json(root, HALF_CPU)["dtypes"].items():
        rows.append([dtype, f"median {_pct(d['ghost_b1_vs_loop_median'])}, max "
                            f"{_pct(d['ghost_b1_vs_loop_max'])}",
                     f"median {_pct(d['ghost_vs_ghost_b1_median'])}, max "
                     f"{_pct(d['ghost_vs_ghost_b1_max'])}"])
    return _grid(["dtype", "ghost, one answer per batch vs loop",
                  "ghost, batch of 16 vs one per batch"], rows)


def _half_value(rel: str, dtype: str, key: str, fmt: Callable[[float], str] = _pct):
    def fn(root: Path) -> str:
        return fmt(_json(root, rel)["dtypes"][dtype][key])
    fn.__doc__ = f"``{key}`` of {dtype} in ``{rel}``."
    return fn


#: the half-precision numbers the docs quote: (file, its tag, dtype, key)
HALF_VALUES = (
    *((HALF_CPU, "cpu", "bfloat16", k) for k in (
        "ghost_b1_vs_loop_median", "ghost_b1_vs_loop_max", "ghost_vs_ghost_b1_median",
        "ghost_vs_ghost_b1_max", "ghost_vs_f32_median", "ghost_b1_vs_f32_median")),
    *((HALF_CPU, "cpu", "float16", k) for k in (
        "ghost_vs_ghost_b1_median", "loop_vs_f32_max", "ghost_vs_f32_max", "ghost_vs_f32_median")),
    *((HALF_CUDA, "cuda", "bfloat16", k) for k in (
        "ghost_vs_loop_median", "ghost_vs_loop_max", "ghost_b1_vs_loop_median",
        "ghost_b1_vs_loop_max", "ghost_vs_f32_median", "loop_vs_f32_median")),
)
for _rel, _tag, _dtype, _key in HALF_VALUES:
    _short_dtype = {"bfloat16": "bf16", "float16": "fp16"}[_dtype]
    value(f"half_{_tag}_{_short_dtype}_{_key}", _rel)(_half_value(_rel, _dtype, _key))
value("half_cuda_bf16_ghost_spearman", HALF_CUDA)(
    _half_value(HALF_CUDA, "bfloat16", "ghost_spearman_f32", lambda x: fixed(x, 3)))
value("half_cpu_bf16_ghost_spearman", HALF_CPU)(
    _half_value(HALF_CPU, "bfloat16", "ghost_spearman_f32", lambda x: fixed(x, 3)))


# --------------------------------------------------------------------------- values: GPU

GPU_TESTS_LOG = "benchmarks/results/gpu_check_tests_h200.log"
GPU_PAPER_SIZES_LOG = "benchmarks/results/gpu_check_paper_sizes_h200.log"
QUANTIZED_CHECK_LOG = "benchmarks/results/quantized_check_cuda_h200.log"


def _passed(text: str, rel: str) -> int:
    m = re.findall(r"^(\d+) passed", text, re.M)
    if not m:
        raise ValueError(f"{rel}: no pytest summary line (N passed)")
    if re.search(r"^\d+ passed.*\b\d+ failed", text, re.M) or re.search(r"^\d+ failed", text, re.M):
        raise ValueError(f"{rel}: a test failed in the kept log")
    return int(m[-1])


@value("gpu_tests_passed", GPU_TESTS_LOG)
def _v_gpu_tests_passed(root: Path) -> str:
    """Tests passed in the kept GPU test log."""
    return str(_passed(_text(root, GPU_TESTS_LOG), GPU_TESTS_LOG))


@value("gpu_tests_paper_sizes_passed", GPU_PAPER_SIZES_LOG)
def _v_gpu_tests_paper_sizes(root: Path) -> str:
    """Tests passed in the kept GPU log of the half-precision Grams' run."""
    return str(_passed(_text(root, GPU_PAPER_SIZES_LOG), GPU_PAPER_SIZES_LOG))


@value("gpu_tests_stack", GPU_TESTS_LOG)
def _v_gpu_tests_stack(root: Path) -> str:
    """The GPU and software the kept GPU test log names (its first two lines)."""
    first, second = _text(root, GPU_TESTS_LOG).splitlines()[:2]
    return f"{first.split(',')[0]}, {second}"


@value("quantized_check_cuda", QUANTIZED_CHECK_LOG)
def _v_quantized_check(root: Path) -> str:
    """The largest relative difference of the 4-bit rule on the GPU."""
    d = json.loads(_text(root, QUANTIZED_CHECK_LOG).splitlines()[0])
    return f"{d['max_rel_diff_ghost_4bit_vs_dequantized_twin_loop']:.1e}"


@value("cuda_ghost_batch_s", CUDA_SYNC)
def _v_cuda_ghost_batch(root: Path) -> str:
    """Seconds of one ghost batch on the GPU, batches 16 and 32."""
    rows = [r for r in _json(root, CUDA_SYNC)["rows"] if r["method"] == "ghost"]
    return span((r["seconds_batch"] for r in rows), lambda x: sig(x, 2)) + " s"


PAPER_SIZES_F32 = "benchmarks/results/paper_sizes_cuda_bf16_f32grams.json"
PAPER_SIZES_4BIT = "benchmarks/results/paper_sizes_cuda_4bit.json"
PAPER_NAMES = {"olmo-1b": "OLMo 1B", "llama-3.2-3b": "Llama 3.2 3B", "llama-2-7b": "Llama 2 7B",
               "phi-4": "Phi-4 (14B)"}


def _paper_table(root: Path, rel: str = PAPER_SIZES) -> list[dict]:
    return _json(root, rel)["table"]


@value("paper_times", PAPER_SIZES)
def _v_paper_times(root: Path) -> str:
    """The paper's seconds per answer per model, as the kept file records them."""
    p = _json(root, PAPER_SIZES)["paper_seconds_per_answer"]
    return ", ".join(f"{PAPER_NAMES.get(m, m)} {p[m]:g}" for m in p)


@value("paper_times_range", PAPER_SIZES)
def _v_paper_times_range(root: Path) -> str:
    """The range of the paper's seconds per answer."""
    return span(_json(root, PAPER_SIZES)["paper_seconds_per_answer"].values(), lambda x: f"{x:g}")


@value("paper_sizes_params", PAPER_SIZES)
def _v_paper_sizes_params(root: Path) -> str:
    """Billions of parameters of the four architectures as built."""
    n = {}
    for r in _json(root, PAPER_SIZES)["rows"]:
        n.setdefault(r["model"], r["n_params"])
    vals = [f"{x / 1e9:.2f}" for x in n.values()]
    return ", ".join(vals[:-1]) + " and " + vals[-1]


@value("paper_sizes_tokens_b16", PAPER_SIZES)
def _v_paper_sizes_tokens(root: Path) -> str:
    """Tokens per row (padded) at batch 16, and answer tokens on average."""
    r = next(r for r in _json(root, PAPER_SIZES)["rows"] if r["batch"] == 16)
    return f"{r['tokens_padded']} tokens padded at batch 16, {r['answer_tokens_mean']:.0f} answer tokens"


def _paper_column(column: str, batches: Sequence[int], fmt: Callable[[float], str]):
    def fn(root: Path) -> str:
        return span((r[column] for r in _paper_table(root) if r["batch"] in batches
                     and r[column] is not None), fmt)
    fn.__doc__ = f"``{column}`` over the four models at batch {', '.join(map(str, batches))}."
    return fn


for _b in (1, 16, 64):
    value(f"paper_sizes_ghost_over_floor_b{_b}", PAPER_SIZES)(
        _paper_column("ghost/floor", (_b,), _two))
    value(f"paper_sizes_ghost_over_full_b{_b}", PAPER_SIZES)(
        _paper_column("ghost/(fwd+full bwd)", (_b,), _two))
value("paper_sizes_ghost_s_b1", PAPER_SIZES)(
    _paper_column("ghost s/answer", (1,), lambda x: sig(x, 2)))
value("paper_sizes_ghost_s_b16_up", PAPER_SIZES)(
    _paper_column("ghost s/answer", (16, 64), lambda x: sig(x, 2)))


@value("paper_sizes_3b_batch_s", PAPER_SIZES)
def _v_paper_3b_batch(root: Path) -> str:
    """Seconds of one ghost batch and one floor batch of the 3B model at batches 1 and 16."""
    rows = {(r["method"], r["batch"]): r["seconds_batch"] for r in _json(root, PAPER_SIZES)["rows"]
            if r["model"] == "llama-3.2-3b"}
    return (f"{sig(rows[('ghost', 1)])} s at batch 1 and {sig(rows[('ghost', 16)])} s at batch 16, "
            f"against the floor's {sig(rows[('floor', 1)], 2)} and {sig(rows[('floor', 16)], 2)} s")


PROFILES = {m: f"benchmarks/results/profile_llama-3.2-3b_b16_{m}.txt" for m in ("floor", "ghost")}
#: calls of the method inside the profiler (``benchmarks/paper_sizes.py``, ``profile``)
PROFILED_CALLS = 3


def _profile_ms(root: Path, method: str, op: str | None = None) -> float:
    """Device milliseconds per profiled call: the whole profile (``Self CUDA time total``) or one
    operator's self device time (its row of the table by device time)."""
    text = _text(root, PROFILES[method])
    if op is None:
        m = re.search(r"Self CUDA time total:\s*([\d.]+)ms", text)
        if m is None:
            raise ValueError(f"{PROFILES[method]}: no 'Self CUDA time total' line")
        return float(m[1]) / PROFILED_CALLS
    for line in text.split("by host time")[0].splitlines():
        cells = line.split()
        if cells and cells[0] == op:
            return float(cells[6].removesuffix("ms")) / PROFILED_CALLS  # Self CUDA
    raise ValueError(f"{PROFILES[method]}: no row {op}")


@value("profile_device_ms", *PROFILES.values())
def _v_profile_device_ms(root: Path) -> str:
    """Device time per batch of ghost and of the floor (3B, batch 16)."""
    return (f"{_profile_ms(root, 'ghost'):.0f} ms of device time per batch against "
            f"{_profile_ms(root, 'floor'):.0f} ms")


@value("profile_bmm_ms", *PROFILES.values())
def _v_profile_bmm_ms(root: Path) -> str:
    """The batched products' (``aten::bmm``: the Gram products) share of the difference."""
    return f"{_profile_ms(root, 'ghost', 'aten::bmm') - _profile_ms(root, 'floor', 'aten::bmm'):.0f} ms"


@value("f32grams_b64", PAPER_SIZES_F32, PAPER_SIZES)
def _v_f32grams(root: Path) -> str:
    """ghost's seconds per answer at batch 64, before → after the half-precision Grams."""
    before = {r["model"]: r for r in _paper_table(root, PAPER_SIZES_F32) if r["batch"] == 64}
    after = {r["model"]: r for r in _paper_table(root) if r["batch"] == 64}
    return ", ".join(f"{sig(before[m]['ghost s/answer'], 2)} → {sig(after[m]['ghost s/answer'], 2)} s"
                     f" ({PAPER_NAMES[m]})" for m in after if m in before and m != "olmo-1b")


@value("f32grams_ratio_b64", PAPER_SIZES_F32, PAPER_SIZES)
def _v_f32grams_ratio(root: Path) -> str:
    """ghost / floor at batch 64, before → after."""
    before = {r["model"]: r for r in _paper_table(root, PAPER_SIZES_F32) if r["batch"] == 64}
    after = {r["model"]: r for r in _paper_table(root) if r["batch"] == 64}
    return ", ".join(f"{_two(before[m]['ghost/floor'])} → {_two(after[m]['ghost/floor'])}"
                     for m in after if m in before and m != "olmo-1b")


@value("phi4_memory", PAPER_SIZES)
def _v_phi4_memory(root: Path) -> str:
    """Peak GiB of the 14B model with ghost at batch 16 and 64, and its bfloat16 weights."""
    t = {r["batch"]: r for r in _paper_table(root) if r["model"] == "phi-4"}
    n = next(r["n_params"] for r in _json(root, PAPER_SIZES)["rows"] if r["model"] == "phi-4")
    return (f"{fixed(t[16]['ghost peak GiB'], 1)} GiB at batch 16 and "
            f"{fixed(t[64]['ghost peak GiB'], 1)} GiB at batch 64 with ghost (weights alone, "
            f"2 bytes each: {fixed(2 * n / 2**30, 1)} GiB)")


@value("paper_sizes_4bit", PAPER_SIZES_4BIT, PAPER_SIZES)
def _v_paper_4bit(root: Path) -> str:
    """The 3B model in 4-bit against its floor, and its peak against bfloat16 (batch 16)."""
    (q,) = _paper_table(root, PAPER_SIZES_4BIT)
    bf = next(r for r in _paper_table(root) if r["model"] == "llama-3.2-3b" and r["batch"] == 16)
    return (f"{sig(q['ghost s/answer'])} s per answer against a floor of "
            f"{sig(q['floor s/answer'], 2)} s ({_two(q['ghost/floor'])}×), with a peak of "
            f"{fixed(q['ghost peak GiB'], 1)} GiB against {fixed(bf['ghost peak GiB'], 1)} GiB in "
            "bfloat16")


# --------------------------------------------------------------------------- values: LM-Polygraph


def _polygraph_ranks(root: Path) -> list[dict]:
    return _section(_json(root, POLYGRAPH_REPORT), "lm-polygraph-benchmark")["ranks"]


def _difference_interval(r: Mapping) -> tuple[float, float]:
    """The 95% interval of isouq's best minus the best LM-Polygraph estimator, from the report's
    ``difference [95% CI]`` cell (``-0.024 [-0.049, -0.004]``)."""
    num = r"[-−]?\d[\d.]*(?:e[-+]?\d+)?"  # as format_value writes it: 0.004, 2.92e-04
    m = re.search(rf"\[\s*({num})\s*,\s*({num})\s*\]", r["difference [95% CI]"])
    if m is None:
        raise ValueError(f"{POLYGRAPH_REPORT}: no interval in {r['difference [95% CI]']!r}")
    return tuple(float(x.replace("−", "-")) for x in m.groups())


@value("polygraph_standing", POLYGRAPH_REPORT)
def _v_polygraph_standing(root: Path) -> str:
    """Where isouq's best score stands against the best LM-Polygraph estimator, over the
    rankable settings of the kept report."""
    ok = [r for r in _polygraph_ranks(root) if "isouq best" in r
          and not str(r.get("verdict", "")).startswith("not rankable")]
    if not ok:
        return "no setting of the kept benchmark could rank the estimators"
    cis = [_difference_interval(r) for r in ok]
    ahead = sum(lo > 0 for lo, _ in cis)
    below = sum(hi < 0 for _, hi in cis)
    within = len(ok) - ahead - below
    lead = ("never ahead of the best LM-Polygraph estimator" if ahead == 0 else
            f"ahead of the best LM-Polygraph estimator beyond noise in {ahead}")
    heads = any(str(r.get("isouq best", "")).startswith("isouq ") for r in ok)
    what = ("best estimator (its scores and, where kept, its cross-fitted learned heads)" if heads
            else "best score")
    return (f"over the {len(ok)} rankable settings (model × dataset × quality metric), isouq's "
            f"{what} is {lead}: within noise in {within}, below beyond noise in {below}")


@value("polygraph_head_vs_msp", POLYGRAPH_REPORT)
def _v_polygraph_head_vs_msp(root: Path) -> str:
    """The learned block head (cross-fitted) against MSP and, beside it, the hidden-state probe,
    counted over the rankable settings of the kept report."""
    from isouq.study.analysis.learned_heads import PROBE, STACKED
    from isouq.study.report.polygraph import verdict_counts

    rows = _section(_json(root, POLYGRAPH_REPORT), "lm-polygraph-benchmark").get("heads", [])

    def counts(name: str) -> tuple[int, int, int, int]:
        c = verdict_counts([r for r in rows if r["head"] == name])
        return (sum(c), *c)

    n, ahead, within, below = counts(TRUST_HEAD)
    if not n:
        return "no learned head is kept yet (scripts/polygraph/heads.py, then isouq report)"
    out = (f"over the {n} rankable settings, isouq's learned block head (cross-fitted) is ahead "
           f"of the maximum sequence probability beyond noise in {ahead}, within noise in "
           f"{within} and below in {below}")
    pn, pa, pw, pb = counts(PROBE)
    if pn:
        out += (f"; a supervised probe on the hidden state, fitted on the same answers, is ahead "
                f"in {pa}, within noise in {pw} and below in {pb}")
    sn, sa, sw, sb = counts(STACKED.name)
    if sn:
        out += (f"; and isouq's head with that probe stacked under its scores and MSP "
                f"(`isouq calibrate --features ... hidden`) is ahead in {sa}, within noise in "
                f"{sw} and below in {sb}")
    return out


@value("polygraph_lm_estimators", POLYGRAPH_REPORT)
def _v_polygraph_lm_estimators(root: Path) -> str:
    """How many LM-Polygraph estimators isouq's best is ranked among."""
    ofs = {int(r["rank (of estimators)"].split(" of ")[1]) for r in _polygraph_ranks(root)
           if "rank (of estimators)" in r}
    return span((n - 1 for n in ofs), count)


@value("polygraph_questions", POLYGRAPH_REPORT)
def _v_polygraph_questions(root: Path) -> str:
    """Questions answered per model and dataset in the kept report."""
    return span((r["n"] for r in _polygraph_ranks(root)), count)


@value("polygraph_bootstrap", POLYGRAPH_REPORT)
def _v_polygraph_bootstrap(root: Path) -> str:
    """Bootstrap resamples of the kept report."""
    return count(_json(root, POLYGRAPH_REPORT)["options"]["n_bootstrap"])


@value("polygraph_estimators_per_file", POLYGRAPH)
def _v_polygraph_estimators(root: Path) -> str:
    """Estimators (LM-Polygraph's and isouq's) per kept benchmark file."""
    return span((len(d["estimators"]) for d in _polygraph_docs(root)), count)


# --------------------------------------------------------------------------- values: QA


def _qa_groups(root: Path) -> list[tuple[str, str, int, int]]:
    """(dataset, model, answers, correct by the judge) of each group of the QA study's rows."""
    out = []
    for ds in DATASETS:
        for model in MODELS:
            path = root / QA_ROWS / f"qa_{ds}__{model}.jsonl"
            if path.exists():
                rows = latest_by_key(read_jsonl(path))
                out.append((ds, model, len(rows), sum(bool(x.get("correct")) for x in rows)))
    return out


@value("qa_judge_correct", QA_ROWS)
def _v_qa_judge_correct(root: Path) -> str:
    """The share of open questions answered correctly by the judge, over the study's groups."""
    return span((c / n for _, _, n, c in _qa_groups(root)), lambda x: f"{100 * x:.0f}") + "%"


@value("qa_judge_kappa", QA_REPORT)
def _v_qa_judge_kappa(root: Path) -> str:
    """Cohen's κ of the judge against the hand labels, over the study's groups."""
    rows = _section(_json(root, QA_REPORT), "qa-study")["label_agreement"]
    return span((r["kappa"] for r in rows if r["labels"] == "judge"), _two)


def _qa_raw(root: Path) -> list[dict]:
    return _section(_json(root, QA_REPORT), "qa-study")["raw_auroc"]


@value("qa_pbar_raw_auroc", QA_REPORT)
def _v_qa_pbar_raw(root: Path) -> str:
    """Raw AUROC of p̄ over the study's groups."""
    return span((r["auroc"] for r in _qa_raw(root) if r["score"] == "mean_prob"), _two)


def _score_direction_groups(root: Path, score: str) -> dict[str, int]:
    rows = [r for r in _qa_raw(root) if r["score"] == score]
    return {d: sum(r["score_direction"] == d for r in rows)
            for d in ("higher = wrong", "higher = correct", "none")}


@value("qa_epistemic_log_directions", QA_REPORT)
def _v_qa_epistemic_log_dirs(root: Path) -> str:
    """How the raw ``epistemic_log`` points over the study's groups."""
    d = _score_direction_groups(root, "epistemic_log")
    n = sum(d.values())
    return (f"higher = wrong in {d['higher = wrong']} of {n} groups, no direction in "
            f"{d['none']}, higher = correct in {d['higher = correct']}")


@value("qa_study_bootstrap", QA_REPORT)
def _v_qa_study_bootstrap(root: Path) -> str:
    """Bootstrap resamples of the QA study's report."""
    return count(_json(root, QA_REPORT)["options"]["n_bootstrap"])


@register("qa_study_raw_auroc", QA_REPORT, QA_ROWS)
def _qa_study_raw_auroc(root: Path) -> str:
    """Raw AUROC of each score per group of the QA study (judge labels), oriented as a
    confidence, with its 95% interval and direction."""
    mark = {"higher = correct": "↑", "higher = wrong": "↓", "none": "–"}
    raw = {(r["dataset"], r["model"], r["score"]): r for r in _qa_raw(root)}
    rows = []
    for ds, model, n, c in _qa_groups(root):
        cells = []
        for score in ("mean_prob", "epistemic", "epistemic_log", "aleatoric"):
            r = raw.get((ds, model, score))
            if r is None:
                cells.append(MISSING)
                continue
            d = r["direction"] if score == "mean_prob" else r["score_direction"]
            sym = mark[d] if not (score == "epistemic" and d == "higher = correct") else "✗"
            cells.append(f"{fixed(r['auroc'], 2)} [{fixed(r['ci_low'], 2)}, "
                         f"{fixed(r['ci_high'], 2)}] {sym}")
        rows.append([DATASETS[ds], model, f"{c}/{n}", *cells])
    return _grid(["dataset", "model", "correct/n", "p̄", "epistemic", "epistemic_log",
                  "aleatoric"], rows)


def _evidence(root: Path, sid: str) -> Mapping:
    return _section(_json(root, EVIDENCE), sid)


@value("mc1_questions", EVIDENCE)
def _v_mc1_questions(root: Path) -> str:
    """MC1 questions per model."""
    return span((c["n"] for c in _evidence(root, "qa-evidence-mc")["counts"]), count)


@value("mc1_gradient_raw_auroc", EVIDENCE)
def _v_mc1_gradient_raw(root: Path) -> str:
    """Raw AUROC of −epistemic and −epistemic_log over the MC1 models."""
    rows = [r for r in _evidence(root, "qa-evidence-mc")["raw_auroc"]
            if r["score"] in ("epistemic", "epistemic_log")]
    if not all(r["ci_low"] > 0.5 for r in rows):
        raise ValueError(f"{EVIDENCE}: an MC1 gradient interval holds 0.5; reword the docs")
    return span((r["auroc"] for r in rows), _two)


def _pooled(root: Path, sid: str, method: str, baseline: str) -> Mapping:
    for r in _evidence(root, sid)["paired_pooled"]:
        if r["method"] == method and r["baseline"] == baseline:
            return r
    raise KeyError(f"{EVIDENCE}: no pooled {method} vs {baseline} in {sid}")


@value("mc1_epi_log_vs_pbar", EVIDENCE)
def _v_mc1_epi_log_vs_pbar(root: Path) -> str:
    """The pooled fitted ΔAUROC of ‖∇θ log p̄‖² over p̄ on MC1, with its BH-adjusted p."""
    r = _pooled(root, "qa-evidence-mc", "Epi. log", "p̄")
    return f"ΔAUROC {r['delta_auroc']:+.3f}, p_BH {r['p_bh']:.3f}".replace("-", "−")


@value("short_correct", EVIDENCE)
def _v_short_correct(root: Path) -> str:
    """Correct TriviaQA short answers per model."""
    counts = _by(_evidence(root, "qa-evidence-short")["counts"], "model")
    return ", ".join(f"{EVIDENCE_MODELS[m][1]} {counts[m]['correct']} of {count(counts[m]['n'])}"
                     for m in EVIDENCE_MODELS if m in counts)


@value("short_epistemic_raw_auroc", EVIDENCE)
def _v_short_epistemic_raw(root: Path) -> str:
    """Raw AUROC of −epistemic on TriviaQA short answers over the models (all below 0.5)."""
    rows = [r for r in _evidence(root, "qa-evidence-short")["raw_auroc"] if r["score"] == "epistemic"]
    if not all(r["ci_high"] < 0.5 for r in rows):
        raise ValueError(f"{EVIDENCE}: a short-answer epistemic interval reaches 0.5; reword")
    return span((r["auroc"] for r in rows), _two)


@value("short_label_quality", EVIDENCE)
def _v_short_label_quality(root: Path) -> str:
    """Alias match and token F1 against the hand labels of the short answers."""
    rows = _by(_evidence(root, "qa-evidence-short")["label_quality"], "labels")
    a, f = rows["alias match"], rows["token F1 ≥ 0.5"]
    return (f"{a['n']} hand labels: alias match κ {_two(a['kappa'])}, accuracy {_two(a['accuracy'])}, "
            f"{a['false yes']} false yes, {a['false no']} false no; token F1 ≥ 0.5 κ {_two(f['kappa'])}")


def _raw(root: Path, sid: str, table: str, score: str) -> list[dict]:
    return [r for r in _evidence(root, sid)[table] if r["score"] == score]


@value("mc1_pooled_gradient", EVIDENCE)
def _v_mc1_pooled_gradient(root: Path) -> str:
    """Pooled raw AUROC of −epistemic_log and −epistemic on MC1, with intervals."""
    (lg,) = _raw(root, "qa-evidence-mc", "raw_pooled", "epistemic_log")
    (ep,) = _raw(root, "qa-evidence-mc", "raw_pooled", "epistemic")
    return f"{interval(lg)} and {interval(ep)}"


@value("mc1_epi_log_pooled_wins", EVIDENCE)
def _v_mc1_epi_log_wins(root: Path) -> str:
    """The baselines the fitted ‖∇θ log p̄‖² beats pooled on MC1 (BH), with the Δ range and p."""
    rows = [r for r in _evidence(root, "qa-evidence-mc")["paired_pooled"]
            if r["method"] == "Epi. log" and r["significant"] and r["delta_auroc"] > 0]
    label = {"Max prob.": "the maximum option probability", "Option ent.": "the option entropy"}
    names = ", ".join(label.get(r["baseline"], r["baseline"]) for r in rows)
    return (f"{names} (ΔAUROC {span((r['delta_auroc'] for r in rows), lambda x: f'{x:+.2f}')}, "
            f"p_BH ≤ {max(r['p_bh'] for r in rows):.3f})").replace("–", " to ")


@value("short_epistemic_log_raw_auroc", EVIDENCE)
def _v_short_epistemic_log(root: Path) -> str:
    """Raw AUROC of −epistemic_log on the short answers per model, and pooled."""
    per = _raw(root, "qa-evidence-short", "raw_auroc", "epistemic_log")
    (pooled,) = _raw(root, "qa-evidence-short", "raw_pooled", "epistemic_log")
    return f"{span((r['auroc'] for r in per), _two)}, pooled {fixed(pooled['auroc'], 3)}"


# --------------------------------------------------------------------------- values: spans


def _long_auroc(root: Path) -> list[dict]:
    return _json(root, QA_LONG)["tables"].get("auroc", [])


@value("long_epistemic_log_wrong_way", QA_LONG)
def _v_long_epistemic_log_wrong_way(root: Path) -> str:
    """Where the span ``epistemic_log`` points the wrong way on the labelled sentences of
    ``qa long`` (interval below 0.5), of how many model × setting cells."""
    rows = [r for r in _long_auroc(root) if r["score"] == "span epistemic_log"]
    wrong = [r for r in rows if r["ci_high"] < 0.5]
    what = ", ".join(f"{EVIDENCE_MODELS.get(r['model'], (r['model'], r['model']))[1]} "
                     f"{r['setting']} {interval(r)}" for r in wrong)
    cells = f"{len(wrong)} of the {len(rows)} model × setting cells"
    return f"{cells} ({what})" if wrong else cells


@value("spans_cpu_sizes", SPANS_CPU)
def _v_spans_sizes(root: Path) -> str:
    """What ``benchmarks/spans.py`` scored."""
    d = _json(root, SPANS_CPU)
    return (f"{d['answers']} answers, {d['spans']} sentences, {d['answer_tokens_mean']:.1f} answer "
            f"tokens on average, at most {d['prompt_plus_answer_tokens_max']} with the prompt")


@value("spans_cpu_rows_batch", SPANS_CPU)
def _v_spans_rows_batch(root: Path) -> str:
    """Answers per pass of the rows form in the kept run."""
    return str(_json(root, SPANS_CPU)["meta"]["rows_batch"])


@value("spans_retain_over_whole", SPANS_CPU)
def _v_spans_retain_over_whole(root: Path) -> str:
    """Wall time of span scores (ghost) over the whole-answer score."""
    return f"{_json(root, SPANS_CPU)['retain_over_whole']:.1f}×"


@value("spans_loop_over_retain", SPANS_CPU)
def _v_spans_loop_over_retain(root: Path) -> str:
    """Wall time of the per-span loop over span scores (ghost)."""
    return f"{_json(root, SPANS_CPU)['loop_over_retain']:.1f}×"


@value("spans_max_rel_diff", SPANS_CPU)
def _v_spans_max_rel_diff(root: Path) -> str:
    """Largest relative difference of a span's epistemic, ghost against the loop."""
    return f"{_json(root, SPANS_CPU)['max_rel_diff_retain_vs_loop']:.1e}"


@value("spans_memory", *SPANS_ALONE.values())
def _v_spans_memory(root: Path) -> str:
    """Peak RSS of span scores (ghost) against the whole-answer score, each alone."""
    a = {m: _json(root, SPANS_ALONE[m])["peak_rss_gib"] for m in ("spans_retain", "whole")}
    return f"{a['spans_retain']:.2f} against {a['whole']:.2f} GiB"


# --------------------------------------------------------------------------- classifiers.md

CLASSIFIERS_CPU = "benchmarks/results/classifiers_cpu_quiet.json"
CLASSIFIERS_CPU_LOOP = "benchmarks/results/classifiers_cpu.json"
CLASSIFIERS_CUDA = "benchmarks/results/classifiers_cuda.json"
CLASSIFIER_BREAKDOWN = "benchmarks/results/classifier_breakdown_cpu.json"
CONV_CHUNKS = "benchmarks/results/conv_chunks_cpu.json"


def _setting_label(r: Mapping, classes: bool = True) -> str:
    label = f"{r['input'].replace('x', '×')}, N={r['batch']}"
    return f"{label}, C={r['classes']}" if classes else label


@register("classifiers_cpu", CLASSIFIERS_CPU)
def _classifiers_cpu(root: Path) -> str:
    """The CNN benchmark on the CPU (``benchmarks/classifiers.py``, one round-robin run):
    seconds per call and peak MiB of the floor, a training step, isouq and Opacus."""
    rows = []
    for r in _json(root, CLASSIFIERS_CPU)["rows"]:
        rows.append([
            _setting_label(r), f"{r['floor_s']:.3f}",
            f"{r['train_step_s']:.3f} ({r['train_step_over_floor']:.2f}×)",
            f"{r['isouq_s']:.3f} ({r['isouq_over_floor']:.2f}×)",
            f"{r['isouq_first_call_s']:.3f} ({r['isouq_first_call_over_floor']:.2f}×)",
            f"{r['isouq_over_train_step']:.2f}×", f"{r['isouq_gn_s']:.3f}",
            f"{r['opacus_gn_s']:.3f} ({r['opacus_gn_over_isouq_gn']:.2f}×)",
            f"{r['floor_peak_mib']:.0f} / {r['isouq_peak_mib']:.0f} / {r['opacus_gn_peak_mib']:.0f}"])
    return _grid(["input, batch, classes", "floor s", "training step s (/ floor)",
                  "isouq s (/ floor)", "isouq, first call (/ floor)", "isouq / training step",
                  "isouq GN s", "Opacus GN s (/ isouq GN)", "peak MiB floor / isouq / Opacus"],
                 rows)


@register("classifier_breakdown", CLASSIFIER_BREAKDOWN)
def _classifier_breakdown(root: Path) -> str:
    """Milliseconds per call beyond the floor, by part (``benchmarks/classifier_breakdown.py``)."""
    rows = []
    for r in _json(root, CLASSIFIER_BREAKDOWN)["rows"]:
        parts = r["Conv2d_rule_ms"] + r["BatchNorm_rule_ms"] + r["sq_norms_ms"] + r["Linear_rule_ms"]
        rest = r["isouq_nocheck_ms"] - r["floor_ms"] - parts  # within the timing noise: ≈ 0
        rows.append([_setting_label(r, classes=False), f"{r['floor_ms']:.0f}",
                     f"{r['isouq_nocheck_ms']:.0f}", f"{r['Conv2d_rule_ms']:.0f}",
                     f"{r['BatchNorm_rule_ms']:.0f}", f"{r['sq_norms_ms']:.0f}",
                     "≈ 0" if abs(rest) < 5 else fixed(rest, 0),
                     f"{r['check_ms']:.0f}"])
    return _grid(["input, batch", "floor", "isouq, no check", "conv rules", "BatchNorm rules",
                  "squared norms", "hooks and the rest beyond the floor",
                  "the check's one-example forward"], rows)


@register("conv_chunks", CONV_CHUNKS)
def _conv_chunks(root: Path) -> str:
    """Milliseconds per call of each path of the conv rule (``benchmarks/conv_chunks.py``)."""
    rows = [[f"{r['batch']}, {r['in']}→{r['out']}, {r['size']}², {r['stride']}",
             *(f"{r[k]:.1f}" for k in ("rule_ms", "gram_ms", "one_call_ms", "chunked_ms",
                                       "per_example_ms"))]
            for r in _json(root, CONV_CHUNKS)["rows"]]
    return _grid(["batch, channels, size, stride", "rule", "Gram", "one call", "chunked",
                  "per example"], rows)


def _clf(root: Path, rel: str, key: str, fmt: Callable[[float], str]) -> str:
    return span((r[key] for r in _json(root, rel)["rows"]), fmt)


def _clf_value(rel: str, key: str, fmt: Callable[[float], str], doc: str):
    def fn(root: Path) -> str:
        return _clf(root, rel, key, fmt)
    fn.__doc__ = doc
    return fn


for _name, _rel, _key, _fmt in (
        ("classifiers_cpu_isouq_over_floor", CLASSIFIERS_CPU, "isouq_over_floor", _two),
        ("classifiers_cpu_train_over_floor", CLASSIFIERS_CPU, "train_step_over_floor", _two),
        ("classifiers_cpu_isouq_over_train", CLASSIFIERS_CPU, "isouq_over_train_step", _two),
        ("classifiers_cpu_opacus_over_isouq", CLASSIFIERS_CPU, "opacus_gn_over_isouq_gn", _one),
        ("classifiers_cpu_loop_over_isouq", CLASSIFIERS_CPU_LOOP, "loop_over_isouq", _one),
        ("classifiers_cuda_train_over_floor", CLASSIFIERS_CUDA, "train_step_over_floor", _two),
        ("classifiers_cuda_isouq_over_floor", CLASSIFIERS_CUDA, "isouq_over_floor", _one),
        ("classifiers_cuda_opacus_over_isouq", CLASSIFIERS_CUDA, "opacus_gn_over_isouq_gn", _two)):
    value(_name, _rel)(_clf_value(_rel, _key, _fmt, f"``{_key}`` over the rows of ``{_rel}``."))


def _ms_range(root: Path, rel: str, key: str) -> str:
    return span((1000 * r[key] for r in _json(root, rel)["rows"]), lambda x: f"{x:.1f}") + " ms"


@value("classifiers_cuda_floor_ms", CLASSIFIERS_CUDA)
def _v_classifiers_cuda_floor(root: Path) -> str:
    """The floor's milliseconds per call on the GPU."""
    return _ms_range(root, CLASSIFIERS_CUDA, "floor_s")


@value("classifiers_cuda_isouq_ms", CLASSIFIERS_CUDA)
def _v_classifiers_cuda_isouq(root: Path) -> str:
    """isouq's milliseconds per call on the GPU."""
    return span((1000 * r["isouq_s"] for r in _json(root, CLASSIFIERS_CUDA)["rows"]),
                lambda x: f"{x:.0f}") + " ms"


def _memory_share(root: Path, rel: str) -> str:
    """isouq's peak memory as a fraction of Opacus's, per row, with both ends' MiB."""
    rows = _json(root, rel)["rows"]
    share = span((r["isouq_gn_peak_mib"] / r["opacus_gn_peak_mib"] for r in rows), _two)
    mib = (f"{span((r['isouq_gn_peak_mib'] for r in rows), lambda x: f'{x:.0f}')} MiB against "
           f"{span((r['opacus_gn_peak_mib'] for r in rows), lambda x: f'{x:.0f}')} MiB")
    return f"{share} of its peak memory ({mib})"


@value("classifiers_cpu_memory_share", CLASSIFIERS_CPU)
def _v_classifiers_cpu_memory(root: Path) -> str:
    """isouq's peak memory over Opacus's on the CPU."""
    return _memory_share(root, CLASSIFIERS_CPU)


@value("classifiers_cuda_memory_share", CLASSIFIERS_CUDA)
def _v_classifiers_cuda_memory(root: Path) -> str:
    """isouq's peak memory over Opacus's on the GPU."""
    return _memory_share(root, CLASSIFIERS_CUDA)


@value("classifier_conv_rule_ms", CLASSIFIER_BREAKDOWN)
def _v_classifier_conv_rule(root: Path) -> str:
    """Milliseconds of the conv rules per call."""
    return _clf(root, CLASSIFIER_BREAKDOWN, "Conv2d_rule_ms", lambda x: f"{x:.0f}") + " ms"


@value("classifier_bn_rule_ms", CLASSIFIER_BREAKDOWN)
def _v_classifier_bn_rule(root: Path) -> str:
    """Milliseconds of the BatchNorm rules per call."""
    return _clf(root, CLASSIFIER_BREAKDOWN, "BatchNorm_rule_ms", lambda x: f"{x:.0f}") + " ms"


@value("classifier_check_ms", CLASSIFIER_BREAKDOWN)
def _v_classifier_check(root: Path) -> str:
    """Milliseconds of the independence check on a model's first call."""
    return _clf(root, CLASSIFIER_BREAKDOWN, "check_ms", lambda x: f"{x:.0f}") + " ms"


@value("classifiers_cpu_train_minus_floor_ms", CLASSIFIERS_CPU)
def _v_classifiers_train_minus_floor(root: Path) -> str:
    """What a training step costs beyond the floor, milliseconds per call."""
    return span((1000 * (r["train_step_s"] - r["floor_s"]) for r in _json(root, CLASSIFIERS_CPU)["rows"]),
                lambda x: f"{x:.0f}") + " ms"


@value("conv_gram_over_rule_wide", CONV_CHUNKS)
def _v_conv_gram_wide(root: Path) -> str:
    """The Gram form's time over the rule's on the layers of at least 1,024 positions."""
    return span((r["gram_ms"] / r["rule_ms"] for r in _json(root, CONV_CHUNKS)["rows"]
                 if r["size"] ** 2 >= 1024), lambda x: f"{x:.0f}") + "×"


@value("conv_one_call_max_ratio", CONV_CHUNKS)
def _v_conv_one_call_ratio(root: Path) -> str:
    """How much slower one weight-gradient call over the batch runs than the chunks, at most."""
    return f"{max(r['one_call_ms'] / r['chunked_ms'] for r in _json(root, CONV_CHUNKS)['rows']):.1f}×"


@value("conv_one_call_largest", CONV_CHUNKS)
def _v_conv_one_call_largest(root: Path) -> str:
    """One call against chunks on the row where one call takes longest."""
    r = max(_json(root, CONV_CHUNKS)["rows"], key=lambda r: r["one_call_ms"])
    return (f"{r['one_call_ms']:.0f} ms against {r['chunked_ms']:.0f} ms for {r['in']}→{r['out']} "
            f"channels at {r['size']}×{r['size']}, batch {r['batch']}")


# --------------------------------------------------------------------------- models.md


def _models_cpu_rows(root: Path) -> dict[str, tuple[dict, dict]]:
    return {kind: _batches(_json(root, rel))[16] for kind, rel in MODELS_CPU.items()}


_MODEL_KINDS = {"fp32": "float32", "4bit": "bitsandbytes 4-bit (NF4, `--quantize 4bit`)",
                "lora8": "float32 + LoRA rank 8 on every projection"}


def _model_value(kind: str, what: str):
    def fn(root: Path) -> str:
        s, rq = _models_cpu_rows(root)[_MODEL_KINDS[kind]]
        if what == "ghost/floor":
            return _two(rq["ghost/floor"])
        if what == "by round":
            return rq["ghost/floor by round"]
        if what == "loop/ghost":
            return f"{rq['loop/ghost']:.1f}×"
        if what == "weights":
            return f"{s['ghost']['weights_gib']:.2f}"
        if what == "peak":
            return f"{s['ghost']['peak_rss_scoring_gib']:.2f} GiB"
        if what == "loop_trainable":
            lt = s["loop_trainable"]["seconds_per_answer"]
            return (f"{sig(lt)} s per answer, {lt / s['ghost']['seconds_per_answer']:.1f}× ghost "
                    "over every weight")
        raise KeyError(what)
    fn.__doc__ = f"{what} of the {kind} row of ``models_cpu``."
    return fn


for _kind in _MODEL_KINDS:
    for _what in ("ghost/floor", "loop/ghost") + (("weights", "peak") if _kind != "lora8" else ()):
        _n = _what.replace("/", "_over_")
        value(f"models_cpu_{_kind}_{_n}", MODELS_CPU[_MODEL_KINDS[_kind]])(_model_value(_kind, _what))
value("models_cpu_lora8_by_round", MODELS_CPU[_MODEL_KINDS["lora8"]])(
    _model_value("lora8", "by round"))
value("models_cpu_4bit_loop_trainable", MODELS_CPU[_MODEL_KINDS["4bit"]])(
    _model_value("4bit", "loop_trainable"))


@value("ghost_launches_fewer", *GHOST_LAUNCHES)
def _v_ghost_launches_fewer(root: Path) -> str:
    """How many fewer operations beyond the floor's a ghost batch runs after than before, per
    architecture, as a range of percentages."""
    before, after = (_json(root, rel) for rel in GHOST_LAUNCHES)
    return span((100 * (1 - a["ghost − floor"] / b["ghost − floor"])
                 for b, a in zip(before["table"], after["table"], strict=True)),
                lambda x: f"{x:.0f}") + "%"


# --------------------------------------------------------------------------- CHANGELOG.md

WORKER_THREAD = "benchmarks/results/worker_thread.json"


@value("worker_thread", WORKER_THREAD)
def _v_worker_thread(root: Path) -> str:
    """One scoring call on a second torch thread and on the model thread, against the main
    thread (``benchmarks/worker_thread.py``)."""
    d = _json(root, WORKER_THREAD)
    return (f"{d['second_thread_over_main']:.2f}× the main thread's wall time on a second thread, "
            f"{d['model_thread_over_main']:.2f}× on the model thread")


# --------------------------------------------------------------------------- memory plan


def _plan(root: Path) -> Mapping:
    return _json(root, MEMORY_PLAN)


@value("memory_plan_constants", MEMORY_PLAN)
def _v_memory_plan_constants(root: Path) -> str:
    """The module's four constant factors, as the kept file records them."""
    c = _plan(root)["calibration_in_module"]
    return (f"{c['activations']:g}, {c['logits']:g}, {c['loop_gradients']:g}, "
            f"{c['overhead'] / 2**20:.1f} MiB")


@value("memory_plan_refit", MEMORY_PLAN)
def _v_memory_plan_refit(root: Path) -> str:
    """The same four refitted on the kept calibration rows."""
    c = _plan(root)["fit_on_calibrate_rows"]
    return (f"{c['activations']:.2f}, {c['logits']:.2f}, {c['loop_gradients']:.2f} and "
            f"{c['overhead'] / 2**20:.1f} MiB")


def _plan_checks(root: Path, dtype: str) -> list[dict]:
    half = dtype != "float32"
    return [r for r in _plan(root)["rows"]
            if r["role"] == "check" and (r["dtype"] != "float32") == half]


def _plan_summary(root: Path, dtype: str) -> str:
    rows = _plan_checks(root, dtype)
    within = [r for r in rows if abs(r["ratio"] - 1) <= 0.2]
    errors = sorted(abs(r["ratio"] - 1) for r in rows)
    return (f"{len(within)} of the {len(rows)} check rows are within 20% (ratios "
            f"{span((r['ratio'] for r in rows), _two)}, median error "
            f"{100 * statistics.median(errors):.0f}%)")


@value("memory_plan_fp32", MEMORY_PLAN)
def _v_memory_plan_fp32(root: Path) -> str:
    """How the float32 check rows compare with the prediction."""
    return _plan_summary(root, "float32")


@value("memory_plan_half", MEMORY_PLAN)
def _v_memory_plan_half(root: Path) -> str:
    """How the half-precision check rows compare with the prediction."""
    return _plan_summary(root, "half")


def _plan_outside(root: Path, dtype: str) -> str:
    out = [r for r in _plan_checks(root, dtype) if abs(r["ratio"] - 1) > 0.2]
    return "; ".join(f"{r['model']} {r['method']} {r['dtype']} {r['batch']} × {r['length']} at "
                     f"{r['ratio']:.2f} ({r['measured_mib']:,.0f} MiB measured, "
                     f"{r['predicted_mib']:,.0f} predicted)" for r in out) or "none"


@value("memory_plan_fp32_outside", MEMORY_PLAN)
def _v_memory_plan_fp32_outside(root: Path) -> str:
    """The float32 check rows outside 20%."""
    return _plan_outside(root, "float32")


@value("memory_plan_half_outside", MEMORY_PLAN)
def _v_memory_plan_half_outside(root: Path) -> str:
    """The half-precision check rows outside 20%."""
    return _plan_outside(root, "half")


# --------------------------------------------------------------------------- calibration.md

CALIBRATION = "results/calibration/summary/results.json"


def _cal(root: Path, table: str) -> list[dict]:
    return _json(root, CALIBRATION)["tables"][table]


@register("calibration_crossfit", CALIBRATION)
def _calibration_crossfit(root: Path) -> str:
    """Cross-fitted P(correct) of each kept QA model, dataset and label source."""
    rows = [[r["model"], r["dataset"], r["labels"], f"{r['n']} ({r['correct']})", r["map"],
             fixed(r["ECE"], 3), f"{fixed(r['Brier'], 3)} ({fixed(r['base Brier'], 3)})",
             f"{fixed(r['log-loss'], 3)} ({fixed(r['base log-loss'], 3)})",
             f"{r['best single']}: {fixed(r['its log-loss'], 3)}", fixed(r["AUROC"], 3)]
            for r in _cal(root, "calibrations")]
    return _grid(["model", "dataset", "labels", "n (correct)", "map selected", "ECE",
                  "Brier (base)", "log-loss (base)", "best single score: log-loss", "AUROC"], rows)


@register("calibration_withholding", CALIBRATION)
def _calibration_withholding(root: Path) -> str:
    """Learn then Test per α: the threshold, how many held-out answers it keeps, their error."""
    cells: dict[tuple, dict] = {}
    alphas: list[float] = []
    for r in _cal(root, "withholding"):
        cells[(r["model"], r["dataset"], r["labels"], r["alpha"])] = r
        alphas += [] if r["alpha"] in alphas else [r["alpha"]]

    def cell(r: Mapping) -> str:
        if "held-out rows" not in r:
            return "too few correct to split"
        if r["threshold"] is None:
            return "none (withhold all)"
        return (f"λ̂ {fixed(r['threshold'], 2)}: keeps {r['kept']}/{r['held-out rows']}, "
                f"{fixed(r['error rate kept'], 2)} wrong")

    groups = list(dict.fromkeys(k[:3] for k in cells))
    rows = [[*g, *(cell(cells[(*g, a)]) for a in alphas)] for g in groups]
    return _grid(["model", "dataset", "labels", *(f"α = {a:g}" for a in alphas)], rows)


@register("calibration_transfer", CALIBRATION)
def _calibration_transfer(root: Path) -> str:
    """A map fitted on one dataset, evaluated on the other's rows."""
    rows = [[r["model"], r["labels"], f"{r['from']} → {r['to']}", fixed(r["ECE"], 3),
             fixed(r["Brier"], 3), fixed(r["log-loss"], 3), fixed(r["AUROC"], 3),
             f"{fixed(r['in-domain ECE'], 3)} / {fixed(r['in-domain log-loss'], 3)} / "
             f"{fixed(r['in-domain AUROC'], 3)}", fixed(r["source base rate log-loss"], 3)]
            for r in _cal(root, "transfer")]
    return _grid(["model", "labels", "from → to", "ECE", "Brier", "log-loss", "AUROC",
                  "in-domain ECE / log-loss / AUROC", "source base rate log-loss"], rows)


def _cal_rows(root: Path, labels: str) -> list[dict]:
    return [r for r in _cal(root, "calibrations") if r["labels"] == labels]


@value("calibration_elapsed", CALIBRATION)
def _v_calibration_elapsed(root: Path) -> str:
    """Seconds the whole calibration set took."""
    return f"{_json(root, CALIBRATION)['elapsed_s']:.0f} s"


@value("calibration_rows", CALIBRATION)
def _v_calibration_rows(root: Path) -> str:
    """Labelled answers per calibration."""
    return span((r["n"] for r in _cal(root, "calibrations")), count)


@value("calibration_judge", CALIBRATION)
def _v_calibration_judge(root: Path) -> str:
    """With the judge's labels: log-loss against the base rate, ECE and AUROC ranges, and in how
    many groups p̄ alone (Platt-scaled) is as good or better."""
    rows = _cal_rows(root, "judge")
    beats = sum(r["log-loss"] < r["base log-loss"] for r in rows)
    pbar = sum(r["best single"] == "p̄" and round(r["its log-loss"], 3) <= round(r["log-loss"], 3)
               for r in rows)  # as the table shows them, to 3 decimals
    return (f"beats the base rate in {beats} of {len(rows)} groups (log-loss "
            f"{span((r['log-loss'] for r in rows), _two)} against "
            f"{span((r['base log-loss'] for r in rows), _two)}; ECE "
            f"{span((r['ECE'] for r in rows), _two)}; AUROC {span((r['AUROC'] for r in rows), _two)}). "
            f"p̄ alone, Platt-scaled, is as good or better in {pbar} of {len(rows)}")


@value("calibration_hand", CALIBRATION)
def _v_calibration_hand(root: Path) -> str:
    """With hand labels: correct answers per group, the groups that beat the base rate, and the
    AUROC range of the others."""
    rows = _cal_rows(root, "hand")
    win = [r for r in rows if r["log-loss"] < r["base log-loss"]]
    rest = [r for r in rows if r not in win]
    names = ", ".join(f"{r['model']} on {r['dataset']} ({r['correct']} of {r['n']} correct)"
                      for r in win) or "no group"
    return (f"{span((r['correct'] for r in rows), count)} correct answers per group; the "
            f"calibration beats the base rate for {names}; elsewhere AUROC "
            f"{span((r['AUROC'] for r in rest), _two)}")


@value("calibration_correct_share", CALIBRATION)
def _v_calibration_share(root: Path) -> str:
    """The share of correct answers under each label source."""
    def share(labels: str) -> str:
        return span((r["correct"] / r["n"] for r in _cal_rows(root, labels)),
                    lambda x: sig(100 * x, 2)) + "%"
    return f"{share('judge')} correct under the judge, {share('hand')} under hand labels"


@value("calibration_alpha07", CALIBRATION)
def _v_calibration_alpha07(root: Path) -> str:
    """What the threshold at α = 0.7 keeps, over the groups where one is certified."""
    rows = [r for r in _cal(root, "withholding") if r.get("alpha") == 0.7 and r.get("threshold")]
    if not rows:
        return "nothing is certified at α = 0.7"
    groups = "; ".join(f"{r['model']} {r['dataset']} ({r['labels']})" for r in rows)
    return (f"the calibration keeps {span((r['coverage'] for r in rows), lambda x: f'{100 * x:.0f}')}% "
            f"of held-out answers ({groups}) with "
            f"{span((r['error rate kept'] for r in rows), lambda x: f'{100 * x:.0f}')}% of them wrong")


@value("calibration_transfer_judge", CALIBRATION)
def _v_calibration_transfer(root: Path) -> str:
    """Carried maps with judge labels: AUROC and ECE against in-domain, and the log-loss counts."""
    rows = [r for r in _cal(root, "transfer") if r["labels"] == "judge"]
    worse = sum(r["log-loss"] > r["in-domain log-loss"] for r in rows)
    const = sum(r["log-loss"] > r["source base rate log-loss"] for r in rows)
    return (f"AUROC {span((r['AUROC'] for r in rows), _two)} against "
            f"{span((r['in-domain AUROC'] for r in rows), _two)} in-domain), but its probabilities "
            f"are off (ECE {span((r['ECE'] for r in rows), _two)} against "
            f"{span((r['in-domain ECE'] for r in rows), _two)}) because the share of correct answers "
            f"differs between datasets; its log-loss is worse than in-domain in {worse} of "
            f"{len(rows)} judge-labelled cases, and in {const} worse than a constant")

if __name__ == "__main__":
    sys.exit(main())
