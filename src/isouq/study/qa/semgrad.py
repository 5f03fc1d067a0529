"""SemGrad, HybridGrad and the lm_head-gradient baseline (Li et al., ICML 2026, arXiv 2605.04638;
code github.com/mingdali6717/SemGrad, ``run_gradient.py`` and ``gradient/utils.py``).

Their critique of parameter-gradient scores: for free-form answers the gradient does not vanish
at the optimum (several answers are valid), so ‖∇θ‖ mixes task randomness with model ignorance;
they take gradients with respect to hidden states that carry the input's meaning instead.

As their code computes it, for a prompt x and answer y = (y₁..y_T):

- loss L = (1/T) Σₜ −Hₜ log p(yₜ | y<ₜ, x), Hₜ = entropy (nats) of the model's next-token
  distribution at answer position t, held constant (their ``loss_function`` with
  ``entropy_weight=True``, ``loss_name="CE"``);
- SemGrad = mean |∂L/∂h| over the hidden states h of one prompt token and the last ⌊(n+1)/2⌋…
  layers: of the ``output_hidden_states`` tuple (embeddings, then each layer; n + 1 entries for
  n layers) the last entry (after the final norm) is dropped and the last ⌊n/2⌋ of the others
  are kept; the token is the one their Semantic Preservation Score picks per model, given as an
  offset from the end of the prompt (``IMPORTANCE_TOKEN``: −3 for Qwen2.5/Qwen3 chat prompts,
  the ``<|im_start|>`` that opens the assistant turn; −4 for Llama 3). Our models had no SPS
  run: ChatML prompts (SmolLM2, Qwen2.5-Coder) take −3 as their Qwen models do, and a plain
  prompt (Gemma 3 base) takes −1, its last token (our choice, documented).
- lm_head baseline ("exgrad_weight" in their code) = mean |∂L/∂W_out| over the output matrix,
  the gradient of its use as the output layer only (for a tied embedding: not its input use);
- HybridGrad = α·lm_head + (1 − α)·SemGrad with α = exp(−mean over t of Hₜ).

All three are uncertainties (higher = less trustworthy), in units of the loss per entry.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

import torch

from ...errors import InputError
from ...llm.prompts import encode_prompt


@dataclass
class SemGradScores:
    """semgrad, lm_head, hybrid (uncertainties), mean_entropy (nats), token_offset used."""

    semgrad: float
    lm_head: float
    hybrid: float
    mean_entropy: float
    token_offset: int

    def to_dict(self) -> dict:
        return asdict(self)


def default_token_offset(tokenizer) -> int:
    """−3 for ChatML chat templates (their Qwen setting), −1 otherwise (see module doc)."""
    template = getattr(tokenizer, "chat_template", None) or ""
    return -3 if "<|im_start|>" in str(template) else -1


def _output_layer(model):
    head = model.get_output_embeddings()
    if head is None or not hasattr(head, "weight"):
        raise InputError("the model has no output layer (get_output_embeddings); SemGrad needs "
                         "a causal LM with an lm_head")
    return head


def semgrad_scores(model, tokenizer, prompt: str, answer: str | Sequence[int], *,
                   token_offset: int | None = None) -> SemGradScores:
    """SemGrad, the lm_head baseline and HybridGrad of one answer (one forward, one backward).

    Args:
        model: a Hugging Face causal LM (any device); its weights are not changed.
        tokenizer: its tokenizer.
        prompt: the prompt text (``encode_prompt``: BOS once).
        answer: the answer text (no special tokens) or its token ids.
        token_offset: prompt token whose hidden states are differentiated, counted from the
            prompt's end (−1 = last); default ``default_token_offset(tokenizer)``.

    Returns:
        SemGradScores (floats).
    """
    p_ids = encode_prompt(tokenizer, prompt)
    a_ids = (list(tokenizer(answer, add_special_tokens=False)["input_ids"])
             if isinstance(answer, str) else [int(t) for t in answer])
    if not a_ids:
        raise InputError("the answer is empty (no tokens)")
    off = default_token_offset(tokenizer) if token_offset is None else int(token_offset)
    if not -len(p_ids) <= off <= -1:
        raise InputError(f"token_offset={off} is outside the prompt's {len(p_ids)} tokens")
    P, T = len(p_ids), len(a_ids)
    dev = model.get_input_embeddings().weight.device
    ids = torch.tensor([p_ids + a_ids], device=dev)
    head = _output_layer(model)
    saved = [(q, q.requires_grad) for q in model.parameters()]
    captured: dict = {}

    def grab(_mod, inputs, _out):  # the output layer's input: the final hidden states
        captured["h"] = inputs[0]

    hook = head.register_forward_hook(grab)
    try:
        for q, _ in saved:
            q.requires_grad_(False)
        with torch.enable_grad():
            emb = model.get_input_embeddings()(ids).detach().requires_grad_(True)
            out = model(inputs_embeds=emb, output_hidden_states=True)
            hs = out.hidden_states
            logits = out.logits[0, P - 1 : P - 1 + T]  # predict the answer tokens
            logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
            logp = torch.log_softmax(logits, -1)
            ent = -(logp.exp() * logp).sum(-1).detach()  # (T,) nats, constant weights
            target = ids[0, P:]
            loss = (-ent * logp.gather(1, target[:, None])[:, 0]).mean()
            dlogits = torch.autograd.grad(loss, out.logits, retain_graph=True)[0][0]
            grads = torch.autograd.grad(loss, list(hs))
    finally:
        hook.remove()
        for q, flag in saved:
            q.requires_grad_(flag)
    n = len(hs) - 1
    kept = torch.stack([g[0, P + off] for g in grads[:-1]])[-(n // 2):]  # (⌊n/2⌋, d)
    semgrad = float(kept.abs().double().mean())
    # lm_head use only: ∂L/∂W = Σ_positions dlogits_jᵀ h_j (rows with non-zero dlogits)
    h = captured["h"][0].detach().double()
    d = dlogits.double()
    rows = d.abs().sum(1) > 0
    d, h = d[rows], h[rows]
    total = 0.0
    for s in range(0, d.shape[1], 16384):  # (V, d_model) in slices of the vocabulary
        total += float((d[:, s : s + 16384].T @ h).abs().sum())
    lm_head = total / (d.shape[1] * h.shape[1])
    mean_ent = float(ent.mean())
    alpha = float(torch.exp(-ent.mean()))
    return SemGradScores(semgrad, lm_head, alpha * lm_head + (1 - alpha) * semgrad, mean_ent, off)
