"""One backward's norms reduced in batches (ghost/reduction.py): exact against brute-force
per-example autograd and the per-parameter path, whatever the buffers' size (a cap that makes
them flush at every piece, or too small to hold one), with groups, on tiny models in float64."""

from __future__ import annotations

import pytest
import torch

import tiny
from brute import brute
from isouq.ghost import factors, reduction
from isouq.ghost.engine import GhostNorms

N, T = 4, 10


def s_of(logits: torch.Tensor) -> torch.Tensor:
    return torch.softmax(logits, -1)[:, :, 5].mean(1)


def logits(m, ids: torch.Tensor) -> torch.Tensor:
    """The logits, position ids given per example (GPT-2's position embedding would see one
    row broadcast across the batch)."""
    pos = torch.arange(ids.shape[1]).expand(ids.shape[0], -1)
    return m(input_ids=ids, position_ids=pos).logits


def model_of(family: str):
    """The model in float64 after one ghost backward (the norm layers' first call)."""
    m = tiny.causal_lm(family).double()
    with GhostNorms(m, dict(m.named_parameters()), warn=False) as ghost:
        ghost.backward(s_of(logits(m, torch.randint(4, tiny.VOCAB, (2, 3)))))
    return m


def reference(m, ids) -> torch.Tensor:
    return brute(m, dict(m.named_parameters()),
                 lambda i: s_of(logits(m, ids[i:i + 1]))[0], ids.shape[0])


@pytest.fixture
def written(monkeypatch):
    """Which of the reduction's ways each backward took: Gram slots, materialized columns,
    kept gradients, flushes."""
    seen: dict[str, int] = {}

    def spy(name):
        method = getattr(reduction.Reduction, name)

        def counted(self, *a, **k):
            seen[name] = seen.get(name, 0) + 1
            return method(self, *a, **k)

        monkeypatch.setattr(reduction.Reduction, name, counted)

    for name in ("gram", "block", "materialized", "_flush_slots", "_flush_columns",
                 "_flush_deferred"):
        spy(name)
    return seen


@pytest.mark.parametrize("family", ["llama", "llama-tied", "gpt2", "qwen2"])
@pytest.mark.parametrize("cap", [None, 1, 3000])
def test_the_batched_total_is_exact_whatever_the_buffers(family, cap, monkeypatch, written):
    """cap None: the default buffers (one reduction at the end); 1 byte: one Gram slot, no
    column buffer (each piece reduced at once); 3000 bytes: a few pieces per buffer, flushed
    when full."""
    if cap is not None:
        monkeypatch.setattr(factors, "REDUCTION_BYTES", cap)
    m = model_of(family)
    ids = torch.randint(4, tiny.VOCAB, (N, T))
    ref = reference(m, ids)
    with GhostNorms(m, dict(m.named_parameters()), warn=False) as ghost:
        total = ghost.backward(s_of(logits(m, ids)))
    torch.testing.assert_close(total, ref.sum(1), rtol=1e-10, atol=1e-14)
    assert written.get("gram", 0) + written.get("block", 0) > 0  # the reduction ran
    if cap == 3000:
        assert written.get("_flush_slots", 0) + written.get("_flush_columns", 0) > 2  # when full


@pytest.mark.parametrize("cap", [None, 3000])
def test_groups_are_summed_apart(cap, monkeypatch):
    """With groups (e.g. blocks) each group's total is its parameters' sum, from the batched
    reduction, equal to the per-parameter path's."""
    if cap is not None:
        monkeypatch.setattr(factors, "REDUCTION_BYTES", cap)
    m = model_of("llama")
    names = [n for n, _ in m.named_parameters()]
    groups = tuple(1 if ".layers.0." in n else 2 if ".layers.1." in n else 0 for n in names)
    ids = torch.randint(4, tiny.VOCAB, (N, T))
    ref = reference(m, ids)
    want = torch.zeros(N, 3, dtype=ref.dtype).index_add_(1, torch.tensor(groups), ref)
    with GhostNorms(m, dict(m.named_parameters()), warn=False) as ghost:
        res = ghost.backward_detailed(s_of(logits(m, ids)), per_param=False,
                                      groups=groups)
    torch.testing.assert_close(res.per_group, want, rtol=1e-10, atol=1e-14)
    torch.testing.assert_close(res.total, ref.sum(1), rtol=1e-10, atol=1e-14)


def test_norm_layers_are_kept_and_scaled_once(monkeypatch):
    """A norm layer's per-example gradient comes as (Σₜ bₜ ⊙ yₜ, 1/w) and is scaled with the
    others at the end, in one product; the total stays exact."""
    m = model_of("llama")
    ids = torch.randint(4, tiny.VOCAB, (N, T))
    ref = reference(m, ids)
    scaled, flushes = [], []
    materialized, flush = reduction.Reduction.materialized, reduction.Reduction._flush_deferred
    monkeypatch.setattr(reduction.Reduction, "materialized", lambda self, g, group=None: (
        scaled.append(g.scale is not None), materialized(self, g, group))[1])
    monkeypatch.setattr(reduction.Reduction, "_flush_deferred", lambda self: (
        flushes.append(len(self._scaled)), flush(self))[1])
    with GhostNorms(m, dict(m.named_parameters()), warn=False) as ghost:
        total = ghost.backward(s_of(logits(m, ids)))
    torch.testing.assert_close(total, ref.sum(1), rtol=1e-10, atol=1e-14)
    assert scaled == [True] * 5  # 2 norms in each of 2 layers, and the final one
    assert flushes == [5]  # all five scaled together
