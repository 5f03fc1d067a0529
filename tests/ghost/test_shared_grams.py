"""Layers that read one input share its Gram (ghost/shared.py): exact against the per-parameter
path and against brute-force per-example autograd, on tiny Llamas in float64 (untied, tied
embeddings, a LoRA adapter, a parameter set without k_proj)."""

from __future__ import annotations

import pytest
import torch

import tiny
from brute import brute
from isouq.ghost import factors, shared
from isouq.ghost.engine import GhostNorms
from isouq.ghost.factors import Pair

N, T = 4, 10  # at T = 10 the group rule takes q/k/v's Gram form, the per-parameter rule not


def s_of(logits: torch.Tensor) -> torch.Tensor:
    """A per-example scalar reading every position: the mean probability of token 5."""
    return torch.softmax(logits, -1)[:, :, 5].mean(1)


def lora(model):
    peft = pytest.importorskip("peft")
    cfg = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "k_proj", "v_proj"],
                          lora_dropout=0.0, init_lora_weights=False)
    torch.manual_seed(1)
    return peft.get_peft_model(model, cfg).eval()


def model_of(kind: str):
    """The model, after one ghost backward: a norm layer's first call picks its formula by
    comparing the fused x̂ (float64 here) with the module's own forward, which Hugging Face
    runs in float32 (1e-7 apart); later calls read its output, exact to float64."""
    m = tiny.causal_lm("llama-tied" if kind == "tied" else "llama").double()
    m = lora(m) if kind == "lora" else m
    run(m, dict(m.named_parameters()), torch.randint(4, tiny.VOCAB, (2, 3)), share=False,
        detailed=False)
    return m


def params_of(m, kind: str) -> dict:
    ps = dict(m.named_parameters())
    if kind == "no_k_proj":  # sharing groups must respect the set: k_proj is not hooked
        ps = {n: p for n, p in ps.items() if "k_proj" not in n}
    return ps


def run(m, params, ids, *, share: bool, detailed: bool):
    with GhostNorms(m, params, warn=False, share_grams=share) as ghost:
        s = s_of(m(input_ids=ids).logits)
        return ghost.backward_detailed(s) if detailed else ghost.backward(s)


def reference(m, params, ids) -> torch.Tensor:
    """(N, n) per-parameter ‖∇θ sᵢ‖², one autograd backward per example."""
    for p in m.parameters():
        p.requires_grad_(True)  # PEFT freezes the base weights; brute force differentiates all
    return brute(m, params, lambda i: s_of(m(input_ids=ids[i:i + 1]).logits)[0], ids.shape[0])


@pytest.fixture
def groups(monkeypatch):
    """The names in each group computed, with the plan its members got."""
    seen: list[tuple[list[str], list[bool]]] = []
    finish, plan = shared.SharedInputs._finish, shared.gram_plan

    def spy_finish(self, group):
        seen.append(([n for n, _ in group.members], []))
        return finish(self, group)

    def spy_plan(pairs):
        flags = plan(pairs)
        seen[-1][1].extend(flags)
        return flags

    monkeypatch.setattr(shared.SharedInputs, "_finish", spy_finish)
    monkeypatch.setattr(shared, "gram_plan", spy_plan)
    return seen


@pytest.mark.parametrize("kind", ["untied", "tied", "lora", "no_k_proj"])
def test_shared_grams_equal_the_unshared_path_and_brute_force(kind, groups):
    m = model_of(kind)
    params = params_of(m, kind)
    torch.manual_seed(2)
    ids = torch.randint(4, tiny.VOCAB, (N, T))
    ref = reference(m, params, ids)
    total = run(m, params, ids, share=True, detailed=False)  # one inner product per group
    detailed = run(m, params, ids, share=True, detailed=True)  # one per parameter
    assert groups, "no group was formed"
    unshared = run(m, params, ids, share=False, detailed=False)
    torch.testing.assert_close(detailed.per_param, ref, rtol=1e-10, atol=1e-14)
    torch.testing.assert_close(total, ref.sum(1), rtol=1e-10, atol=1e-14)
    torch.testing.assert_close(unshared, total, rtol=1e-10, atol=1e-14)

    names = [set(n) for n, _ in groups]
    def weight(g, proj):  # the layer's own weight (a LoRA layer's base layer)
        return any(n.endswith((f"{proj}.weight", f"{proj}.base_layer.weight")) for n in g)

    qkv = [g for g in names if weight(g, "q_proj")]
    mlp = [g for g in names if weight(g, "gate_proj")]
    assert len(qkv) == 2 * 2 and len(mlp) == 2 * 2  # two layers, shared and detailed runs
    for g in qkv:
        assert weight(g, "v_proj")
        assert weight(g, "k_proj") == (kind != "no_k_proj")
        if kind == "lora":  # the base layer and the adapter's A read the same input
            assert any("lora_A" in n for n in g) and any("base_layer" in n for n in g)
    assert all(weight(g, "up_proj") for g in mlp)
    # the shared Gram form was taken by groups of several members
    assert any(len(n) > 1 and sum(f) > 1 for n, f in groups)
    assert not any("embed_tokens" in n or "lm_head" in n for g in names for n in g) \
        or kind != "tied"  # tied weights keep their cross terms (sq_norms), outside any group


@pytest.mark.parametrize("flags", ["all_gram", "all_materialize", "mixed"])
def test_every_plan_of_a_group_is_exact(flags, monkeypatch):
    """Whatever the plan, members that materialize and members in the shared Gram give the
    brute-force norms (the total one product, per parameter one each)."""
    def plan(pairs):
        if flags == "mixed":
            return [k % 2 == 0 for k in range(len(pairs))]
        return [flags == "all_gram"] * len(pairs)

    monkeypatch.setattr(shared, "gram_plan", plan)
    m = model_of("untied")
    params = params_of(m, "untied")
    ids = torch.randint(4, tiny.VOCAB, (N, 7))
    ref = reference(m, params, ids)
    torch.testing.assert_close(run(m, params, ids, share=True, detailed=True).per_param, ref,
                               rtol=1e-10, atol=1e-14)
    torch.testing.assert_close(run(m, params, ids, share=True, detailed=False), ref.sum(1),
                               rtol=1e-10, atol=1e-14)


@pytest.mark.parametrize("blocks", [2, 3])
def test_symmetric_block_grams_are_exact(blocks, monkeypatch):
    """Each symmetric Gram from the blocks on and above its diagonal (T = 10 in 2 or 3 blocks
    of unequal sizes), per parameter and summed, against brute force."""
    monkeypatch.setattr(factors, "GRAM_BLOCKS", blocks)
    m = model_of("untied")
    params = params_of(m, "untied")
    ids = torch.randint(4, tiny.VOCAB, (N, T))
    ref = reference(m, params, ids)
    torch.testing.assert_close(run(m, params, ids, share=True, detailed=True).per_param, ref,
                               rtol=1e-10, atol=1e-14)
    torch.testing.assert_close(run(m, params, ids, share=True, detailed=False), ref.sum(1),
                               rtol=1e-10, atol=1e-14)


def test_block_gram_inner_is_the_whole_grams_inner_product():
    x, y = torch.randn(3, 7, 5, dtype=torch.float64), torch.randn(3, 7, 2, dtype=torch.float64)
    whole = factors.gram_inner(x @ x.transpose(1, 2), y @ y.transpose(1, 2))
    for k in range(1, 8):
        xs, ys = factors.block_gram(x, k), factors.block_gram(y, k)
        assert len(xs) == k * (k + 1) // 2
        torch.testing.assert_close(factors.block_gram_inner(xs, ys, k), whole)


def test_groups_are_released_in_the_backward_not_kept_to_its_end():
    """With sharing, no input (nor its Gram) is cached to the end of the backward: each group
    is computed and dropped once its last member's gradient arrived; the unshared path caches
    the inputs of its Gram-form layers."""
    m = model_of("untied")
    params = params_of(m, "untied")
    ids = torch.randint(4, tiny.VOCAB, (N, 6))
    held = {}
    for share in (True, False):
        with GhostNorms(m, params, warn=False, share_grams=share) as ghost:
            norms = ghost._norms

            def at_end(*a, share=share, ghost=ghost, norms=norms, **kw):
                held[share] = (len(ghost._cache),
                               0 if ghost._shared is None else len(ghost._shared._groups))
                return norms(*a, **kw)

            ghost._norms = at_end
            ghost.backward(s_of(m(input_ids=ids).logits))
    assert held[True] == (0, 0)
    assert held[False][0] > 0


def test_the_switch_turns_sharing_off(monkeypatch):
    m = model_of("untied")
    params = params_of(m, "untied")
    monkeypatch.setenv("ISOUQ_GHOST_SHARE_GRAMS", "0")
    assert not GhostNorms(m, params).share_grams
    assert GhostNorms(m, params, share_grams=True).share_grams
    monkeypatch.delenv("ISOUQ_GHOST_SHARE_GRAMS")
    assert GhostNorms(m, params).share_grams


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_shared_equals_unshared(dtype):
    """Half-precision factors: both paths multiply them into float32 (``bmm_f32``)."""
    m = tiny.causal_lm("llama").to(dtype)
    params = dict(m.named_parameters())
    ids = torch.randint(4, tiny.VOCAB, (N, T))
    a = run(m, params, ids, share=True, detailed=False)
    b = run(m, params, ids, share=False, detailed=False)
    assert a.dtype == torch.float32
    torch.testing.assert_close(a, b, rtol=1e-4, atol=0)


def pair(N, T, w, d):
    return Pair(torch.randn(N, T, w), torch.randn(N, T, d))


def test_the_group_plan():
    # one member: exactly the per-parameter rule, at both ends of T
    for t in (4, 512):
        p = [pair(2, t, 64, 64)]
        assert shared.gram_plan(p) == [factors.choose_gram(p)]
    # q/k/v of a 16-wide model at T = 10: alone each materializes; the group takes the Gram
    A = torch.randn(2, 10, 16)
    qkv = [Pair(torch.randn(2, 10, w), A) for w in (16, 8, 8)]
    assert not any(factors.choose_gram([p]) for p in qkv)
    assert shared.gram_plan(qkv) == [True, True, True]
    # at T = 12 the group costs more in Gram form (48 T² > 512 T + 512): every member materializes
    A = torch.randn(2, 12, 16)
    assert shared.gram_plan([Pair(torch.randn(2, 12, w), A) for w in (16, 8, 8)]) == [False] * 3
    # a member whose own side favours materializing (T > d) stays out of a Gram group
    A = torch.randn(1, 40, 32)
    big = Pair(torch.randn(1, 40, 4096), A)  # 4096·32 per block: far cheaper to materialize
    wide = [big, Pair(torch.randn(1, 40, 4096), A)]
    assert shared.gram_plan(wide) == [False, False]


def test_a_member_over_the_memory_cap_forces_the_gram_form(monkeypatch):
    monkeypatch.setattr(factors, "MATERIALIZE_BYTES", 1000)
    A = torch.randn(2, 40, 32)
    pairs = [Pair(torch.randn(2, 40, 16), A), Pair(torch.randn(2, 40, 8), A)]
    assert shared.gram_plan(pairs) == [True, True]


@pytest.mark.parametrize("kind", ["untied", "lora", "no_k_proj"])
@pytest.mark.parametrize("blocks", [1, 2])
def test_summed_gram_of_the_gradients_side_by_side_is_exact(kind, blocks, monkeypatch):
    """The path CUDA takes for a group's total (``CONCAT_DEVICES``): Σₚ Bₚ Bₚᵀ as one product
    of [B₁ … Bₘ], forced on the CPU, against brute force (also from Gram blocks); the Grams it
    forms are of wider factors than the separate path's (the gradients side by side)."""
    monkeypatch.setattr(factors, "GRAM_BLOCKS", blocks)
    m = model_of(kind)
    params = params_of(m, kind)
    ids = torch.randint(4, tiny.VOCAB, (N, T))
    ref = reference(m, params, ids)
    widths = {}
    product = factors.f32_product  # every Gram's product (block_gram's and the reduction's)
    for devices in (set(), {"cpu", "cuda"}):
        monkeypatch.setattr(shared, "CONCAT_DEVICES", devices)
        seen = widths.setdefault(bool(devices), set())
        monkeypatch.setattr(factors, "f32_product", lambda x, y, out=None, seen=seen: seen.add(
            x.shape[-1]) or product(x, y, out=out))
        torch.testing.assert_close(run(m, params, ids, share=True, detailed=False), ref.sum(1),
                                   rtol=1e-10, atol=1e-14)
    assert widths[True] - widths[False]
