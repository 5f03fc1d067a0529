"""isouq's ghost norms against Opacus's ghost clipping on an untied causal LM: the same
per-example ‖∇θ p̄ᵢ‖² from a peer library's independent implementation."""

import pytest
import torch

from isouq import GhostNorms


def test_ghost_norms_match_opacus_ghost_clipping_on_an_untied_lm():
    pytest.importorskip("opacus")
    tf = pytest.importorskip("transformers")
    from opacus.grad_sample import GradSampleModuleFastGradientClipping

    torch.manual_seed(0)
    cfg = tf.GPTNeoXConfig(vocab_size=97, hidden_size=32, num_hidden_layers=2,
                           num_attention_heads=4, intermediate_size=64,
                           max_position_embeddings=16, tie_word_embeddings=False,
                           attention_dropout=0.0, hidden_dropout=0.0, use_cache=False)
    model = tf.GPTNeoXForCausalLM(cfg)
    ids = torch.randint(0, 97, (5, 12), generator=torch.Generator().manual_seed(1),
                        device="cpu").to(torch.get_default_device())

    def p_bar(logits):  # (B,) mean probability of the last 4 tokens
        lp = torch.log_softmax(logits[:, -5:-1], dim=-1)
        return lp.gather(-1, ids[:, -4:, None])[..., 0].exp().mean(dim=1)

    with GhostNorms(model.eval(), dict(model.named_parameters())) as ghost:
        ours = ghost.backward(p_bar(model(ids).logits))
    gsm = GradSampleModuleFastGradientClipping(model.train(), batch_first=True,
                                               loss_reduction="sum", strict=False,
                                               use_ghost_clipping=True)
    p_bar(gsm(ids).logits).sum().backward()
    theirs = gsm.get_norm_sample() ** 2
    torch.testing.assert_close(ours, theirs.detach(), rtol=1e-4, atol=0)
    assert bool((ours > 0).all())
