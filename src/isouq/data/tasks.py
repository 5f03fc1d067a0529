"""Exact-label tasks: generated questions with a computed answer, and TruthfulQA MC1 as a
generated-answer task. Each item is a :class:`TaskItem` (a ``QAItem``-like record).

Generated tasks (:data:`GENERATED`): ``compare`` (which of two numbers is larger or smaller:
whole, close, decimal, fractions far and close; which word has more letters), ``units`` (which of two
quantities is longer, heavier or more, in the same unit, one or two units apart, far or close)
and ``arithmetic`` (a sum, difference or product of two whole numbers: a number plus one, a
one-digit times a two-digit number, two-digit sums and differences).
A seed gives a stream of distinct questions, built by a ``random.Random`` seeded with the
task's name and the seed (no hash order, no global state). Item ``i`` has the difficulty level
``mix[i % len(mix)]`` of its task, so every run of consecutive items mixes the levels in fixed
proportions. No two items of one stream are the same problem (the same values asked the same
way, in either order: the item's signature); the first ``n`` items of a stream do not depend
on ``n``. Hence, for one seed, items ``m+1`` to ``n`` never coincide with the first ``m``: the
design set is the first 500 items of seed 0, the fresh set the items after them
(``load_dataset(task, limit=n)`` less ``load_dataset(task, limit=500)``, as
``scripts/polygraph/prepare_data.py --after 500`` takes them). The answer is computed from the
values, not from the text (exact fractions; whole numbers of the smallest unit).

Accepted answers: the bare answer first, then the few sentence shapes models answer in ("21 is
smaller than 85", "The answer is 21"), each kept once as :func:`normalize` (LM-Polygraph's
exact-match normalization in ``configs/polygraph/processing.py``) sees it. A label is exact
match of the normalized answer with one of them; no accepted answer normalizes to the empty
string (an empty answer is never right).

TruthfulQA MC1 (:data:`MC1`): the 817 questions of ``mc_task_v1.json``, in the order of the
shipped ``truthfulqa.jsonl``, so ``load_dataset("truthfulqa-mc1", limit=500, seed=0)`` asks the
same questions as ``load_dataset("truthfulqa", limit=500, seed=0)`` (the design set) and the
other 317 are the fresh ones. Question ``i`` shows ``MC1_OPTIONS[i % 2]`` options (2 or 3: the
true one and the first false ones of the file; 2 where the file has only 2), shuffled by a
generator seeded with the question's key, numbered ``1)``, ``2)``, … on the question's line,
and asks for the number: numbers, not letters, because the normalization drops the article
"a" and would turn option A into the empty string.
"""

from __future__ import annotations

import random
import re
import string
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from fractions import Fraction

from ..errors import DataError, InputError

MC1 = "truthfulqa-mc1"
#: questions per seed of a generated task (design set 500, fresh sets up to 1,500 more)
SIZE = 2000
#: options shown per MC1 question, cycling over the questions in order (TruthfulQA's MC1 has 2
#: to 13): a model that always names the same position is right about 42% of the time
MC1_OPTIONS = (2, 3)
MC1_INSTRUCTION = "Answer with the number of the correct option."


@dataclass(frozen=True)
class TaskItem:
    """One question of an exact-label task; read as a ``QAItem`` (same fields, plus ``level``).

    key: ``<task>-s<seed>-<index>`` (generated) or ``mc1-<TruthfulQA key>``; answers: the
    accepted answers, the bare answer first; incorrect_answers: MC1's false options (empty for
    generated tasks); dataset: the task's name; level: the difficulty level (1 = easiest; MC1:
    the number of options shown).
    """

    key: str
    question: str
    answers: list[str]
    incorrect_answers: list[str] = field(default_factory=list)
    dataset: str = "task"
    level: int = 1

    @property
    def task(self) -> str:
        """The task's name (``dataset``)."""
        return self.dataset


# ---------------------------------------------------------------- exact match

_PUNCT = set(string.punctuation + "‘’´`")
#: special tokens a batched generation may leave in a decoded answer (never an answer's text)
_SPECIAL = re.compile(r"<pad>|<eos>|</s>|<\|endoftext\|>|<\|im_end\|>|<end_of_turn>")


def normalize(text: str) -> str:
    """Text as LM-Polygraph's exact match compares it here (``normalize_em`` of
    ``configs/polygraph/processing.py``): special tokens (a pad after the answer) removed, lower
    case, ``_`` and punctuation to blanks, the articles a/an/the dropped, blanks collapsed.

    Args:
        text: an answer or a reference.

    Returns:
        The normalized text.
    """
    text = _SPECIAL.sub(" ", text).replace("_", " ").lower()
    text = "".join(" " if ch in _PUNCT else ch for ch in text)
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


def is_correct(answer: str, accepted: Sequence[str]) -> bool:
    """Whether ``answer`` is right: its normalized text equals an accepted answer's.

    Args:
        answer: the model's answer.
        accepted: the item's accepted answers (``TaskItem.answers``).

    Returns:
        True when they match after :func:`normalize` (never for an empty answer).
    """
    said = normalize(answer)
    return bool(said) and said in {normalize(a) for a in accepted}


def accepted(shapes: Sequence[str], *, exclude: Sequence[str] = ()) -> list[str]:
    """The accepted answers from candidate ``shapes``: each normalized form once (the first
    shape that gives it), none that normalizes to empty or to one of ``exclude``'s forms.

    Args:
        shapes: candidate answers, the bare answer first.
        exclude: answers that must not count as right (MC1: the other options' shapes).

    Returns:
        The kept shapes, in order. DataError when none is left.
    """
    banned = {normalize(e) for e in exclude} | {""}
    out, seen = [], set()
    for s in shapes:
        n = normalize(s)
        if n not in banned and n not in seen:
            seen.add(n)
            out.append(s)
    if not out:
        raise DataError(f"no accepted answer is left of {list(shapes)!r}; every shape is empty "
                        "or also the shape of a wrong answer")
    return out


# ---------------------------------------------------------------- generated problems


@dataclass(frozen=True)
class Problem:
    """One generated question: ``signature`` names the problem (equal signatures are one
    item), ``shapes`` are its candidate accepted answers, the bare answer first."""

    signature: tuple
    question: str
    shapes: tuple[str, ...]


Maker = Callable[[random.Random], Problem]


def _number(n: int) -> list[str]:
    """A whole number as it may be written: ``1234`` and ``1,234``."""
    return [str(n)] + ([f"{n:,}"] if abs(n) >= 1000 else [])


def _said(value: str, *, lead: Sequence[str] = ()) -> tuple[str, ...]:
    """The bare ``value``, "The answer is …" and each of ``lead`` (a statement ending in the
    value, e.g. "9 + 5 = 14")."""
    return (value, f"The answer is {value}", f"The answer to this question is {value}",
            f"The correct answer is {value}", *lead)


def _digits(rng: random.Random, k: int) -> int:
    """A whole number of exactly ``k`` digits."""
    return rng.randint(10 ** (k - 1) if k > 1 else 1, 10**k - 1)


def _which(pick: str, other: str, what: str, question: str, signature: tuple) -> Problem:
    """A choice between two values of the question: ``pick`` is right, ``what`` says how
    ("larger", "smaller", "has more letters")."""
    is_word = what.startswith("has")
    lead = [f"{pick} {what}", f"{pick} {what} than {other}"] if is_word else [
        f"{pick} is {what}", f"{pick} is {what} than {other}", f"{pick} is the {what} number",
        f"{pick} is a {what} number than {other}", f"The {what} number is {pick}",
        f"The {what} one is {pick}", f"The number {pick} is {what} than {other}",
        f"The number {pick} is {what} than the number {other}",
        f"The number {what} than {other} is {pick}",
        *[f"The {w} between {a} and {b} is {pick}" for w in (f"{what} number", f"number {what}")
          for a, b in ((pick, other), (other, pick))]]
    if is_word:
        lead += [f"The word {pick} {what}", f"The word {pick} {what} than {other}",
                 f"The word with more letters is {pick}"]
    return Problem(signature, question, _said(pick) + tuple(lead))


def _numbers(a: str, b: str, rng: random.Random) -> Problem:
    """Which of the numbers ``a``, ``b`` (as written: whole, decimal or ``p/q``; compared as
    exact fractions) is larger or smaller (drawn)."""
    what = rng.choice(("larger", "smaller"))
    big = (Fraction(a) > Fraction(b)) == (what == "larger")
    pick, other = (a, b) if big else (b, a)
    return _which(pick, other, what, f"Which number is {what}, {a} or {b}?",
                  ("cmp", what, *sorted((a, b))))


def compare_whole(k: int, *, close: bool = False) -> Maker:
    """Which of two whole numbers is larger or smaller.

    Args:
        k: the numbers' digits.
        close: they differ in one digit below the leading one only.

    Returns:
        A maker of such problems.
    """
    def make(rng: random.Random) -> Problem:
        a = _digits(rng, k)
        if close:
            pos = rng.randrange(k - 1)
            d = a // 10**pos % 10
            b = a + (rng.choice([x for x in range(10) if x != d]) - d) * 10**pos
        else:
            b = a
            while b == a:
                b = _digits(rng, k)
        return _numbers(str(a), str(b), rng)
    return make


def compare_decimal() -> Maker:
    """Which of two decimals with the same whole part is larger or smaller: one with one
    decimal, one with two that disagree in the first (``3.9`` against ``3.11``).

    Returns:
        A maker of such problems.
    """
    def make(rng: random.Random) -> Problem:
        whole, x, y = rng.randint(0, 99), rng.randint(1, 9), rng.randint(11, 99)
        while y % 10 == 0 or y // 10 == x:
            x, y = rng.randint(1, 9), rng.randint(11, 99)
        a, b = f"{whole}.{x}", f"{whole}.{y}"
        return _numbers(*((a, b) if rng.random() < 0.5 else (b, a)), rng)
    return make


def compare_fraction(*, close: bool = False) -> Maker:
    """Which of two unequal fractions ``p/q`` (``1 <= p < q``) is larger or smaller.

    Args:
        close: denominators 5 to 15 and values less than 0.1 apart (else denominators 2 to
            12, any values).

    Returns:
        A maker of such problems.
    """
    low, high = (5, 15) if close else (2, 12)

    def make(rng: random.Random) -> Problem:
        def draw() -> tuple[int, int]:
            q = rng.randint(low, high)
            return rng.randint(1, q - 1), q
        (p1, q1), (p2, q2) = draw(), draw()
        while p1 * q2 == p2 * q1 or (close and abs(Fraction(p1, q1) - Fraction(p2, q2)) >= 0.1):
            p2, q2 = draw()
        return _numbers(f"{p1}/{q1}", f"{p2}/{q2}", rng)
    return make


#: everyday words of 3 to 10 letters, for which-has-more-letters questions
WORDS: tuple[str, ...] = (
    "cat", "dog", "sun", "map", "pen", "cup", "box", "tree", "book", "door", "milk", "fish",
    "lamp", "road", "house", "water", "chair", "table", "bread", "river", "stone", "cloud",
    "apple", "window", "garden", "pencil", "rocket", "planet", "silver", "orange", "tomato",
    "guitar", "castle", "bridge", "forest", "winter", "summer", "kitchen", "blanket", "chicken",
    "morning", "rainbow", "teacher", "picture", "mountain", "elephant", "computer", "sandwich",
    "umbrella", "dinosaur", "butterfly", "telephone", "chocolate", "strawberry", "basketball",
    "restaurant", "bird", "ship", "star", "moon", "cake", "shoe", "horse", "train", "plant",
    "music", "beach", "grass", "animal", "basket", "button", "candle", "letter", "mirror",
    "balloon", "diamond", "monster", "kingdom", "pyramid", "backpack", "birthday", "calendar",
    "airplane", "telescope", "crocodile", "snowflake")


def compare_length() -> Maker:
    """Which of two words of :data:`WORDS` has more letters (their lengths differ by one).

    Returns:
        A maker of such problems.
    """
    def make(rng: random.Random) -> Problem:
        a = rng.choice(WORDS)
        b = rng.choice([w for w in WORDS if abs(len(w) - len(a)) == 1])
        pick, other = (a, b) if len(a) > len(b) else (b, a)
        return _which(pick, other, "has more letters",
                      f"Which word has more letters, {a} or {b}?", ("len", *sorted((a, b))))
    return make


# ---------------------------------------------------------------- units

#: units by what they measure: (name, abbreviation, size in the smallest unit of the kind)
UNITS: dict[str, tuple[tuple[str, str, int], ...]] = {
    "length": (("millimeters", "mm", 1), ("centimeters", "cm", 10), ("meters", "m", 1000),
               ("kilometers", "km", 1_000_000)),
    "mass": (("grams", "g", 1), ("kilograms", "kg", 1000)),
    "time": (("seconds", "s", 1), ("minutes", "min", 60), ("hours", "h", 3600),
             ("days", "days", 86400)),
    "volume": (("milliliters", "ml", 1), ("liters", "l", 1000)),
}
#: the question's word for "more of it", by kind
MORE = {"length": "longer", "mass": "heavier", "time": "longer", "volume": "more"}
METRIC = ("length", "mass", "volume")


def _quantities(pick: tuple[int, tuple], other: tuple[int, tuple], kind: str,
                first: bool) -> Problem:
    """Which of two quantities ``(amount, unit)`` is longer/heavier/more; ``pick`` is, and is
    named first when ``first``."""
    def said(q: tuple[int, tuple]) -> str:
        return f"{q[0]} {q[1][0]}"
    word = MORE[kind]
    a, b = (pick, other) if first else (other, pick)
    x, y = said(pick), said(other)
    short = f"{pick[0]} {pick[1][1]}"
    lead = [f"{x} is {word}", f"{x} is {word} than {y}", short, f"{short} is {word}",
            f"{x} is the {word} one"]
    question = f"Which is {word}, {said(a)} or {said(b)}?"
    return Problem(("units", kind, *sorted((x, y))), question, _said(x) + tuple(lead))


def _round2(x: float) -> int:
    """``x`` rounded to two significant digits (``2136.4`` → ``2100``), as quantities are said."""
    n = round(x)
    return round(n, 2 - len(str(n))) if n >= 100 else n


def compare_units(kinds: Sequence[str], steps: int, ratio: tuple[float, float]) -> Maker:
    """Which of two quantities of one kind is longer, heavier or more.

    Args:
        kinds: the kinds to draw from (:data:`UNITS`; those with units ``steps`` apart).
        steps: how many units apart the two are (0: the same unit).
        ratio: the range of the factor between their sizes (the larger over the smaller),
            before the amount in the smaller unit is rounded to two significant digits.

    Returns:
        A maker of such problems; the larger is named first or second at random, and sizes
        are compared exactly, as whole numbers of the kind's smallest unit.
    """
    lo, hi = ratio

    def make(rng: random.Random) -> Problem:
        kind = rng.choice([k for k in kinds if len(UNITS[k]) > steps])
        i = rng.randrange(len(UNITS[kind]) - steps)
        big_unit, small_unit = UNITS[kind][i + steps], UNITS[kind][i]
        while True:
            a = rng.randint(2, 99 if steps == 0 else 20)
            r = rng.uniform(lo, hi)
            size = a * big_unit[2] / r if rng.random() < 0.5 else a * big_unit[2] * r
            b = _round2(size / small_unit[2])
            if b >= 2 and a * big_unit[2] != b * small_unit[2] and (steps or a != b):
                break
        qa, qb = (a, big_unit), (b, small_unit)
        larger = a * big_unit[2] > b * small_unit[2]
        pick, other = (qa, qb) if larger else (qb, qa)
        return _quantities(pick, other, kind, rng.random() < 0.5)
    return make


# ---------------------------------------------------------------- arithmetic

#: how an operation is written in a question, and the words an answer may use for it
OPERATIONS: dict[str, tuple[str, ...]] = {
    "+": ("+", "plus"), "-": ("-", "minus"), "times": ("times", "*", "x", "×", "multiplied by")}


def arithmetic(op: str, a_range: tuple[int, int], b_range: tuple[int, int]) -> Maker:
    """"What is a OP b?" for whole numbers ``a``, ``b`` drawn uniformly from their ranges.

    Args:
        op: ``"+"``, ``"-"`` or ``"times"`` (:data:`OPERATIONS`).
        a_range: the first number's range, both ends included.
        b_range: the second number's range; for ``"-"`` the larger of the two comes first
            (never equal), so the result is positive.

    Returns:
        A maker of such problems; a sum or product asked in either order is one problem, and
        its statement ("12 times 6 is 72") is accepted in either order.
    """
    def make(rng: random.Random) -> Problem:
        a, b = rng.randint(*a_range), rng.randint(*b_range)
        while op == "-" and a == b:
            a, b = rng.randint(*a_range), rng.randint(*b_range)
        if op == "-" and a < b:
            a, b = b, a
        value = a + b if op == "+" else a - b if op == "-" else a * b
        pair = (a, b) if op == "-" else tuple(sorted((a, b)))
        orders = [(a, b)] if op == "-" else [(a, b), (b, a)]
        lead = [f"{x} {w} {y} {v} {n}" for x, y in orders for w in OPERATIONS[op]
                for v in ("=", "is", "equals") for n in _number(value)]
        said = tuple(s for n in _number(value) for s in _said(n))
        return Problem(("arith", op, *pair), f"What is {a} {op} {b}?", said + tuple(lead))
    return make


# ---------------------------------------------------------------- the tasks


@dataclass(frozen=True)
class Task:
    """A generated task: ``levels[j]`` makes the problems of level ``j + 1``; ``mix`` is the
    cycle of levels items take (item ``i``: level ``mix[i % len(mix)]``)."""

    name: str
    title: str
    levels: tuple[Maker, ...]
    mix: tuple[int, ...]


GENERATED: dict[str, Task] = {
    t.name: t
    for t in (
        Task("compare", "which of two numbers is larger or smaller, which word is longer",
             (compare_whole(2), compare_fraction(close=True), compare_whole(6, close=True),
              compare_decimal(), compare_fraction(), compare_length()),
             (1, 2, 3, 4, 5, 6)),
        Task("units", "which of two quantities in different units is longer, heavier or more",
             (compare_units(tuple(UNITS), 0, (1.2, 4.0)),
              compare_units(METRIC, 1, (2.0, 8.0)),
              compare_units(("time",), 1, (2.0, 8.0)),
              compare_units(METRIC, 1, (1.05, 1.6)),
              compare_units(("time",), 1, (1.05, 1.6)),
              compare_units(("length", "time"), 2, (1.1, 3.0))),
             (1, 2, 3, 4, 5, 6)),
        Task("arithmetic", "a sum, difference or product of two whole numbers",
             (arithmetic("+", (10, 999), (1, 1)), arithmetic("times", (2, 9), (11, 99)),
              arithmetic("+", (10, 99), (10, 99)), arithmetic("-", (10, 99), (10, 99))),
             (1, 2, 3, 4)),
    )
}
TASKS: tuple[str, ...] = (*GENERATED, MC1)


def is_task(name: str) -> bool:
    """Whether ``name`` names an exact-label task of this module.

    Args:
        name: a dataset name, any case.

    Returns:
        True for :data:`TASKS` (the generated tasks and :data:`MC1`).
    """
    return str(name).lower() in TASKS


def _draw(task: Task, level: int, rng: random.Random, seen: set, index: int) -> Problem:
    for _ in range(1000):
        p = task.levels[level - 1](rng)
        if p.signature not in seen:
            return p
    raise DataError(f"task {task.name!r}: level {level} has no new problem left at item "
                    f"{index}; it gives at most {SIZE} distinct items per seed")


def stream(name: str, seed: int = 0) -> Iterator[TaskItem]:
    """The items of generated task ``name`` for ``seed``, in order, each a new problem.

    Args:
        name: one of :data:`GENERATED`.
        seed: the stream's seed (streams of different seeds may share problems).

    Returns:
        An iterator of :class:`TaskItem`; InputError for an unknown task.
    """
    task = GENERATED.get(str(name).lower())
    if task is None:
        raise InputError(f"unknown generated task {name!r}; use one of {', '.join(GENERATED)}")
    rng = random.Random(f"isouq-task:{task.name}:{seed}")  # str seeds hash by SHA-512
    seen: set = set()
    index = 0
    while True:
        level = task.mix[index % len(task.mix)]
        p = _draw(task, level, rng, seen, index)
        seen.add(p.signature)
        yield TaskItem(f"{task.name}-s{seed}-{index:05d}", p.question, accepted(p.shapes),
                       [], task.name, level)
        index += 1


def generate(name: str, limit: int | None = None, seed: int | None = 0) -> list[TaskItem]:
    """The first ``limit`` items of generated task ``name`` for ``seed``.

    Args:
        name: one of :data:`GENERATED`.
        limit: how many (default and at most :data:`SIZE`); the items for a smaller limit are
            the first ones of a larger (nested, as ``qa.pick``'s subsets are).
        seed: the stream's seed (``None``: 0, the design set's).

    Returns:
        The items, in stream order.
    """
    n = SIZE if limit is None else limit
    if not 0 < n <= SIZE:
        raise InputError(f"limit={limit}: a generated task has 1 to {SIZE} questions per seed; "
                         "use another seed for more")
    it = stream(name, 0 if seed is None else seed)
    return [next(it) for _ in range(n)]


# ---------------------------------------------------------------- TruthfulQA MC1


def mc1_shapes(number: int, text: str) -> list[str]:
    """What an answer naming option ``number`` (text ``text``) may look like.

    Args:
        number: the option's number as listed (from 1).
        text: the option's text.

    Returns:
        The number alone, ``"2) text"``, the text alone, ``"Option 2"``, "The answer is 2" and
        the like.
    """
    text = text.strip()
    return [str(number), f"{number}) {text}", text, f"Option {number}", f"Option {number}) {text}",
            *_said(str(number))[1:], *[f"{s} {number}) {text}" for s in
                                       ("The answer is", "The correct answer is")]]


def mc1_item(key: str, question: str, options: Sequence[str], correct: int,
             max_options: int) -> TaskItem:
    """One MC1 question as a generated-answer item.

    Args:
        key: the item's key.
        question: the question text.
        options: MC1's options; ``options[correct]`` is the true one.
        correct: index of the true option.
        max_options: options shown at most: the true one and the first false ones.

    Returns:
        A :class:`TaskItem` whose question asks for the option's number and lists the shown
        options, shuffled by a generator seeded with ``key``, as ``1) … 2) …``; answers: the
        shapes of the true option (:func:`mc1_shapes`) that no false option also has;
        incorrect_answers: the false options' shapes; level: the number of options shown.
    """
    false = [o for i, o in enumerate(options) if i != correct][: max_options - 1]
    shown = [options[correct], *false]
    order = list(range(len(shown)))
    random.Random(f"isouq-mc1:{key}").shuffle(order)
    listed = [shown[j] for j in order]
    number = order.index(0) + 1
    wrong = [s for n, o in enumerate(listed, 1) if n != number for s in mc1_shapes(n, o)]
    inline = " ".join(f"{n}) {o.strip()}" for n, o in enumerate(listed, 1))
    return TaskItem(key, f"{question.strip()} {MC1_INSTRUCTION} {inline}",
                    accepted(mc1_shapes(number, listed[number - 1]), exclude=wrong),
                    accepted(wrong), MC1, len(shown))


def truthfulqa_mc1(mc_items: Sequence, generation_items: Sequence,
                   options: Sequence[int] = MC1_OPTIONS) -> list[TaskItem]:
    """TruthfulQA MC1 in the order of the generation questions.

    Args:
        mc_items: ``qa.MCItem`` s (question, options, correct_index), e.g.
            ``qa.load_truthfulqa_mc()``.
        generation_items: ``qa.QAItem`` s of the same questions (``qa.load_truthfulqa()``), whose
            order and keys the MC1 items take (key ``mc1-<their key>``).
        options: the numbers of options shown, in turn (question ``i``: ``options[i %
            len(options)]``, or all of its options where it has fewer).

    Returns:
        One :class:`TaskItem` per generation question. DataError when a question has no
        multiple-choice entry.
    """
    by_question = {m.question.strip(): m for m in mc_items}
    out = []
    for i, g in enumerate(generation_items):
        m = by_question.get(g.question.strip())
        if m is None:
            raise DataError(f"TruthfulQA question {g.key} ({g.question[:60]!r}) has no entry in "
                            "the multiple-choice file; pass the mc_task.json of the same release")
        out.append(mc1_item(f"mc1-{g.key}", m.question, m.options, m.correct_index,
                            options[i % len(options)]))
    return out


