"""Result types returned by the scoring functions: tensors plus the metadata to read them.

Torch-free to import (tensors are only held), so that the registries built on these types (the
score keys of an answer, ``SequenceScores.KEYS``) can be read without loading torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar

from .errors import InputError

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class ParamInfo:
    """Which parameters took part in the gradient.

    names: parameter names (as in ``model.named_parameters()``) that were differentiated.
    n_params: total number of scalar parameters among them (a quantized weight counts as its
        dequantized values).
    sq_norm: ‖θ*‖² over them (for the normalized score ‖g‖²/‖θ*‖²).
    set: the name of the set, ``n_model``: the whole model's count, ``share``: n_params/n_model.
    """

    names: tuple[str, ...]
    n_params: int
    sq_norm: float
    #: the set's name ("all", "trainable", "adapter", "last-layer"), or the patterns / "custom"
    set: str = "all"
    #: scalar parameters of the whole model (quantized weights counted as their dequantized
    #: values), so that ``n_params / n_model`` is the share of the model scored
    n_model: int = 0

    @property
    def share(self) -> float:
        """Fraction of the model's parameters scored (1.0 when unknown)."""
        return self.n_params / self.n_model if self.n_model else 1.0

    def to_dict(self) -> dict:
        return {"set": self.set, "n_params": self.n_params, "n_model": self.n_model,
                "share": self.share, "sq_norm": self.sq_norm, "names": list(self.names)}


@dataclass
class Scores:
    """Uncertainty scores for classifiers (per class) or regressors.

    Classifier, ``classes="all"``: ``epistemic``, ``epistemic_log``, ``aleatoric`` and
    ``probs`` have shape (N, C); epistemic[i, c] = g_cᵀ C g_c with g_c = ∇θ p(y=c | x_i, θ*)
    (probability units squared); epistemic_log[i, c] = the same for ∇θ log p_c, which equals
    epistemic / p_c² (∇ log p = ∇p / p: it does not carry the confidence p_c² in it);
    aleatoric[i, c] = p_c (1 − p_c). Binary (one-logit) models give C = 2.
    Classifier, one class per example (``classes="predicted"`` or indices): epistemic,
    epistemic_log and aleatoric are (N,) for class ``classes[i]`` (N,) int64; probs stays (N, C).
    Regressor: ``epistemic`` (N,) = gᵀ C g with g = ∇θ f(x_i, θ*) (output units squared),
    ``mean`` (N,) = f(x_i, θ*), ``aleatoric``, ``probs``, ``epistemic_log`` are None.
    """

    epistemic: torch.Tensor
    params: ParamInfo
    covariance: str
    aleatoric: torch.Tensor | None = None
    probs: torch.Tensor | None = None
    mean: torch.Tensor | None = None
    extra: dict = field(default_factory=dict)
    epistemic_log: torch.Tensor | None = None
    classes: torch.Tensor | None = None

    @property
    def normalized_epistemic(self) -> torch.Tensor:
        """‖g‖² / ‖θ*‖², comparable across models of different size (paper §4.2)."""
        return self.epistemic / max(self.params.sq_norm, 1e-30)

    def predicted(self) -> Scores:
        """Scores of the predicted class only: epistemic/aleatoric/probs of shape (N,).

        From ``classes="all"`` scores; ``score_classifier(..., classes="predicted")`` gives
        the same (with probs (N, C)) from one backward pass instead of C.
        """
        if self.probs is None:
            raise InputError("predicted() is for classifier scores; regressor scores are (N,) already")
        if self.classes is not None:
            raise InputError("these scores already hold one class per example (classes=...); "
                             "use them as they are")
        c = self.probs.argmax(dim=1, keepdim=True)
        return Scores(
            epistemic=self.epistemic.gather(1, c).squeeze(1),
            aleatoric=self.aleatoric.gather(1, c).squeeze(1),
            probs=self.probs.gather(1, c).squeeze(1),
            params=self.params,
            covariance=self.covariance,
            extra={**self.extra, "predicted_class": c.squeeze(1)},
            epistemic_log=None if self.epistemic_log is None
            else self.epistemic_log.gather(1, c).squeeze(1),
            classes=c.squeeze(1),
        )


@dataclass
class SequenceScores:
    """Uncertainty of generated answers, one value per answer (all shape (N,)).

    epistemic: ‖∇θ p̄‖² (or gᵀCg), p̄ = mean per-token probability of the answer tokens.
    epistemic_log (property): ‖∇θ log p̄‖² = epistemic / p̄², since ∇θ log p̄ = ∇θ p̄ / p̄ (the
    same backward pass; it does not carry the answer's confidence squared).
    aleatoric: (1/T) Σ_t p_t (1 − p_t).
    mean_prob: p̄.   n_tokens: T, the number of answer tokens.
    seq_logprob: log p(y | x) = Σ_t log p_t, the answer's log-probability (nats; LM-Polygraph's
    maximum sequence probability is its negative).
    per_param: optional (N, n_tensors) breakdown of ‖g‖² by parameter tensor
    (columns in ``params.names`` order), when requested.
    blocks: optional (N, B) breakdown of ‖g‖² by block of the model (``isouq.blocks``: the
    embeddings, each layer of its stack, the final norm, the head), columns in ``block_names``
    order (module paths); each row sums to ``epistemic``.
    hidden: optional {state name: (N, d) array}, each answer's mean hidden state at the probe's
    depths (``isouq.hidden``), when requested.

    ``KEYS`` are the scores of one answer (or one span of it) as an answer row holds them,
    listed here once: :meth:`row_scores`, span scores, the server's ``uncertainty``, the QA
    methods' registry and the LM-Polygraph plugin read them from here.
    """

    #: the scores of an answer, as an answer row's ``scores`` holds them
    KEYS: ClassVar[tuple[str, ...]] = ("epistemic", "epistemic_log", "aleatoric",
                                       "normalized_epistemic", "mean_prob", "seq_logprob")

    epistemic: torch.Tensor
    aleatoric: torch.Tensor
    mean_prob: torch.Tensor
    n_tokens: torch.Tensor
    params: ParamInfo
    method: str
    covariance: str = "identity"
    per_param: torch.Tensor | None = None
    extra: dict = field(default_factory=dict)
    blocks: torch.Tensor | None = None
    block_names: tuple[str, ...] | None = None
    seq_logprob: torch.Tensor | None = None
    hidden: dict | None = None

    @property
    def normalized_epistemic(self) -> torch.Tensor:
        """‖g‖² / ‖θ*‖²."""
        return self.epistemic / max(self.params.sq_norm, 1e-30)

    @property
    def epistemic_log(self) -> torch.Tensor:
        """(N,) ‖∇θ log p̄‖² = ‖∇θ p̄‖² / p̄² (units: squared log-probability)."""
        return self.epistemic / self.mean_prob.pow(2)

    def row_scores(self, i: int) -> dict[str, float]:
        """Answer ``i``'s scores as an answer row holds them (``isouq.answer_row``): the
        :attr:`KEYS`, as floats."""
        return {k: float(getattr(self, k)[i]) for k in self.KEYS}

    def row_hidden(self, i: int) -> dict[str, list[float]] | None:
        """Answer ``i``'s mean hidden states {state name: d floats} (None without them)."""
        if self.hidden is None:
            return None
        return {name: [float(v) for v in X[i]] for name, X in self.hidden.items()}

    def row_blocks(self, i: int) -> dict[str, float] | None:
        """Answer ``i``'s block profile {block module path: ‖∇θ_b p̄‖²} (None without blocks)."""
        if self.blocks is None or self.block_names is None:
            return None
        return {b: float(v) for b, v in zip(self.block_names, self.blocks[i].tolist(),
                                             strict=True)}
