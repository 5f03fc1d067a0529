"""Reference posteriors for validation: HMC/NUTS and mean-field VI (NumPyro), analytic BLR.

Importing this package (before JAX starts) prepares JAX for the references:
- float64 everywhere (``jax_enable_x64``): float32 HMC on these networks mixed poorly;
- one XLA host (CPU) device per core, up to 8 (``ISOUQ_JAX_HOST_DEVICES`` overrides), so
  several chains run in parallel. This only takes effect if JAX was not yet initialised; if it
  was, chains run one after another (same results, slower).

Requires the optional dependencies: ``pip install 'isouq[reference]'`` (jax, numpyro).
"""

from __future__ import annotations

import os
import sys

from ...errors import IsouqError


def _prepare_jax() -> None:
    if "jax" not in sys.modules and "xla_force_host_platform_device_count" not in os.environ.get(
        "XLA_FLAGS", ""
    ):
        n = int(os.environ.get("ISOUQ_JAX_HOST_DEVICES", min(os.cpu_count() or 1, 8)))
        flags = os.environ.get("XLA_FLAGS", "")
        os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={n} {flags}".strip()
    try:
        import jax
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise IsouqError(
            "isouq.study.reference needs JAX and NumPyro; install them with "
            "pip install 'isouq[reference]'  (or: pip install jax jaxlib numpyro)"
        ) from e
    jax.config.update("jax_enable_x64", True)


_prepare_jax()

from .analytic import (  # noqa: E402
    blr_posterior,
    blr_predictive,
    linear_features,
    linear_regression_reference,
    mean_field_optimum,
)
from .hmc import hmc_reference  # noqa: E402
from .jax_models import flat_params, load_into, to_state_dict  # noqa: E402
from .result import Reference  # noqa: E402
from .vi import vi_reference  # noqa: E402

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
    "to_state_dict",
    "vi_reference",
]
