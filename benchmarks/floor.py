"""The floor of every per-example gradient method: a forward and a backward of the same scalar
with every weight frozen, so that autograd computes activation gradients only."""

from __future__ import annotations

from contextlib import contextmanager


@contextmanager
def activation_gradients_only(model):
    """Within it, ``model``'s weights are frozen and its input embeddings' output requires grad
    (the graph starts there, as in the ghost engine); restored on exit."""
    flags = [(p, p.requires_grad) for p in model.parameters()]
    for p, _ in flags:
        p.requires_grad_(False)
    hook = model.get_input_embeddings().register_forward_hook(
        lambda m, i, o: o.detach().requires_grad_(True))
    try:
        yield
    finally:
        hook.remove()
        for p, f in flags:
            p.requires_grad_(f)


def floor_and_ghost(model, tok, prompts, answers):
    """({"floor": f, "ghost": g}, the padded batch): f and g each run once on the whole batch
    of (prompt, answer) pairs, from the same pairs encoded once, here: the floor on their padded
    batch, ghost as ``score_sequences(..., encoded=...)`` on those token ids (so neither side
    tokenizes inside the timed call). Uses only what every version of ``isouq`` has
    (``benchmarks/score_sequences_ab.py`` runs it against earlier ones): a version without
    ``encoded=`` encodes the pairs itself."""
    import inspect

    from isouq.sequences import collate, encode, score_sequences, summarize, token_probs

    enc = encode(tok, prompts, answers)
    b = collate(enc, tok.pad_token_id or 0)
    given = ({"encoded": enc} if "encoded" in inspect.signature(score_sequences).parameters
             else {})

    def floor():
        with activation_gradients_only(model):
            p, mask = token_probs(model, b)
            summarize(p, mask)[0].sum().backward()

    def ghost():
        score_sequences(model, tok, prompts, answers, method="ghost", batch_size=len(prompts),
                        **given)

    return {"floor": floor, "ghost": ghost}, b
