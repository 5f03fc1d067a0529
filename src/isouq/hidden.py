"""The answer's mean hidden states: what the hidden-state probe reads (``isouq.probe``,
``isouq calibrate --features ... hidden``).

For each (prompt, answer) pair, the model's hidden states (Hugging Face ``hidden_states``: index
0 the token embeddings, k the output of decoder layer k, -1 the final-norm output) averaged over
the positions the model reads: the prompt and the answer but its last token, the way
LM-Polygraph averages its ``embeddings_decoder``; at the probe's depths (:func:`probe_layers`: a
quarter, half and three quarters of the way up, and the final-norm output).

``score_sequences(hidden=True)`` takes them from the scores' own forward
(:class:`StatesOfForward`): no second pass. :func:`mean_hidden_states` runs a forward of its own
without gradients (for span scores, whose forwards are of truncated rows, and for callers with
no scores to compute); where the model's forward takes ``logits_to_keep``, its head then
computes the logits of one position only.
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


def state_means(hidden_states: Sequence[torch.Tensor], keep: torch.Tensor,
                layers: Sequence[int] | None = None) -> dict[str, np.ndarray]:
    """Each row's mean hidden state over the positions ``keep`` marks, at ``layers``.

    Args:
        hidden_states: the model's ``hidden_states`` of one forward, each (N, L, d).
        keep: (N, L) 1 (or True) at the positions to average.
        layers: ``hidden_states`` indices; default :func:`probe_layers` of the model's depth.

    Returns:
        :func:`state_name` -> (N, d) float32 array, in ``layers`` order.
    """
    picked = probe_layers(len(hidden_states) - 1) if layers is None else list(layers)
    m = keep.to(hidden_states[0].device, hidden_states[0].dtype).unsqueeze(-1)
    with torch.no_grad():
        return {state_name(k): ((hidden_states[k] * m).sum(1) / m.sum(1)).float().cpu().numpy()
                for k in picked}


class StatesOfForward:
    """Collects each answer's mean hidden states from the scores' own forward (``isouq.passes.
    score_encoded(on_states=...)``): the positions of the prompt and the answer but its last
    token (the input's last real token), as :func:`mean_hidden_states` averages them, without a
    second forward.

    Args:
        n: the number of answers scored.
    """

    def __init__(self, n: int):
        self.n = n
        self.parts: dict[int, dict[str, np.ndarray]] = {}

    def __call__(self, hidden_states: Sequence[torch.Tensor], batch, rows: slice) -> None:
        """Average one batch's states (``batch.attention_mask``: (N, L), the batch's rows
        ``rows``)."""
        keep = batch.attention_mask.clone()
        last = keep.cumsum(1).argmax(1)  # the last real position of each row, either padding
        keep[torch.arange(keep.shape[0]), last] = 0
        self.parts[rows.start] = state_means(hidden_states, keep)

    def result(self) -> dict[str, np.ndarray]:
        """:func:`state_name` -> (n, d) float32 array, in the answers' order."""
        parts = [self.parts[k] for k in sorted(self.parts)]
        if not parts:
            return {}
        out = {name: np.concatenate([p[name] for p in parts]) for name in parts[0]}
        if any(len(X) != self.n for X in out.values()):
            raise RuntimeError(f"hidden states of {len(next(iter(out.values())))} answers "
                               f"collected for {self.n}")
        return out


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
    from .llm.packed_logits import takes_logits_to_keep
    from .passes import input_device

    device = input_device(model)
    few_logits = {"logits_to_keep": 1} if takes_logits_to_keep(model) else {}
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
                        output_hidden_states=True, use_cache=False, **few_logits)
            states = getattr(res, "hidden_states", None)
            if not states:
                raise ModelError(f"{type(model).__name__} returns no hidden_states; the "
                                 "hidden-state probe needs a Hugging Face causal LM")
            for name, X in state_means(states, mask, layers).items():
                out.setdefault(name, []).append(X)
    return {name: np.concatenate(parts) for name, parts in out.items()}


__all__ = ["DEPTHS", "StatesOfForward", "mean_hidden_states", "model_states", "probe_layers",
           "state_means", "state_name"]
