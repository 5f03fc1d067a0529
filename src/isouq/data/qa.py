"""Question-answering datasets as lists of :class:`QAItem`: TruthfulQA, TriviaQA, any JSONL/CSV.

Sources, in the order :func:`load_dataset` tries them:
- a local file (``.jsonl``/``.json`` lines or ``.csv``) with a question and its answers;
- the copies shipped in the project's ``shared/data`` (found from ``$ISOUQ_DATA``, else beside
  or inside the repository root, else above the working directory): TruthfulQA (817
  questions, Apache-2.0) and TriviaQA unfiltered validation (11,313 questions with answer
  aliases; research use only; see each folder's SOURCE.md);
- Hugging Face ``datasets`` names when online: ``truthful_qa/generation``,
  ``trivia_qa/unfiltered.nocontext`` or ``trivia_qa/rc.nocontext`` (``datasets`` is imported
  only then);
- the exact-label tasks of :mod:`isouq.data.tasks` by name (``compare``, ``lists``,
  ``truthfulqa-mc1``; :func:`load_task`).

``limit`` with a ``seed`` picks a deterministic subset, returned in file order; for one seed
the subsets are nested (the first 100 picked are inside the first 200). ``seed=None`` takes
the first ``limit`` questions.
"""

from __future__ import annotations

import csv
import os
import random
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import DataError, InputError
from ..runio import read_jsonl
from . import tasks

SHIPPED = {
    ("truthfulqa", "validation"): "truthfulqa/truthfulqa.jsonl",
    ("triviaqa", "validation"): "triviaqa/triviaqa_validation.jsonl",
    ("triviaqa", "train"): "triviaqa/triviaqa_train_subset.jsonl",
}
# SHA-256 of the shipped files, from their SOURCE.md.
SHIPPED_SHA256 = {
    "truthfulqa/truthfulqa.jsonl": (
        "896e105249c686c390103efa22db66dd572fb8b65d3c0b725bebc2bb8119d79d"
    ),
    "triviaqa/triviaqa_validation.jsonl": (
        "78f732995553041216bdd0bc6ada2e62cd340919c9c6e19cfb91184a9b40462c"
    ),
    "triviaqa/triviaqa_train_subset.jsonl": (
        "7ed7fb63ef729583ebbf35f5b9a087af5b244388111319059dabc2023249790a"
    ),
}
HF_DEFAULT = {
    "truthfulqa": ("truthful_qa", "generation"),
    "triviaqa": ("trivia_qa", "unfiltered.nocontext"),
}
HF_DATASET = {"truthful_qa": "truthfulqa", "trivia_qa": "triviaqa"}
NAMES = {"truthfulqa": "truthfulqa", "triviaqa": "triviaqa", **HF_DATASET}
ANSWER_FIELDS = ("answers", "correct_answers", "answer", "aliases")
LIST_FIELDS = ("answers", "correct_answers", "incorrect_answers", "aliases")


@dataclass(frozen=True)
class QAItem:
    """One question with its reference answers.

    key: stable id (``truthfulqa-0``, ``tqa-val-00000``), used to resume runs.
    answers: correct reference answers, best first (TruthfulQA: best_answer, then the
    other correct answers; TriviaQA: the answer aliases). incorrect_answers: TruthfulQA's
    false references (empty elsewhere). dataset: "truthfulqa", "triviaqa" or the file's name.
    """

    key: str
    question: str
    answers: list[str]
    incorrect_answers: list[str] = field(default_factory=list)
    dataset: str = "qa"


# ---------------------------------------------------------------- rows → items


def _as_list(value, split_semicolons: bool) -> list[str]:
    if value is None:
        return []
    if isinstance(value, dict):  # HF trivia_qa: {"value": ..., "aliases": [...], ...}
        aliases = list(value.get("aliases") or [])
        return aliases + [value["value"]] if value.get("value") else aliases
    if isinstance(value, str):
        return value.split(";") if split_semicolons else [value]
    return [str(v) for v in value]


def _unique(values) -> list[str]:
    out: list[str] = []
    for v in values:
        v = str(v).strip()
        if v and v not in out:
            out.append(v)
    return out


def _key(row: dict, index: int, dataset: str) -> str:
    for name in ("key", "id", "question_id"):
        value = row.get(name)
        if value is not None and str(value) != "":
            return f"{dataset}-{value}" if isinstance(value, int) else str(value)
    return f"{dataset}-{index}"


def item_from_row(row: dict, index: int, dataset: str, *, split_semicolons: bool = False):
    """A QAItem from one record; DataError naming the missing field.

    Answers come from ``best_answer`` (first) and any of ``answers``, ``correct_answers``,
    ``answer``, ``aliases`` (lists, strings, or HF TriviaQA's answer dict); false references
    from ``incorrect_answers``. ``split_semicolons``: list fields are ``;``-separated strings
    (TruthfulQA's CSV).
    """
    question = str(row.get("question") or "").strip()
    if not question:
        raise DataError(f"row {index}: no 'question' text; each row needs question and answers")
    answers = _as_list(row.get("best_answer"), False)
    for name in ANSWER_FIELDS:
        answers += _as_list(row.get(name), split_semicolons and name in LIST_FIELDS)
    answers = _unique(answers)
    if not answers:
        raise DataError(
            f"row {index} ({question[:60]!r}): no reference answer; give 'answers' (a list) or "
            "'answer', 'best_answer', 'correct_answers'"
        )
    incorrect = _unique(_as_list(row.get("incorrect_answers"), split_semicolons))
    return QAItem(_key(row, index, dataset), question, answers, incorrect, dataset)


# ---------------------------------------------------------------- files


def _rows_csv(path: Path) -> list[dict]:
    with open(path, encoding="utf-8-sig", newline="") as f:
        reader = csv.DictReader(f)
        return [{_snake(k): v for k, v in row.items() if k is not None} for row in reader]


def _snake(header: str) -> str:
    return "_".join(header.strip().lower().split())


def read_qa_file(path: str | os.PathLike, *, dataset: str | None = None) -> list[QAItem]:
    """All items of a JSONL (one object per line) or CSV file (header row; list columns
    ``;``-separated, as in TruthfulQA.csv). ``dataset`` defaults to the lower-case file stem."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path} does not exist; pass a JSONL or CSV file of questions/answers")
    name = dataset or path.stem.lower()
    is_csv = path.suffix.lower() == ".csv"
    rows = _rows_csv(path) if is_csv else read_jsonl(path, missing_ok=False)
    if not rows:
        raise DataError(f"{path} has no rows")
    items = []
    for i, row in enumerate(rows):
        try:
            items.append(item_from_row(row, i, name, split_semicolons=is_csv))
        except DataError as e:
            raise DataError(f"{path}: {e}") from None
    return _check_unique(items, str(path))


def _check_unique(items: list[QAItem], where: str) -> list[QAItem]:
    seen: set[str] = set()
    for it in items:
        if it.key in seen:
            raise DataError(f"{where}: key {it.key!r} appears twice; keys must be unique")
        seen.add(it.key)
    return items


# ---------------------------------------------------------------- shipped copies


def _repo_root() -> Path | None:
    for parent in Path(__file__).resolve().parents:
        if (parent / "pyproject.toml").is_file():
            return parent
    return None


def _candidates() -> list[Path]:
    roots = [r for r in (_repo_root(),) if r is not None]
    cwd = Path.cwd()
    roots += [cwd, *cwd.parents]
    out: list[Path] = []
    for r in roots:
        for c in (r / "shared" / "data", r.parent / "shared" / "data"):
            if c not in out:
                out.append(c)
    return out


def data_root() -> Path:
    """The shipped data folder: ``$ISOUQ_DATA``, else ``shared/data`` beside or inside the
    repository root, else above the working directory. DataError when none exists."""
    env = os.environ.get("ISOUQ_DATA")
    if env:
        root = Path(env).expanduser()
        if not root.is_dir():
            raise DataError(f"ISOUQ_DATA={env} is not a folder; point it at shared/data")
        return root
    for c in _candidates():
        if c.is_dir():
            return c
    raise DataError(
        "the shipped data folder (shared/data) was not found beside the repository or above "
        "the working directory. Set ISOUQ_DATA=/path/to/shared/data, pass path=<file>, or, "
        "online, use a Hugging Face name such as 'truthful_qa/generation' (pip install 'isouq[data]')."
    )


def shipped_path(name: str, split: str = "validation") -> Path:
    """Path of a shipped dataset file; DataError when the split or file is missing."""
    rel = SHIPPED.get((name, split))
    if rel is None:
        have = sorted(s for n, s in SHIPPED if n == name)
        raise DataError(f"no shipped {name} split {split!r}; shipped splits: {', '.join(have)}")
    path = data_root() / rel
    if not path.is_file():
        raise DataError(f"{path} is missing from the data folder; see {path.parent}/SOURCE.md")
    return path


# ---------------------------------------------------------------- Hugging Face


def load_hf(hf_name: str, config: str | None, split: str, dataset: str) -> list[QAItem]:
    """Items from ``datasets.load_dataset(hf_name, config, split=split)`` (needs internet).

    Rows whose key repeats (TriviaQA rc.* lists questions once per evidence source) are kept
    once. DataError when ``datasets`` is missing or the hub cannot be reached.
    """
    try:
        import datasets
    except ImportError:
        raise DataError(
            f"loading {hf_name!r} from the Hugging Face hub needs the datasets package: "
            f"pip install 'isouq[data]'. Offline, use the shipped copy: load_dataset({dataset!r})."
        ) from None
    try:
        rows = datasets.load_dataset(hf_name, config, split=split)
    except Exception as e:  # offline, unknown config, hub errors: one clear message
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise DataError(
            f"could not load {hf_name}/{config} [{split}] from the Hugging Face hub "
            f"({type(e).__name__}: {first}). Offline? Use the shipped copy "
            f"(load_dataset({dataset!r})) or a local JSONL file."
        ) from e
    items, seen = [], set()
    for i, row in enumerate(rows):
        item = item_from_row(dict(row), i, dataset)
        if item.key not in seen:
            seen.add(item.key)
            items.append(item)
    return items


# ---------------------------------------------------------------- entry points


def pick(items: list[QAItem], limit: int | None, seed: int | None = 0) -> list[QAItem]:
    """A deterministic subset of ``limit`` items, in their original order.

    ``seed`` (int): a seeded shuffle, of which the first ``limit`` are kept, so subsets for
    one seed are nested. ``seed=None``: the first ``limit`` items. ``limit=None``: all.
    """
    if limit is None or limit >= len(items):
        return list(items)
    if limit < 0:
        raise InputError(f"limit={limit}; use a positive number of questions or None for all")
    if seed is None:
        return list(items[:limit])
    order = list(range(len(items)))
    random.Random(seed).shuffle(order)
    return [items[i] for i in sorted(order[:limit])]


def _split_hf(name: str) -> tuple[str, str | None] | None:
    """("trivia_qa", "rc.nocontext") for "trivia_qa/rc.nocontext" or "hf:…"; else None."""
    text = name.removeprefix("hf:")
    hf_name, _, config = text.partition("/")
    if name.startswith("hf:") or (hf_name in HF_DATASET and config):
        return hf_name, config or None
    return None


def load_dataset(
    name: str | os.PathLike,
    *,
    path: str | os.PathLike | None = None,
    split: str = "validation",
    limit: int | None = None,
    seed: int | None = 0,
) -> list[QAItem]:
    """Questions and reference answers, as a list of :class:`QAItem`.

    name: "truthfulqa" or "triviaqa" (the shipped copy, or ``path`` when given); a JSONL/CSV
    file; or a Hugging Face name with config, "truthful_qa/generation",
    "trivia_qa/unfiltered.nocontext", "trivia_qa/rc.nocontext" (any other as "hf:NAME/CONFIG").
    split: "validation" (TriviaQA also "train": the shipped 8,837-question train subset).
    limit, seed: see :func:`pick` (an exact-label task: see :func:`load_task`).
    """
    text = str(name)
    if tasks.is_task(text):
        if path is not None or split != "validation":
            raise InputError(f"{text!r} is a built-in task: it takes no data file and no split "
                             "(drop --data/path and split)")
        return load_task(text, limit=limit, seed=seed)
    if path is not None:
        dataset = NAMES.get(text.lower(), Path(path).stem.lower())
        return pick(read_qa_file(path, dataset=dataset), limit, seed)
    if Path(text).is_file():
        return pick(read_qa_file(text), limit, seed)
    hf = _split_hf(text)
    if hf is not None:
        dataset = HF_DATASET.get(hf[0], hf[0].split("/")[-1])
        return pick(load_hf(hf[0], hf[1], split, dataset), limit, seed)
    key = NAMES.get(text.lower())
    if key is None:
        raise DataError(
            f"unknown dataset {text!r}: use 'truthfulqa', 'triviaqa', a task "
            f"({', '.join(tasks.TASKS)}), a JSONL/CSV file, or a Hugging Face name such as "
            "'truthful_qa/generation'"
        )
    return pick(read_qa_file(shipped_path(key, split), dataset=key), limit, seed)


def load_task(name: str, *, limit: int | None = None, seed: int | None = 0) -> list:
    """The items of an exact-label task (:mod:`isouq.data.tasks`), as ``TaskItem`` s.

    Args:
        name: a generated task (``tasks.GENERATED``) or ``"truthfulqa-mc1"``.
        limit: a generated task: its first ``limit`` items for ``seed`` (default all
            ``tasks.SIZE``); MC1: the seeded subset :func:`pick` gives, the same questions as
            ``load_dataset("truthfulqa", limit=limit, seed=seed)``.
        seed: the generator's seed (``None``: 0) or, for MC1, :func:`pick`'s.

    Returns:
        The items; for one seed, the items of a smaller limit are among those of a larger one.
    """
    if str(name).lower() == tasks.MC1:
        return pick(tasks.truthfulqa_mc1(load_truthfulqa_mc(), load_truthfulqa()), limit, seed)
    return tasks.generate(name, limit, seed)


def load_truthfulqa(
    path: str | os.PathLike | None = None, *, limit: int | None = None, seed: int | None = 0
) -> list[QAItem]:
    """TruthfulQA (817 questions): shipped copy, or ``path`` (its JSONL or TruthfulQA.csv)."""
    return load_dataset("truthfulqa", path=path, limit=limit, seed=seed)


def load_triviaqa(
    path: str | os.PathLike | None = None,
    *,
    split: str = "validation",
    limit: int | None = None,
    seed: int | None = 0,
) -> list[QAItem]:
    """TriviaQA unfiltered validation (11,313 questions with answer aliases), or ``path``."""
    return load_dataset("triviaqa", path=path, split=split, limit=limit, seed=seed)


# ---------------------------------------------------------------- TruthfulQA multiple choice

MC_FILE = "truthfulqa/mc_task_v1.json"
MC_SHA256 = "b3799639bc76c939836d587de7d30b48d91012cb34be04806d33106ce06c162a"


@dataclass(frozen=True)
class MCItem:
    """One TruthfulQA multiple-choice question (MC1 targets, MC2 beside them).

    key: ``tqa-mc-NNN`` (0-based index in ``mc_task.json``, whose order differs from the CSV).
    options: MC1 answer options in the file's order; labels: 1 for the one true MC1 option,
    0 for the others. mc2_options / mc2_labels: the MC2 targets (several may be true).
    """

    key: str
    question: str
    options: list[str]
    labels: list[int]
    mc2_options: list[str] = field(default_factory=list)
    mc2_labels: list[int] = field(default_factory=list)

    @property
    def correct_index(self) -> int:
        """Index in ``options`` of the MC1 option labelled 1."""
        return self.labels.index(1)


def read_truthfulqa_mc(path: str | os.PathLike) -> list[MCItem]:
    """All questions of a TruthfulQA ``mc_task.json`` (a list of ``{question, mc1_targets,
    mc2_targets}``, targets = {answer text: 0/1}). DataError when a question lacks MC1 targets
    or has other than exactly one true MC1 option."""
    import json

    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path} does not exist; pass TruthfulQA's mc_task.json "
                        f"(shipped as shared/data/{MC_FILE})")
    try:
        rows = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise DataError(f"{path} is not JSON ({e}); pass TruthfulQA's mc_task.json") from None
    if not isinstance(rows, list) or not rows:
        raise DataError(f"{path}: expected a non-empty JSON list of questions")
    items = []
    for i, row in enumerate(rows):
        q = str(row.get("question") or "").strip() if isinstance(row, dict) else ""
        mc1 = row.get("mc1_targets") if isinstance(row, dict) else None
        if not q or not isinstance(mc1, dict) or len(mc1) < 2:
            raise DataError(f"{path}: entry {i} needs a question and ≥ 2 mc1_targets")
        labels = [int(v) for v in mc1.values()]
        if sum(labels) != 1 or set(labels) - {0, 1}:
            raise DataError(f"{path}: entry {i} has {sum(labels)} true MC1 options; MC1 has one")
        mc2 = row.get("mc2_targets") or {}
        items.append(MCItem(f"tqa-mc-{i:03d}", q, list(mc1), labels, list(mc2),
                            [int(v) for v in mc2.values()]))
    return items


def load_truthfulqa_mc(
    path: str | os.PathLike | None = None, *, limit: int | None = None, seed: int | None = 0
) -> list[MCItem]:
    """TruthfulQA multiple choice (817 questions): the shipped ``mc_task_v1.json`` (SHA-256
    checked) or ``path``. ``limit``/``seed`` pick a subset as :func:`pick` does."""
    if path is None:
        import hashlib

        path = data_root() / MC_FILE
        if not path.is_file():
            raise DataError(f"{path} is missing from the data folder; see {path.parent}/SOURCE.md")
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        if digest != MC_SHA256:
            raise DataError(f"{path} has SHA-256 {digest[:12]}…, not the shipped file's "
                            f"{MC_SHA256[:12]}…; restore it from {path.parent}/SOURCE.md")
    return pick(read_truthfulqa_mc(path), limit, seed)
