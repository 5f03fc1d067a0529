"""The GPU benchmark scripts run end to end (on the CPU, a tiny random config): a GPU session
has minutes, and a script that fails there costs them."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

import by_path

ROOT = Path(__file__).resolve().parents[1]


def test_paper_sizes_runs_every_method_and_variant(tiny_llama_dir, tmp_path):
    pytest.importorskip("transformers")
    res = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "paper_sizes.py"), "--models",
         str(tiny_llama_dir), "--methods", "floor", "full_backward", "ghost", "floor_unaligned",
         "ghost_unaligned", "--batch-sizes", "2", "--tokenizer", str(tiny_llama_dir),
         "--device", "cpu", "--dtype", "float32", "--warmups", "0", "--repeats", "1",
         "--tag", "t", "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert res.returncode == 0, res.stderr[-3000:]
    doc = json.loads((tmp_path / "paper_sizes_t.json").read_text())
    assert not doc["failures"], doc["failures"]
    methods = {r["method"] for r in doc["rows"] if not r.get("oom")}
    assert methods == {"floor", "full_backward", "ghost", "floor_unaligned", "ghost_unaligned"}
    row = doc["table"][0]
    assert row["ghost/floor"] > 0 and row["unaligned ghost/floor"] > 0


def test_spans_benchmark_runs_on_a_random_config(tiny_llama_dir, tmp_path):
    out = tmp_path / "spans.json"
    res = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "spans.py"), "--config", str(tiny_llama_dir),
         "--device", "cpu", "--n", "4", "--repeats", "1", "--loop-repeats", "1", "--threads", "1",
         "--out", str(out)], capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert res.returncode == 0, res.stderr[-3000:]
    doc = json.loads(out.read_text())
    assert set(doc["seconds"]) >= {"whole", "spans_retain", "spans_loop"}
    assert doc["max_rel_diff_retain_vs_loop"] < 1e-4


def test_score_sequences_benchmark_runs_on_a_random_config(tiny_llama_dir, tmp_path):
    res = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "score_sequences.py"), "--config",
         str(tiny_llama_dir), "--device", "cpu", "--batch-sizes", "2", "--methods", "floor",
         "ghost", "loop", "ghost_unaligned", "--repeats", "1", "--warmups", "0", "--threads",
         "1", "--tag", "t", "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert res.returncode == 0, res.stderr[-3000:]
    doc = json.loads((tmp_path / "score_sequences_t.json").read_text())
    assert {r["method"] for r in doc["rows"]} == {"floor", "ghost", "loop", "ghost_unaligned"}
    assert {"loop/ghost", "ghost/floor", "ghost_unaligned/ghost"} <= set(doc["ratios"][0])


def test_half_precision_benchmark_runs_on_a_random_config(tiny_llama_dir, tmp_path):
    res = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "half_precision.py"), "--config",
         str(tiny_llama_dir), "--device", "cpu", "--n", "4", "--dtypes", "bfloat16", "--tag",
         "t", "--out", str(tmp_path)], capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert res.returncode == 0, res.stderr[-3000:]
    assert list(tmp_path.glob("*.json"))


def test_ghost_launches_counts_a_narrow_architecture(tiny_llama_dir, tmp_path):
    res = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "ghost_launches.py"), "--models", "olmo-1b",
         "--tokenizer", str(tiny_llama_dir), "--tag", "t", "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert res.returncode == 0, res.stderr[-3000:]
    doc = json.loads((tmp_path / "ghost_launches_t.json").read_text())
    row = doc["table"][0]
    assert row["layers"] == 16 and row["ghost ops"] > row["floor ops"] > 0
    assert row["host syncs ghost − floor"] >= 0 and doc["commit"]


@pytest.mark.parametrize("mode", ["interleaved", "processes"])
def test_score_sequences_ab_runs_both_sides_in_turn(tiny_llama_dir, tmp_path, mode):
    if not (ROOT / ".git").exists():
        pytest.skip("needs a git checkout (the earlier side is a git worktree)")
    extra = ["--", "--config", str(tiny_llama_dir), "--device", "cpu"] if mode == "processes" else []
    res = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "score_sequences_ab.py"), "--before", "HEAD",
         "--rounds", "2", "--batch-sizes", "2", "--mode", mode, "--tag", "t", "--out",
         str(tmp_path), "--model", str(tiny_llama_dir), "--repeats", "2", "--warmups", "0",
         "--threads", "1", *extra], capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert res.returncode == 0, res.stderr[-3000:]
    doc = json.loads((tmp_path / "score_sequences_ab_t.json").read_text())
    assert [(r["side"], r["round"]) for r in doc["runs"]] == [
        ("before", 1), ("after", 1), ("before", 2), ("after", 2)]
    assert len(doc["load_average"]["start"]) == 3 and len(doc["load_average"]["end"]) == 3
    for run in doc["runs"]:
        (row,) = run["rows"]
        assert set(row["seconds_per_answer"]) == {"ghost", "floor", "hf_floor"}
        assert all(v > 0 for v in row["seconds_per_answer"].values())
        assert len(row["times"]["hf_floor"]) == 2  # every call's raw seconds kept
    assert isinstance(doc["after_uncommitted"], list)  # git status lines of src/, benchmarks/
    if mode == "interleaved":  # each side ran its own src/: the worktree's, then the copy of
        srcs = [r["rows"][0]["src"] for r in doc["runs"]]  # this checkout's made at the start
        tail = str(Path("src") / "isouq" / "__init__.py")
        assert srcs[0].endswith(str(Path("before") / tail)) and "isouq-ab-" in srcs[0]
        assert srcs[1].endswith(str(Path("after") / tail)) and "isouq-ab-" in srcs[1]
        for run in doc["runs"]:
            row = run["rows"][0]
            assert all(len(row["times"][m]) == 2 for m in ("ghost", "floor", "hf_floor"))
            assert row["p_bar_largest_difference"] <= 1e-4
    (s,) = doc["summary"]
    assert s["batch"] == 2
    for side in ("before", "after"):
        hf = s["seconds_per_answer"][side]["hf_floor"]
        assert len(hf["by_round"]) == 2 and hf["min"] <= hf["median"] <= hf["max"]
        assert s["noise"][side] == pytest.approx((hf["max"] - hf["min"]) / hf["median"])
        for name in ("ghost/floor", "ghost/hf_floor"):
            assert s["ratios"][side][name]["median"] > 0
    both = (s["seconds_per_answer"]["before"]["hf_floor"]["by_round"]
            + s["seconds_per_answer"]["after"]["hf_floor"]["by_round"])
    assert s["noise"]["both"] == pytest.approx((max(both) - min(both)) / statistics.median(both))
    for name in ("ghost", "floor", "hf_floor", "ghost/floor", "ghost/hf_floor"):
        ab = s["after/before"][name]
        src = s["ratios"] if "/" in name else s["seconds_per_answer"]
        assert ab["ratio"] == pytest.approx(src["after"][name]["median"]
                                            / src["before"][name]["median"])
        assert ab["inside_noise"] == (abs(ab["ratio"] - 1) <= ab["noise"])
    md = (tmp_path / "score_sequences_ab_t.md").read_text()
    assert "floor (transformers only)" in md and "noise" in md
    worktrees = subprocess.run(["git", "worktree", "list"], cwd=ROOT, capture_output=True,
                               text=True).stdout
    assert "isouq-ab-" not in worktrees  # the temporary worktree is removed


def test_score_sequences_ab_names_a_bad_revision(tmp_path):
    res = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "score_sequences_ab.py"), "--before",
         "no-such-rev", "--out", str(tmp_path)], capture_output=True, text=True, timeout=120,
        cwd=ROOT)
    assert res.returncode == 2 and "--before no-such-rev: not a commit" in res.stderr


def _hf_floor_module():
    """benchmarks/hf_floor.py, imported from its file."""
    return by_path.module("benchmarks/hf_floor.py", register=True)


@pytest.mark.parametrize("family", ["llama-tied", "gpt2"])
def test_hf_floor_computes_isouqs_p_bar_with_activation_gradients_only(family):
    """The independent floor does isouq's work: on the same pairs (chat and plain prompts of
    different lengths, so padding matters) its batch is isouq's and its p̄ is isouq's
    ``token_probs`` p̄; it runs a backward that reaches the layers and leaves no weight
    gradient, every weight's requires_grad as it was."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    import tiny
    from isouq.sequences import collate, encode, summarize, token_probs

    hf = _hf_floor_module()
    model, tok = tiny.causal_lm(family), tiny.tokenizer()
    prompts = [[{"role": "user", "content": "what is the cat"}], "the dog is",
               [{"role": "user", "content": "a"}]]
    answers = [" the cat is a dog", " big", " what is the dog of the cat"]
    b = collate(encode(tok, prompts, answers), tok.pad_token_id)
    floor, hb = hf.hf_floor(model, tok, prompts, answers)
    assert torch.equal(hb.input_ids, b.input_ids)
    with torch.no_grad():
        ours = hf.mean_answer_probs(model, hb)
        theirs = summarize(*token_probs(model, b))[0]
    assert ours.shape == (3,) and torch.allclose(ours, theirs, rtol=0, atol=1e-6)
    assert len(set(ours.tolist())) == 3  # three answers, three p̄ (not one value broadcast)
    reached = []
    layer = next(m for m in model.modules() if isinstance(m, torch.nn.Linear))
    hook = layer.register_full_backward_hook(lambda *_: reached.append(1))
    model.get_input_embeddings().weight.requires_grad_(False)  # one weight frozen beforehand
    floor()
    hook.remove()
    assert reached  # the backward ran through the layers
    assert all(p.grad is None for p in model.parameters())
    assert [p.requires_grad for p in model.parameters()].count(False) == 1


def test_hf_floor_runs_alone_without_isouq(tiny_llama_dir, tmp_path):
    """Run alone, the independent floor times its calls and imports no isouq module."""
    pairs = tmp_path / "pairs.json"
    pairs.write_text(json.dumps([[[{"role": "user", "content": "what is the cat"}], " a dog"],
                                 ["the dog is", " big"]]))
    code = ("import runpy, sys; script, *sys.argv[1:] = sys.argv[1:]; "
            "runpy.run_path(script, run_name='__main__'); "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('isouq', 'floor')))")
    res = subprocess.run([sys.executable, "-c", code, str(ROOT / "benchmarks" / "hf_floor.py"),
                          "--model-dir", str(tiny_llama_dir), "--pairs", str(pairs), "--batch",
                          "2", "--repeats", "2", "--threads", "1"],
                         capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    *_, line, modules = res.stdout.strip().splitlines()
    row = json.loads(line)
    assert row["batch"] == 2 and len(row["times"]) == 2 and row["seconds_per_answer"] > 0
    assert len(row["p_bar"]) == 2 and all(0 < p < 1 for p in row["p_bar"])
    assert modules == "[]"
