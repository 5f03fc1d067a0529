"""memory_plan: the peak-memory model of score_sequences, batch planning, budgets.

The activation count is checked against autograd itself (the tensors the forward saves for the
backward, plus what the ghost hooks hold, counted by storage); the planner against peak_bytes;
one slow test compares the prediction with a measured peak RSS in a fresh process.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from isouq import memory_plan as mp
from isouq import sequences as S
from isouq.errors import InputError, MemoryBudgetError
from isouq.ghost.engine import GhostNorms
from isouq.params import select_params
from tiny import causal_lm

ROOT = Path(__file__).resolve().parents[1]


def llama(layers: int = 2, dtype=torch.float32, tied: bool = False):
    import transformers as tf

    torch.manual_seed(0)
    cfg = tf.LlamaConfig(hidden_size=64, intermediate_size=160, num_hidden_layers=layers,
                         num_attention_heads=4, num_key_value_heads=2, vocab_size=500,
                         tie_word_embeddings=tied)
    return tf.LlamaForCausalLM(cfg).to(dtype).eval()


def saved_bytes(model, N: int, L: int = 24, A: int = 5) -> int:
    """Bytes the ghost forward keeps for the backward: autograd's saved tensors and the hooks'
    recorded inputs/outputs, counted once per storage, parameters excluded."""
    torch.manual_seed(1)
    ids = torch.randint(3, model.config.vocab_size, (N, L))
    enc = [S.Encoded(ids[i, : L - A - (1 if i == 0 and N > 1 else 0)].tolist(),
                     ids[i, -A:].tolist()) for i in range(N)]
    batch = S.collate(enc, 0, "left")
    store: dict[int, int] = {}

    def keep(t):
        store[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()

    def pack(t):
        keep(t)
        return t

    with GhostNorms(model, select_params(model, None), seq_len=L) as g, torch.enable_grad():
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            S.token_probs(model, batch)
        for c in g.calls:
            for t in (*c.args, c.output):
                if isinstance(t, torch.Tensor):
                    keep(t)
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    return sum(v for k, v in store.items() if k not in params)


@pytest.mark.parametrize("N", [1, 3])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_activation_count_matches_what_autograd_saves_per_layer(N, dtype):
    L = 24
    per_layer = saved_bytes(llama(2, dtype), N, L) - saved_bytes(llama(1, dtype), N, L)
    s = mp.shape_of(llama(1, dtype))
    e = torch.empty((), dtype=dtype).element_size()
    blocks = mp._activation_blocks(dataclasses.replace(s, layers=1), N, L, e, padded=N > 1)
    # blocks of count 3 are outside the layers (embedding output, final norm in and out)
    predicted = sum(c * b for c, b in blocks if c != 3)
    assert predicted == per_layer


def test_shape_of_reads_the_config():
    s = mp.shape_of(llama(2))
    assert (s.hidden, s.kv_hidden, s.intermediate, s.layers, s.heads, s.vocab) == (
        64, 32, 160, 2, 4, 500)
    m = llama(2)
    assert s.param_bytes == 4 * sum(p.numel() for p in m.parameters()) + 4 * sum(
        b.numel() for b in m.buffers() if b.is_floating_point())
    assert not s.tied and mp.shape_of(llama(2, tied=True)).tied
    half = mp.shape_of(llama(2), torch.bfloat16)
    assert half.dtype == torch.bfloat16 and half.param_bytes == s.param_bytes // 2


@pytest.mark.parametrize("method", ["ghost", "loop"])
def test_peak_grows_with_batch_and_length(method):
    m = causal_lm("llama")
    s = dataclasses.replace(mp.shape_of(m), vocab=32000, hidden=512, kv_hidden=256,
                            intermediate=1376, layers=8, param_bytes=400 * 2**20)
    for L in (32, 128, 512, 2048):
        peaks = [mp.peak_bytes(s, batch=n, length=L, answer_length=16, method=method)
                 for n in (1, 2, 4, 16, 64)]
        assert peaks == sorted(peaks), (L, peaks)
        if method == "ghost":
            assert len(set(peaks)) == len(peaks)
    for n in (1, 4, 16):
        peaks = [mp.peak_bytes(s, batch=n, length=L, answer_length=16, method=method)
                 for L in (32, 128, 512, 2048)]
        assert peaks == sorted(peaks) and peaks[0] < peaks[-1], (n, peaks)


def test_ghost_and_loop_ordering():
    """The loop's weight gradients (3 × parameter bytes) dominate one short row; the ghost
    batch's activations and logits dominate many long rows."""
    s = mp.shape_of(causal_lm("llama"))
    big = dataclasses.replace(s, vocab=32000, hidden=512, kv_hidden=256, intermediate=1376,
                              layers=8, param_bytes=400 * 2**20)

    def w(method, n, L):
        return mp.estimate(big, batch=n, length=L, answer_length=8, method=method).working

    assert w("ghost", 1, 32) < w("loop", 1, 32)
    assert w("ghost", 64, 1024) > w("loop", 64, 1024)
    # the loop holds one row at a time: its peak barely depends on the batch size
    assert w("loop", 64, 1024) < 1.5 * w("loop", 1, 1024)


def test_plan_batch_size_is_the_largest_that_fits():
    s = dataclasses.replace(mp.shape_of(causal_lm("llama")), vocab=32000, hidden=512,
                            kv_hidden=256, intermediate=1376, layers=8,
                            param_bytes=400 * 2**20)
    for budget in ("2.5GiB", "4GiB", 9 * 2**30):
        for method in ("ghost", "loop"):
            n = mp.plan_batch_size(s, [100, 300, 256], budget, answer_length=16, method=method,
                                   max_batch=10_000)
            need = [mp.peak_bytes(s, batch=k, length=300, answer_length=16, method=method)
                    for k in (n, n + 1)]
            b = mp.parse_bytes(budget)
            assert need[0] <= b, (budget, method, n)
            assert need[1] > b or n == 10_000, (budget, method, n)
    assert mp.plan_batch_size(s, 64, "100GB", max_batch=7) == 7


def test_budget_too_small_for_one_row_names_budget_and_need():
    s = mp.shape_of(causal_lm("llama"))
    need = mp.peak_bytes(s, batch=1, length=40, answer_length=8)
    with pytest.raises(MemoryBudgetError) as err:
        mp.plan_batch_size(s, [40], need - 1, answer_length=8)
    msg = str(err.value)
    assert f"{need / 2**30:.2f} GiB" in msg and f"{(need - 1) / 2**30:.2f} GiB" in msg
    assert "budget" in msg
    assert mp.plan_batch_size(s, [40], need, answer_length=8) >= 1


@pytest.mark.parametrize("text,value", [
    ("8GB", 8 * 10**9), ("512MiB", 512 * 2**20), ("1.5 GiB", int(1.5 * 2**30)),
    ("800m", 800 * 2**20), ("2G", 2 * 2**30), ("100", 100), ("4kb", 4000), (12345, 12345),
    ("1TiB", 2**40)])
def test_parse_bytes(text, value):
    assert mp.parse_bytes(text) == value


@pytest.mark.parametrize("text", ["", "GB", "8 bananas", "-1GB", "0", "0.1B", "8 G B", 0, "nan"])
def test_parse_bytes_rejects_with_a_clear_message(text):
    with pytest.raises(InputError, match="memory size"):
        mp.parse_bytes(text)


def test_bad_arguments_are_input_errors():
    s = mp.shape_of(causal_lm("llama"))
    with pytest.raises(InputError, match="method"):
        mp.peak_bytes(s, batch=1, length=10, answer_length=2, method="nope")
    # the engines' names (isouq.engines), older names resolved: per_token holds what ghost holds
    assert mp.peak_bytes(s, batch=2, length=10, answer_length=3, method="per_token") == \
        mp.peak_bytes(s, batch=2, length=10, answer_length=3, method="ghost")
    assert mp.peak_bytes(s, batch=2, length=10, answer_length=3, method="loop") == \
        mp.peak_bytes(s, batch=2, length=10, answer_length=3, method="per_example")
    with pytest.raises(InputError, match="batch"):
        mp.peak_bytes(s, batch=0, length=10, answer_length=2)
    with pytest.raises(InputError, match="answer_length"):
        mp.peak_bytes(s, batch=1, length=10, answer_length=0)
    with pytest.raises(InputError, match="length=1"):
        mp.peak_bytes(s, batch=1, length=1, answer_length=1)
    # an answer as long as the row (empty prompt): its first token is never predicted
    assert mp.peak_bytes(s, batch=2, length=10, answer_length=10) == mp.peak_bytes(
        s, batch=2, length=10, answer_length=9)
    with pytest.raises(InputError, match="row length"):
        mp.plan_batch_size(s, [], "1GB")
    with pytest.raises(InputError, match="memory size"):
        mp.plan_batch_size(s, [10], "lots")


@pytest.mark.slow
def test_prediction_matches_a_measured_peak_in_a_fresh_process():
    """benchmarks/memory_plan.py's child on its tiny Llama: peak RSS of one ghost batch."""
    cmd = [sys.executable, str(ROOT / "benchmarks" / "memory_plan.py"), "--child",
           "--model", "tiny-llama", "--n", "8", "--length", "256", "--method", "ghost"]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True,
                         env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"})
    measured = json.loads(out.stdout.strip().splitlines()[-1])["measured"]
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        from memory_plan import tiny_llama
    finally:
        sys.path.pop(0)
    est = mp.estimate(tiny_llama(), batch=8, length=256, answer_length=16)
    assert 0.7 < est.working / measured < 1.4


def test_the_plan_reads_what_the_linear_rule_keeps_from_its_registration():
    """A Linear rule registered as reading its layer's output makes the engine keep every
    Linear output until the backward; the plan counts them from that registration alone
    (q, o, down of width d and k, v of width d_kv per token and layer)."""
    from torch import nn

    from isouq.ghost import registry
    from isouq.ghost.registry import register_rule, rule_for

    cfg = mp.Shape(hidden=64, kv_hidden=32, intermediate=128, layers=3, heads=4, vocab=100,
                   tied=False, param_bytes=4 * 10_000, dtype=torch.float32)
    before = mp.estimate(cfg, batch=4, length=32, answer_length=8, dtype=torch.float32)
    original = rule_for(nn.Linear(1, 1))
    try:
        register_rule(nn.Linear, uses_output=True)(original.contributions)
        after = mp.estimate(cfg, batch=4, length=32, answer_length=8, dtype=torch.float32)
    finally:
        registry._BY_TYPE[nn.Linear] = original
    tok = 4 * 32
    kept = 3 * (3 * 64 + 2 * 32) * tok * 4  # bytes, counted; the fitted factor applies
    assert after.activations - before.activations == pytest.approx(
        mp.CALIBRATION["activations"] * kept, abs=1)
