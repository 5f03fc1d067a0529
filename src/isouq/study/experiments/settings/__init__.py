"""Experiment settings as frozen dataclasses: presets are instances, CLI options their fields.

Torch-free, as is each experiment's module here (``settings.validation``, ``settings.scaling``,
…: its presets and ``add_arguments``), so that ``isouq experiment NAME --help`` lists every
option without importing torch or the experiment; ``experiments.catalog`` names them.

A settings class lists every option of one part of an experiment with its type, its default (the
full run's), its choices and its help; a preset (``--quick``) is an instance; the command-line
options are generated from the fields (:func:`add_options`, default None = "not given") and
applied to a preset by :func:`resolve`, which replaces only the options that were given, so 0
or an empty value is honoured (never defaulted through ``or``), and refuses an unknown one.

>>> quick = HMCSettings(num_warmup=150, num_samples=150)
>>> resolve(quick, {"num_samples": 0})
Traceback (most recent call last):
...
isouq.errors.InputError: num_samples must be ≥ 1, got 0
"""

from __future__ import annotations

import argparse
from dataclasses import MISSING, Field, asdict, dataclass, field, fields, replace
from typing import Any, TypeVar

from ....choices import TOY_PRIORS
from ....errors import InputError

S = TypeVar("S")
#: the toy networks' priors (``models.toy.PRIORS``)
PRIORS: tuple[str, ...] = TOY_PRIORS


def option(default: Any, help: str, *, choices: tuple | None = None,
           flag: str | None = None) -> Any:
    """A settings field: its default, help, choices, and the CLI flag if not ``--field-name``."""
    return field(default=default, metadata={"help": help, "choices": choices, "flag": flag})


def _flag(f: Field, prefix: str) -> str:
    return f.metadata.get("flag") or (prefix + f.name).replace("_", "-")


def add_options(parser: argparse.ArgumentParser, cls: type, *, prefix: str = "",
                defaults: dict[str, str] | None = None) -> None:
    """One ``--{prefix}{field}`` option per field of ``cls`` (type, choices, help from it).

    Args:
        parser: the experiment's parser.
        cls: a settings dataclass.
        prefix: flag prefix, e.g. ``"vi-"`` → ``--vi-steps``; the argparse dest (and the
            ``run`` keyword) is the flag with ``_``: ``vi_steps``.
        defaults: per field, how the help states the default (e.g. ``"1000; --quick 150"``);
            otherwise the class default.
    """
    for f in fields(cls):
        shown = (defaults or {}).get(f.name, f.default)
        parser.add_argument(f"--{_flag(f, prefix)}", type=type(f.default), default=None,
                            choices=f.metadata.get("choices"),
                            help=f"{f.metadata['help']} (default {shown})")


def resolve(preset: S, options: dict[str, Any], *, prefix: str = "") -> S:
    """``preset`` with every option in ``options`` that is not None put in its place.

    options: ``{dest: value}`` as :func:`add_options` names them (``vi_steps`` for the field
    ``steps`` with prefix ``"vi-"``); None means "not given". Raises InputError on an option
    that is no field of the preset's class, naming the known ones.
    """
    by_dest = {_flag(f, prefix).replace("-", "_"): f.name for f in fields(preset)}
    unknown = sorted(k for k in options if k not in by_dest)
    if unknown:
        raise InputError(f"unknown option(s) {unknown} for {type(preset).__name__}; known: "
                         f"{', '.join(sorted(by_dest))}")
    return replace(preset, **{by_dest[k]: v for k, v in options.items() if v is not None})


def split_options(options: dict[str, Any], *classes: tuple[type, str]) -> list[dict[str, Any]]:
    """Partition ``options`` by the settings classes (with their prefixes) that own each key.

    Returns one dict per class, then one with the keys no class owns.
    """
    parts: list[dict[str, Any]] = [{} for _ in classes] + [{}]
    owners = {}
    for i, (cls, prefix) in enumerate(classes):
        for f in fields(cls):
            owners[_flag(f, prefix).replace("-", "_")] = i
    for k, v in options.items():
        parts[owners.get(k, len(classes))][k] = v
    return parts


def _check_positive(obj, names: tuple[str, ...], low: int = 1) -> None:
    for n in names:
        v = getattr(obj, n)
        if not isinstance(v, int) or v < low:
            raise InputError(f"{n} must be ≥ {low}, got {v}")


@dataclass(frozen=True)
class HMCSettings:
    """The HMC reference of an experiment (:func:`isouq.study.reference.hmc_reference`)."""

    num_warmup: int = option(1000, "HMC warmup iterations per chain")
    num_samples: int = option(1000, "HMC draws per chain")
    num_chains: int = option(2, "HMC chains")
    kernel: str = option("hmc", "HMC with a fixed trajectory length, or NUTS",
                         choices=("hmc", "nuts"))
    init: str = option("prior", "chains start at prior draws, or at θ* + 0.1·noise",
                       choices=("prior", "map"), flag="hmc-init")

    def __post_init__(self) -> None:
        _check_positive(self, ("num_samples", "num_chains"))
        _check_positive(self, ("num_warmup",), low=0)
        if self.kernel not in ("hmc", "nuts"):
            raise InputError(f"kernel must be 'hmc' or 'nuts', got {self.kernel!r}")
        if self.init not in ("prior", "map"):
            raise InputError(f"init must be 'prior' or 'map', got {self.init!r}")

    def to_dict(self, keys: tuple[str, ...] | None = None) -> dict:
        """The fields (or ``keys`` of them, in that order) as a dict."""
        d = asdict(self)
        return d if keys is None else {k: d[k] for k in keys}


@dataclass(frozen=True)
class VISettings:
    """The mean-field VI reference of an experiment (:func:`isouq.study.reference.vi_reference`)."""

    steps: int = option(5000, "SVI steps")
    draws: int = option(400, "draws of q for the VI predictive")
    batch_size: int = option(128, "SVI minibatch size")
    lr: float = option(1e-2, "SVI learning rate (Adam)")
    n_train: int = option(4000, "training points of the VI study")
    prior: str = option("isotropic", "VI reference prior: isotropic N(0, I/λ) or fan_in "
                        "(weights' variance 1/(λ·fan_in), biases 1/λ)", choices=PRIORS)
    elbo: str = option("trace", "SVI gradient estimator: trace (KL sampled too) or analytic_kl "
                       "(closed-form Gaussian KL, less noise at large D)",
                       choices=("trace", "analytic_kl"))

    def __post_init__(self) -> None:
        _check_positive(self, ("steps", "draws", "batch_size", "n_train"))
        if not self.lr > 0:
            raise InputError(f"lr must be > 0, got {self.lr}")
        if self.prior not in PRIORS:
            raise InputError(f"prior must be one of {PRIORS}, got {self.prior!r}")
        if self.elbo not in ("trace", "analytic_kl"):
            raise InputError(f"elbo must be 'trace' or 'analytic_kl', got {self.elbo!r}")


def default_of(cls: type, name: str) -> Any:
    """The class default of field ``name``."""
    f = next(f for f in fields(cls) if f.name == name)
    return f.default if f.default is not MISSING else None


__all__ = ["HMCSettings", "VISettings", "add_options", "default_of", "option", "resolve",
           "split_options"]
