"""`isouq score`: output rows, resume after a crash, bucketing, torchrun sharding and merge."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import isouq
from isouq.answer_row import FIELDS
from isouq.cli import main
from isouq.prepare import plan_batches
from isouq.runio import read_jsonl

QUESTIONS = ["what is the capital of france", "who wrote hamlet", "why is the sky blue",
             "what is the moon made of", "is the cat on the mat", "who sat on the mat"]
ANSWERS = ["paris", "shakespeare wrote hamlet", "because the sky is blue", "cheese rock",
           "yes the cat is", "the dog sat on the mat"]


@pytest.fixture(scope="module")
def model_dir(tiny_llama_dir):
    return tiny_llama_dir


def write_input(path: Path, n: int) -> Path:
    with open(path, "w") as f:
        for i in range(n):
            row = {"id": f"q{i}", "answer": ANSWERS[i % 6] + (" mat" * (i % 5))}
            if i % 2:
                row["question"] = QUESTIONS[i % 6]
            else:
                row["prompt"] = [{"role": "user", "content": QUESTIONS[i % 6]}]
            f.write(json.dumps(row) + "\n")
    return path


def rows_by_key(path):
    return {r["key"]: r for r in read_jsonl(path)}


def same_scores(a: dict, b: dict):
    assert list(a) == list(b)
    for k in a:
        assert a[k]["answer"] == b[k]["answer"]
        for f in ("epistemic", "aleatoric", "mean_prob"):
            assert a[k]["scores"][f] == pytest.approx(b[k]["scores"][f], rel=1e-5), (k, f)


def test_plan_batches():
    lengths = [5, 1, 9, 3, 7, 2]
    b = plan_batches(lengths, batch_size=2, max_tokens=None)
    assert b == [[1, 5], [3, 0], [4, 2]]
    b = plan_batches(lengths, batch_size=10, max_tokens=12)
    assert all(max(lengths[i] for i in g) * len(g) <= 12 or len(g) == 1 for g in b)
    assert sorted(i for g in b for i in g) == list(range(6))
    assert plan_batches(lengths, 4, None, bucket=False) == [[0, 1, 2, 3], [4, 5]]


def test_score_matches_library_and_resumes(model_dir, tmp_path):
    inp = write_input(tmp_path / "in.jsonl", 12)
    out = tmp_path / "scores.jsonl"
    assert main(["score", str(inp), "--out", str(out), "--model", str(model_dir),
                 "--batch-size", "4"]) == 0
    rows = read_jsonl(out)
    assert [r["key"] for r in rows] == [f"q{i}" for i in range(12)]  # input order restored
    meta = json.loads(Path(str(out) + ".meta.json").read_text())
    assert meta["params"]["n_params"] == rows[0]["n_params"]
    assert all(set(FIELDS) <= set(r) for r in rows)  # the one answer-row schema
    # the same numbers straight from the library
    from isouq.llm.prompts import qa_prompt
    from isouq.models import load_model

    model, tok, _ = load_model(str(model_dir))
    src = [json.loads(line) for line in open(inp)]
    prompts = [r.get("prompt") or qa_prompt(tok, r["question"]) for r in src]
    lib = isouq.score_sequences(model, tok, prompts, [r["answer"] for r in src])
    assert torch.allclose(torch.tensor([r["scores"]["epistemic"] for r in rows]), lib.epistemic, rtol=1e-5)
    # crash: keep 5 rows and a torn half-line; a re-run completes without duplicates
    full = rows_by_key(out)
    lines = out.read_text().splitlines(keepends=True)
    out.write_text("".join(lines[:5]) + lines[5][:20])
    assert main(["score", str(inp), "--out", str(out), "--model", str(model_dir),
                 "--batch-size", "4"]) == 0
    same_scores(rows_by_key(out), full)
    assert len(read_jsonl(out)) == 12
    # bucketing does not change a score
    out2 = tmp_path / "nobucket.jsonl"
    main(["score", str(inp), "--out", str(out2), "--model", str(model_dir), "--batch-size", "5",
          "--no-bucketing"])
    same_scores(rows_by_key(out2), full)


def test_input_fields_travel_and_the_model_is_recorded(model_dir, tmp_path, capsys):
    """An input row's own fields (a label, a dataset) reach its answer row unchanged, the row
    names the model, and `isouq calibrate` reads the labels of those rows with no --model and
    no meta file; a changed label writes its row again on a resume."""
    inp = tmp_path / "in.jsonl"
    rows = [{"id": f"q{i}", "question": QUESTIONS[i % 6], "answer": ANSWERS[i % 6] + " mat" * i,
             "correct": i % 2, "dataset": "mine", "note": {"why": "kept as it is"}}
            for i in range(8)]
    inp.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "scores.jsonl"
    assert main(["score", str(inp), "--out", str(out), "--model", str(model_dir)]) == 0
    got = read_jsonl(out)
    assert [(r["correct"], r["dataset"], r["note"]) for r in got] == [
        (i % 2, "mine", {"why": "kept as it is"}) for i in range(8)]
    assert {r["model"] for r in got} == {str(model_dir)}
    alone = tmp_path / "moved" / "scores.jsonl"  # no meta file beside it: the rows say it
    alone.parent.mkdir()
    alone.write_text(out.read_text())
    capsys.readouterr()
    assert main(["calibrate", str(alone), "--out", str(tmp_path / "cal")]) == 0
    assert "8 answers, 4 correct" in capsys.readouterr().out
    rows[3]["correct"] = 0
    inp.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert main(["score", str(inp), "--out", str(out), "--model", str(model_dir)]) == 0
    assert "1 of them again" in capsys.readouterr().out
    assert read_jsonl(out)[3]["correct"] == 0


def test_bad_input_is_one_clear_line(tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"prompt": "x"}) + "\n")
    assert main(["score", str(bad), "--out", str(tmp_path / "o.jsonl")]) == 2
    err = capsys.readouterr().err
    assert "line 1 has no 'answer'" in err and "Traceback" not in err


@pytest.mark.parametrize("argv, problem", [
    (["experiment", "validation", "--out", "{file}"], "is a file; give a folder"),
    (["report", "results", "--out", "{file}"], "is a file; give a folder"),
    (["qa", "run", "--out", "{file}"], "is a file; give a folder"),
    (["score", "{file}", "--out", "{dir}"], "is a folder; give a file name"),
    (["score", "{file}", "--out", "o.jsonl", "--batch-size", "0"], "0 must be ≥ 1"),
    (["qa", "run", "--out", "{dir}", "--limit", "-3"], "-3 must be ≥ 1"),
    (["report", "{dir}", "--out", "{dir}", "--n-bootstrap", "many"], "'many' is not a whole number"),
])
def test_a_wrong_output_or_count_is_refused_before_any_work(tmp_path, capsys, argv, problem):
    file = tmp_path / "taken.txt"
    file.write_text("x")
    argv = [a.format(file=file, dir=tmp_path) for a in argv]
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and problem in err and "Traceback" not in err


def torchrun(args, **kw):
    exe = shutil.which("torchrun") or str(Path(sys.executable).parent / "torchrun")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "ISOUQ_THREADS": "1"}
    cmd = [exe, "--nproc-per-node", "2", "--master-port", str(29500 + os.getpid() % 1000),
           "-m", "isouq", *args]
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True, **kw)


def test_torchrun_two_processes_equal_one_and_survive_a_kill(model_dir, tmp_path):
    n = 40
    inp = write_input(tmp_path / "in.jsonl", n)
    one = tmp_path / "one.jsonl"
    assert main(["score", str(inp), "--out", str(one), "--model", str(model_dir),
                 "--batch-size", "1"]) == 0
    two = tmp_path / "two.jsonl"
    args = ["score", str(inp), "--out", str(two), "--model", str(model_dir), "--batch-size", "1"]
    # first launch: kill the whole job as soon as rank 1 has written some rows
    proc = torchrun(args)
    shard1 = tmp_path / "two.rank1-of-2.jsonl"
    deadline = time.time() + 240
    while time.time() < deadline and proc.poll() is None:
        if shard1.exists() and len(read_jsonl(shard1)) >= 2:
            os.killpg(proc.pid, signal.SIGKILL)
            break
        time.sleep(0.05)
    proc.wait()
    done_after_kill = len(read_jsonl(shard1)) if shard1.exists() else 0
    assert 0 < done_after_kill < n // 2 or proc.returncode == 0
    # re-launch with the same arguments: finishes, merges in input order, no gaps/duplicates
    proc = torchrun(args)
    log, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, log
    rows = read_jsonl(two)
    assert [r["key"] for r in rows] == [f"q{i}" for i in range(n)]
    same_scores(rows_by_key(two), rows_by_key(one))


@pytest.mark.skipif(shutil.which("accelerate") is None and not
                    (Path(sys.executable).parent / "accelerate").exists(),
                    reason="accelerate's launcher is not installed")
def test_accelerate_launch_equals_one_process(model_dir, tmp_path):
    """`accelerate launch --multi_gpu` runs torchrun's launcher: same variables, same rows.

    (It works on a CPU-only machine too, with gloo; `accelerate launch --cpu` starts ONE
    process unless an MPI hostfile is given, so it is not the way to shard.)"""
    inp = write_input(tmp_path / "in.jsonl", 12)
    one = tmp_path / "one.jsonl"
    assert main(["score", str(inp), "--out", str(one), "--model", str(model_dir)]) == 0
    exe = shutil.which("accelerate") or str(Path(sys.executable).parent / "accelerate")
    out = tmp_path / "acc.jsonl"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "ISOUQ_THREADS": "1",
           "HF_HOME": str(tmp_path / "hf")}  # no user accelerate config is read
    cmd = [exe, "launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1",
           "--mixed_precision", "no", "--dynamo_backend", "no",
           "--main_process_port", str(30500 + os.getpid() % 1000),
           "-m", "isouq", "score", str(inp), "--out", str(out), "--model", str(model_dir)]
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout + res.stderr
    assert (tmp_path / "acc.rank1-of-2.jsonl").exists()  # it really ran as two ranks
    rows = read_jsonl(out)
    assert [r["key"] for r in rows] == [f"q{i}" for i in range(12)]
    same_scores(rows_by_key(out), rows_by_key(one))


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="NCCL test needs 2 CUDA devices")
def test_torchrun_nccl_two_gpus_equal_one_process(model_dir, tmp_path):
    """The same sharding on GPUs: --device cuda makes rank r use cuda:r with NCCL."""
    inp = write_input(tmp_path / "in.jsonl", 16)
    one = tmp_path / "one.jsonl"
    assert main(["score", str(inp), "--out", str(one), "--model", str(model_dir),
                 "--device", "cuda"]) == 0
    two = tmp_path / "two.jsonl"
    proc = torchrun(["score", str(inp), "--out", str(two), "--model", str(model_dir),
                     "--device", "cuda"])
    log, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, log
    assert [r["key"] for r in read_jsonl(two)] == [f"q{i}" for i in range(16)]
    same_scores(rows_by_key(two), rows_by_key(one))


def test_quantize_adapter_and_parameter_sets_on_the_command_line(model_dir, tmp_path, capsys):
    """--quantize 4bit on a local folder (bitsandbytes on CPU), --params trainable (the paper's
    4-bit setting: said once, with its share), --adapter DIR (PEFT) with --params adapter, and
    the one-line errors."""
    pytest.importorskip("bitsandbytes")
    peft = pytest.importorskip("peft")
    inp = write_input(tmp_path / "in.jsonl", 4)
    assert main(["score", str(inp), "--out", str(tmp_path / "q.jsonl"), "--model", str(model_dir),
                 "--quantize", "4bit"]) == 0
    rows = read_jsonl(tmp_path / "q.jsonl")
    assert {r["params"]["set"] for r in rows} == {"all"} and rows[0]["params"]["share"] == 1.0
    assert "parameters scored" not in capsys.readouterr().out
    assert main(["score", str(inp), "--out", str(tmp_path / "t.jsonl"), "--model", str(model_dir),
                 "--quantize", "4bit", "--params", "trainable"]) == 0
    out = capsys.readouterr().out
    assert "parameters scored: set 'trainable'" in out and "--params all" in out
    trainable = read_jsonl(tmp_path / "t.jsonl")[0]["params"]
    assert trainable["share"] < 1 and trainable["n_params"] < rows[0]["n_params"]

    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(model_dir)
    cfg = peft.LoraConfig(r=2, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    torch.manual_seed(0)
    peft.get_peft_model(base, cfg).save_pretrained(tmp_path / "adapter")
    assert main(["score", str(inp), "--out", str(tmp_path / "a.jsonl"), "--model", str(model_dir),
                 "--adapter", str(tmp_path / "adapter"), "--params", "adapter"]) == 0
    got = read_jsonl(tmp_path / "a.jsonl")
    lm = peft.PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(model_dir),
                                        str(tmp_path / "adapter")).eval()
    from isouq.models import load_model

    _, tok, _ = load_model(str(model_dir))
    from isouq.llm.prompts import qa_prompt

    prompts = [r["prompt"] if r.get("prompt") is not None else qa_prompt(tok, r["question"])
               for r in got]
    want = isouq.score_sequences(lm, tok, prompts, [r["answer"] for r in got], params="adapter")
    assert [r["scores"]["epistemic"] for r in got] == pytest.approx(want.epistemic.tolist(),
                                                                     rel=1e-5)
    assert got[0]["params"]["set"] == "adapter" and got[0]["n_params"] == want.params.n_params
    capsys.readouterr()
    assert main(["score", str(inp), "--out", str(tmp_path / "x.jsonl"), "--model", str(model_dir),
                 "--adapter", str(tmp_path / "nowhere")]) == 2
    assert "adapter_config.json" in capsys.readouterr().err
    assert main(["score", str(inp), "--out", str(tmp_path / "y.jsonl"), "--model", str(model_dir),
                 "--params", "adapter"]) == 2
    assert "no PEFT adapter" in capsys.readouterr().err


def test_a_resume_with_other_load_options_is_refused(model_dir, tmp_path, capsys):
    """--quantize and the adapter's digest are settings of the rows: resuming a float run with
    --quantize 4bit (or the reverse), or with another adapter, is refused in one line."""
    pytest.importorskip("bitsandbytes")
    inp = write_input(tmp_path / "in.jsonl", 2)
    out = tmp_path / "f.jsonl"
    assert main(["score", str(inp), "--out", str(out), "--model", str(model_dir)]) == 0
    meta = json.loads((tmp_path / "f.jsonl.meta.json").read_text())["settings"]
    assert "quantize" not in meta and "adapter_sha256" not in meta  # older runs compare equal
    capsys.readouterr()
    assert main(["score", str(inp), "--out", str(out), "--model", str(model_dir),
                 "--quantize", "4bit"]) == 2
    err = capsys.readouterr().err
    assert "quantize: None there, '4bit' now" in err and len(err.strip().splitlines()) == 1
    q = tmp_path / "q.jsonl"
    assert main(["score", str(inp), "--out", str(q), "--model", str(model_dir),
                 "--quantize", "4bit"]) == 0
    assert json.loads((tmp_path / "q.jsonl.meta.json").read_text())["settings"]["quantize"] == "4bit"
    assert main(["score", str(inp), "--out", str(q), "--model", str(model_dir),
                 "--quantize", "4bit"]) == 0  # the same options resume
    capsys.readouterr()
    assert main(["score", str(inp), "--out", str(q), "--model", str(model_dir)]) == 2
    assert "quantize: '4bit' there, None now" in capsys.readouterr().err
