"""Long answers whose every sentence has an exact label (``isouq qa long``).

Span scores (``isouq.spans``) say which sentence of an answer to check; this study measures
whether they find the wrong ones, on answers whose every sentence is labelled offline by alias
match (TriviaQA, as ``qa short``).

Prompt (``PROMPT_NAME``; plain text for every model, as ``qa short``): K = 5 TriviaQA
questions, numbered, with a one-line instruction::

    Answer each question in a few words, one numbered answer per line.
    Questions:
    1. {q_1}
    ...
    5. {q_5}
    Answers:

Questions are grouped five by five in the order of the seeded subset's shuffle
(``data.qa.pick``: the first 500 of that order are ``qa short --limit 500``'s questions, the first
1000 ``--limit 1000``'s), so group ``g`` holds the same questions for every model, and groups
made only of questions the short study kept come first.

Answer (one line per question, ``compose_answer``)::

    1. {a_1}
    2. {a_2}
    ...
    5. {a_5}

lines joined by a newline, no newline at the end. Sentence j is the text of ``a_j`` only (its
character range after ``"j. "``), not the number: a short answer holds no newline (the short
study stops at one), so the split is exact, and the spans are given to ``score_sequences`` as
character ranges (no splitter).

Two settings:

- ``composed``: ``a_j`` = the model's own greedy short answer to question j, from the kept
  ``qa short`` rows (``--short``, default ``results/qa_short``); a question they lack is answered
  here the same way (the short study's few-shot prompt, greedy, stop strings, 24 new tokens) and
  kept in ``OUT/short__<model>.jsonl``. Sentence j carries the short row's ``correct`` (alias
  match). A group with an empty short answer is skipped (counted).
- ``generated``: the model answers the prompt itself (greedy, ``llm.generation``; stop at a blank
  line, ``Questions:``, ``Answers:`` or a sixth item; ``max_new_tokens``); its lines are aligned
  to the questions by their numbers (``align_lines``) and sentence j is labelled by alias
  match against question j's aliases (``short.alias_match``). A question with no line of its
  number (or only an empty one) has no sentence; lines without a number, with a repeated one or
  one outside 1..5 are dropped; both are counted.

A small model often repeats the question, and an alias can be a phrase of the question ("The
Palmetto State" to "Which US state is known as the Palmetto State?"): such a sentence is
labelled correct by alias match and flagged ``echo`` (``echo_only``); the tables are computed
with the alias-match labels and again with echoes counted wrong (``*_no_echo``).

Scores of each sentence: the span scores of ``score_sequences(spans=ranges)`` (p̄, aleatoric,
epistemic ‖∇θ p̄_span‖², epistemic_log, normalized_epistemic) plus ``min_prob``, the span's
lowest token probability, from one forward without gradients of the same (prompt, answer)
tokens; the whole answer's scores (and its ``min_prob``) beside them.

Files under ``OUT`` (resumable: a group is written whole or not at all, a re-run skips the
groups written, rows made with other settings are refused): ``<setting>__<model>.jsonl`` (one
row per answer), ``<setting>__<model>.run.json`` (settings, model files, how many answers were
asked for and written), ``short__<model>.jsonl``, ``cache/generated__<model>.jsonl`` (the
generations), and, after each run, ``results.json``, ``tables.md`` and the figure
(``study.analysis.long_spans``) over every answer row in ``OUT``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import random
import re
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from ...errors import InputError
from ...runio import (
    JsonlWriter,
    check_resume,
    dumps,
    exclusive,
    latest_by_key,
    machine_label,
    read_jsonl,
    slug,
    versions,
)
from .short import SOURCE_DATASET, alias_match, few_shot_prefix, short_prompt
from .short import STOP as SHORT_STOP

K = 5
PROMPT_NAME = "numbered-zero-shot-5"
HEADER = "Answer each question in a few words, one numbered answer per line.\n"
STOP = ("\n\n", "Questions:", "Answers:", f"\n{K + 1}.")
SETTINGS = ("composed", "generated")
#: the short study's answer length cap (``qa short``: ``max_new_tokens=24``)
SHORT_MAX_NEW_TOKENS = 24
EXPERIMENT = "qa-long"
FIGURE = "auroc_wrong_sentences.png"
_NUMBER = re.compile(r"\s*(\d+)\s*[.):]\s*")


# ------------------------------------------------------------------ prompt and answers
def clean(text: str) -> str:
    """A question on one line (blanks collapsed)."""
    return " ".join(str(text).split())


def long_prompt(questions: Sequence[str]) -> str:
    """The prompt that asks ``questions`` (module doc)."""
    if not questions:
        raise InputError("a long prompt needs at least one question")
    body = "".join(f"{j}. {clean(q)}\n" for j, q in enumerate(questions, 1))
    return f"{HEADER}Questions:\n{body}Answers:\n"


def compose_answer(answers: Sequence[str]) -> tuple[str, list[tuple[int, int]]]:
    """(text, character range of each answer) of the numbered answer lines (module doc).

    Raises InputError for an empty answer or one with a line break (the split would not be
    exact)."""
    text, ranges = "", []
    for j, a in enumerate(answers, 1):
        a = str(a).strip()
        if not a or "\n" in a or "\r" in a:
            raise InputError(f"answer {j} ({a!r}) is empty or spans lines; a composed answer "
                             "needs one non-empty line per question")
        if j > 1:
            text += "\n"
        text += f"{j}. "
        ranges.append((len(text), len(text) + len(a)))
        text += a
    return text, ranges


@dataclasses.dataclass(frozen=True)
class Alignment:
    """Lines of a generated answer aligned to its K questions: ``ranges[j]`` the character
    range of question j's answer (None: no sentence), ``dropped_lines`` lines left out by
    reason (``unnumbered``, ``repeated``, ``out_of_range``, ``empty``)."""

    ranges: tuple[tuple[int, int] | None, ...]
    dropped_lines: dict

    @property
    def missing(self) -> int:
        return sum(r is None for r in self.ranges)


def align_lines(text: str, k: int = K) -> Alignment:
    """Align the lines of ``text`` to questions 1..k by the number each begins with
    (``"3. "``, ``"3) "``, ``"3: "``): the first non-empty line of a number is that question's
    sentence (its text after the number, blanks stripped)."""
    ranges: list[tuple[int, int] | None] = [None] * k
    dropped = {"unnumbered": 0, "repeated": 0, "out_of_range": 0, "empty": 0}
    start = 0
    for line in text.split("\n"):
        here, start = start, start + len(line) + 1
        if not line.strip():
            continue
        m = _NUMBER.match(line)
        if m is None:
            dropped["unnumbered"] += 1
            continue
        j = int(m.group(1))
        body = line[m.end():]
        if not 1 <= j <= k:
            dropped["out_of_range"] += 1
        elif ranges[j - 1] is not None:
            dropped["repeated"] += 1
        elif not body.strip():
            dropped["empty"] += 1
        else:
            a = here + m.end()
            ranges[j - 1] = (a, a + len(body.rstrip()))
    return Alignment(tuple(ranges), dropped)


def cut_after_last(tok, ids: list[int], k: int = K) -> tuple[list[int], int]:
    """(ids, how many were cut): a generated answer ends with its line of number ``k`` (text
    the model wrote after it, e.g. "The correct answer is …", is no answer to any question);
    the tokens kept are those that begin before that line's end."""
    from ...spans import answer_offsets

    text, offsets = answer_offsets(tok, ids, ids)
    r = align_lines(text, k).ranges[k - 1]
    if r is None:
        return ids, 0
    end = text.find("\n", r[1])
    if end < 0:
        return ids, 0
    m = sum(1 for a, _ in offsets if a < end)
    return ids[:max(m, 1)], len(ids) - max(m, 1)


def echo_only(text: str, question: str, aliases: Sequence[str]) -> bool:
    """Whether ``text`` matches the aliases (``short.alias_match``) only through aliases the
    question itself contains (as whole normalized words): "The Palmetto State" to "Which US
    state is known as the Palmetto State?" (an alias of South Carolina). Such a sentence echoes
    the question; the label counts it correct, ``no_echo`` evaluations count it wrong."""
    from .judge import normalize_answer

    if not alias_match(text, list(aliases)):
        return False
    q = f" {normalize_answer(question)} "
    rest = [a for a in aliases if normalize_answer(a) and f" {normalize_answer(a)} " not in q]
    return not (rest and alias_match(text, rest))


# ------------------------------------------------------------------ questions
def question_pool(n: int, seed: int = 0, items=None) -> list:
    """The first ``n`` TriviaQA validation questions in the order of ``data.qa.pick``'s seeded
    shuffle: the questions of ``qa short --limit n --seed seed`` (a set), ordered so that every
    smaller limit's questions come first."""
    if items is None:
        from ...data.qa import load_dataset

        items = load_dataset(SOURCE_DATASET, limit=None, seed=None)
    order = list(range(len(items)))
    random.Random(seed).shuffle(order)
    return [items[i] for i in order[:n]]


def groups_of(pool: Sequence, k: int = K) -> list[tuple[str, list]]:
    """(key ``g0000``, k questions) of each whole group of consecutive pool questions."""
    return [(f"g{g:04d}", list(pool[g * k:(g + 1) * k])) for g in range(len(pool) // k)]


def kept_short_rows(short_dir: str | Path | None, model: str,
                    load_settings: dict | None = None) -> dict[str, dict]:
    """The kept ``qa short`` rows of ``model`` (newest revision of each), by TriviaQA key.

    ``load_settings``: this run's ``models.content_options`` (quantize, adapter digest); kept
    rows whose run.json records others (absent: None) are an InputError naming the fix.
    """
    if short_dir is None:
        return {}
    path = Path(short_dir) / f"qa_{SOURCE_DATASET}__{slug(model)}.jsonl"
    rows = latest_by_key(read_jsonl(path))
    kept = {str(r["key"]).removeprefix("short-"): r for r in rows if "correct" in r}
    if kept:
        from .runner import LOAD_SETTINGS

        run = path.with_suffix(".run.json")
        made = ((json.loads(run.read_text(encoding="utf-8")).get("config") or {})
                if run.is_file() else {})
        now = load_settings or {}
        diff = {k: (made.get(k), now.get(k)) for k in LOAD_SETTINGS
                if made.get(k) != now.get(k)}
        if diff:
            raise InputError(f"the kept qa short rows {path} were made with other load options "
                             f"(there, now: {diff}); pass --short none, or a --short folder of "
                             "qa short rows made with the same --quantize/--adapter")
    return kept


# ------------------------------------------------------------------ scoring
def span_probabilities(model, tok, prompts, answers, ranges) -> list[dict]:
    """Per answer, from ONE forward without gradients: its answer tokens' probabilities
    (``probs``), and per range ``min_prob`` and ``mean_prob`` over the tokens the range holds
    (``spans.resolve_spans``: the tokens ``score_sequences(spans=…)`` reads)."""
    import torch

    from ...passes import collate, token_probs
    from ...spans import resolve_spans
    from ...tokens import encode, pad_id

    enc = encode(tok, prompts, answers)
    spans = resolve_spans(tok, answers, ranges, enc)
    with torch.no_grad():
        p, mask = token_probs(model, collate(enc, pad_id(tok), "left"))
    out = []
    for i, sp in enumerate(spans):
        probs = p[i][mask[i]].float().cpu().tolist()
        per = [[probs[t] for t in toks] for toks in sp.tokens]
        out.append({"probs": probs, "min_prob": [min(v) for v in per],
                    "mean_prob": [sum(v) / len(v) for v in per]})
    return out


def usable_ranges(tok, answer, ranges) -> list[bool]:
    """Which ranges hold a token of their own (``spans.resolve_spans`` accepts them)."""
    from ...spans import resolve_spans

    out = []
    for r in ranges:
        try:
            resolve_spans(tok, [answer], [[r]])
            out.append(True)
        except InputError:
            out.append(False)
    return out


def score_answers(model, tok, prompts, answers, ranges, *, batch_size: int = 2
                  ) -> list[tuple[dict, list[dict]]]:
    """Per answer: (whole-answer scores, one score dict per range), the span scores of
    ``score_sequences(spans=ranges)`` plus ``min_prob`` (and ``n_tokens``)."""
    from ...sequences import score_sequences

    res = score_sequences(model, tok, list(prompts), list(answers), spans=list(ranges),
                          batch_size=batch_size)
    extra = []
    for s in range(0, len(answers), batch_size):
        extra += span_probabilities(model, tok, prompts[s:s + batch_size],
                                    answers[s:s + batch_size], ranges[s:s + batch_size])
    out = []
    for i in range(len(answers)):
        whole = {**res.row_scores(i), "min_prob": min(extra[i]["probs"]),
                 "n_tokens": int(res.n_tokens[i])}
        spans = []
        for k, sp in enumerate(res.spans[i]):
            d = sp.to_dict()
            spans.append({**d["scores"], "min_prob": extra[i]["min_prob"][k],
                          "n_tokens": d["n_tokens"],
                          "mean_prob_check": extra[i]["mean_prob"][k]})
        out.append((whole, spans))
    return out


# ------------------------------------------------------------------ the runner
class LongRunner:
    """One model's ``qa long`` run into ``out`` (module doc)."""

    def __init__(self, model: str, out: str | Path, *, questions: int = 1050,
                 answers: int | None = None, seed: int = 0, short_dir: str | Path | None =
                 "results/qa_short", max_new_tokens: int = 64, batch_size: int = 2,
                 device: str = "cpu", dtype: str | None = None, load: dict | None = None,
                 loader=None, generator: Callable | None = None, items=None,
                 progress: bool = True, say: Callable[[str], None] | None = None):
        from ...models import content_options

        if questions < K:
            raise InputError(f"--questions {questions}: give at least {K} (one prompt)")
        self.name, self.out = model, Path(out)
        self.questions, self.answers, self.seed = questions, answers, seed
        self.short_dir, self.max_new_tokens, self.batch_size = short_dir, max_new_tokens, batch_size
        self.device, self.dtype = device, dtype
        #: further ``load_model`` options (trust_remote_code, allow_pickle, quantize, adapter,
        #: device_map, max_memory, offload_folder); quantize and the adapter are settings
        self.load_options = {k: v for k, v in (load or {}).items() if v is not None}
        self.load_settings = content_options(self.load_options.get("quantize"),
                                             self.load_options.get("adapter"))
        self._loader, self._generator, self._items = loader, generator, items
        self.progress, self.say = progress, say or (lambda text: None)
        self._loaded = None
        self.info = None
        self.planned = groups_of(question_pool(questions, seed, items))
        self.groups = self.planned if answers is None else self.planned[:answers]
        self.kept = kept_short_rows(short_dir, model, self.load_settings)

    # ---------------------------------------------------------------- files
    def path(self, setting: str) -> Path:
        return self.out / f"{setting}__{slug(self.name)}.jsonl"

    @property
    def short_path(self) -> Path:
        return self.out / f"short__{slug(self.name)}.jsonl"

    @property
    def gens_path(self) -> Path:
        return self.out / "cache" / f"generated__{slug(self.name)}.jsonl"

    def settings(self, setting: str) -> dict:
        """What a row's content depends on (a resume with others is refused)."""
        s = {"prompt": PROMPT_NAME, "k": K, "seed": self.seed, "setting": setting,
             "dataset": SOURCE_DATASET, **self.load_settings}
        if setting == "generated":
            s["max_new_tokens"] = self.max_new_tokens
            s["stop"] = list(STOP)
        else:
            s["short_max_new_tokens"] = SHORT_MAX_NEW_TOKENS
        return s

    # ---------------------------------------------------------------- model
    def load(self):
        if self._loaded is None:
            if self._loader is not None:
                self._loaded = self._loader(self.name)
            else:
                from ...models import load_model

                self._loaded = load_model(self.name, device=self.device, dtype=self.dtype,
                                          **self.load_options)
            self.info = self._loaded[2]
        return self._loaded

    def _generate(self, model, tok, prompts, *, max_new_tokens, stop):
        from ...llm.generation import generate_greedy

        gen = self._generator or generate_greedy
        return gen(model, tok, prompts, max_new_tokens=max_new_tokens, stop=stop,
                   batch_size=max(1, len(prompts)))

    # ---------------------------------------------------------------- short answers
    def short_answers(self, items) -> dict[str, dict]:
        """{TriviaQA key: {answer, correct, source}} of ``items``: the kept short row, else one
        answered here (and kept in ``short__<model>.jsonl``)."""
        w = JsonlWriter(self.short_path)
        made = {"prompt": "kuhn2023-fewshot-10", "greedy": True,
                "max_new_tokens": SHORT_MAX_NEW_TOKENS, **self.load_settings}
        mine = {r["key"]: r for r in read_jsonl(self.short_path)  # made with these settings
                if r.get("settings", made) == made}
        miss = [it for it in items if it.key not in self.kept and it.key not in mine]
        if miss:
            model, tok, _ = self.load()
            prefix = few_shot_prefix()
            t0 = time.perf_counter()
            gens = self._generate(model, tok, [short_prompt(it.question, prefix) for it in miss],
                                  max_new_tokens=SHORT_MAX_NEW_TOKENS, stop=SHORT_STOP)
            dt = (time.perf_counter() - t0) / len(miss)
            for it, g in zip(miss, gens, strict=True):
                row = {"key": it.key, "model": self.name, "question": it.question,
                       "answer": g.text, "stop_reason": g.stop_reason,
                       "correct": int(alias_match(g.text, list(it.answers))),
                       "label_source": "alias_match", "seconds": dt, "settings": made}
                w.write(row)
                mine[it.key] = row
        out = {}
        for it in items:
            if it.key in self.kept:
                r = self.kept[it.key]
                out[it.key] = {"answer": r["answer"], "correct": int(r["correct"]),
                               "source": "kept qa short row"}
            else:
                r = mine[it.key]
                out[it.key] = {"answer": r["answer"], "correct": int(r["correct"]),
                               "source": "answered by qa long"}
        return out

    # ---------------------------------------------------------------- run
    def run(self, settings: Sequence[str] = SETTINGS) -> dict[str, Path]:
        """Run (or resume) each setting; returns {setting: rows file}."""
        bad = [s for s in settings if s not in SETTINGS]
        if bad:
            raise InputError(f"unknown setting(s) {bad}; use {', '.join(SETTINGS)}")
        out = {}
        for setting in settings:
            path = self.path(setting)
            with exclusive(path):
                out[setting] = self._run(setting, path)
        return out

    def _run(self, setting: str, path: Path) -> Path:
        rows = JsonlWriter(path)
        have = read_jsonl(path)
        want = self.settings(setting)
        check_resume(have, lambda r: want, path.name)
        todo = [(k, qs) for k, qs in self.groups if not rows.done(k)]
        self._write_run(setting, status="running", written=len(rows.keys))
        bar = None
        if self.progress and todo:
            from tqdm.auto import tqdm

            bar = tqdm(total=len(self.groups), initial=len(self.groups) - len(todo),
                       desc=f"qa long {setting}/{self.name}", unit="answer")
        step = self._composed if setting == "composed" else self._generated
        for s in range(0, len(todo), self.batch_size):
            chunk = todo[s:s + self.batch_size]
            for row in step(chunk, want):
                rows.write(row)
            if bar is not None:
                bar.update(len(chunk))
        if bar is not None:
            bar.close()
        self._write_run(setting, status="complete", written=len(rows.keys))
        return path

    def _base(self, key, qs, setting, want, prompt) -> dict:
        return {"key": key, "model": self.name, "setting": setting, "settings": want,
                "questions": [{"key": it.key, "question": it.question} for it in qs],
                "prompt": prompt}

    def _scored(self, todo: list[tuple[dict, str, list, list]], t_extra: dict[str, float]
                ) -> list[dict]:
        """Score (row, answer, ranges, sentence dicts) entries; fill their rows."""
        model, tok, _ = self.load()
        if not todo:
            return []
        t0 = time.perf_counter()
        res = score_answers(model, tok, [r["prompt"] for r, *_ in todo],
                            [a for _, a, _, _ in todo], [rg for *_, rg, _ in todo],
                            batch_size=self.batch_size)
        dt = (time.perf_counter() - t0) / len(todo)
        for (row, _, _, sents), (whole, spans) in zip(todo, res, strict=True):
            for s, sc in zip(sents, spans, strict=True):
                s["n_tokens"] = sc.pop("n_tokens")
                s["scores"] = sc
            row["whole"] = whole
            row["seconds"] = {**t_extra, "scoring": dt}
            row["timed_on"] = machine_label(self.device)
        return [r for r, *_ in todo]

    def _composed(self, chunk, want) -> list[dict]:
        items = [it for _, qs in chunk for it in qs]
        t0 = time.perf_counter()
        short = self.short_answers(items)
        t_short = (time.perf_counter() - t0) / len(chunk)
        out, todo = [], []
        for key, qs in chunk:
            row = self._base(key, qs, "composed", want, long_prompt([it.question for it in qs]))
            sh = [short[it.key] for it in qs]
            row["short_sources"] = sorted({s["source"] for s in sh})
            empty = [j for j, s in enumerate(sh, 1) if not str(s["answer"]).strip()]
            if empty:
                row.update(answer=None, sentences=[], whole=None,
                           skipped=f"empty short answer to question(s) {empty}")
                out.append(row)
                continue
            text, ranges = compose_answer([s["answer"] for s in sh])
            _, tok, _ = self.load()
            ok = usable_ranges(tok, text, ranges)
            sents = [{"index": j, "question_key": it.key, "text": text[a:b], "start": a,
                      "end": b, "correct": s["correct"],
                      "echo": bool(s["correct"]) and echo_only(text[a:b], it.question,
                                                               it.answers)}
                     for j, (it, s, (a, b), good) in enumerate(zip(qs, sh, ranges, ok,
                                                                    strict=True), 1) if good]
            row.update(answer=text, sentences=sents,
                       dropped={"no_token": ok.count(False)})
            todo.append((row, text, [r for r, g in zip(ranges, ok, strict=True) if g], sents))
            out.append(row)
        self._scored(todo, {"short_answers": t_short})
        return out

    def _generated(self, chunk, want) -> list[dict]:
        from .runner import _gen_from

        prompts = [long_prompt([it.question for it in qs]) for _, qs in chunk]
        cache = JsonlWriter(self.gens_path)
        have = {r["key"]: r for r in read_jsonl(self.gens_path)
                if r.get("settings") == want}
        miss = [i for i, (k, _) in enumerate(chunk) if k not in have]
        if miss:
            model, tok, _ = self.load()
            t0 = time.perf_counter()
            gens = self._generate(model, tok, [prompts[i] for i in miss],
                                  max_new_tokens=self.max_new_tokens, stop=STOP)
            dt = (time.perf_counter() - t0) / len(miss)
            for i, g in zip(miss, gens, strict=True):
                d = {"key": chunk[i][0], "model": self.name, "settings": want,
                     **dataclasses.asdict(g), "seconds": dt}
                cache.write(d)
                have[chunk[i][0]] = d
        _, tok, _ = self.load()
        out, todo = [], []
        for (key, qs), prompt in zip(chunk, prompts, strict=True):
            g = _gen_from(have[key])
            row = self._base(key, qs, "generated", want, prompt)
            from ...spans import answer_offsets

            ids, cut = cut_after_last(tok, list(g.token_ids))
            text = answer_offsets(tok, ids, ids)[0]
            al = align_lines(text)
            pairs = [(j, it, r) for j, (it, r) in enumerate(zip(qs, al.ranges, strict=True), 1)
                     if r is not None]
            ok = usable_ranges(tok, ids, [r for *_, r in pairs]) if pairs else []
            sents = []
            for (j, it, (a, b)), good in zip(pairs, ok, strict=True):
                if good:
                    sents.append({"index": j, "question_key": it.key, "text": text[a:b],
                                  "start": a, "end": b,
                                  "correct": int(alias_match(text[a:b], list(it.answers))),
                                  "echo": echo_only(text[a:b], it.question, it.answers)})
            row.update(answer=text, answer_token_ids=ids, stop_reason=g.stop_reason,
                       tokens_cut_after_last_item=cut,
                       sentences=sents,
                       dropped={"missing": al.missing, "no_token": ok.count(False),
                                **{f"lines_{k}": v for k, v in al.dropped_lines.items()}})
            if sents:
                todo.append((row, ids, [(s["start"], s["end"]) for s in sents], sents))
            else:
                row["whole"] = None
            out.append(row)
        self._scored(todo, {"generation": float(have[chunk[0][0]].get("seconds", 0.0))})
        return out

    def _write_run(self, setting: str, *, status: str, written: int) -> None:
        doc = {"status": status, "model": self.name, "setting": setting,
               "settings": self.settings(setting), "questions": self.questions,
               "answers_planned": len(self.planned), "answers_asked": len(self.groups),
               "answers_written": written,
               "short_dir": None if self.short_dir is None else str(self.short_dir),
               "kept_short_rows": len(self.kept), "batch_size": self.batch_size,
               "device": self.device, "machine": machine_label(self.device),
               "versions": versions(), "updated": time.strftime("%Y-%m-%dT%H:%M:%S")}
        path = self.path(setting).with_suffix(".run.json")
        if self.info is not None and hasattr(self.info, "to_dict"):
            doc["model_info"] = json.loads(dumps(self.info.to_dict()))
        elif path.is_file():  # nothing loaded this time: keep what loaded before
            old = json.loads(path.read_text(encoding="utf-8")).get("model_info")
            if old is not None:
                doc["model_info"] = old
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(dumps(doc, indent=2), encoding="utf-8")
        tmp.replace(path)


# ------------------------------------------------------------------ results
def answer_rows(out: str | Path, items=None) -> list[dict]:
    """Every answer row under ``out`` (``<setting>__<model>.jsonl``); a sentence written
    without ``echo`` gets it (``echo_only``, the question and aliases from ``items``, default
    the shipped TriviaQA)."""
    rows = []
    for setting in SETTINGS:
        for p in sorted(Path(out).glob(f"{setting}__*.jsonl")):
            rows += latest_by_key(read_jsonl(p))
    lack = [s for r in rows for s in r.get("sentences") or [] if "echo" not in s]
    if lack:
        if items is None:
            from ...data.qa import load_dataset

            items = load_dataset(SOURCE_DATASET, limit=None, seed=None)
        by = {it.key: it for it in items}
        for s in lack:
            it = by[s["question_key"]]
            s["echo"] = bool(s["correct"]) and echo_only(s["text"], it.question, it.answers)
    return rows


def runs_of(out: str | Path) -> list[dict]:
    """The ``run.json`` of each (setting, model) under ``out``."""
    docs = []
    for setting in SETTINGS:
        for p in sorted(Path(out).glob(f"{setting}__*.run.json")):
            docs.append(json.loads(p.read_text(encoding="utf-8")))
    return docs


def progress_table(out: str | Path, rows: Sequence[dict]) -> list[dict]:
    """Per (setting, model): answers planned (every prompt of ``--questions``), written,
    scored, sentences labelled, dropped sentences and lines, and whether the run is partial
    (fewer answers written than planned: ``--answers`` stopped it, or it was interrupted)."""
    table = []
    for doc in runs_of(out):
        st, m = doc["setting"], doc["model"]
        planned = int(doc.get("answers_planned", doc.get("answers_asked", 0)))
        rs = [r for r in rows if r["setting"] == st and r["model"] == m]
        dropped: dict[str, int] = {}
        for r in rs:
            for k, v in (r.get("dropped") or {}).items():
                dropped[k] = dropped.get(k, 0) + int(v)
        skipped = sum(1 for r in rs if r.get("skipped"))
        table.append({
            "setting": st, "model": m, "planned": planned, "written": len(rs),
            "scored": sum(1 for r in rs if r.get("whole")), "skipped": skipped,
            "sentences": sum(len(r.get("sentences") or []) for r in rs),
            "sentences_dropped": dropped.get("missing", 0) + dropped.get("no_token", 0),
            "lines_dropped": sum(v for k, v in dropped.items() if k.startswith("lines_")),
            "stopped_by_length": sum(1 for r in rs if r.get("stop_reason") == "length"),
            "partial": len(rs) < planned,
            "seconds_per_answer": _mean([(r.get("seconds") or {}).get("scoring") for r in rs]),
        })
    return table


def _mean(v) -> float | None:
    v = [x for x in v if isinstance(x, int | float)]
    return sum(v) / len(v) if v else None


def write_long_results(out: str | Path, *, n_bootstrap: int = 1000, seed: int = 0,
                       started: float | None = None, items=None) -> Path:
    """Evaluate every answer row under ``out``: ``results.json`` (tables ``progress``,
    ``counts``, ``auroc``, ``paired``, ``within``, ``pooled``, ``paired_pooled``, and
    ``counts_no_echo``, ``auroc_no_echo`` with the sentences that only echo the question
    counted wrong; ``verdict`` lines), ``tables.md`` and the figure (one process at a time).
    ``items``: the questions (default: the shipped TriviaQA). Returns the results.json path."""
    out = Path(out)
    with _results_lock(out):
        return _write_long_results(out, n_bootstrap=n_bootstrap, seed=seed, started=started,
                                   items=items)


@contextlib.contextmanager
def _results_lock(out: Path):
    """Wait for (then hold) ``OUT/cache/results.lock``: runs of other models or settings into
    the same folder rewrite results.json, tables.md and the figure one at a time."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows
        yield
        return
    lock = out / "cache" / "results.lock"
    lock.parent.mkdir(parents=True, exist_ok=True)
    with open(lock, "a") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


def _write_long_results(out: Path, *, n_bootstrap: int, seed: int, started: float | None,
                        items=None) -> Path:
    from ...runio import write_results
    from ..analysis.long_spans import long_tables, sentence_rows, verdict
    from ..report.long_section import auroc_figure

    rows = answer_rows(out, items)
    tables = {"progress": progress_table(out, rows)}
    sents = sentence_rows(rows)
    tables.update(long_tables(sents, n_bootstrap=n_bootstrap, seed=seed))
    strict = long_tables(sentence_rows(rows, label="no_echo"), n_bootstrap=n_bootstrap,
                         seed=seed)
    tables.update({"counts_no_echo": strict["counts"], "auroc_no_echo": strict["auroc"]})
    figures = []
    if tables["auroc"]:
        auroc_figure(tables["auroc"], out / FIGURE)
        figures.append(FIGURE)
    partial = [f"{p['model']} {p['setting']}: {p['written']} of {p['planned']} answers"
               for p in tables["progress"] if p["partial"]]
    return write_results(
        out, EXPERIMENT, settings={"prompt": PROMPT_NAME, "k": K, "header": HEADER,
                                   "stop": list(STOP), "n_bootstrap": n_bootstrap,
                                   "seed": seed},
        seed=seed, started=started or time.time(), tables=tables, figures=figures,
        extra={"verdict": verdict(tables), "partial": partial})


def run_long(models: Sequence[str], out: str | Path, *, settings: Sequence[str] = SETTINGS,
             questions: int = 1050, answers: int | None = None, seed: int = 0,
             short_dir: str | Path | None = "results/qa_short", max_new_tokens: int = 64,
             batch_size: int = 2, device: str = "cpu", dtype: str | None = None,
             trust_remote_code: bool = False, allow_pickle: bool = False,
             quantize: str | None = None, adapter: str | Path | None = None,
             device_map: str | dict | None = None, max_memory: str | dict | None = None,
             offload_folder: str | Path | None = None, n_bootstrap: int = 1000, loader=None,
             generator=None, items=None, progress: bool = True,
             say: Callable[[str], None] | None = None) -> Path:
    """Run (or resume) ``qa long`` for each model and setting (one after the other, the tables
    rewritten after each); returns ``OUT/results.json``.

    Args:
        models: registry names, folders or hub ids.
        out: output folder.
        settings: ``composed`` and/or ``generated`` (module doc).
        questions: the TriviaQA questions (seeded subset, ``question_pool``), grouped K by K.
        answers: at most this many answers (groups) per setting (default: all).
        seed: the subset's seed (``qa short --seed``).
        short_dir: the kept ``qa short`` rows (None: answer every question here).
        max_new_tokens: the generated setting's answer length cap.
        batch_size: answers per scoring pass (each is 1 + K rows) and per generation batch.
        device, dtype, trust_remote_code, allow_pickle: as ``isouq.models.load_model``.
        quantize, adapter: as ``isouq.models.load_model``, for every model (an adapter fits
            one base model: one model only); settings of the rows, so a resume with others, or
            kept ``qa short`` rows made with others, is refused.
        device_map, max_memory, offload_folder: as ``isouq.models.load_model``.
        n_bootstrap: resamples of the answers for the intervals.
        loader, generator, items: tests: ``name -> (model, tok, info)``, a stand-in for
            ``generate_greedy``, the questions instead of the shipped TriviaQA.
        progress: progress bars.
        say: where progress lines go.
    """
    started = time.time()
    say = say or (lambda text: None)
    if adapter is not None and len(models) > 1:
        raise InputError(f"--adapter fits one base model, and {len(models)} models are given; "
                         "run each model with its own adapter (one --model per run)")
    load = dict(trust_remote_code=trust_remote_code, allow_pickle=allow_pickle,
                quantize=quantize, adapter=adapter, device_map=device_map,
                max_memory=max_memory, offload_folder=offload_folder)
    for name in models:
        runner = LongRunner(name, out, questions=questions, answers=answers, seed=seed,
                            short_dir=short_dir, max_new_tokens=max_new_tokens,
                            batch_size=batch_size, device=device, dtype=dtype, load=load,
                            loader=loader,
                            generator=generator, items=items, progress=progress, say=say)
        for setting in settings:
            runner.run([setting])
            path = write_long_results(out, n_bootstrap=n_bootstrap, seed=seed, started=started,
                                      items=items)
            say(f"qa long {setting}/{name}: rows in {runner.path(setting)}; tables in {path}")
    return write_long_results(out, n_bootstrap=n_bootstrap, seed=seed, started=started,
                              items=items)


__all__ = ["EXPERIMENT", "HEADER", "K", "PROMPT_NAME", "SETTINGS", "STOP", "Alignment",
           "LongRunner", "align_lines", "answer_rows", "compose_answer", "groups_of",
           "long_prompt", "question_pool", "run_long", "score_answers", "span_probabilities",
           "write_long_results"]
