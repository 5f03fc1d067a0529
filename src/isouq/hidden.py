"""The answer's mean hidden states: what the hidden-state probe reads (``isouq.probe``,
``isouq calibrate --features ... hidden``).

For each (prompt, answer) pair, the model's hidden states (Hugging Face ``hidden_states``: index
0 the token embeddings, k the output of decoder layer k, -1 the final-norm output) averaged over
the positions the model reads: the prompt and the answer but its last token, the way
LM-Polygraph averages its ``embeddings_decoder``; at the probe's depths (:func:`probe_layers`: a
quarter, half and three quarters of the way up, and the final-norm output). One forward pass
without gradients per batch, beside the scores' own pass.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import nn

from .errors import InputError, ModelError
from .estimators import eval_mode
from .tokens import Encoded

#: the fractions of the decoder's depth the probe may read, besides its final-norm output
DEPTHS: tuple[float, ...] = (0.25, 0.5, 0.75)


def probe_layers(n_layers: int) -> list[int]:
    """The ``hidden_states`` indices the probe chooses among for a model of ``n_layers`` decoder
    layers: a quarter, half and three quarters of the way up, and -1, the final-norm output.
    SAPLMA (Azaria & Mitchell 2023) found a middle layer's state the most telling."""
    return [*dict.fromkeys(max(1, round(n_layers * f)) for f in DEPTHS), -1]


def state_name(index: int) -> str:
    """The name of the state at ``hidden_states[index]`` in rows and calibrations."""
    return f"hidden_states[{index}]"


def model_states(model: nn.Module, token: int = 0) -> dict[str, int]:
    """The states :func:`mean_hidden_states` gives for this model, {state name: width}, from a
    forward of one token (to check a calibration's probe before heavy work)."""
    return {name: X.shape[1] for name, X in mean_hidden_states(
        model, [Encoded(prompt=[token], answer=[token])], pad=token).items()}


def mean_hidden_states(model: nn.Module, enc: Sequence[Encoded], *, pad: int,
                       batch_size: int = 8, layers: Sequence[int] | None = None
                       ) -> dict[str, np.ndarray]:
    """Each pair's mean hidden state at a few depths.

    Args:
        model: a Hugging Face causal LM (its forward returns ``hidden_states``).
        enc: the pairs' token ids (``isouq.prepare``), each with a prompt.
        pad: the padding id (masked out).
        batch_size: pairs per forward.
        layers: ``hidden_states`` indices; default :func:`probe_layers` of the model's depth.

    Returns:
        :func:`state_name` -> (N, d) float32 array, in ``layers`` order.

    Raises:
        InputError: a pair without prompt tokens, or ``batch_size`` < 1.
        ModelError: the model's forward returns no hidden states.
    """
    if batch_size < 1:
        raise InputError(f"batch_size={batch_size}; use 1 or more")
    seqs = [list(e.prompt) + list(e.answer)[:-1] for e in enc]
    if any(not e.prompt for e in enc):
        raise InputError("a pair without prompt tokens has no state to average before its "
                         "answer; give each answer its prompt")
    from .passes import input_device

    device = input_device(model)
    out: dict[str, list[np.ndarray]] = {}
    with torch.no_grad(), eval_mode(model):
        for start in range(0, len(seqs), batch_size):
            chunk = seqs[start:start + batch_size]
            width = max(len(s) for s in chunk)
            ids = torch.full((len(chunk), width), pad, dtype=torch.long)
            mask = torch.zeros((len(chunk), width), dtype=torch.long)
            for i, s in enumerate(chunk):
                ids[i, :len(s)] = torch.tensor(s)
                mask[i, :len(s)] = 1
            res = model(input_ids=ids.to(device), attention_mask=mask.to(device),
                        output_hidden_states=True, use_cache=False)
            states = getattr(res, "hidden_states", None)
            if not states:
                raise ModelError(f"{type(model).__name__} returns no hidden_states; the "
                                 "hidden-state probe needs a Hugging Face causal LM")
            picked = probe_layers(len(states) - 1) if layers is None else list(layers)
            m = mask.to(states[0].device, states[0].dtype).unsqueeze(-1)
            for k in picked:
                mean = (states[k] * m).sum(1) / m.sum(1)
                out.setdefault(state_name(k), []).append(mean.float().cpu().numpy())
    return {name: np.concatenate(parts) for name, parts in out.items()}


__all__ = ["DEPTHS", "mean_hidden_states", "model_states", "probe_layers", "state_name"]
