"""Models larger than one device: a device map with disk offload through `isouq score`, FSDP2
sharding under torchrun (gloo on CPU), and the placement `--memory-budget` suggests.

Each compares with the same model scored whole in one process (rel. 1e-5)."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import tiny
from isouq import memory_plan as mp
from isouq.cli import main
from isouq.errors import MemoryBudgetError
from isouq.runio import read_jsonl

QUESTIONS = ["what is the capital of france", "who wrote hamlet", "why is the sky blue",
             "what is the moon made of", "is the cat on the mat"]
ANSWERS = ["paris", "shakespeare wrote hamlet", "because the sky is blue", "cheese rock",
           "yes the cat is"]


def write_input(path: Path, n: int) -> Path:
    with open(path, "w") as f:
        for i in range(n):
            f.write(json.dumps({"id": f"q{i}", "question": QUESTIONS[i % 5],
                                "answer": ANSWERS[i % 5] + " mat" * (i % 3)}) + "\n")
    return path


def same_scores(a: Path, b: Path, n: int):
    ra, rb = read_jsonl(a), read_jsonl(b)
    assert [r["key"] for r in ra] == [r["key"] for r in rb] == [f"q{i}" for i in range(n)]
    for x, y in zip(ra, rb, strict=True):
        assert "error" not in x and "error" not in y, (x, y)
        for f in ("epistemic", "aleatoric", "mean_prob"):
            assert y["scores"][f] == pytest.approx(x["scores"][f], rel=1e-5), (x["key"], f)


def params_of(out: Path) -> dict:
    return json.loads(Path(str(out) + ".meta.json").read_text())["params"]


# ---------------------------------------------------------------- (a) device map, offload
def test_device_map_auto_offloads_to_disk_and_scores_as_in_memory(tiny_llama_dir, tmp_path):
    """--device-map auto with a max_memory too small for the model: some modules on disk
    (weights on meta, loaded by accelerate's hooks), the scores and ‖θ*‖² those of the model in
    memory."""
    inp = write_input(tmp_path / "in.jsonl", 7)
    one, off = tmp_path / "one.jsonl", tmp_path / "off.jsonl"
    assert main(["score", str(inp), "--out", str(one), "--model", str(tiny_llama_dir)]) == 0
    folder = tmp_path / "offload"
    assert main(["score", str(inp), "--out", str(off), "--model", str(tiny_llama_dir),
                 "--device-map", "auto", "--max-memory", "cpu=12KB",
                 "--offload-folder", str(folder), "--on-error", "stop"]) == 0
    meta = json.loads(Path(str(off) + ".meta.json").read_text())
    # some modules really went to disk (transformers reads safetensors weights from the
    # checkpoint itself, so the offload folder may stay empty)
    assert "disk" in meta["model"]["device"]
    same_scores(one, off, 7)
    a, b = params_of(one), params_of(off)
    assert b["names"] == a["names"] and b["n_params"] == a["n_params"]
    assert b["sq_norm"] == pytest.approx(a["sq_norm"], rel=1e-6)


@pytest.mark.parametrize("argv, problem", [
    (["--max-memory", "cpu=1GB"], "device map"),
    (["--device-map", "auto", "--max-memory", "cpu"], "DEVICE=SIZE"),
    (["--device-map", "auto", "--max-memory", "gpu=1GB"], "unknown device"),
    (["--shard", "fsdp"], "torchrun"),
])
def test_placement_options_refused_in_one_line(tiny_llama_dir, tmp_path, capsys, argv, problem):
    inp = write_input(tmp_path / "in.jsonl", 2)
    code = main(["score", str(inp), "--out", str(tmp_path / "o.jsonl"), "--model",
                 str(tiny_llama_dir), *argv])
    err = capsys.readouterr().err
    assert code == 2 and problem in err and "Traceback" not in err


# ---------------------------------------------------------------- (b) FSDP2 under torchrun
def torchrun(args) -> subprocess.CompletedProcess:
    exe = shutil.which("torchrun") or str(Path(sys.executable).parent / "torchrun")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "ISOUQ_THREADS": "1"}
    cmd = [exe, "--nproc-per-node", "2", "--master-port", str(31500 + os.getpid() % 1000),
           "-m", "isouq", *args]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)


def test_fsdp_two_ranks_equal_one_process(tiny_llama_dir, tmp_path):
    """--shard fsdp: each rank holds half of every weight (gloo), scores its own rows (7 rows,
    batch 1: rank 1 runs a filler batch to keep the lockstep); rows and ‖θ*‖² (an all-reduce of
    the shards' norms) equal one process's."""
    inp = write_input(tmp_path / "in.jsonl", 7)
    one, two = tmp_path / "one.jsonl", tmp_path / "two.jsonl"
    assert main(["score", str(inp), "--out", str(one), "--model", str(tiny_llama_dir),
                 "--batch-size", "1"]) == 0
    res = torchrun(["score", str(inp), "--out", str(two), "--model", str(tiny_llama_dir),
                    "--batch-size", "1", "--shard", "fsdp", "--on-error", "stop"])
    assert res.returncode == 0, res.stdout + res.stderr
    assert "on rank 1 of 2" in res.stdout + res.stderr
    same_scores(one, two, 7)
    assert params_of(two)["sq_norm"] == pytest.approx(params_of(one)["sq_norm"], rel=1e-6)


def _fsdp_worker(rank: int, world: int, port: int, out: str, families: list[str]) -> None:
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.set_num_threads(1)
    sys.path.insert(0, str(Path(__file__).parent))
    import tiny as t
    from isouq import score_sequences
    from isouq.distributed import DistEnv, shard_model

    try:
        for fam in families:
            m = shard_model(t.causal_lm(fam), DistEnv(rank, world, rank))
            w = next(p for p in m.parameters())
            assert type(w).__name__ == "DTensor" and w.to_local().numel() < w.numel()
            rows = list(range(rank, len(QUESTIONS), world))
            r = score_sequences(m, t.tokenizer(), [QUESTIONS[i] for i in rows],
                                [ANSWERS[i] for i in rows], per_param=True, batch_size=2,
                                hidden=True)
            assert all(p.grad is None for p in m.parameters())  # frozen inside: no gradients
            torch.save({"rows": rows, "per": r.per_param, "sq": r.params.sq_norm,
                        "names": r.params.names, "hidden": r.hidden}, f"{out}/{fam}.{rank}.pt")
        dist.barrier()  # both ranks done before either tears gloo down
    finally:
        dist.destroy_process_group()


def test_fsdp_per_parameter_norms_equal_one_process(tmp_path):
    """score_sequences on a model sharded with shard_model (FSDP2, gloo, 2 processes): every
    rank's per-parameter norms of its own rows equal the unsharded model's (norm layers read
    their gathered weights; tied embeddings stay tied), and so do the hidden states the probe
    reads (from the scores' own forward, in the ranks' lockstep)."""
    import torch.multiprocessing as tmp

    from isouq import score_sequences

    families = ["llama", "llama-tied", "gpt2", "gemma3"]
    tmp.spawn(_fsdp_worker, args=(2, 32500 + os.getpid() % 1000, str(tmp_path), families),
              nprocs=2)
    for fam in families:
        ref = score_sequences(tiny.causal_lm(fam), tiny.tokenizer(), QUESTIONS, ANSWERS,
                              per_param=True, batch_size=2, hidden=True)
        for rank in range(2):
            got = torch.load(tmp_path / f"{fam}.{rank}.pt", weights_only=False)
            assert got["names"] == ref.params.names
            assert list(got["hidden"]) == list(ref.hidden)
            for name, X in ref.hidden.items():
                np.testing.assert_allclose(got["hidden"][name], X[got["rows"]], atol=2e-5)
            torch.testing.assert_close(got["per"], ref.per_param[got["rows"]], rtol=1e-5,
                                       atol=1e-12)
            assert got["sq"] == pytest.approx(ref.params.sq_norm, rel=1e-6)


def _fsdp_cuda_worker(rank: int, world: int, port: int, out: str, families: list[str]) -> None:
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=world)
    sys.path.insert(0, str(Path(__file__).parent))
    import tiny as t
    from isouq import score_sequences
    from isouq.distributed import fully_shard_blocks

    try:
        for fam in families:
            m = fully_shard_blocks(t.causal_lm(fam), world, f"cuda:{rank}")
            w = next(p for p in m.parameters())
            assert type(w).__name__ == "DTensor" and w.to_local().device.type == "cuda"
            rows = list(range(rank, len(QUESTIONS), world))
            r = score_sequences(m, t.tokenizer(), [QUESTIONS[i] for i in rows],
                                [ANSWERS[i] for i in rows], per_param=True, batch_size=2)
            torch.save({"rows": rows, "per": r.per_param.cpu(), "sq": r.params.sq_norm},
                       f"{out}/{fam}.{rank}.pt")
        dist.barrier()
    finally:
        dist.destroy_process_group()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (scripts/gpu_check.sh)")
def test_fsdp_over_nccl_equals_one_process(tmp_path):
    """FSDP2 over NCCL, one rank per GPU (two where the machine has two; one rank on a single
    GPU runs the same sharded parameters and collectives): every rank's per-parameter norms of
    its own rows equal the unsharded model's on the GPU."""
    import torch.multiprocessing as tmp

    from isouq import score_sequences

    families = ["llama", "llama-tied", "gemma3"]
    world = min(2, torch.cuda.device_count())
    tmp.spawn(_fsdp_cuda_worker, args=(world, 33500 + os.getpid() % 1000, str(tmp_path),
                                       families), nprocs=world)
    for fam in families:
        ref = score_sequences(tiny.causal_lm(fam).to("cuda"), tiny.tokenizer(), QUESTIONS,
                              ANSWERS, per_param=True, batch_size=2)
        for rank in range(world):
            got = torch.load(tmp_path / f"{fam}.{rank}.pt")
            torch.testing.assert_close(got["per"], ref.per_param[got["rows"]].cpu(), rtol=1e-5,
                                       atol=1e-12)
            assert got["sq"] == pytest.approx(ref.params.sq_norm, rel=1e-6)


# ---------------------------------------------------------------- the placement a budget needs
def big_shape(**kw) -> mp.Shape:
    s = mp.shape_of(tiny.causal_lm("llama"))
    return dataclasses.replace(s, param_bytes=8 * 2**30, hidden=2048, vocab=32000, layers=16,
                               intermediate=5632, kv_hidden=512, heads=16, **kw)


def test_plan_placement_memory_fsdp_or_device_map():
    s = big_shape()
    assert mp.plan_placement(s, "20GB").kind == "memory"
    p = mp.plan_placement(s, "6GB", devices=8)
    assert p.kind == "fsdp" and p.ranks == 3 and "--shard fsdp" in p.advice
    assert mp.fsdp_rank_bytes(s, 3) <= mp.parse_bytes("6GB") < mp.fsdp_rank_bytes(s, 2)
    q = mp.plan_placement(s, "6GB", devices=1)  # one device: offload, FSDP named as the other way
    assert q.kind == "device_map" and "--device-map auto --max-memory cpu=" in q.advice
    assert "--nproc-per-node 3" in q.advice
    # what the device map may hold leaves room for the scoring and one offloaded module
    est = mp.estimate(s, batch=1, length=64, answer_length=16)
    assert 0 < q.max_memory < mp.parse_bytes("6GB") - est.runtime - est.working
    assert "--max-memory 0=" in mp.plan_placement(s, "6GB", device="cuda:0").advice
    with pytest.raises(MemoryBudgetError, match="raise the budget"):
        mp.plan_placement(s, "0.5GB")


def test_shape_of_counts_what_the_process_holds(tmp_path):
    """Offloaded weights (on meta) are not held, but the largest offloaded module is, while it
    runs: the budget check of a device-mapped run plans with that."""
    accelerate = pytest.importorskip("accelerate")
    m = tiny.causal_lm("llama")
    full = mp.shape_of(m).param_bytes
    off = accelerate.disk_offload(m, str(tmp_path / "o"), execution_device="cpu")
    biggest = max(sum(p.numel() for p in x.parameters(recurse=False)) for x in off.modules())
    held = mp.shape_of(off).param_bytes
    assert held == sum(b.numel() * 4 for b in off.buffers() if b.is_floating_point()) \
        + biggest * 4 < full


def llama_dir(tmp_path: Path) -> Path:
    """A Llama whose decoder layers outweigh its embeddings (as in real LMs)."""
    import transformers as tf

    torch.manual_seed(0)
    cfg = tf.LlamaConfig(hidden_size=64, intermediate_size=512, num_hidden_layers=6,
                         num_attention_heads=4, num_key_value_heads=2, vocab_size=500,
                         tie_word_embeddings=False, pad_token_id=0, bos_token_id=2,
                         eos_token_id=3)
    d = tmp_path / "llama"
    tf.LlamaForCausalLM(cfg).eval().save_pretrained(d)
    tiny.tokenizer().save_pretrained(d)
    return d


def test_memory_budget_names_the_placement_and_it_runs(tmp_path, capsys, monkeypatch):
    """isouq score --memory-budget on a model that does not fit whole: one line naming the
    device map (and max_memory) to use; run with it, every row fits and scores as in memory.
    (The interpreter's constant is set aside so that a small model shows it.)"""
    monkeypatch.setitem(mp.CALIBRATION, "runtime", 0)
    monkeypatch.setitem(mp.CALIBRATION, "overhead", 0)
    model = llama_dir(tmp_path)
    inp = write_input(tmp_path / "in.jsonl", 5)
    out = tmp_path / "o.jsonl"
    code = main(["score", str(inp), "--out", str(out), "--model", str(model),
                 "--memory-budget", "2MB"])
    err = capsys.readouterr().err
    assert code == 2 and "--device-map auto --max-memory cpu=" in err and "Traceback" not in err
    flags = err.split("--device-map auto --max-memory ")[1].split()[0]
    ref = tmp_path / "ref.jsonl"
    assert main(["score", str(inp), "--out", str(ref), "--model", str(model)]) == 0
    assert main(["score", str(inp), "--out", str(out), "--model", str(model), "--memory-budget",
                 "7MB", "--device-map", "auto", "--max-memory", flags, "--on-error",
                 "stop"]) == 0
    assert "disk" in json.loads(Path(str(out) + ".meta.json").read_text())["model"]["device"]
    same_scores(ref, out, 5)
