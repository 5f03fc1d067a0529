"""TriviaQA short answers with a few-shot prompt and alias-match labels (``isouq qa short``).

The open-question study (``qa run``) asks with a zero-shot brief instruction, and the small
models answer in sentences that only an LLM judge can grade. Here the setup of Kuhn et al.
(2023, "Semantic uncertainty", their TriviaQA few-shot prompt) makes them answer in a few
words, which the dataset's answer aliases grade exactly enough:

- Prompt (plain text for every model, no chat template, as for the base models Kuhn et al. ran)::

    This is a bot that correctly answers questions. \\n
    Question: {q_1} Answer: {a_1} … Question: {q_10} Answer: {a_10} Question: {question} Answer:

  with the first 10 questions of the shipped TriviaQA train subset (never a validation
  question) whose alias list names a canonical answer: the alias contained in most of the
  others (``shot_answer``; the shipped file has no canonical value). Generation stops at a newline,
  "Question:" or "Answer:" (``STOP``).
- Label: ``alias_match`` = some answer alias occurs, as whole words, in the answer after SQuAD
  normalization (``judge.contains_answer``); the exact match is kept beside it in ``lexical``.
- Scores: as ``qa run`` (gradient: epistemic, aleatoric, p̄; naive entropy and P(True) on K
  shared samples), plus ``epistemic_log`` = epistemic / p̄² (‖∇θ log p̄‖²) and, with the
  gradient method, the critique's SemGrad, lm_head-gradient and HybridGrad (``qa.semgrad``).

Rows: ``OUT/qa_triviaqa__<model>.jsonl`` (the ``qa run`` schema; ``label_source`` =
``"alias_match"``), resumable; the prompt is part of the run's content settings. A row's key is
the question's TriviaQA key with ``KEY_PREFIX`` (``short-tqa-val-00051``), so the rows (and hand
labels) of this study and of the open one (``qa run``, ``tqa-val-00051``) never share a
(dataset, model, key) and can be reported together. The caches under ``OUT/cache/`` stay keyed
by the TriviaQA key, which seeds the question's samples (``source_key``). Rows written before
the prefix are refused with the fix: ``python scripts/migrate_qa_short.py OUT``.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

from ...answer_row import (  # noqa: F401  (the short-answer rows' keys, defined with the row schema)
    KEY_PREFIX,
    LABEL,
    MIGRATE,
    check_keys,
    is_short_row,
    short_key,
    source_key,
)
from ...errors import InputError
from ...runio import read_jsonl
from .runner import DEFAULT_JUDGE_MODEL, QAConfig, QARunner

PROMPT_NAME = "kuhn2023-fewshot-10"
HEADER = "This is a bot that correctly answers questions. \n"
N_SHOTS = 10
STOP = ("\n", "Question:", "Answer:", "Context:")
#: the questions' dataset (``data.qa.load_dataset``), as rows and run.json name it
SOURCE_DATASET = "triviaqa"
def _counts(aliases: list[str]) -> list[tuple[str, str, int]]:
    """(alias, normalized, how many aliases contain it as whole normalized words) of the ASCII
    aliases of at most five words without parentheses."""
    from .judge import normalize_answer

    norm = [f" {normalize_answer(a)} " for a in aliases]
    out = []
    for i, a in enumerate(aliases):
        n = norm[i].strip()
        if a.isascii() and len(a.split()) <= 5 and "(" not in a and n:
            out.append((a, n, sum(f" {n} " in m for m in norm)))
    return out


def shot_answer(aliases: list[str]) -> str | None:
    """A canonical alias for a solved example (the shipped aliases have no canonical value):
    the ASCII alias of at most five words, without parentheses, contained (as whole normalized
    words) in the most aliases, the shorter on ties; None when another normalized form ties
    with it (an ambiguous alias list: the example is not used)."""
    cands = _counts(aliases)
    if not cands:
        return None
    top = max(c for _, _, c in cands)
    best = [(a, n) for a, n, c in cands if c == top]
    if len({n for _, n in best}) > 1:
        return None
    return min((a for a, _ in best), key=len)


def few_shot_prefix(examples=None) -> str:
    """Kuhn et al.'s header and 10 solved examples: the first 10 questions of ``examples``
    (``QAItem`` s; default: the shipped TriviaQA train subset) whose alias list has a canonical
    alias (``shot_answer``)."""
    if examples is None:
        from ...data.qa import load_dataset

        examples = load_dataset(SOURCE_DATASET, split="train", limit=None, seed=None)[:100]
    shots = [(it.question, a) for it in examples if (a := shot_answer(it.answers))][:N_SHOTS]
    return HEADER + "".join(f"Question: {q} Answer: {a} " for q, a in shots)


def short_prompt(question: str, prefix: str) -> str:
    """The prompt of one question: the few-shot prefix, then ``Question: … Answer:``."""
    return f"{prefix}Question: {question} Answer:"


def alias_match(answer: str, aliases: list[str]) -> bool:
    """Whether a normalized alias occurs as whole words in the normalized answer."""
    from .judge import contains_answer

    return bool(answer.strip()) and contains_answer(answer, aliases)


class ShortRunner(QARunner):
    """``QARunner`` with the few-shot prompt, alias-match labels and ``epistemic_log``."""

    def __init__(self, cfg: QAConfig, out: str | Path, **kw):
        if cfg.judge_model is not None:
            raise InputError("short answers are labelled by alias match; pass judge_model=None")
        cfg.extra = {**cfg.extra, "prompt": PROMPT_NAME, "label": LABEL, "stop": list(STOP)}
        super().__init__(cfg, out, **kw)
        self.stop = STOP
        self._prefix: str | None = None

    def items(self):
        """The TriviaQA questions, each keyed ``short_key`` (the rows' keys)."""
        return [dataclasses.replace(it, key=short_key(it.key)) for it in super().items()]

    def _source(self, chunk):
        return [dataclasses.replace(it, key=source_key(it.key)) for it in chunk]

    def _greedy(self, model, tok, chunk, prompts):
        """Greedy answers cached under the TriviaQA key (as before keys had the prefix)."""
        return super()._greedy(model, tok, self._source(chunk), prompts)

    def _samples(self, model, tok, chunk, prompts):
        """Samples seeded by and cached under the TriviaQA key: the draws of a question do not
        depend on the rows' key prefix (the kept samples are drawn again by a new run)."""
        return super()._samples(model, tok, self._source(chunk), prompts)

    def _cached(self, path: Path, keys: list[str]) -> dict[str, dict]:
        """As ``QARunner._cached``, for cache keys (TriviaQA keys) of edited questions too."""
        stale = {source_key(k) for k in self.changed}
        want = set(keys) - stale
        return {r["key"]: r for r in read_jsonl(path) if r.get("key") in want}

    def prompts(self, tok, chunk) -> list[str]:
        if self._prefix is None:
            self._prefix = few_shot_prefix()
        return [short_prompt(it.question, self._prefix) for it in chunk]

    def _check_resume(self, have: dict[str, dict]) -> None:
        check_keys(have.values(), self.paths["rows"], error=InputError)
        super()._check_resume(have)
        doc = self._previous_run() if have else {}
        before = (doc.get("config") or {}).get("extra") or {}
        now = self.cfg.extra
        diff = {k: (before.get(k), now[k]) for k in ("prompt", "label", "stop") if before.get(k) != now[k]}
        if doc and diff:
            raise InputError(f"{self.paths['rows']} holds rows made with other settings "
                             f"(before, now: {diff}); use another --out")

    def _chunk(self, model, tok, info, chunk, prompts, judge, ent, old=None, *, say=None):
        rows = super()._chunk(model, tok, info, chunk, prompts, judge, ent, old, say=say)
        gens = self._greedy(model, tok, chunk, prompts) if "gradient" in self.cfg.methods else None
        out = []
        for i, (it, row) in enumerate(zip(chunk, rows, strict=True)):
            s = row["scores"]
            if "epistemic" in s and s.get("mean_prob"):
                s["epistemic_log"] = s["epistemic"] / s["mean_prob"] ** 2
            if row.get("label_source") != LABEL:
                ok = alias_match(row["answer"], list(it.answers))
                row = {**row, "correct": int(ok), "label_source": LABEL,
                       "lexical": {**row["lexical"], LABEL: ok}, "prompt": prompts[i]}
            if gens is not None and "semgrad" not in s and gens[i].token_ids:
                from .semgrad import semgrad_scores

                t0 = time.perf_counter()
                sg = semgrad_scores(model, tok, prompts[i], gens[i].token_ids)
                s.update({"semgrad": sg.semgrad, "lm_head_grad": sg.lm_head,
                          "hybridgrad": sg.hybrid})
                row = {**row, "semgrad": {"token_offset": sg.token_offset,
                                          "mean_entropy": sg.mean_entropy},
                       "seconds": {**row["seconds"], "semgrad": time.perf_counter() - t0}}
            out.append(row)
        return out


def run_short(model: str, out: str | Path, *, limit: int = 1000, seed: int = 0,
              methods: tuple[str, ...] = ("gradient", "naive_entropy", "p_true"), k: int = 5,
              max_new_tokens: int = 24, batch_size: int = 8,
              entailment_model: str | None = DEFAULT_JUDGE_MODEL, device: str = "cpu",
              dtype: str | None = None, trust_remote_code: bool = False,
              allow_pickle: bool = False, quantize: str | None = None,
              adapter: str | Path | None = None, device_map: str | dict | None = None,
              max_memory: str | dict | None = None, offload_folder: str | Path | None = None,
              loader=None, progress: bool = True) -> Path:
    """Run (or resume) TriviaQA short answers for one model; returns the rows file.

    Args:
        model: registry name, folder or hub id.
        out: output folder.
        limit: questions, a seeded subset of the validation set (nested across limits).
        seed: subset and sampling seed.
        methods: of ``isouq.methods.METHODS``; semantic entropy is off by default (its
            entailment judge costs far more than the rest, ``docs/qa-study.md``): run it on a
            smaller ``limit`` (the subsets are nested) into the same ``out``.
        k: samples shared by naive entropy, P(True) (its brainstormed answers) and semantic
            entropy.
        max_new_tokens: answer length cap.
        batch_size: questions per batch.
        entailment_model: semantic entropy's entailment judge (registry name, folder or hub
            id; an MNLI-style classifier or a causal LM), loaded only with that method.
        device: torch device.
        dtype, trust_remote_code, allow_pickle: as ``isouq.models.load_model``.
        quantize, adapter, device_map, max_memory, offload_folder: as
            ``isouq.models.load_model``, for the model under study only (``QAConfig``);
            ``quantize`` and the adapter's digest are content settings of the run.
        loader: optional ``name -> (model, tokenizer, info)`` (tests).
        progress: show a progress bar.

    Returns:
        Path of the JSONL rows.
    """
    cfg = QAConfig(dataset=SOURCE_DATASET, model=model, limit=limit, seed=seed, methods=methods,
                   k=k, max_new_tokens=max_new_tokens, batch_size=batch_size, judge_model=None,
                   entailment_model=entailment_model if "semantic_entropy" in methods else None,
                   device=device, dtype=dtype, trust_remote_code=trust_remote_code,
                   allow_pickle=allow_pickle, quantize=quantize,
                   adapter=None if adapter is None else str(adapter), device_map=device_map,
                   max_memory=max_memory,
                   offload_folder=None if offload_folder is None else str(offload_folder))
    return ShortRunner(cfg, out, loader=loader, progress=progress).run()
