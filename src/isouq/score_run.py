"""The resumable runner behind ``isouq score``: rows in, one JSONL row out per input.

- One object, :class:`ScoreRun`: each row is tokenized once (:meth:`ScoreRun.prepare`; its
  token ids go to ``score_sequences(encoded=...)``, also on a retry), and the batches it plans
  are the batches scored (one ``score_sequences`` call each).
- Streaming: input rows are read, tokenized and scored in windows of ``window`` rows
  (length-bucketed inside a window), so memory does not grow with the input's size.
- Span scores: ``spans="sentences"`` or ``"lines"``, and a row's own ``spans`` ranges (checked
  before the model loads, :func:`check_row_spans`), which win over the splitter.
- Resumable and never mixed: every output row carries ``input_sha`` (its prompt and answer as
  scored, and its own spans when given) and ``settings_sha`` (model file SHA-256, method,
  parameters, dtype, isouq version; the full settings are in ``<out>.meta.json``). A resume
  with other settings is refused, naming the setting; a row whose input changed under the same
  key is scored again and replaces the stale one; each batch is appended whole (fsync'ed) as
  soon as it is scored, so a killed run loses at most the batch in flight. The finished output
  is rewritten in input order.
- One bad row does not stop a run (``on_error="skip"``): it gets an error row
  ``{"key", "error", ...}`` and the run goes on; ``on_error="stop"`` raises instead.
- Data-parallel under torchrun: see :mod:`isouq.distributed`; with ``shard="fsdp"`` the
  weights are split over the ranks too (FSDP2), and the ranks score in lockstep.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import nullcontext
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path
from typing import Any

from .data.pairs import PairIndex, PairRow, content_sha
from .distributed import (
    SHARD_MODES,
    DistEnv,
    barrier,
    lockstep_steps,
    merge_shards,
    shard_path,
    write_ordered,
)
from .engines import engine_name
from .errors import CaptureRefused, InputError, IsouqError
from .prepare import Limits, Prepared, RowProblem, plan, prepare_pair, prompt_for
from .runio import JsonlWriter, dumps, exclusive, read_jsonl
from .sequences import score_sequences
from .spans import SPLITTERS, check_ranges
from .tokens import Encoded, pad_id

ON_ERROR = ("skip", "stop")
WINDOW = 1024


#: the settings ``models.content_options`` writes; a run without one was made without it
LOAD_OPTION_KEYS = ("quantize", "adapter_sha256")


def run_settings(*, model: str, method: str, params=None, dtype: str = "float32",
                 model_files: dict[str, str] | None = None,
                 options: dict | None = None) -> dict:
    """What makes a score: the model (name and, once loaded, the SHA-256 of its files), the
    load options that change what it computes (``models.content_options``: quantization, the
    adapter's digest; absent when not given, so older runs resume), the method, the parameters
    that take part, the dtype, the isouq version."""
    from . import __version__

    out = {"model": str(model), **(options or {}), "method": method, "params": params,
           "dtype": str(dtype), "isouq": __version__}
    if model_files is not None:
        out["model_sha256"] = content_sha(sorted(model_files.values()))
    return out


def meta_path(out: str | Path) -> Path:
    return Path(str(out) + ".meta.json")


def check_out(out: str | Path, inputs: Iterable[str | Path] = ()) -> None:
    """InputError unless ``out`` can be written and is none of ``inputs``."""
    out = Path(out)
    for inp in inputs:
        inp = Path(inp)
        if out.resolve() == inp.resolve() or (out.exists() and inp.exists()
                                              and os.path.samefile(out, inp)):
            raise InputError(f"--out {out} is the input file; give another file for the scores")
    if out.is_dir():
        raise InputError(f"--out {out} is a folder; give a file name, e.g. {out / 'scores.jsonl'}")
    parent = out.parent if str(out.parent) else Path(".")
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise InputError(f"cannot create the folder of --out {out}: {e.strerror}; choose "
                         "another --out") from None
    if not os.access(parent, os.W_OK | os.X_OK) or (out.exists() and not os.access(out, os.W_OK)):
        raise InputError(f"--out {out} is not writable; choose another --out or fix its "
                         "permissions")


def check_token_ids(index: PairIndex, model: str) -> None:
    """InputError, before the model loads, when an answer given as token ids has an id outside
    the model's vocabulary (read from its config or GGUF header: ``models.vocab_size``); nothing
    when the vocabulary cannot be known without loading (then such a row fails once loaded)."""
    if index.max_token_id is None:
        return
    from .models import vocab_size

    top, key = index.max_token_id
    n = vocab_size(model)
    if n is not None and top >= n:
        raise InputError(f"row {key!r}: answer token id {top} is outside the vocabulary of "
                         f"{model} ({n} ids); pass ids of this model's tokenizer, or run with "
                         "--on-error skip to write an error row for it and go on")


def check_settings(out: str | Path, settings: dict) -> None:
    """InputError when ``out`` holds rows made with settings other than ``settings`` (the fields
    both sides know are compared, and the load options, absent = not given: call it before the
    model loads, and after)."""
    out, side = Path(out), meta_path(out)
    has_rows = out.exists() and out.stat().st_size > 0
    if not side.exists():
        if has_rows:
            raise InputError(f"{out} has rows but no {side.name} (another tool or an older isouq "
                             "wrote it); give another --out")
        return
    try:
        old = json.loads(side.read_text(encoding="utf-8")).get("settings")
    except (OSError, json.JSONDecodeError) as e:
        raise InputError(f"{side} cannot be read ({e}); delete it with {out}, or give another "
                         "--out") from None
    if old is None:
        if has_rows:
            raise InputError(f"{side.name} records no settings (an older isouq wrote {out}); "
                             "give another --out")
        return
    diff = [k for k in settings if k in old and old[k] != settings[k]]
    diff += [k for k in LOAD_OPTION_KEYS if k not in diff and old.get(k) != settings.get(k)]
    if diff:
        said = "; ".join(f"{k}: {old.get(k)!r} there, {settings.get(k)!r} now" for k in diff)
        raise InputError(f"{out} was scored with other settings ({said}); give another --out, "
                         "or the same settings to resume")


def _windows(rows: Iterable[PairRow], size: int) -> Iterator[list[PairRow]]:
    it = iter(rows)
    while chunk := list(islice(it, size)):
        yield chunk


def check_row_spans(row: PairRow) -> None:
    """InputError naming the row's key and the fix when its own ``spans`` cannot be character
    ranges of its answer (``spans.check_ranges``: not pairs of whole numbers, outside the text,
    empty, overlapping). An answer of token ids: what needs no text (its text is the ids'
    decoding, known once the tokenizer loads; the rest is checked then)."""
    if row.spans is not None:
        check_ranges(row.spans, row.answer if isinstance(row.answer, str) else None, row.key)


@dataclass
class ScoreRun:
    """The resumable runner of ``isouq score``: the settings of one run over ``out`` and the
    loaded model; :meth:`run` scores the rows this process has not written yet.

    Each row is tokenized once (:meth:`prepare`), the rows of a window (``window`` rows) are
    grouped into batches (:meth:`plan`), and each batch is one ``score_sequences`` call on those
    token ids (:meth:`score_batch`), written whole as soon as it is scored.

    Attributes:
        model, tokenizer: the loaded model.
        out: the output JSONL (input order once finished) beside ``<out>.meta.json``.
        settings: what made the scores (:func:`run_settings`); ``method``, ``params`` (and
            ``spans`` when given) are added. A resume with other settings is an InputError.
        method, params: of ``score_sequences``.
        spans: ``"sentences"`` or ``"lines"``: each row also gets a ``spans`` list, one entry
            per span with its text, character range and scores (``isouq.spans``); a row whose
            spans cannot be made (blank text) is an error row. Recorded in the settings. A row
            that gives its own ``spans`` ranges (``PairRow.spans``) is scored on those, with or
            without this setting.
        blocks: each row also gets its block profile, ``blocks`` {module path: ‖∇θ_b p̄‖²}
            (``isouq.blocks``), from the same backward. Recorded in the settings.
        hidden: each row also gets its mean hidden states, ``hidden`` {state name: d floats}
            (``isouq.hidden``), from the scores' own forward (with spans: one more forward per
            batch). Recorded in the settings.
        batch_size, max_tokens_per_batch, bucket: how rows are grouped into batches
            (:func:`plan_batches`).
        memory_budget: bytes the process may use: batches are cut so that the predicted peak
            (:func:`isouq.memory_plan.peak_bytes`) fits; a row that does not fit alone is an
            error row (or, with ``on_error="stop"``, an error).
        on_error: ``"skip"`` writes an error row for a row that cannot be scored and goes on;
            ``"stop"`` raises an InputError naming its key.
        window: rows read, tokenized and scored at a time.
        env: this process's rank and the world size (:mod:`isouq.distributed`).
        lockstep: the weights are sharded over the ranks (FSDP2): every rank runs as many
            batches as the busiest one (fillers that write nothing), and a batch that fails is
            written as error rows whole (a retry row by row would run more collectives on one
            rank than on the others).
        prune: drop output rows whose key is no longer in the input (stale rows of an edited
            file); False keeps them after the input's rows (a run over fewer rows, ``--limit``).
        meta: more fields of ``<out>.meta.json`` (the model's provenance, the input).
        model_name: the model as the user named it, written in every row (``model``), so that
            ``isouq calibrate`` knows the rows' model without the meta file.
        progress: show a progress bar.
        on_batch: called with the number of rows of each batch once it is written.
    """

    model: Any
    tokenizer: Any
    out: Path
    settings: dict = field(default_factory=dict)
    method: str = "ghost"
    params: Any = None
    spans: str | None = None
    blocks: bool = False
    hidden: bool = False
    batch_size: int = 16
    max_tokens_per_batch: int | None = None
    bucket: bool = True
    memory_budget: int | None = None
    on_error: str = "skip"
    window: int = WINDOW
    env: DistEnv = field(default_factory=DistEnv)
    lockstep: bool = False
    prune: bool = False
    meta: dict | None = None
    model_name: str | None = None
    progress: bool = True
    on_batch: Callable[[int], None] | None = None
    compile: bool = False  # score_sequences(compile=True): graph capture where it is offered

    def __post_init__(self) -> None:
        if self.on_error not in ON_ERROR:
            raise InputError(f"on_error={self.on_error!r} is not one of {', '.join(ON_ERROR)}")
        if self.spans is not None and self.spans not in SPLITTERS:
            raise InputError(f"spans={self.spans!r} is not one of {', '.join(SPLITTERS)}")
        self.env = self.env or DistEnv()
        self.out = Path(self.out)
        self.method = engine_name(self.method, ("auto", "ghost", "per_example", "per_token",
                                                 "forward"))
        self.settings = {**(self.settings or {}), "method": self.method, "params": self.params}
        if self.spans is not None:  # absent otherwise: runs made before spans existed resume
            self.settings["spans"] = self.spans
        if self.blocks:  # likewise
            self.settings["blocks"] = True
        if self.hidden:  # likewise
            self.settings["hidden"] = True
        self.settings_sha = content_sha(self.settings)
        self.path = (shard_path(self.out, self.env.rank, self.env.world) if self.env.world > 1
                     else self.out)
        self.limits = Limits.of_model(self.model, memory_budget=self.memory_budget,
                                      method=self.method)
        self.counts = {"written": 0, "skipped": 0, "rescored": 0, "errors": 0}
        self._writer: JsonlWriter | None = None
        self._bar = None
        self._info = None

    # ------------------------------------------------------------------ the run
    def run(self, rows: Iterable[PairRow], *, total: int | None = None,
            locked: bool = False) -> dict:
        """Score the rows of this process (input position r, r + W, …) not yet written with the
        same input and settings, then (rank 0) write ``out`` in input order.

        Args:
            rows: validated rows (``data.pairs.iter_pairs``), read lazily, ``window`` at a time.
            total: number of rows (for the progress bar), if known.
            locked: the caller already holds ``exclusive(out)`` (the CLI takes it before
                loading the model).

        Returns:
            {"written", "skipped", "rescored", "errors", "seconds", "params"}: rows scored now,
            rows already done, rows scored again because their input changed, error rows
            written now, wall time, the scores' ``ParamInfo`` (None when nothing was scored).
        """
        check_settings(self.out, self.settings)
        if self.env.world > 1:
            check_settings(self.path, self.settings)
        with exclusive(self.path) if not locked else nullcontext():
            self.counts = {"written": 0, "skipped": 0, "rescored": 0, "errors": 0}
            self._info = None
            doc = self._open()
            done = self._done()
            t0 = time.perf_counter()
            if self.progress:
                from tqdm.auto import tqdm

                self._bar = tqdm(total=total, unit="answer", desc="scoring" if self.env.world
                                 == 1 else f"scoring (rank {self.env.rank})")
            keys: list[str] = []
            for chunk in _windows(rows, self.window):
                todo = self._select(chunk, done, keys)
                self._advance(len(chunk) - len(todo))
                items = self._prepare_all(todo)
                batches = self.plan(items)
                steps = (lockstep_steps(len(batches), self.env) if self.lockstep
                         else len(batches))
                for step in range(steps):
                    if step >= len(batches):  # sharded weights: the others' batch needs us
                        self._filler()
                        continue
                    self._info = self.score_batch(batches[step],
                                                  retry=not self.lockstep) or self._info
                    self._advance(len(batches[step]))
                    if self.on_batch is not None:
                        self.on_batch(len(batches[step]))
            if self._bar is not None:
                self._bar.close()
            self.merge(keys, doc)
            return {**self.counts, "seconds": time.perf_counter() - t0, "params": self._info}

    def _open(self) -> dict:
        """Write the side files (first: a resume after a crash compares against them) and open
        this process's output; returns the ``<out>.meta.json`` document."""
        doc = {**(self.meta or {}), "settings": self.settings,
               "settings_sha": self.settings_sha, "world_size": self.env.world}
        if self.env.is_main:
            meta_path(self.out).write_text(dumps(doc, indent=2), encoding="utf-8")
        if self.env.world > 1:  # a shard's own side file, for check_settings on resume
            meta_path(self.path).write_text(dumps({"settings": self.settings}),
                                            encoding="utf-8")
        self._writer = JsonlWriter(self.path)
        return doc

    def _done(self) -> dict[str, str]:
        """Key → input_sha of the rows this process's output already holds."""
        done = {}
        for r in read_jsonl(self.path):
            if r.get("settings_sha", self.settings_sha) != self.settings_sha:
                raise InputError(f"{self.path} holds rows of other settings (key "
                                 f"{r.get('key')!r}); give another --out")
            done[str(r.get("key"))] = r.get("input_sha")
        return done

    def _select(self, chunk: list[PairRow], done: dict[str, str],
                keys: list[str]) -> list[PairRow]:
        """This process's rows of ``chunk`` not yet scored with the same input (every key is
        appended to ``keys``, the input order)."""
        todo = []
        for r in chunk:
            position = len(keys)
            keys.append(r.key)
            if position % self.env.world != self.env.rank:
                continue
            if done.get(r.key) == r.fingerprint:
                self.counts["skipped"] += 1
            else:
                self.counts["rescored"] += r.key in done
                todo.append(r)
        return todo

    def _advance(self, n: int) -> None:
        if self._bar is not None and n:
            self._bar.update(n)

    # ------------------------------------------------------------------ rows and batches
    def prepare(self, row: PairRow) -> Prepared:
        """The row made ready (``prepare.prepare_pair``: its prompt, its one tokenization, its
        fit, its spans; the row itself in ``source``), or a ``RowProblem`` with the reason."""
        given = row.spans if row.spans is not None else self.spans
        if given is not None and self.lockstep:
            raise RowProblem("invalid_spans", "span scores run a backward per span, a number "
                             "that differs between ranks of sharded weights; drop its spans "
                             "or --shard")
        try:
            prompt = prompt_for(self.tokenizer, row.prompt, row.question)
        except IsouqError as e:
            raise RowProblem("invalid_prompt", str(e)) from None
        return prepare_pair(self.tokenizer, prompt, row.answer, self.limits, spans=given,
                            method=self.method, key=row.key, source=row)

    def _prepare_all(self, rows: list[PairRow]) -> list[Prepared]:
        """:meth:`prepare` of each row; a row that cannot be scored gets its error row."""
        out = []
        for r in rows:
            try:
                out.append(self.prepare(r))
            except RowProblem as e:
                self.fail(r, str(e), e.reason)
                self._advance(1)
        return out

    def plan(self, items: list[Prepared]) -> list[list[Prepared]]:
        """The batches of ``items`` (``prepare.plan``: ``batch_size``, ``max_tokens_per_batch``,
        ``bucket``, the memory budget; rows with spans and rows without apart)."""
        return plan(items, self.batch_size, max_tokens=self.max_tokens_per_batch,
                    bucket=self.bucket, memory=self.limits.memory)

    def score_batch(self, items: list[Prepared], *, retry: bool = True):
        """Score one batch (one ``score_sequences`` call on its token ids, as one batch) and
        write its rows; on a failure, each row alone (``retry``, with the same token ids), so
        that one bad row gives one error row and its batch-mates are still scored; without
        ``retry`` every row of the batch gets the error. Returns the scores' ParamInfo, or None
        when no row of the batch could be scored."""
        tb = time.perf_counter()
        spans = [it.spans for it in items] if items[0].spans is not None else None
        try:
            res = score_sequences(self.model, self.tokenizer, [it.prompt for it in items],
                                  [it.answer for it in items], batch_size=len(items),
                                  method=self.method, params=self.params,
                                  encoded=[it.encoded for it in items], blocks=self.blocks,
                                  hidden=self.hidden, compile=self.compile,
                                  **({"spans": spans} if spans is not None else {}))
        except CaptureRefused:
            raise  # the run stops with the reason, no row fails for it
        except (IsouqError, RuntimeError, ValueError, IndexError) as e:
            if len(items) == 1 or not retry:
                for it in items:
                    self.fail(it.source, f"{type(e).__name__}: "
                                         f"{str(e).splitlines()[0] if str(e) else ''}",
                              getattr(e, "reason", None))
                return None
            infos = [self.score_batch([it]) for it in items]
            return next((i for i in infos if i is not None), None)
        self.write_scored(items, res, (time.perf_counter() - tb) / len(items))
        return res.params

    # ------------------------------------------------------------------ rows out
    def _base(self, r: PairRow) -> dict:
        return {**r.extra, "key": r.key, "prompt": r.prompt, "question": r.question,
                "answer": r.answer, **({"model": self.model_name} if self.model_name else {}),
                "input_sha": r.fingerprint, "settings_sha": self.settings_sha}

    def write_scored(self, items: list[Prepared], res, seconds: float) -> None:
        """Append the answer rows of a scored batch (``res``: its ``SequenceScores``;
        ``seconds``: each row's share of the batch)."""
        for j, it in enumerate(items):
            self._writer.write({
                **self._base(it.source),
                "scores": {k: v if math.isfinite(v) else None  # JSON has no NaN
                           for k, v in res.row_scores(j).items()},
                "seconds": {"forward" if self.method == "forward" else "gradient":
                            round(seconds, 5)},
                "n_answer_tokens": int(res.n_tokens[j]),
                "n_params": res.params.n_params,
                "params": {"set": res.params.set, "n_params": res.params.n_params,
                           "share": round(res.params.share, 6)},
                "method": self.method,
                **({"spans": res.row_spans(j)} if it.spans is not None else {}),
                **({"blocks": res.row_blocks(j)} if self.blocks else {}),
                **({"hidden": res.row_hidden(j)} if self.hidden else {}),
            })
            self.counts["written"] += 1

    def fail(self, r: PairRow, message: str, reason: str | None = None) -> None:
        """The error row of ``r`` (``on_error="skip"``): its ``error`` message and, when the
        row could not be prepared, the ``reason`` code (``prepare.REASONS``); or, with
        ``on_error="stop"``, an InputError naming its key."""
        if self.on_error == "stop":
            raise InputError(f"row {r.key!r} (line {r.line}): {message} "
                             "(or run with --on-error skip to write an error row and go on)")
        self._writer.write({**self._base(r), "error": message,
                            **({"reason": reason} if reason else {})})
        self.counts["errors"] += 1

    def _filler(self) -> None:
        """One forward and backward that writes nothing: with sharded weights, the batch of a
        rank that has run out of rows, so that the busier ranks' collectives have their
        partner."""
        pad = pad_id(self.tokenizer)
        score_sequences(self.model, self.tokenizer, ["a"], [[pad]], batch_size=1,
                        method=self.method, params=self.params,
                        encoded=[Encoded([pad], [pad])])

    def merge(self, keys: list[str], doc: dict) -> None:
        """Once every rank is done: rank 0 writes ``out`` in input order (``keys``; the shards
        merged under torchrun) and records the parameters that took part in the side file."""
        barrier(self.env)
        if self.env.world > 1:
            if self.env.is_main:
                merge_shards(self.out, self.env.world, keys, prune=self.prune)
        elif keys:
            write_ordered(self.out, read_jsonl(self.out), keys, latest="last", prune=self.prune)
        if self.env.is_main and self._info is not None:
            meta_path(self.out).write_text(dumps({**doc, "params": self._info.to_dict()},
                                                 indent=2), encoding="utf-8")


def score_rows(model, tokenizer, rows: Iterable[PairRow], out: str | Path, *,
               total: int | None = None, locked: bool = False, **options) -> dict:
    """Score this process's rows not yet written with the same input and settings:
    ``ScoreRun(model, tokenizer, out, **options).run(rows, total=total, locked=locked)``.

    Args:
        rows: validated rows (``data.pairs.iter_pairs``), read lazily.
        out: the output JSONL.
        total, locked: as :meth:`ScoreRun.run`.
        **options: the fields of :class:`ScoreRun` (``settings``, ``method``, ``params``,
            ``spans``, ``batch_size``, ``on_error``, ``memory_budget``, …).

    Returns:
        The counts of :meth:`ScoreRun.run`.
    """
    return ScoreRun(model, tokenizer, Path(out), **options).run(rows, total=total,
                                                                 locked=locked)


def score_file(input: str | Path, out: str | Path, *, model: str, load: dict | None = None,
               method: str | None = None, params=None, batch_size: int = 16,
               max_tokens_per_batch: int | None = None, bucket: bool = True,
               limit: int | None = None, on_error: str = "skip",
               memory_budget: str | int | None = None, calibration=None,
               spans: str | None = None, shard: str | None = None,
               blocks: bool = False, hidden: bool = False, compile: bool = False) -> list[str]:
    """``isouq score``: check everything a user can get wrong, then load the model and score
    the file's rows into ``out`` (resumable; under torchrun each rank its share).

    Args:
        input: the (prompt, answer) rows (``data.pairs``: JSONL or CSV, optionally .gz).
        out: output JSONL of answer rows.
        model: registry name, folder, .gguf or hub id.
        load: options of ``models.load_model`` (device, dtype, trust_remote_code,
            allow_pickle).
        method, params, batch_size, max_tokens_per_batch, bucket, on_error: as
            :class:`ScoreRun`; ``method`` None: ``"forward"`` (no backward pass) when the
            calibration reads no gradient score and neither blocks nor spans are asked for,
            else ``"ghost"``.
        limit: score only the first ``limit`` rows.
        memory_budget: bytes, or text such as ``"8GB"`` (``memory_plan.parse_bytes``).
        calibration: a ``Calibrator`` for this model: each row gets ``p_correct``.
        spans: ``"sentences"`` or ``"lines"``: a ``spans`` list per row (:class:`ScoreRun`);
            a row that gives its own ``spans`` ranges is scored on those (checked before the
            model loads: :func:`check_row_spans`), with or without this option.
        shard: ``"fsdp"``: under torchrun, split the weights over the ranks with FSDP2
            (``distributed.shard_model``); each rank still scores its own rows, in lockstep.
        blocks: each row also gets its block profile (:class:`ScoreRun`); implied by a
            calibration that reads it.
        hidden: each row also gets its mean hidden states (:class:`ScoreRun`); implied by a
            calibration whose probe reads them.
        compile: graph capture of each batch's backward (``score_sequences``), or a
            ``CaptureRefused`` naming why not.

    Returns:
        The lines that say what was done.
    """
    from .data.pairs import iter_pairs, scan_pairs
    from .distributed import device_for, dist_env, init_process_group
    from .models import check_loadable, content_options, load_model
    from .runio import exclusive

    load = dict(load or {})
    forward_only = (method is None and calibration is not None
                    and not calibration.needs_backward and not blocks and spans is None)
    method = engine_name("forward" if forward_only else method or "ghost",
                         ("auto", "ghost", "per_example", "per_token", "forward"))
    options = content_options(load.get("quantize"), load.get("adapter"))
    # everything a user can get wrong is checked before the model loads
    index = scan_pairs(input, limit=limit, check=check_row_spans)
    check_out(out, [input])
    check_loadable(model)
    if on_error == "stop":
        check_token_ids(index, model)
    env = dist_env()
    dtype = load.get("dtype") or "float32"
    if spans is not None and spans not in SPLITTERS:
        raise InputError(f"--spans {spans} is not one of {', '.join(SPLITTERS)}")
    blocks = blocks or (calibration is not None and calibration.needs_blocks)
    hidden = hidden or (calibration is not None and calibration.needs_hidden)
    check_settings(out, {**run_settings(model=model, method=method, params=params, dtype=dtype,
                                        options=options),
                         "params": params, **({"spans": spans} if spans is not None else {}),
                         **({"blocks": True} if blocks else {}),
                         **({"hidden": True} if hidden else {})})
    if isinstance(memory_budget, str):
        from .memory_plan import parse_bytes

        memory_budget = parse_bytes(memory_budget)
    check_shard(shard, env, method=method, load=load, spans=spans, spans_key=index.spans_key)
    with exclusive(shard_path(out, env.rank, env.world) if env.world > 1 else out):
        load["device"] = device_for(env, load.get("device", "cpu"))
        init_process_group(env, load["device"])
        target = load["device"]
        if shard is not None:  # read on the CPU; each rank's shards then move to its device
            load["device"] = "cpu"
        lm, tok, info = load_model(model, **load)
        if shard is not None:
            from .distributed import shard_model

            shard_model(lm, env, target)
        elif memory_budget is not None and load.get("device_map") is None:
            check_placement(lm, memory_budget, env, method=method, device=target)
        if params not in ("last-layer", "last_layer"):  # a set that cannot be: one line now
            from .params import select_params

            chosen = select_params(lm, params)
            if blocks:  # blocks that cannot be named: one line now
                from .blocks import block_map

                names = block_map(lm, tuple(chosen)).names
        files = getattr(info, "files", None)
        if calibration is not None:
            calibration.check_model(model, files)
            if calibration.needs_blocks and params not in ("last-layer", "last_layer"):
                calibration.check_blocks(names)
            if calibration.needs_hidden:  # a probe on another model's states: one line now
                from .hidden import model_states

                calibration.check_hidden(model_states(lm))
        runner = ScoreRun(
            lm, tok, Path(out), settings=run_settings(model=model, method=method, params=params,
                                                      dtype=dtype, model_files=files,
                                                      options=options),
            method=method, params=params, spans=spans, blocks=blocks, hidden=hidden,
            batch_size=batch_size,
            max_tokens_per_batch=max_tokens_per_batch, bucket=bucket,
            memory_budget=memory_budget, on_error=on_error, env=env,
            lockstep=shard is not None, prune=limit is None,
            meta={"model": info.to_dict() if hasattr(info, "to_dict") else str(info),
                  "input": str(input)}, model_name=str(model), compile=compile)
        res = runner.run(iter_pairs(input, limit=limit), total=len(index), locked=True)
    where = "" if env.world == 1 else f" on rank {env.rank} of {env.world}"
    again = f", {res['rescored']} of them again as their input changed" if res["rescored"] else ""
    errors = (f"; {res['errors']} rows could not be scored (error rows in the output, "
              "--on-error skip)") if res["errors"] else ""
    lines = [f"scored {res['written']} answers ({res['skipped']} already done{again}){where} in "
             f"{res['seconds']:.1f} s -> {out}{errors}"]
    info = res.get("params")
    if info is not None and info.share < 1:  # said once: the score is not the whole model's
        lines.append(f"parameters scored: set {info.set!r}, {info.n_params:,} of "
                     f"{info.n_model:,} ({100 * info.share:.2f}% of the model); --params all "
                     "scores every weight")
    if forward_only and res["written"]:
        lines.append(f"the calibration reads no gradient score: scored with the forward pass "
                     f"only (--method forward), no backward: {res['seconds'] / res['written']:.3g}"
                     " s per answer")
    if calibration is not None and env.is_main:
        from .calibrate_run import annotate_file

        lines.append(annotate_file(out, calibration))
    return lines


def check_shard(shard: str | None, env: DistEnv, *, method: str, load: dict,
                spans: str | None = None, spans_key: str | None = None) -> None:
    """InputError, before the model loads, for a ``shard`` mode that cannot run here
    (``spans_key``: the key of a row that gives its own spans, ``PairIndex.spans_key``)."""
    if shard is None:
        return
    if shard not in SHARD_MODES:
        raise InputError(f"--shard {shard}: use one of {', '.join(SHARD_MODES)}")
    if env.world <= 1:
        raise InputError("--shard fsdp splits the weights over the ranks of a torchrun run: "
                         "launch with torchrun --nproc-per-node W (W ≥ 2), or drop --shard")
    if method != "ghost":
        raise InputError(f"--shard fsdp scores with --method ghost (one backward per batch, the "
                         f"same on every rank); --method {method} is not sharded")
    if spans is not None:
        raise InputError("--shard fsdp scores whole answers: span scores run a backward per "
                         "span, a number that differs between ranks; drop --spans or --shard")
    if spans_key is not None:
        raise InputError(f"--shard fsdp scores whole answers: row {spans_key!r} gives its own "
                         "spans, and span scores run a backward per span, a number that "
                         "differs between ranks; drop the rows' spans or --shard")
    for opt in ("device_map", "quantize"):
        if load.get(opt) is not None:
            raise InputError(f"--shard fsdp and --{opt.replace('_', '-')} do not combine: FSDP "
                             "already splits the weights over the ranks; drop one")


def check_placement(model, budget: int, env: DistEnv, *, method: str, device: str) -> None:
    """MemoryBudgetError naming what to run when the model held whole in this process does not
    fit ``budget`` with one short row (``memory_plan.plan_placement``): FSDP over W ranks, or a
    device map offloading to CPU memory or disk."""
    from .errors import MemoryBudgetError
    from .memory_plan import plan_placement

    # the model itself with the least scoring there is (two tokens): rows too long for the
    # budget are the batches' business (error rows naming it), not a reason to place the model
    plan = plan_placement(model, budget, devices=env.world, device=device, length=2,
                          answer_length=1,
                          method=method if method in ("ghost", "loop") else "ghost")
    if plan.kind != "memory":
        raise MemoryBudgetError(f"--memory-budget: {plan.advice}; or raise --memory-budget")


__all__ = ["ON_ERROR", "ScoreRun", "check_out", "check_row_spans", "check_settings",
           "check_token_ids", "run_settings", "score_file", "score_rows"]
