"""`isouq score` under bad input and changed inputs: one-line errors before the model loads,
resume that never mixes rows, one bad row never stops a run, nothing written is lost."""

import gzip
import json
from pathlib import Path

import pytest

import tiny
from isouq import cli
from isouq.data.pairs import iter_pairs, read_pairs, scan_pairs
from isouq.errors import IsouqError
from isouq.runio import exclusive, read_jsonl
from isouq.score_run import score_rows


@pytest.fixture(scope="module")
def model_dir(tiny_llama_dir):
    return tiny_llama_dir


def jsonl(path: Path, rows) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


ROWS = [{"question": "what is the capital of france", "answer": "paris"},
        {"question": "who wrote hamlet", "answer": "shakespeare"},
        {"question": "why is the sky blue", "answer": "because"},
        {"prompt": "the moon is made of", "answer": "cheese rock"},
        {"prompt": [{"role": "user", "content": "is the cat on the mat"}], "answer": "yes"}]


def score(argv_in, out, model_dir, *more):
    return cli.main(["score", str(argv_in), "--out", str(out), "--model", str(model_dir),
                     "--batch-size", "2", *more])


def no_load(monkeypatch):
    import isouq.models

    def boom(*args, **kw):
        raise AssertionError("the model was loaded before the error")
    monkeypatch.setattr(isouq.models, "load_model", boom)


def by_key(path):
    return {r["key"]: r for r in read_jsonl(path)}


# ------------------------------------------------------------------ resume never mixes
def test_inserted_row_is_scored_and_nothing_shifts(model_dir, tmp_path, capsys):
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    assert score(jsonl(inp, ROWS), out, model_dir) == 0
    first = by_key(out)
    new = {"question": "who sat on the mat", "answer": "the dog"}
    assert score(jsonl(inp, [new, *ROWS]), out, model_dir) == 0
    assert "scored 1 answers (5 already done)" in capsys.readouterr().out
    rows = read_jsonl(out)
    assert [r["answer"] for r in rows] == [new["answer"], *(r["answer"] for r in ROWS)]
    for k, r in first.items():  # the old rows are untouched
        assert by_key(out)[k] == r


def test_changed_answer_under_same_key_is_rescored(model_dir, tmp_path, capsys):
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    keyed = [{**r, "key": f"k{i}"} for i, r in enumerate(ROWS)]
    assert score(jsonl(inp, keyed), out, model_dir) == 0
    before = by_key(out)
    keyed[2] = {**keyed[2], "answer": "because the sky is blue"}
    assert score(jsonl(inp, keyed), out, model_dir) == 0
    assert "1 of them again as their input changed" in capsys.readouterr().out
    after = read_jsonl(out)
    assert [r["key"] for r in after] == [f"k{i}" for i in range(5)]  # one row per key
    assert after[2]["answer"] == "because the sky is blue"
    assert after[2]["scores"]["epistemic"] != before["k2"]["scores"]["epistemic"]
    assert all(after[i] == before[f"k{i}"] for i in (0, 1, 3, 4))


def test_other_settings_refused_before_the_model_loads(model_dir, tmp_path, monkeypatch, capsys):
    inp, out = jsonl(tmp_path / "in.jsonl", ROWS), tmp_path / "out.jsonl"
    assert score(inp, out, model_dir) == 0
    no_load(monkeypatch)
    assert score(inp, out, model_dir, "--method", "loop") == 2
    err = capsys.readouterr().err
    assert "method: 'ghost' there, 'per_example' now" in err and "Traceback" not in err
    assert len(read_jsonl(out)) == 5


def test_rows_carry_fingerprints_and_settings(model_dir, tmp_path):
    inp, out = jsonl(tmp_path / "in.jsonl", ROWS), tmp_path / "out.jsonl"
    assert score(inp, out, model_dir) == 0
    meta = json.loads(Path(str(out) + ".meta.json").read_text())
    s = meta["settings"]
    assert s["method"] == "ghost" and len(s["model_sha256"]) == 16 and s["isouq"]
    fps = scan_pairs(inp).fingerprints
    for r in read_jsonl(out):
        assert r["input_sha"] == fps[r["key"]] and r["settings_sha"] == meta["settings_sha"]
        # epistemic_log = ‖∇ log p̄‖² = ‖∇ p̄‖² / p̄²
        s = r["scores"]
        assert s["epistemic_log"] == pytest.approx(s["epistemic"] / s["mean_prob"] ** 2)
    assert not Path(str(out) + ".lock").exists()  # lock removed at the end


# ------------------------------------------------------------------ refused before loading
@pytest.mark.parametrize("content, problem", [
    ('{"prompt": 0, "answer": "x"}\n', "'prompt' must be a string or a non-empty list"),
    ('{"prompt": [], "answer": "x"}\n', "got []"),
    ('{"answer": "x", "q": 1}\n', "needs a 'prompt' or a 'question' (columns found: answer, q)"),
    ('{"prompt": [{"role": "user"}], "answer": "x"}\n', "'prompt' must be a string"),
    ('{"prompt": "q", "answer": 4}\n', "quote text answers"),
    ('{"prompt": "q", "answer": [1.5, 2]}\n', "token ids must be whole numbers"),
    ('{"prompt": "q", "answer": "x"}\n{"prompt": "q", "ans',
     "line 2 is not valid JSON (the last line is cut off)"),
    ('{"key": "a", "prompt": "q", "answer": "x"}\n{"key": "a", "prompt": "q", "answer": "y"}\n',
     "key 'a' repeats"),
    ('[1, 2]\n', "is not a JSON object"),
])
def test_bad_rows_are_one_line_naming_the_row(model_dir, tmp_path, monkeypatch, capsys, content,
                                              problem):
    inp = tmp_path / "in.jsonl"
    inp.write_text(content, encoding="utf-8")
    no_load(monkeypatch)
    assert score(inp, tmp_path / "out.jsonl", model_dir) == 2
    err = capsys.readouterr().err
    assert problem in err and "Traceback" not in err and err.count("\n") == 1


def test_files_refused_before_loading(model_dir, tmp_path, monkeypatch, capsys):
    no_load(monkeypatch)
    inp = jsonl(tmp_path / "in.jsonl", ROWS)
    latin = tmp_path / "latin.csv"
    latin.write_bytes("question,answer\ncaf\xe9 au lait,yes\n".encode("latin-1"))
    blocked = tmp_path / "blocker"
    blocked.write_text("a file where a folder should be")
    cases = [
        ([str(inp), "--out", str(inp)], "is the input file"),
        ([str(tmp_path), "--out", str(tmp_path / "o.jsonl")], "is a folder"),
        ([str(latin), "--out", str(tmp_path / "o.jsonl")], "is not UTF-8"),
        ([str(inp), "--out", str(blocked / "o.jsonl")], "cannot create the folder of --out"),
    ]
    for argv, problem in cases:
        assert cli.main(["score", *argv, "--model", str(model_dir)]) == 2
        err = capsys.readouterr().err
        assert problem in err and "Traceback" not in err, (argv, err)


def test_locked_out_refused_before_loading(model_dir, tmp_path, monkeypatch, capsys):
    inp, out = jsonl(tmp_path / "in.jsonl", ROWS), tmp_path / "out.jsonl"
    no_load(monkeypatch)
    with exclusive(out):
        assert score(inp, out, model_dir) == 2
    assert "another process is writing" in capsys.readouterr().err


def test_csv_with_bom_and_gzip(tmp_path):
    bom = tmp_path / "bom.csv"
    bom.write_bytes("\ufeffquestion,answer\nwho wrote hamlet,shakespeare\n".encode())
    assert read_pairs(bom)[0].answer == "shakespeare"
    gz = tmp_path / "rows.jsonl.gz"
    with gzip.open(gz, "wt", encoding="utf-8") as f:
        f.write(json.dumps({"key": 7, "prompt": "q", "answer": [5, 6]}) + "\n")
    r = read_pairs(gz)[0]
    assert r.key == "7" and r.answer == [5, 6]


def test_content_keys_are_stable_and_repeats_numbered(tmp_path):
    a = jsonl(tmp_path / "a.jsonl", [ROWS[0], ROWS[1], ROWS[0]])
    keys = scan_pairs(a).keys
    assert keys[0].startswith("c-") and keys[2] == keys[0] + "~2" and keys[1] != keys[0]
    b = jsonl(tmp_path / "b.jsonl", [ROWS[3], ROWS[0], ROWS[1]])
    assert scan_pairs(b).keys[1:] == keys[:2]


# ------------------------------------------------------------------ one bad row
def test_bad_rows_become_error_rows_and_the_rest_is_scored(model_dir, tmp_path, capsys):
    long = " ".join(["mat"] * 3000)  # past the tiny model's context window
    rows = [{"key": "ok1", **ROWS[0]}, {"key": "long", "prompt": "q", "answer": long},
            {"key": "ids", "prompt": "q", "answer": [5, 10_000]},
            {"key": "ok2", **ROWS[1]}]
    inp, out = jsonl(tmp_path / "in.jsonl", rows), tmp_path / "out.jsonl"
    assert score(inp, out, model_dir) == 0
    assert "2 rows could not be scored" in capsys.readouterr().out
    got = by_key(out)
    assert list(got) == ["ok1", "long", "ids", "ok2"]
    assert "context window" in got["long"]["error"] and "scores" not in got["long"]
    assert "outside the model's vocabulary" in got["ids"]["error"]
    assert got["ok1"]["scores"]["epistemic"] > 0 and got["ok2"]["scores"]["epistemic"] > 0
    # stop: the key is named, nothing after it is written; the id outside the vocabulary is
    # known before the model loads, the too-long row once it is tokenized
    out2 = tmp_path / "out2.jsonl"
    assert score(inp, out2, model_dir, "--on-error", "stop", "--no-bucketing") == 2
    err = capsys.readouterr().err
    assert "row 'ids': answer token id 10000" in err and "Traceback" not in err
    inp = jsonl(tmp_path / "in2.jsonl", [r for r in rows if r["key"] != "ids"])
    assert score(inp, out2, model_dir, "--on-error", "stop", "--no-bucketing") == 2
    err = capsys.readouterr().err
    assert "row 'long' (line 2)" in err and "Traceback" not in err


def test_token_ids_outside_the_vocabulary_stop_before_the_model_loads(model_dir, tmp_path,
                                                                      capsys, monkeypatch):
    from isouq.models import vocab_size

    n = vocab_size(model_dir)
    assert n == tiny.tokenizer().vocab_size  # the config's count, read without loading
    rows = [{"key": "ok", "prompt": "q", "answer": [1, n - 1]},
            {"key": "far", "prompt": "q", "answer": [5, n]}]
    inp = jsonl(tmp_path / "in.jsonl", rows)
    no_load(monkeypatch)
    assert score(inp, tmp_path / "out.jsonl", model_dir, "--on-error", "stop") == 2
    err = capsys.readouterr().err
    assert f"row 'far': answer token id {n} is outside the vocabulary" in err
    assert "Traceback" not in err and not (tmp_path / "out.jsonl").exists()


def test_a_failing_batch_is_retried_row_by_row(model_dir, tmp_path, monkeypatch):
    """A failure inside scoring (not foreseeable from the input) costs its row only."""
    from isouq import score_run

    real = score_run.score_sequences

    def flaky(model, tok, prompts, answers, **kw):
        if "boom" in answers:
            raise RuntimeError("numerical trouble")
        return real(model, tok, prompts, answers, **kw)

    monkeypatch.setattr(score_run, "score_sequences", flaky)
    rows = [{"key": "a", **ROWS[0]}, {"key": "b", "prompt": "q", "answer": "boom"},
            {"key": "c", **ROWS[1]}]
    inp, out = jsonl(tmp_path / "in.jsonl", rows), tmp_path / "out.jsonl"
    assert score(inp, out, model_dir, "--batch-size", "3") == 0
    got = by_key(out)
    assert got["b"]["error"] == "RuntimeError: numerical trouble"
    assert got["a"]["scores"]["epistemic"] > 0 and got["c"]["scores"]["epistemic"] > 0


# ------------------------------------------------------------------ streaming
def test_rows_are_read_in_windows(model_dir, tmp_path, monkeypatch):
    """The runner pulls rows lazily: at most one window is read ahead of the scoring."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(model_dir)
    tok = AutoTokenizer.from_pretrained(model_dir)
    inp = jsonl(tmp_path / "in.jsonl", [{**ROWS[i % 5], "key": f"r{i}"} for i in range(9)])
    pulled, scored = [], []

    def rows():
        for r in iter_pairs(inp):
            pulled.append(r.key)
            yield r

    score_rows(model, tok, rows(), tmp_path / "out.jsonl", window=3, batch_size=2,
               progress=False, on_batch=lambda n: scored.append((len(pulled), n)))
    assert all(p - done <= 3 + n for (p, n), done in
               zip(scored, [sum(n for _, n in scored[:i]) for i in range(len(scored))],
                   strict=True))
    assert len(read_jsonl(tmp_path / "out.jsonl")) == 9


# ------------------------------------------------------------------ property
def test_malformed_rows_never_raise_anything_but_isouq_errors(tmp_path):
    pytest.importorskip("hypothesis")
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st
    from transformers import AutoModelForCausalLM, AutoTokenizer

    d = tmp_path / "m"
    tiny.causal_lm("llama-tied").save_pretrained(d)
    tiny.tokenizer().save_pretrained(d)
    model = AutoModelForCausalLM.from_pretrained(d)
    tok = AutoTokenizer.from_pretrained(d)
    out = tmp_path / "out.jsonl"
    good = jsonl(tmp_path / "good.jsonl", [{**ROWS[0], "key": "keep"}])
    score_rows(model, tok, iter_pairs(good), out, progress=False)
    kept = read_jsonl(out)[0]

    scalars = st.one_of(st.none(), st.booleans(), st.integers(-5, 10**6), st.floats(),
                        st.text(max_size=12))
    values = st.recursive(scalars, lambda c: st.one_of(
        st.lists(c, max_size=4), st.dictionaries(st.sampled_from(["role", "content", "x"]), c,
                                                 max_size=3)), max_leaves=6)
    row = st.dictionaries(st.sampled_from(["key", "id", "prompt", "question", "answer", "x"]),
                          values, max_size=5)
    line = st.one_of(row.map(json.dumps), st.text(max_size=20))

    @settings(max_examples=60, deadline=None,
              suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
    @given(st.lists(line, min_size=1, max_size=4))
    def check(lines):
        inp = tmp_path / "in.jsonl"
        inp.write_text("\n".join(lines) + "\n", encoding="utf-8")
        try:
            rows = list(iter_pairs(inp))
        except IsouqError:
            return
        rows = [r for r in rows if r.key != "keep"]
        try:
            score_rows(model, tok, rows, out, progress=False, prune=False)
        except IsouqError:
            pass
        assert by_key(out)["keep"] == kept  # nothing already written is lost or changed
        for r in read_jsonl(out):
            assert "error" in r or r["scores"]["epistemic"] >= 0

    check()


# ------------------------------------------------------------------ memory budget
def test_memory_budget_cuts_batches_to_what_fits(model_dir, tmp_path, capsys, monkeypatch):
    """--memory-budget: each batch's predicted peak fits; a budget below one row's need gives
    error rows naming the budget; the scores equal an unbudgeted run's."""
    from transformers import AutoModelForCausalLM

    from isouq.memory_plan import peak_bytes, shape_of

    rows = [{"key": f"r{i}", **ROWS[i % 5]} for i in range(10)]
    inp = jsonl(tmp_path / "in.jsonl", rows)
    free, tight = tmp_path / "free.jsonl", tmp_path / "tight.jsonl"
    assert score(inp, free, model_dir, "--batch-size", "8") == 0
    shape = shape_of(AutoModelForCausalLM.from_pretrained(model_dir))
    one = peak_bytes(shape, batch=1, length=16, answer_length=4)
    two = peak_bytes(shape, batch=2, length=16, answer_length=4)
    budget = (one + two) // 2  # room for one row of these, not two
    batches = []
    from isouq import score_run

    real = score_run.score_sequences

    def spy(model, tok, prompts, answers, **kw):
        batches.append(len(answers))
        return real(model, tok, prompts, answers, **kw)

    monkeypatch.setattr(score_run, "score_sequences", spy)
    assert score(inp, tight, model_dir, "--batch-size", "8", "--memory-budget", str(budget)) == 0
    monkeypatch.undo()
    assert max(batches) < 8 and sum(batches) == 10
    for k, r in by_key(free).items():
        assert by_key(tight)[k]["scores"]["epistemic"] == pytest.approx(r["scores"]["epistemic"],
                                                                   rel=1e-5)
    tiny_out = tmp_path / "none.jsonl"  # not even the model fits: one line, nothing scored
    assert score(inp, tiny_out, model_dir, "--memory-budget", "1KB") == 2
    assert "the budget" in capsys.readouterr().err and not tiny_out.exists()
    assert all("raise --memory-budget" in r["error"] for r in read_jsonl(tiny_out))
    assert score(inp, tiny_out.with_name("x.jsonl"), model_dir, "--memory-budget", "lots") == 2
    assert "cannot read 'lots' as a memory size" in capsys.readouterr().err
