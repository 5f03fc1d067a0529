"""The result type every reference posterior returns (HMC, mean-field VI, analytic)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ...errors import InputError
from ...models.toy import MLPSpec


@dataclass
class Reference:
    """Posterior predictive moments on evaluation points, with the sampler's diagnostics.

    Classification (C classes; binary one-logit models give C = 2, columns [1 − p, p]):
      epistemic (G, C) = Var_θ[p_c(x)] over posterior draws (probability units squared),
      aleatoric (G, C) = E_θ[p_c(x)(1 − p_c(x))],
      mean (G, C)      = E_θ[p_c(x)].
    Regression: epistemic (G,) = Var_θ[f(x)], aleatoric (G,) = noise_std² (the likelihood's
      constant noise variance), mean (G,) = E_θ[f(x)]; the predictive variance of y is
      epistemic + aleatoric (output units squared).
    param_mean, param_std (D,): posterior (or variational) mean and std of θ, flat in the torch
      layout (``jax_models.to_state_dict(ref.param_mean, spec)`` loads the mean into torch).
    samples: (S, D) parameter draws when requested (``keep_samples=True``), else None.
    elbo: (steps,) ELBO estimate per VI step (VI only; ELBO = −loss, nats), else None.
    diagnostics: method-specific numbers (R-hat, ESS, step size, seconds, ...), JSON-ready.
    settings: the arguments that produced it, JSON-ready.
    All tensors are float64 on the CPU.
    """

    method: str
    task: str
    epistemic: torch.Tensor
    aleatoric: torch.Tensor
    mean: torch.Tensor
    param_mean: torch.Tensor
    param_std: torch.Tensor
    diagnostics: dict = field(default_factory=dict)
    settings: dict = field(default_factory=dict)
    spec: MLPSpec | None = None
    samples: torch.Tensor | None = None
    elbo: torch.Tensor | None = None

    def state_dict(self, dtype: torch.dtype = torch.float32) -> dict[str, torch.Tensor]:
        """``param_mean`` as a state_dict for ``toy.build(self.spec)``."""
        from .jax_models import to_state_dict

        if self.spec is None:
            raise InputError("this reference has no model spec; use jax_models.to_state_dict")
        return to_state_dict(self.param_mean, self.spec, dtype)

    def summary(self) -> dict:
        """Method, settings and diagnostics as one JSON-ready dict (no arrays)."""
        return {"method": self.method, "task": self.task, **self.settings,
                "diagnostics": self.diagnostics}
