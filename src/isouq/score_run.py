"""The resumable runner behind ``isouq score``: rows in, one JSONL row out per input.

- Streaming: input rows are read, tokenized and scored in windows of ``window`` rows
  (length-bucketed inside a window), so memory does not grow with the input's size.
- Resumable and never mixed: every output row carries ``input_sha`` (its prompt and answer as
  scored) and ``settings_sha`` (model file SHA-256, method, parameters, dtype, isouq version;
  the full settings are in ``<out>.meta.json``). A resume with other settings is refused, naming
  the setting; a row whose input changed under the same key is scored again and replaces the
  stale one; each batch is appended whole (fsync'ed) as soon as it is scored, so a killed run
  loses at most the batch in flight. The finished output is rewritten in input order.
- One bad row does not stop a run (``on_error="skip"``): it gets an error row
  ``{"key", "error", ...}`` and the run goes on; ``on_error="stop"`` raises instead.
- Data-parallel under torchrun: see :mod:`isouq.distributed`; with ``shard="fsdp"`` the
  weights are split over the ranks too (FSDP2), and the ranks score in lockstep.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import nullcontext
from itertools import islice
from pathlib import Path

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
from .errors import InputError, IsouqError
from .runio import JsonlWriter, dumps, exclusive, read_jsonl
from .sequences import context_window, encode, pad_id, score_sequences
from .spans import SPLITTERS, resolve_spans

ON_ERROR = ("skip", "stop")
WINDOW = 1024


def prompt_of(row: PairRow, tokenizer) -> str | list:
    """The row's prompt, or the documented QA prompt built from its question."""
    if row.prompt is not None:
        return row.prompt
    from .llm.prompts import qa_prompt

    return qa_prompt(tokenizer, row.question)


def run_settings(*, model: str, method: str, params=None, dtype: str = "float32",
                 model_files: dict[str, str] | None = None) -> dict:
    """What makes a score: the model (name and, once loaded, the SHA-256 of its files), the
    method, the parameters that take part, the dtype, the isouq version."""
    from . import __version__

    out = {"model": str(model), "method": method, "params": params, "dtype": str(dtype),
           "isouq": __version__}
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
    """InputError when ``out`` holds rows made with settings other than ``settings`` (only the
    fields both sides know are compared: call it before the model loads, and after)."""
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
    if diff:
        said = "; ".join(f"{k}: {old[k]!r} there, {settings[k]!r} now" for k in diff)
        raise InputError(f"{out} was scored with other settings ({said}); give another --out, "
                         "or the same settings to resume")


def _windows(rows: Iterable[PairRow], size: int) -> Iterator[list[PairRow]]:
    it = iter(rows)
    while chunk := list(islice(it, size)):
        yield chunk


class _RowError(Exception):
    """A row that cannot be scored; its message is the reason written in the error row."""


def _prepare(row: PairRow, tokenizer, window: int | None, vocab: int | None, spans=None):
    """(prompt, token count, answer token count, rows it scores: 1 + its spans) of a row, or
    _RowError with the reason."""
    try:
        prompt = prompt_of(row, tokenizer)
        enc = encode(tokenizer, [prompt], [row.answer])[0]
        n_spans = 0 if spans is None else len(
            resolve_spans(tokenizer, [row.answer], spans, [enc], keys=[row.key])[0].ranges)
    except IsouqError as e:
        raise _RowError(str(e)) from None
    except Exception as e:  # noqa: BLE001 - a chat template (jinja) refusing the messages
        raise _RowError(f"the tokenizer's chat template cannot render this prompt "
                        f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}); "
                        "check the messages' roles and order") from None
    if isinstance(row.answer, list) and vocab is not None and max(row.answer) >= vocab:
        raise _RowError(f"answer token id {max(row.answer)} is outside the model's vocabulary "
                        f"of {vocab}; pass ids of this model's tokenizer")
    n = len(enc.prompt) + len(enc.answer)
    if window is not None and n > window:
        raise _RowError(f"prompt + answer are {n} tokens, longer than the model's context window "
                        f"of {window}; shorten the prompt or the answer")
    return prompt, n, len(enc.answer), 1 + n_spans


def plan_batches(lengths: list[int], batch_size: int, max_tokens: int | None,
                 bucket: bool = True,
                 fits: Callable[[list[int]], bool] | None = None) -> list[list[int]]:
    """Group item indices into batches: sorted by length when ``bucket``, each batch at most
    ``batch_size`` items, (max length × items) ≤ ``max_tokens`` padded tokens, and, given
    ``fits`` (indices -> whether that batch fits a memory budget), a batch that fits."""
    if batch_size < 1:
        raise InputError(f"batch_size must be ≥ 1, got {batch_size}")
    order = sorted(range(len(lengths)), key=lambda i: lengths[i]) if bucket \
        else list(range(len(lengths)))
    batches: list[list[int]] = []
    cur: list[int] = []
    longest = 0
    for i in order:
        grown = max(longest, lengths[i])
        full = len(cur) >= batch_size or (max_tokens is not None and cur
                                          and grown * (len(cur) + 1) > max_tokens) or (
            fits is not None and cur and not fits([*cur, i]))
        if full:
            batches.append(cur)
            cur, grown = [], lengths[i]
        cur.append(i)
        longest = grown
    if cur:
        batches.append(cur)
    return batches


def score_rows(
    model,
    tokenizer,
    rows: Iterable[PairRow],
    out: str | Path,
    *,
    settings: dict | None = None,
    batch_size: int = 16,
    max_tokens_per_batch: int | None = None,
    bucket: bool = True,
    method: str = "ghost",
    params=None,
    meta: dict | None = None,
    on_error: str = "skip",
    window: int = WINDOW,
    total: int | None = None,
    progress: bool = True,
    env: DistEnv | None = None,
    locked: bool = False,
    prune: bool = False,
    memory_budget: int | None = None,
    on_batch: Callable[[int], None] | None = None,
    spans: str | None = None,
    lockstep: bool = False,
) -> dict:
    """Score this process's rows not yet written with the same input and settings.

    Args:
        rows: validated rows (``data.pairs.iter_pairs``), read lazily in windows of ``window``.
        out: the output JSONL (input order once finished) beside ``<out>.meta.json``.
        settings: what made the scores (:func:`run_settings`); ``method`` and ``params`` are
            always included. A resume with other settings is an InputError.
        on_error: ``"skip"`` writes an error row for a row that cannot be scored and goes on;
            ``"stop"`` raises an InputError naming its key.
        total: number of rows (for the progress bar), if known.
        locked: the caller already holds ``exclusive(out)`` (the CLI takes it before loading
            the model).
        prune: drop output rows whose key is no longer in the input (stale rows of an edited
            file); False keeps them after the input's rows (a run over fewer rows, ``--limit``).
        memory_budget: bytes the process may use: batches are cut so that the predicted peak
            (:func:`isouq.memory_plan.peak_bytes`) fits; a row that does not fit alone is an
            error row (or, with ``on_error="stop"``, an error).
        spans: ``"sentences"`` or ``"lines"``: each row also gets a ``spans`` list, one entry
            per span with its text, character range and scores (``isouq.spans``); a row whose
            spans cannot be made (blank text) is an error row. Recorded in the settings.
        lockstep: the weights are sharded over the ranks (FSDP2): every rank runs as many
            batches as the busiest one (fillers that write nothing), and a batch that fails is
            written as error rows whole (a retry row by row would run more collectives on one
            rank than on the others).

    Returns:
        {"written", "skipped", "rescored", "errors", "seconds"}: rows scored now, rows already
        done, rows scored again because their input changed, error rows written now, wall time.
    """
    if on_error not in ON_ERROR:
        raise InputError(f"on_error={on_error!r} is not one of {', '.join(ON_ERROR)}")
    if spans is not None and spans not in SPLITTERS:
        raise InputError(f"spans={spans!r} is not one of {', '.join(SPLITTERS)}")
    env = env or DistEnv()
    settings = {**(settings or {}), "method": method, "params": params}
    if spans is not None:  # absent otherwise: runs made before spans existed still resume
        settings["spans"] = spans
    settings_sha = content_sha(settings)
    path = shard_path(out, env.rank, env.world) if env.world > 1 else Path(out)
    check_settings(out, settings)
    if env.world > 1:
        check_settings(path, settings)
    lock = exclusive(path) if not locked else nullcontext()
    with lock:
        doc = {**(meta or {}), "settings": settings, "settings_sha": settings_sha,
               "world_size": env.world}
        if env.is_main:  # written first: a resume after a crash compares against it
            meta_path(out).write_text(dumps(doc, indent=2), encoding="utf-8")
        if env.world > 1:  # a shard's own side file, for check_settings on resume
            meta_path(path).write_text(dumps({"settings": settings}), encoding="utf-8")
        writer = JsonlWriter(path)
        done = {}
        for r in read_jsonl(path):
            if r.get("settings_sha", settings_sha) != settings_sha:
                raise InputError(f"{path} holds rows of other settings (key {r.get('key')!r}); "
                                 "give another --out")
            done[str(r.get("key"))] = r.get("input_sha")
        counts = {"written": 0, "skipped": 0, "rescored": 0, "errors": 0}
        ctx = context_window(model)
        emb = getattr(model, "get_input_embeddings", lambda: None)()
        vocab = getattr(emb, "num_embeddings", None)
        t0 = time.perf_counter()
        bar = None
        if progress:
            from tqdm.auto import tqdm

            bar = tqdm(total=total, unit="answer",
                       desc="scoring" if env.world == 1 else f"scoring (rank {env.rank})")
        keys: list[str] = []
        position, info = 0, None
        fits = need = None
        if memory_budget is not None:
            from .memory_plan import peak_bytes, shape_of

            shape = shape_of(model)

            def need(n: int, length: int, answer: int) -> int:
                return peak_bytes(shape, batch=n, length=length, answer_length=answer,
                                  method=method if method in ("ghost", "loop") else "ghost")

            def fits(n: int, length: int, answer: int) -> bool:
                return need(n, length, answer) <= memory_budget

        def base(r: PairRow) -> dict:
            return {"key": r.key, "prompt": r.prompt, "question": r.question, "answer": r.answer,
                    "input_sha": r.fingerprint, "settings_sha": settings_sha}

        def fail(r: PairRow, reason: str) -> None:
            if on_error == "stop":
                raise InputError(f"row {r.key!r} (line {r.line}): {reason} "
                                 "(or run with --on-error skip to write an error row and go on)")
            writer.write({**base(r), "error": reason})
            counts["errors"] += 1

        for chunk in _windows(rows, window):
            todo: list[PairRow] = []
            for r in chunk:
                keys.append(r.key)
                mine = position % env.world == env.rank
                position += 1
                if not mine:
                    continue
                if done.get(r.key) == r.fingerprint:
                    counts["skipped"] += 1
                else:
                    counts["rescored"] += r.key in done
                    todo.append(r)
            if bar is not None:
                bar.update(len(chunk) - len(todo))
            prompts, lengths, answer_lengths, ok, n_rows = [], [], [], [], []
            for r in todo:
                try:
                    prompt, n, a, k = _prepare(r, tokenizer, ctx, vocab, spans)
                    if method in ("ghost", "auto"):  # ghost span scores: a whole answer's memory
                        k = 1
                    if fits is not None and not fits(k, n, a):
                        raise _RowError(
                            f"one row of {n} tokens needs more than the memory budget of "
                            f"{memory_budget / 2**30:.2f} GiB (predicted "
                            f"{need(k, n, a) / 2**30:.2f} GiB); raise --memory-budget")
                except _RowError as e:
                    fail(r, str(e))
                    if bar is not None:
                        bar.update(1)
                    continue
                prompts.append(prompt)
                lengths.append(n)
                answer_lengths.append(a)
                n_rows.append(k)
                ok.append(r)

            def fits_batch(idx: list[int], lengths=lengths, answers=answer_lengths,
                           n_rows=n_rows) -> bool:  # per_example span rows count as rows
                return fits(sum(n_rows[i] for i in idx), max(lengths[i] for i in idx),
                            max(answers[i] for i in idx))

            batches = plan_batches(lengths, batch_size, max_tokens_per_batch, bucket,
                                   fits=fits_batch if fits is not None else None)
            steps = lockstep_steps(len(batches), env) if lockstep else len(batches)
            for step in range(steps):
                if step >= len(batches):  # sharded weights: the others' batch needs this rank
                    _filler(model, tokenizer, method, params)
                    continue
                idx = batches[step]
                info = _score_batch(model, tokenizer, [ok[i] for i in idx],
                                    [prompts[i] for i in idx], method, params, writer, base,
                                    fail, counts, spans, retry=not lockstep) or info
                if bar is not None:
                    bar.update(len(idx))
                if on_batch is not None:
                    on_batch(len(idx))
        if bar is not None:
            bar.close()
        barrier(env)
        if env.world > 1:
            if env.is_main:
                merge_shards(out, env.world, keys, prune=prune)
        elif keys:
            write_ordered(out, read_jsonl(out), keys, latest="last", prune=prune)
        if env.is_main and info is not None:  # the parameters that took part
            meta_path(out).write_text(dumps({**doc, "params": info.to_dict()}, indent=2),
                                      encoding="utf-8")
        return {**counts, "seconds": time.perf_counter() - t0, "params": info}


def score_file(input: str | Path, out: str | Path, *, model: str, load: dict | None = None,
               method: str = "ghost", params=None, batch_size: int = 16,
               max_tokens_per_batch: int | None = None, bucket: bool = True,
               limit: int | None = None, on_error: str = "skip",
               memory_budget: str | int | None = None, calibration=None,
               spans: str | None = None, shard: str | None = None) -> list[str]:
    """``isouq score``: check everything a user can get wrong, then load the model and score
    the file's rows into ``out`` (resumable; under torchrun each rank its share).

    Args:
        input: the (prompt, answer) rows (``data.pairs``: JSONL or CSV, optionally .gz).
        out: output JSONL of answer rows.
        model: registry name, folder, .gguf or hub id.
        load: options of ``models.load_model`` (device, dtype, trust_remote_code,
            allow_pickle).
        method, params, batch_size, max_tokens_per_batch, bucket, on_error: as
            :func:`score_rows`.
        limit: score only the first ``limit`` rows.
        memory_budget: bytes, or text such as ``"8GB"`` (``memory_plan.parse_bytes``).
        calibration: a ``Calibrator`` for this model: each row gets ``p_correct``.
        spans: ``"sentences"`` or ``"lines"``: a ``spans`` list per row (:func:`score_rows`).
        shard: ``"fsdp"``: under torchrun, split the weights over the ranks with FSDP2
            (``distributed.shard_model``); each rank still scores its own rows, in lockstep.

    Returns:
        The lines that say what was done.
    """
    from .data.pairs import iter_pairs, scan_pairs
    from .distributed import device_for, dist_env, init_process_group
    from .models import check_loadable, load_model
    from .runio import exclusive

    load = dict(load or {})
    # everything a user can get wrong is checked before the model loads
    index = scan_pairs(input, limit=limit)
    check_out(out, [input])
    check_loadable(model)
    if on_error == "stop":
        check_token_ids(index, model)
    env = dist_env()
    dtype = load.get("dtype") or "float32"
    if spans is not None and spans not in SPLITTERS:
        raise InputError(f"--spans {spans} is not one of {', '.join(SPLITTERS)}")
    check_settings(out, {**run_settings(model=model, method=method, params=params, dtype=dtype),
                         "params": params, **({"spans": spans} if spans is not None else {})})
    if isinstance(memory_budget, str):
        from .memory_plan import parse_bytes

        memory_budget = parse_bytes(memory_budget)
    check_shard(shard, env, method=method, load=load, spans=spans)
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

            select_params(lm, params)
        files = getattr(info, "files", None)
        if calibration is not None:
            calibration.check_model(model, files)
        res = score_rows(lm, tok, iter_pairs(input, limit=limit), out,
                         settings=run_settings(model=model, method=method, params=params,
                                               dtype=dtype, model_files=files),
                         batch_size=batch_size, max_tokens_per_batch=max_tokens_per_batch,
                         bucket=bucket, method=method, params=params, env=env,
                         on_error=on_error, total=len(index), locked=True, prune=limit is None,
                         memory_budget=memory_budget, spans=spans, lockstep=shard is not None,
                         meta={"model": info.to_dict() if hasattr(info, "to_dict") else str(info),
                               "input": str(input)})
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
    if calibration is not None and env.is_main:
        from .calibrate_run import annotate_file

        lines.append(annotate_file(out, calibration))
    return lines


def check_shard(shard: str | None, env: DistEnv, *, method: str, load: dict,
                spans: str | None = None) -> None:
    """InputError, before the model loads, for a ``shard`` mode that cannot run here."""
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


def _filler(model, tokenizer, method: str, params) -> None:
    """One forward and backward that writes nothing: with sharded weights, the batch of a rank
    that has run out of rows, so that the busier ranks' collectives have their partner."""
    score_sequences(model, tokenizer, ["a"], [[pad_id(tokenizer)]], batch_size=1,
                    method=method, params=params)


def _score_batch(model, tokenizer, rows: list[PairRow], prompts: list, method: str, params,
                 writer: JsonlWriter, base, fail, counts: dict, spans=None, *,
                 retry: bool = True) -> None:
    """Score one batch and write its rows; on a failure, each row alone (``retry``), so that
    one bad row gives one error row and its batch-mates are still scored; without ``retry``
    every row of the batch gets the error. Returns the scores' ParamInfo, or None when no row
    of the batch could be scored."""
    tb = time.perf_counter()
    try:
        res = score_sequences(model, tokenizer, prompts, [r.answer for r in rows],
                              batch_size=len(rows), method=method, params=params,
                              **({"spans": spans} if spans is not None else {}))
    except (IsouqError, RuntimeError, ValueError, IndexError) as e:
        if len(rows) == 1 or not retry:
            for r in rows:
                fail(r, f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
            return None
        infos = [_score_batch(model, tokenizer, [r], [p], method, params, writer, base, fail,
                              counts, spans) for r, p in zip(rows, prompts, strict=True)]
        return next((i for i in infos if i is not None), None)
    per = (time.perf_counter() - tb) / len(rows)
    for j, r in enumerate(rows):
        writer.write({
            **base(r),
            "scores": res.row_scores(j),
            "seconds": {"gradient": round(per, 5)},
            "n_answer_tokens": int(res.n_tokens[j]),
            "n_params": res.params.n_params,
            "params": {"set": res.params.set, "n_params": res.params.n_params,
                       "share": round(res.params.share, 6)},
            "method": method,
            **({"spans": res.row_spans(j)} if spans is not None else {}),
        })
        counts["written"] += 1
    return res.params


__all__ = ["ON_ERROR", "check_out", "check_settings", "check_token_ids", "plan_batches",
           "prompt_of", "run_settings", "score_file", "score_rows"]
