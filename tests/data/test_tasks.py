"""Exact-label tasks: answers recomputed from the question text, seeded streams, design and fresh
sets that never share a problem, TruthfulQA MC1 as a generated-answer task, the harness's
exact match."""

from __future__ import annotations

import collections
import hashlib
import json
import re
from datetime import timedelta
from fractions import Fraction
from pathlib import Path

import pytest

import by_path
from isouq.data import qa, tasks
from isouq.data.qa import load_dataset
from isouq.data.tasks import TaskItem, generate, is_correct, mc1_item, normalize
from isouq.errors import DataError, InputError

ROOT = Path(__file__).resolve().parents[2]

#: SHA-256 of each generated task's design set (the first 500 items of seed 0: keys, questions,
#: accepted answers, levels). A change here changes a pre-registered design set: never edit a
#: task's generator in place; add a new task instead.
DESIGN_SHA256 = {
    "compare": "3b5d80f3477e19156e7fddc6b914af993195c78765cc6c1a1fac3d2cc9552332",
    "units": "4714d43509e1af3c40efc163faf0b9a17a92f4ba912092c2c62d5f593bbb3357",
    "arithmetic": "3830d2b4af71575f81374ef592c6728bc7e1010bff2a8f4c1240c47c3c708b2b",
}


#: the same for TruthfulQA MC1's design set (the shipped files' 500 seeded questions)
MC1_DESIGN_SHA256 = "69fc85e3114b1d8f82d3ff5e1b6a220af1275f031359befb53e5b2481d336030"


def _from_file(name: str, path):
    """The module of a script or config file outside the package."""
    return by_path.module(path, name)


def _processing():
    return _from_file("processing", ROOT / "configs" / "polygraph" / "processing.py")


def _digest(items) -> str:
    rows = [[it.key, it.question, it.answers, it.level] for it in items]
    return hashlib.sha256(json.dumps(rows, ensure_ascii=False).encode()).hexdigest()


# ---------------------------------------------------------------- exact match


@pytest.mark.parametrize("text", [
    "The answer is 81.", "  A lion!", "an apple_pie", "“Tokyo”", "B) The sun", "76.96",
    "3/7 is larger", "THE  end", "it's", "a", "", "‘x’ ´y´ `z`", "Ünïcode—dash",
    " 301678\n<pad><pad><pad>", "Paris<|endoftext|>", "<b>bold</b>",
])
def test_normalize_is_the_harness_normalization(text):
    assert normalize(text) == _processing().normalize_em(text)


def test_is_correct_on_realistic_answers():
    item = generate("compare", 1)[0]  # "Which number is smaller, 21 or 85?"
    assert item.question == "Which number is smaller, 21 or 85?"
    for said in ("21", "21.", "The answer is 21.", "21 is smaller than 85.",
                 "21 is a smaller number than 85.", "The smaller number is 21",
                 "The number smaller than 85 is 21."):
        assert is_correct(said, item.answers), said
    for said in ("85", "85 is smaller than 21.", "", "The", "21 or 85", "21, 85",
                 "The number smaller than 21 is 85."):
        assert not is_correct(said, item.answers), said


@pytest.mark.parametrize("name", sorted(tasks.GENERATED))
def test_no_accepted_answer_is_empty_after_normalization(name):
    for it in generate(name, 300):
        assert it.answers and all(normalize(a) for a in it.answers)
        assert len({normalize(a) for a in it.answers}) == len(it.answers)
        assert not is_correct("", it.answers) and not is_correct("a", it.answers)


def test_accepted_drops_empty_and_excluded_shapes():
    assert tasks.accepted(["2", "The", "2.", "1) x"], exclude=["1) x!"]) == ["2"]
    with pytest.raises(DataError, match="no accepted answer"):
        tasks.accepted(["a", "the"])


# ---------------------------------------------------------------- generated streams


@pytest.mark.parametrize("name", sorted(tasks.GENERATED))
def test_streams_are_seeded_and_nested(name):
    first = generate(name, 500)
    assert generate(name, 500) == first
    assert generate(name, 1500)[:500] == first
    assert generate(name, 500, seed=None) == first
    assert generate(name, 500, seed=1) != first
    assert [it.key for it in first[:2]] == [f"{name}-s0-00000", f"{name}-s0-00001"]
    assert all(isinstance(it, TaskItem) and it.task == it.dataset == name for it in first)


@pytest.mark.parametrize("name", sorted(tasks.GENERATED))
def test_design_set_is_pinned(name):
    """The design set (first 500 of seed 0) is pre-registered: any change to it is caught."""
    assert _digest(generate(name, 500)) == DESIGN_SHA256[name]


@pytest.mark.parametrize("name", sorted(tasks.GENERATED))
def test_levels_cycle_in_fixed_proportions(name):
    task = tasks.GENERATED[name]
    items = generate(name, 12 * len(task.mix))
    assert [it.level for it in items[: len(task.mix)]] == list(task.mix)
    counts = collections.Counter(it.level for it in items)
    assert counts == collections.Counter({lv: 12 * task.mix.count(lv) for lv in task.mix})


def _compare_problem(question: str) -> tuple:
    """(what is asked, the two values) read from a compare question, order forgotten."""
    m = re.fullmatch(r"Which number is (larger|smaller), (\S+) or (\S+)\?", question)
    if m:
        return m[1], frozenset((m[2], m[3]))
    m = re.fullmatch(r"Which word has more letters, (\w+) or (\w+)\?", question)
    assert m, question
    return "letters", frozenset((m[1], m[2]))


def _units_problem(question: str) -> tuple:
    m = re.fullmatch(r"Which is (longer|heavier|more), (\d+) (\w+) or (\d+) (\w+)\?", question)
    assert m, question
    return m[1], frozenset(((int(m[2]), m[3]), (int(m[4]), m[5])))


def _arithmetic_problem(question: str) -> tuple:
    m = re.fullmatch(r"What is (\d+) (\+|-|times) (\d+)\?", question)
    assert m, question
    a, b = int(m[1]), int(m[3])
    return m[2], (a, b) if m[2] == "-" else frozenset((a, b))


READ = {"compare": _compare_problem, "units": _units_problem, "arithmetic": _arithmetic_problem}


@pytest.mark.parametrize("name", sorted(tasks.GENERATED))
def test_fresh_items_never_share_a_problem_with_the_design_set(name):
    """Read from the question text (not from the generator's signature): no problem twice in
    the 2,000 items of seed 0, so items 501-2000 never coincide with the first 500."""
    problems = [READ[name](it.question) for it in generate(name)]
    assert len(problems) == tasks.SIZE
    assert len(set(problems)) == len(problems)
    design = load_dataset(name, limit=500)
    keys = {it.key for it in design}
    fresh = [READ[name](it.question) for it in load_dataset(name, limit=1500)
             if it.key not in keys]
    assert len(fresh) == 1000
    assert not {READ[name](it.question) for it in design} & set(fresh)


def test_compare_answers_recomputed_from_the_question():
    seen = collections.Counter()
    for it in generate("compare"):
        what, values = _compare_problem(it.question)
        a, b = sorted(values)
        if what == "letters":
            assert len(a) != len(b)
            want = max(values, key=len)
        else:
            x, y = Fraction(a), Fraction(b)  # "76.96" and "3/7" alike, exactly
            assert x != y
            want = (a if x > y else b) if what == "larger" else (a if x < y else b)
        assert it.answers[0] == want, it.question
        seen[what] += 1
    assert seen["larger"] > 500 and seen["smaller"] > 500 and seen["letters"] > 300


#: the size of each unit, from the standard library and the SI prefixes (apart from the task's
#: own table)
SIZE_OF = {
    "millimeters": Fraction(1, 1000), "centimeters": Fraction(1, 100), "meters": Fraction(1),
    "kilometers": Fraction(1000), "grams": Fraction(1), "kilograms": Fraction(1000),
    "milliliters": Fraction(1, 1000), "liters": Fraction(1),
    **{unit: Fraction(int(timedelta(**{unit: 1}).total_seconds()))
       for unit in ("seconds", "minutes", "hours", "days")},
}


def test_units_answers_recomputed_from_the_question():
    first = collections.Counter()
    for it in generate("units"):
        word, quantities = _units_problem(it.question)
        (a, ua), (b, ub) = sorted(quantities)
        size_a, size_b = a * SIZE_OF[ua], b * SIZE_OF[ub]
        assert size_a != size_b and a >= 2 and b >= 2
        big = f"{a} {ua}" if size_a > size_b else f"{b} {ub}"
        assert it.answers[0] == big, it.question
        assert (ua == ub) == (it.level == 1)
        first[it.question.split(", ", 1)[1].startswith(big)] += 1
    assert min(first.values()) > 0.4 * tasks.SIZE  # the right one is named first about half


def test_arithmetic_answers_recomputed_from_the_question():
    ops = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "times": lambda a, b: a * b}
    levels = collections.Counter()
    for it in generate("arithmetic"):
        m = re.fullmatch(r"What is (\d+) (\+|-|times) (\d+)\?", it.question)
        a, b = int(m[1]), int(m[3])
        value = ops[m[2]](a, b)
        assert value > 0 and it.answers[0] == str(value), it.question
        assert is_correct(f"{a} {m[2]} {b} = {value:,}.", it.answers)
        assert not is_correct(f"{a} {m[2]} {b} = {value + 1}.", it.answers)
        assert not is_correct(str(value - 1), it.answers)
        if m[2] != "-":  # a sum or a product stated in the other order
            assert is_correct(f"{b} {m[2]} {a} is {value}", it.answers)
        assert (it.level == 1) == (m[2] == "+" and 1 in (a, b))  # level 1: a number plus one
        levels[it.level, m[2]] += 1
    assert set(levels) == {(1, "+"), (2, "times"), (3, "+"), (4, "-")}


def test_unknown_task_and_bad_limits():
    with pytest.raises(InputError, match="unknown generated task"):
        generate("nope", 5)
    with pytest.raises(InputError, match="1 to 2000"):
        generate("compare", tasks.SIZE + 1)
    with pytest.raises(InputError, match="1 to 2000"):
        generate("compare", 0)


# ---------------------------------------------------------------- MC1


def test_mc1_item_numbers_shuffled_options_and_judges_realistic_answers():
    options = ["Nothing happens.", "You grow watermelons.", "You die.", "You get sick."]
    item = mc1_item("k-1", "What happens if you eat seeds?", options, 0, 3)
    listed = re.findall(r"(\d)\) ([^.]+\.)", item.question)
    assert [n for n, _ in listed] == ["1", "2", "3"] and item.level == 3
    assert {t for _, t in listed} == set(options[:3])  # the true one and the first false ones
    number = next(n for n, t in listed if t == "Nothing happens.")
    assert item.answers[0] == number
    for said in (number, f"{number})", f"{number}. Nothing happens.", "Nothing happens",
                 f"Option {number}", f"The answer is {number}."):
        assert is_correct(said, item.answers), said
    wrong = next(n for n, _ in listed if n != number)
    for said in (wrong, f"{wrong}) You die.", "You die.", "", "The", "1, 2 or 3"):
        assert not is_correct(said, item.answers), said
    assert mc1_item("k-1", "What happens if you eat seeds?", options, 0, 3) == item


def test_mc1_an_option_text_that_is_another_options_number_is_not_accepted():
    for key in (f"k-{i}" for i in range(20)):  # some shuffle puts "1" as option 2's text
        item = mc1_item(key, "Pick one.", ["1", "7"], 0, 2)
        if item.answers[0] == "2":
            assert not is_correct("1", item.answers) and is_correct("2) 1", item.answers)
            return
    pytest.fail("no shuffle put the true option second")


def test_mc1_positions_are_spread():
    items = [mc1_item(f"k-{i}", "Q?", ["a1", "b2", "c3"], 0, 3) for i in range(300)]
    counts = collections.Counter(it.answers[0] for it in items)
    assert set(counts) == {"1", "2", "3"} and min(counts.values()) > 70


def test_mc1_needs_every_question_in_the_multiple_choice_file():
    gen = [qa.QAItem("truthfulqa-0", "Q one?", ["x"])]
    with pytest.raises(DataError, match="multiple-choice file"):
        tasks.truthfulqa_mc1([], gen)


def _shipped_mc1():
    try:
        root = qa.data_root()
    except DataError:
        pytest.skip("shared/data not found")
    if not (root / qa.MC_FILE).is_file() or not (root / qa.SHIPPED[("truthfulqa",
                                                                       "validation")]).is_file():
        pytest.skip("TruthfulQA files not shipped here")


def test_mc1_design_set_asks_the_truthfulqa_design_questions():
    _shipped_mc1()
    mc = load_dataset("truthfulqa-mc1", limit=500)
    gen = load_dataset("truthfulqa", limit=500)
    assert [m.key for m in mc] == [f"mc1-{g.key}" for g in gen]
    assert all(m.question.startswith(g.question.strip()) for m, g in zip(mc, gen, strict=True))
    every = load_dataset("truthfulqa-mc1")
    n_options = {m.question.strip(): len(m.options) for m in qa.load_truthfulqa_mc()}
    assert len(every) == 817
    for i, (it, g) in enumerate(zip(every, load_dataset("truthfulqa"), strict=True)):
        assert it.level == min((2, 3)[i % 2], n_options[g.question.strip()])
    keys = {m.key for m in mc}
    fresh = [it for it in load_dataset("truthfulqa-mc1", limit=1500) if it.key not in keys]
    assert len(fresh) == 317
    assert not {normalize(it.question) for it in fresh} & {normalize(m.question) for m in mc}
    answers = collections.Counter(it.answers[0] for it in every)
    assert set(answers) == {"1", "2", "3"} and answers["1"] < 0.6 * len(every)
    assert _digest(mc) == MC1_DESIGN_SHA256


# ---------------------------------------------------------------- prepare_data.py


def _prepare_data():
    return _from_file("prepare_data", ROOT / "scripts" / "polygraph" / "prepare_data.py")


@pytest.mark.parametrize("name", sorted(tasks.GENERATED))
def test_prepare_data_fresh_set_of_a_task(name, capsys):
    prep = _prepare_data()
    design = prep.questions(name, 500, 0)
    fresh = prep.questions(name, 1500, 0, after=500)
    assert design == generate(name, 500) and fresh == generate(name, 1500)[500:]
    assert prep.main(["--dataset", name, "--style", "chat", "--limit", "1500", "--after",
                      "500", "--count"]) == 0
    assert capsys.readouterr().out.strip() == "1000"
    assert prep.name_of(name, "plain", 1500, 0, 24, 500) == f"{name}-plain-n1500-after500-s0-c24"
    text = prep.prompt_text(fresh[0].question, "plain")
    assert text.endswith(f"Question: {fresh[0].question}\nAnswer:")


# ---------------------------------------------------------------- load_dataset


def test_load_dataset_takes_task_names():
    assert load_dataset("Compare", limit=3) == generate("compare", 3)
    assert load_dataset("units", limit=4, seed=2) == generate("units", 4, seed=2)
    with pytest.raises(InputError, match="built-in task"):
        load_dataset("compare", path="x.jsonl")
    with pytest.raises(InputError, match="built-in task"):
        load_dataset("units", split="train")
    with pytest.raises(DataError, match="truthfulqa-mc1"):
        load_dataset("no-such-task")


def test_a_pad_after_the_answer_is_not_part_of_it():
    """Gemma's batched greedy answers end in pad tokens after a stop string: exact match reads
    the answer without them."""
    assert normalize(" 301678\n<pad><pad>") == "301678"
    assert is_correct(" 2 minutes\n<pad>", ["2 minutes"])
