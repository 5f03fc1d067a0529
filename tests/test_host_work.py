"""The host work of a scoring call, counted with ``benchmarks/host_ops.py``'s dispatch modes:
no value read back inside the ghost backward, one device→host copy per batch, and issue 64's
targets of aten operations against a floor written without isouq."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import by_path
import isouq
import tiny
from isouq.ghost.engine import GhostNorms

ROOT = Path(__file__).resolve().parents[1]
PROMPTS = ["what is the capital of france", "who wrote hamlet", "why is the sky blue",
           "is the moon made of cheese"]
ANSWERS = ["paris", "shakespeare wrote hamlet", "because", "no the moon is rock"]


@pytest.fixture(scope="module")
def host_ops():
    """benchmarks/host_ops.py, imported from its file."""
    return by_path.module("benchmarks/host_ops.py", register=True)


def test_the_counter_sees_operations_reads_and_copies(host_ops):
    x = torch.tensor([1.0, -2.0, 3.0])
    with host_ops.counting() as seen:
        y = x * 2
        float(y.sum())
        x[x > 0]
        y.cpu()
        y.tolist()
        y.view(3, 1)
    assert seen["op:aten.mul"] == 1 and "op:aten.view" not in seen
    assert seen["read:aten._local_scalar_dense"] == 1 and seen["read:aten.index"] == 1
    assert seen["copy:cpu"] == 1 and seen["copy:tolist"] == 1


def _backward_work(monkeypatch, host_ops) -> list:
    """Every ghost backward's host reads and copies, counted while it runs."""
    seen = []
    backward = GhostNorms.backward_detailed

    def counted(self, *a, **k):
        with host_ops.counting() as c:
            out = backward(self, *a, **k)
        seen.append({k: v for k, v in c.items() if not k.startswith("op:")})
        return out

    monkeypatch.setattr(GhostNorms, "backward_detailed", counted)
    return seen


@pytest.mark.parametrize("family", ["llama", "llama-tied", "gpt2"])
@pytest.mark.parametrize("blocks", [False, True])
def test_the_ghost_backward_reads_nothing_back(family, blocks, monkeypatch, host_ops):
    """Inside the backward (its hooks, the rules, the norms' reduction) no value or size is
    read back from the device, and nothing is copied to the host."""
    model, tok = tiny.causal_lm(family), tiny.tokenizer()
    seen = _backward_work(monkeypatch, host_ops)
    for _ in range(2):  # the second call: after the norm layers' first-call checks
        isouq.score_sequences(model, tok, PROMPTS, ANSWERS, blocks=blocks)
    assert len(seen) == 2 and seen[-1] == {}, seen[-1]


def test_span_backwards_read_nothing_back(monkeypatch, host_ops):
    model, tok = tiny.causal_lm("llama"), tiny.tokenizer()
    seen = _backward_work(monkeypatch, host_ops)
    isouq.score_sequences(model, tok, PROMPTS, ANSWERS, spans="sentences")
    seen.clear()
    isouq.score_sequences(model, tok, PROMPTS, ANSWERS, spans="sentences")
    assert len(seen) > 1 and all(s == {} for s in seen), seen


def test_one_copy_to_the_host_per_batch_and_no_read_beyond_the_models(host_ops):
    """The call's reads are the model forward's own (transformers' mask checks, also in a
    floor), its copies one per batch."""
    model, tok = tiny.causal_lm("llama"), tiny.tokenizer()
    reads = {}
    for batch_size in (4, 2):
        run = lambda bs=batch_size: isouq.score_sequences(  # noqa: E731
            model, tok, PROMPTS, ANSWERS, batch_size=bs)
        res = host_ops.counted(run)
        assert res["by_copy"] == {"cpu": 4 // batch_size}, res["by_copy"]
        reads[batch_size] = res["reads"]
    with torch.no_grad(), host_ops.counting() as c:
        model(input_ids=torch.randint(4, tiny.VOCAB, (2, 5)),
              attention_mask=torch.tensor([[0, 1, 1, 1, 1], [1, 1, 1, 1, 1]]))
    forward_reads = sum(v for k, v in c.items() if k.startswith("read:"))
    assert reads == {4: forward_reads, 2: 2 * forward_reads}


@pytest.mark.parametrize("width", ["tiny", "narrow"])
def test_operations_meet_issue_64s_targets(width, host_ops):
    """Through the public score_sequences, float32, the CPU path, against the independent
    floor: ≤ 16 more operations per decoder layer, ≤ 40 more per call, no more host reads
    and one device→host copy of the results (the floor's p̄ is copied too)."""
    m = host_ops.measure(width, "float32", "cpu", rows=4)
    floor, ghost = m["floor"], m["ghost"]
    assert ghost["per_layer"] - floor["per_layer"] <= 16, ghost["by_op_per_layer"]
    assert ghost["fixed"] - floor["fixed"] <= 40
    assert ghost["reads"] <= floor["reads"] and not ghost["reads_grow_with_depth"]
    assert ghost["copies"] == floor["copies"] == 1


def test_the_benchmark_writes_its_json_and_table(tmp_path):
    res = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "host_ops.py"), "--widths", "tiny",
         "--dtypes", "bfloat16", "--paths", "cuda", "--out", str(tmp_path), "--table",
         str(tmp_path / "host_ops.md")], capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert res.returncode == 0, res.stderr[-3000:]
    doc = json.loads((tmp_path / "host_ops.json").read_text())
    (row,) = doc["table"]
    assert row["dtype"] == "bfloat16" and row["path"] == "cuda"
    assert "host_ops_emulated.bmm_f32_out" in doc["measured"][0]["ghost"]["by_op_per_layer"]
    assert "| Llama tiny (hidden 16) | bfloat16 | cuda |" in (tmp_path / "host_ops.md").read_text()
