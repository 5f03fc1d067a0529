"""Reference posteriors for validation: HMC/NUTS and mean-field VI (NumPyro), analytic BLR.

The references compute in float64: importing this package turns on ``jax_enable_x64``
(float32 HMC on these networks mixed poorly). Nothing else changes on import; before its
first JAX computation, a run that samples calls :func:`prepare_jax`, which gives JAX one CPU
device per core (up to 8; ``ISOUQ_JAX_HOST_DEVICES`` overrides) so that several chains run in
parallel. Called after JAX has computed anything, it changes nothing and chains run one after
another (the same draws, slower).

Requires the optional dependencies: ``pip install 'isouq[reference]'`` (jax, numpyro).
"""

from __future__ import annotations

import os

from ...errors import IsouqError
from ...runtime import env_int

try:
    import jax
except ImportError as e:  # pragma: no cover - depends on the environment
    raise IsouqError(
        "isouq.study.reference needs JAX and NumPyro; install them with "
        "pip install 'isouq[reference]'  (or: pip install jax jaxlib numpyro)"
    ) from e

from .analytic import (
    blr_posterior,
    blr_predictive,
    linear_features,
    linear_regression_reference,
    mean_field_optimum,
)
from .hmc import hmc_reference
from .jax_models import flat_params, load_into, to_state_dict
from .result import Reference
from .vi import vi_reference

jax.config.update("jax_enable_x64", True)


def prepare_jax(host_devices: int | None = None) -> int:
    """Give JAX one CPU device per chain to come, before its first computation.

    Args:
        host_devices: CPU devices wanted; None: ``ISOUQ_JAX_HOST_DEVICES``, else one per core
            up to 8. An ``XLA_FLAGS`` that already sets
            ``--xla_force_host_platform_device_count`` wins over both.

    Returns:
        The CPU devices JAX runs on (fewer than asked when JAX had already computed: then
        chains run one after another, with the same draws).
    """
    if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
        n = host_devices or env_int("ISOUQ_JAX_HOST_DEVICES", min(os.cpu_count() or 1, 8),
                                    low=1)
        try:
            jax.config.update("jax_num_cpu_devices", n)
        except RuntimeError:  # JAX has computed already: its devices are fixed
            pass
        except AttributeError:  # pragma: no cover - JAX before 0.4.38 lacks the option
            flags = os.environ.get("XLA_FLAGS", "")
            os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={n} {flags}".strip()
    return jax.local_device_count()


__all__ = [
    "Reference",
    "blr_posterior",
    "blr_predictive",
    "flat_params",
    "hmc_reference",
    "linear_features",
    "linear_regression_reference",
    "load_into",
    "mean_field_optimum",
    "prepare_jax",
    "to_state_dict",
    "vi_reference",
]
