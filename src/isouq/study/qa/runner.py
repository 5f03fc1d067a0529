"""The resumable QA study runner behind ``isouq qa run`` (paper §4.2).

Per question: the greedy answer (shared by every method), our scores (epistemic, aleatoric,
normalized epistemic; one backward pass), K sampled completions (shared by naive and semantic
entropy and, first k of them, P(True)), the three baselines, and correctness from an LLM judge
beside lexical criteria. Each finished question is one JSONL row (schema in
``isouq.evaluation.rows``); greedy answers and samples are cached by question key in
``DIR/cache/`` so an interrupted run, or a re-run with other methods, reuses them.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ...choices import DEFAULT_JUDGE_MODEL, DEFAULT_JUDGE_PROMPT
from ...distributed import DistEnv, barrier, merge_shards, shard, shard_path, write_ordered
from ...errors import InputError
from ...llm.generation import Generation, Sampled
from ...llm.prompts import DEFAULT_STOP, effective_judge_style
from ...methods import METHODS, check_methods, check_sampling
from ...runio import (
    JsonlWriter,
    dumps,
    exclusive,
    latest_by_key,
    machine_label,
    read_jsonl,
    slug,
    versions,
)
from .methods import AnswerBatch, run_methods

#: settings that define what the rows and the cached generations hold: resuming with others
#: would mix rows (the limit, methods, judge, batch size and device may change)
CONTENT_SETTINGS = ("seed", "k", "k_p_true", "temperature", "max_new_tokens", "dtype",
                    "quantize", "adapter_sha256")
#: content settings a run.json written before they existed lacks: absent there means None
LOAD_SETTINGS = ("quantize", "adapter_sha256")
#: recorded in run.json but not compared: the same dataset (or adapter) under another spelling
#: of its path is the same run (the dataset's content is compared through ``dataset_sha`` and
#: each row's text, the adapter's through ``adapter_sha256``)
SPELLING_SETTINGS = ("data_path", "adapter")
#: the load options of the model under study only (the judge and entailment models load
#: without them)
STUDY_LOAD_OPTIONS = ("quantize", "adapter", "device_map", "max_memory", "offload_folder")


def item_changed(row: dict | None, item) -> bool:
    """Whether a finished row was made for another text of its question (the dataset was edited
    in place): its question or references differ from the item's now."""
    return row is not None and (row.get("question") != item.question
                                or row.get("references", references(item)) != references(item))


def dataset_sha(items) -> str:
    """Digest of a dataset's content (keys, questions, references), whatever its path."""
    from ...data.pairs import content_sha

    return content_sha([[it.key, it.question, references(it)] for it in items])


def needs_verdict(row: dict | None, judge_model: str | None, judge_prompt: str,
                  incorrect: Sequence[str] = ()) -> bool:
    """A row to (re-)judge: new, judged by another judge model or prompt (as the prompt really
    is for an item with these known incorrect answers: ``effective_judge_style``), or an empty
    answer a judge was asked about (now incorrect by rule, see ``JudgeResult.rule``)."""
    if judge_model is None:
        return False
    v = (row or {}).get("judge")
    style = effective_judge_style(judge_prompt, incorrect)
    if not v or v.get("judge") != judge_model or v.get("prompt", "farquhar2024") != style:
        return True
    return not str(row.get("answer", "x")).strip() and not v.get("rule")


def missing_methods(row: dict | None, methods) -> list[str]:
    """Methods of ``methods`` without a score in ``row`` (all of them when there is no row)."""
    if row is None:
        return list(methods)
    return [m for m in methods if METHODS[m].done_key not in row.get("scores", {})]


@dataclass
class QAConfig:
    """Settings of one (dataset, model) run. Defaults follow Farquhar et al. (2024)."""

    dataset: str = "truthfulqa"
    model: str = "smollm2"
    limit: int | None = 200
    seed: int = 0
    methods: tuple[str, ...] = tuple(METHODS)     # of ``isouq.methods.METHODS``
    k: int = 10                      # samples for naive/semantic entropy (T = temperature)
    k_p_true: int = 5                # brainstormed answers for P(True)
    temperature: float = 1.0
    max_new_tokens: int = 50
    batch_size: int = 8
    judge_model: str | None = DEFAULT_JUDGE_MODEL    # None: lexical labels only
    judge_prompt: str = DEFAULT_JUDGE_PROMPT         # see prompts.JUDGE_STYLES
    entailment_model: str | None = None              # LLM or NLI classifier; default: the judge
    device: str = "cpu"
    dtype: str | None = None                         # the models' dtype (default float32)
    trust_remote_code: bool = False
    allow_pickle: bool = False
    # the model under study only (``STUDY_LOAD_OPTIONS``; as ``isouq.models.load_model``)
    quantize: str | None = None                      # "4bit" | "8bit": bitsandbytes on load
    adapter: str | None = None                       # a PEFT adapter folder over the model
    device_map: str | dict | None = None             # accelerate's placement
    max_memory: str | dict | None = None
    offload_folder: str | None = None
    data_path: str | None = None
    extra: dict = field(default_factory=dict)

    def check(self) -> None:
        check_sampling(check_methods(self.methods), k=self.k, k_p_true=self.k_p_true,
                       temperature=self.temperature)
        if self.limit is not None and self.limit < 1:
            raise InputError(f"limit={self.limit}: ask for at least 1 question (or all: None)")
        for name in ("batch_size", "max_new_tokens"):
            if getattr(self, name) < 1:
                raise InputError(f"{name}={getattr(self, name)}: must be ≥ 1")


def dataset_tag(dataset: str) -> str:
    """The dataset's part of the output names: its name, or for a file its stem and a digest of
    its resolved path (the same file under any spelling, two files never alike)."""
    path = Path(dataset)
    if not path.is_file():
        return slug(dataset)
    import hashlib

    digest = hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:8]
    return f"{slug(path.name)}-{digest}"


def run_paths(out: Path, cfg: QAConfig) -> dict[str, Path]:
    tag = f"{dataset_tag(cfg.dataset)}__{slug(cfg.model)}"
    return {"rows": out / f"qa_{tag}.jsonl", "run": out / f"qa_{tag}.run.json",
            "gens": out / "cache" / f"{tag}.greedy.jsonl",
            "samples": out / "cache" / f"{tag}.samples.jsonl"}


def _gen_from(d: dict) -> Generation:
    names = {f.name for f in dataclasses.fields(Generation)}
    return Generation(**{k: v for k, v in d.items() if k in names})


def _sampled_from(d: dict) -> Sampled:
    d = dict(d)
    d["completions"] = [_gen_from(c) for c in d["completions"]]
    names = {f.name for f in dataclasses.fields(Sampled)}
    return Sampled(**{k: v for k, v in d.items() if k in names})


def references(item) -> list[str]:
    return list(item.answers)


def lexical_labels(item, answer: str) -> dict:
    """Lexical correctness criteria, side by side."""
    from .judge import contains_answer, exact_match, lexical_correct, max_f1, truthfulqa_correct

    refs = references(item)
    out = {"exact_match": exact_match(answer, refs), "contains": contains_answer(answer, refs),
           "f1": max_f1(answer, refs), "f1_correct": lexical_correct(answer, refs)}
    if getattr(item, "incorrect_answers", None):
        out["truthfulqa_lexical"] = truthfulqa_correct(answer, refs, item.incorrect_answers)
    return out


def lexical_label(item, lex: dict) -> bool:
    """The dataset's main lexical criterion: TruthfulQA agreement, else token F1 ≥ 0.5."""
    return bool(lex.get("truthfulqa_lexical", lex["f1_correct"]))


class QARunner:
    """Runs one (dataset, model) study into ``out``; models load lazily and once."""

    def __init__(self, cfg: QAConfig, out: str | Path, *, loader=None, progress: bool = True,
                 env: DistEnv | None = None):
        cfg.check()
        self.cfg, self.out, self.progress = cfg, Path(out), progress
        self.env = env or DistEnv()
        if Path(cfg.dataset).is_file():  # one run per file, however its path is spelled
            cfg = dataclasses.replace(cfg, dataset=str(Path(cfg.dataset).resolve()))
        self.cfg = cfg
        self.paths = run_paths(self.out, cfg)
        if self.env.world > 1:  # each rank appends to files of its own; rank 0 merges rows
            for k in ("gens", "samples"):
                self.paths[k] = shard_path(self.paths[k], self.env.rank, self.env.world)
            self.paths["shard"] = shard_path(self.paths["rows"], self.env.rank, self.env.world)
        self._loader = loader
        self._models: dict[tuple[str, bool], tuple] = {}
        from ...models import content_options

        # checked (and the adapter hashed) before anything is read or loaded
        self.load_settings = content_options(cfg.quantize, cfg.adapter)
        self.machine: str | None = None
        self.changed: set[str] = set()  # keys whose question was edited since its row was made
        self.dataset_sha: str | None = None
        self.stop: tuple[str, ...] = DEFAULT_STOP
        """Stop strings of every generation (a subclass with another prompt may add some)."""
        """Where this run's timings are taken (``runio.machine_label``; rows' ``timed_on``)."""

    # ---------------------------------------------------------------- models
    def study_options(self) -> dict:
        """The load options given for the model under study (``STUDY_LOAD_OPTIONS`` not None)."""
        return {k: getattr(self.cfg, k) for k in STUDY_LOAD_OPTIONS
                if getattr(self.cfg, k) is not None}

    def load(self, name: str, *, classifier_ok: bool = False, study: bool = False):
        """(model, tokenizer, info) of ``name``, loaded once: a causal LM, or, where
        ``classifier_ok`` and the checkpoint is one, a sequence classifier (an NLI model).
        ``study``: the model under study, with ``study_options()`` (a judge naming the same
        model then loads apart, without them)."""
        opts = self.study_options() if study else {}
        key = (name, bool(opts))
        if key not in self._models:
            if self._loader is not None:
                self._models[key] = self._loader(name)
            else:
                from ...models import load_classifier_or_lm, load_model

                load = load_classifier_or_lm if classifier_ok else load_model
                cfg = self.cfg
                self._models[key] = load(name, device=cfg.device, dtype=cfg.dtype,
                                         trust_remote_code=cfg.trust_remote_code,
                                         allow_pickle=cfg.allow_pickle, **opts)
        return self._models[key]

    def _judges(self):
        from .baselines.semantic_entropy import entailment_judge
        from .judge import LLMJudge

        cfg = self.cfg
        judge = ent = None
        if cfg.judge_model:
            jm, jt, ji = self.load(cfg.judge_model)
            judge = LLMJudge(jm, jt, name=cfg.judge_model, batch_size=cfg.batch_size,
                             prompt=cfg.judge_prompt)
        name = self.entailment_name()
        if name is not None:
            em, et, _ = self.load(name, classifier_ok=True)
            ent = entailment_judge(em, et, name=name, batch_size=cfg.batch_size)
        return judge, ent

    # ---------------------------------------------------------------- run
    def items(self):
        from ...data.qa import load_dataset

        return load_dataset(self.cfg.dataset, path=self.cfg.data_path, limit=self.cfg.limit,
                            seed=self.cfg.seed)

    def run(self) -> Path:
        """Run (or resume) the study; returns the rows file. One process per output file:
        a second one started on the same file meanwhile gets a clear error."""
        items = self.items()  # a bad dataset name or path fails before anything is written
        self.dataset_sha = dataset_sha(items)
        with exclusive(self.paths.get("shard", self.paths["rows"])):
            return self._run(items)

    def _run(self, items) -> Path:
        cfg, env = self.cfg, self.env
        mine = shard(items, env)
        rows = JsonlWriter(self.paths.get("shard", self.paths["rows"]))
        have = {r["key"]: r for r in latest_by_key(read_jsonl(rows.path))}
        self._check_resume(have)
        # new questions, questions edited since their row was made (answered again), and done
        # ones that lack a method asked for now (added to the row)
        self.changed = {it.key for it in mine if item_changed(have.get(it.key), it)}
        todo = [it for it in mine if it.key in self.changed
                or missing_methods(have.get(it.key), cfg.methods)
                or needs_verdict(have.get(it.key), cfg.judge_model, cfg.judge_prompt,
                                 it.incorrect_answers)]
        if not todo and env.world == 1 and self._completed_before():
            return self.paths["rows"]  # nothing to do: no model is loaded
        if self._loader is None:  # a model that cannot load fails before the first one loads
            from ...models import check_loadable

            for name in dict.fromkeys([cfg.model, cfg.judge_model, self.entailment_name()]):
                if name:
                    check_loadable(name)
        model, tok, info = self.load(cfg.model, study=True)
        judge, ent = self._judges()
        if env.is_main:
            self._write_run(info, judge, ent, status="running", n=len(items))
        bar = None
        if self.progress:
            from tqdm.auto import tqdm

            where = "" if env.world == 1 else f" rank {env.rank}"
            bar = tqdm(total=len(mine), initial=len(mine) - len(todo),
                       desc=f"qa {cfg.dataset}/{cfg.model}{where}", unit="question")
        say = _step_reporter(bar, ent)
        for s in range(0, len(todo), cfg.batch_size):
            chunk = todo[s : s + cfg.batch_size]
            prompts = self.prompts(tok, chunk)
            old = [None if it.key in self.changed else have.get(it.key) for it in chunk]
            for row in self._chunk(model, tok, info, chunk, prompts, judge, ent, old, say=say):
                if row["key"] in self.changed:  # replaces the row of the question's old text
                    row["revision"] = int(have[row["key"]].get("revision", 0)) + 1
                rows.write(row)
            if bar is not None:
                bar.update(len(chunk))
        if bar is not None:
            bar.close()
        barrier(env)
        keys = [it.key for it in items]
        if env.world > 1:
            if env.is_main:
                merge_shards(self.paths["rows"], env.world, keys)
        else:
            write_ordered(self.paths["rows"], read_jsonl(self.paths["rows"]), keys)
        if env.is_main:
            self._write_run(info, judge, ent, status="complete", n=len(items))
        return self.paths["rows"]

    def prompts(self, tok, chunk) -> list[str]:
        """The prompts that ask ``chunk``'s questions (a subclass may use another format)."""
        from ...llm.prompts import qa_prompts

        return qa_prompts(tok, [it.question for it in chunk])

    def entailment_name(self) -> str | None:
        """The entailment judge semantic entropy uses (None when it is not computed)."""
        cfg = self.cfg
        if "semantic_entropy" not in cfg.methods:
            return None
        return cfg.entailment_model or cfg.judge_model or cfg.model

    def _previous_run(self) -> dict:
        """The run.json an earlier run wrote ({} when there is none or it is unreadable)."""
        try:
            return json.loads(self.paths["run"].read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}

    def _config_as_recorded(self) -> dict:
        """This run's config as run.json records it (tuples as lists), with the adapter's
        digest (``adapter_sha256``) when one is given."""
        return json.loads(dumps({**dataclasses.asdict(self.cfg), **self.load_settings}))

    def _check_resume(self, have: dict[str, dict]) -> None:
        """InputError, before any model loads, when rows exist that run.json says were made
        with other ``CONTENT_SETTINGS`` or (for semantic entropy) another entailment judge."""
        doc = self._previous_run() if have else {}
        if not doc:
            return
        before, now = doc.get("config") or {}, self._config_as_recorded()
        diff = {k: (before.get(k), now.get(k)) for k in CONTENT_SETTINGS
                if (k in before or k in LOAD_SETTINGS) and before.get(k) != now.get(k)}
        ent_before, ent_now = (doc.get("entailment") or {}).get("name"), self.entailment_name()
        if (ent_before and ent_now and ent_before != ent_now
                and any("semantic_entropy" in r.get("scores", {}) for r in have.values())):
            diff["entailment model"] = (ent_before, ent_now)
        if diff:
            raise InputError(
                f"{self.paths['rows']} holds rows made with other settings (before, now: "
                f"{diff}); pass the same settings to resume, or use another --out"
            )

    def _completed_before(self) -> bool:
        """Whether run.json says a run with these settings completed on this dataset content
        (however its path is spelled)."""
        doc = self._previous_run()

        defaults = json.loads(dumps(dataclasses.asdict(QAConfig())))

        def same(cfg: dict) -> dict:  # a setting an older run.json lacks had its default
            return {k: v for k, v in {**defaults, **cfg}.items() if k not in SPELLING_SETTINGS}

        return (doc.get("status") == "complete"
                and same(doc.get("config") or {}) == same(self._config_as_recorded())
                and doc.get("dataset_sha") == self.dataset_sha)

    def _cached(self, path: Path, keys: list[str]) -> dict[str, dict]:
        """Cached generations of ``keys`` (the last of a key), except those of questions edited
        since they were cached."""
        want = set(keys) - self.changed
        return {r["key"]: r for r in read_jsonl(path) if r.get("key") in want}

    def _greedy(self, model, tok, chunk, prompts) -> list[Generation]:
        from ...llm.generation import generate_greedy

        keys = [it.key for it in chunk]
        have = self._cached(self.paths["gens"], keys)
        miss = [i for i, k in enumerate(keys) if k not in have]
        if miss:
            gens = generate_greedy(model, tok, [prompts[i] for i in miss],
                                   max_new_tokens=self.cfg.max_new_tokens,
                                   batch_size=self.cfg.batch_size, stop=self.stop)
            w = JsonlWriter(self.paths["gens"])
            for i, g in zip(miss, gens, strict=False):
                have[keys[i]] = {"key": keys[i], **dataclasses.asdict(g)}
                w.write(have[keys[i]])
        return [_gen_from(have[k]) for k in keys]

    def _samples(self, model, tok, chunk, prompts) -> list[Sampled]:
        from ...llm.generation import sample_completions

        keys = [it.key for it in chunk]
        have = self._cached(self.paths["samples"], keys)
        miss = [i for i, k in enumerate(keys) if k not in have]
        if miss:
            sam = sample_completions(model, tok, [prompts[i] for i in miss], k=self.cfg.k,
                                     temperature=self.cfg.temperature, seed=self.cfg.seed,
                                     max_new_tokens=self.cfg.max_new_tokens,
                                     keys=[keys[i] for i in miss], stop=self.stop,
                                     batch_size=min(self.cfg.batch_size * self.cfg.k, 128))
            w = JsonlWriter(self.paths["samples"])
            for i, sm in zip(miss, sam, strict=False):
                have[keys[i]] = {"key": keys[i], **dataclasses.asdict(sm)}
                w.write(have[keys[i]])
        return [_sampled_from(have[k]) for k in keys]

    def _chunk(self, model, tok, info, chunk, prompts, judge, ent,
               old: list[dict | None] | None = None, *, say=None) -> list[dict]:
        """Rows for ``chunk``; ``old``: rows already written for these questions (or None),
        which keep their scores and label and get only the methods they lack. ``say(step)``
        is told each step as it starts (the progress bar shows it)."""
        say = say or (lambda step: None)
        cfg, n = self.cfg, len(chunk)
        old = old or [None] * n
        if self.machine is None:
            self.machine = machine_label(cfg.device)
        want = {m for o in old for m in missing_methods(o, cfg.methods)}
        say("greedy answers")
        gens = self._greedy(model, tok, chunk, prompts)
        answers = [g.text for g in gens]
        batch = AnswerBatch(model, tok, [it.question for it in chunk], prompts, answers,
                            [g.token_ids for g in gens],
                            sample=lambda: self._samples(model, tok, chunk, prompts),
                            entailment=ent, k_p_true=cfg.k_p_true, seed=cfg.seed,
                            batch_size=cfg.batch_size)
        got = run_methods(batch, want, say=say)
        scores = [g["scores"] for g in got]
        secs = [g["seconds"] for g in got]
        passes = [g["passes"] for g in got]
        verdicts = None
        rejudge = [needs_verdict(o, cfg.judge_model, cfg.judge_prompt, it.incorrect_answers)
                   for o, it in zip(old, chunk, strict=True)]
        if judge is not None and any(rejudge):
            say("judge")
            verdicts = judge.judge([it.question for it in chunk], answers,
                                   [references(it) for it in chunk],
                                   [it.incorrect_answers for it in chunk])
        rows = []
        for i, (it, g) in enumerate(zip(chunk, gens, strict=False)):
            if old[i] is not None:
                rows.append(self._updated(old[i], scores[i], secs[i], passes[i],
                                          verdicts[i] if verdicts and rejudge[i] else None,
                                          machine=self.machine))
                continue
            lex = lexical_labels(it, g.text)
            v = verdicts[i] if verdicts else None
            rows.append({
                "key": it.key, "model": cfg.model, "dataset": cfg.dataset,
                "question": it.question, "answer": g.text, "references": references(it),
                "correct": (v.correct if v else lexical_label(it, lex)),
                "label_source": "judge" if v else "lexical",
                "judge": v.to_dict() if v else None, "lexical": lex,
                "lexical_correct": lexical_label(it, lex),
                "n_answer_tokens": len(g.token_ids), "stop_reason": g.stop_reason,
                "scores": scores[i], "seconds": secs[i] | {"generation": g.seconds},
                "passes": passes[i],
                "timed_on": {m: self.machine for m in [*secs[i], "generation"]},
            })
        return rows

    @staticmethod
    def _updated(row: dict, scores: dict, secs: dict, passes: dict, verdict, *,
                 machine: str | None = None) -> dict:
        """``row`` with the new methods' fields added (a higher revision replaces it);
        ``machine`` (``runio.machine_label``) is recorded for the new timings."""
        new = {**row, "scores": {**scores, **row["scores"]},  # what was there stays as it was
               "seconds": {**secs, **row["seconds"]}, "passes": {**passes, **row["passes"]},
               "revision": int(row.get("revision", 0)) + 1}
        timed = {m: machine for m in secs if m not in row["seconds"]} if machine else {}
        if timed or "timed_on" in row:
            new["timed_on"] = {**(row.get("timed_on") or {}), **timed}
        if verdict is not None:  # a new judge model or prompt: its label replaces the old one
            new |= {"correct": verdict.correct, "label_source": "judge",
                    "judge": verdict.to_dict()}
            if row.get("judge"):
                new["judge_before"] = row["judge"]
        return new

    def _write_run(self, info, judge, ent, *, status: str, n: int) -> None:
        doc = {"status": status, "config": self._config_as_recorded(), "n_questions": n,
               "versions": versions(),
               "dataset_sha": self.dataset_sha,
               "model": info.to_dict() if hasattr(info, "to_dict") else str(info),
               "judge": judge.config() if judge else None,
               "entailment": ent.config() if ent else None,
               "updated": time.strftime("%Y-%m-%dT%H:%M:%S")}
        if status == "complete":
            rows = read_jsonl(self.paths["rows"])
            doc["agreement"] = agreement(rows)
            doc["n_rows"] = len(rows)
            if len(rows) > n:  # an earlier, larger run's rows stay (write_ordered)
                doc["rows_from_earlier_runs"] = {
                    "n": len(rows) - n,
                    "note": "rows of questions outside this run, kept as an earlier run in this "
                            "folder made them (same content settings; methods may differ)"}
        self.paths["run"].parent.mkdir(parents=True, exist_ok=True)
        self.paths["run"].write_text(dumps(doc, indent=2), encoding="utf-8")


def _step_reporter(bar, ent):
    """``say(step)`` for ``_chunk``: the step in the progress bar's postfix, and during semantic
    entropy the entailment pairs labelled so far in the batch (a batch can take minutes)."""
    if bar is None:
        return lambda step: None
    state = {"step": "", "pairs": 0}

    def say(step: str) -> None:
        state["step"], state["pairs"] = step, 0
        bar.set_postfix_str(step)

    def on_pairs(n: int) -> None:
        state["pairs"] += n
        bar.set_postfix_str(f"{state['step']}: {state['pairs']} entailment pairs")

    if ent is not None:
        ent.on_pairs = on_pairs
    return say


def agreement(rows: list[dict]) -> dict:
    """Cohen's κ and raw agreement between the judge and the lexical label on the same rows."""
    from .judge import cohen_kappa

    pairs = [(bool(r["judge"]["correct"]), bool(r["lexical_correct"]))
             for r in rows if r.get("judge")]
    if not pairs:
        return {"n": 0}
    a, b = zip(*pairs, strict=False)
    return {"n": len(pairs), "kappa": cohen_kappa(a, b),
            "agreement": sum(x == y for x, y in pairs) / len(pairs),
            "judge_accuracy": sum(a) / len(a), "lexical_accuracy": sum(b) / len(b)}
