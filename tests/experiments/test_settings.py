"""Experiment settings: frozen dataclasses, presets as instances, CLI options from the fields."""

from __future__ import annotations

import argparse
import dataclasses

import pytest

from isouq.errors import InputError
from isouq.study.experiments import scaling as sc
from isouq.study.experiments import validation as V
from isouq.study.experiments.settings import (
    HMCSettings,
    VISettings,
    add_options,
    resolve,
    split_options,
)


def test_settings_are_frozen_and_checked():
    s = HMCSettings()
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.num_warmup = 3
    for bad in ({"num_samples": 0}, {"num_chains": 0}, {"num_warmup": -1}, {"kernel": "mh"},
                {"init": "zero"}):
        with pytest.raises(InputError):
            HMCSettings(**bad)
    for bad in ({"steps": 0}, {"lr": 0.0}, {"prior": "flat"}, {"elbo": "iwae"}):
        with pytest.raises(InputError):
            VISettings(**bad)


def test_resolve_replaces_only_given_options_and_honours_zero():
    quick = HMCSettings(num_warmup=150, num_samples=150)
    assert resolve(quick, {"num_warmup": None, "num_samples": 7}) == HMCSettings(150, 7)
    assert resolve(quick, {"num_warmup": 0}).num_warmup == 0  # not defaulted through `or`
    assert resolve(quick, {"hmc_init": "map"}).init == "map"  # the field's own flag
    assert resolve(VISettings(), {"vi_steps": 3}, prefix="vi-").steps == 3
    with pytest.raises(InputError, match="unknown option.*num_warmups"):
        resolve(quick, {"num_warmups": 5})


def test_cli_options_generated_from_the_fields():
    p = argparse.ArgumentParser()
    add_options(p, HMCSettings)
    add_options(p, VISettings, prefix="vi-")
    args = vars(p.parse_args(["--num-warmup", "5", "--hmc-init", "map", "--vi-lr", "0.5",
                              "--vi-prior", "fan_in"]))
    hmc, vi, rest = split_options(args, (HMCSettings, ""), (VISettings, "vi-"))
    assert rest == {}
    assert resolve(HMCSettings(), hmc) == HMCSettings(num_warmup=5, init="map")
    assert resolve(VISettings(), vi, prefix="vi-") == VISettings(lr=0.5, prior="fan_in")
    with pytest.raises(SystemExit):
        p.parse_args(["--vi-elbo", "iwae"])


def test_scaling_presets_give_the_kept_rows_fingerprints():
    """The full presets reproduce the settings stored in the kept results' rows."""
    kw = dict(seed=0, grid_n=sc.GRID_N["full"], prior_precision=1.0,
              hmc=sc.HMC_PRESETS["full"], vi=sc.VI_PRESETS["full"])
    assert sc.study_settings("hmc", **kw) == {
        "problem": "multiclass_rings", "seed": 0, "grid_n": 50, "prior_precision": 1.0,
        "kernel": "hmc", "num_warmup": 1000, "num_samples": 1000, "num_chains": 2,
        "init": "prior"}
    assert sc.study_settings("vi", **kw) == {
        "problem": "multiclass_clusters", "seed": 0, "grid_n": 50, "prior_precision": 1.0,
        "n_train": 4000, "vi_steps": 5000, "vi_draws": 400, "vi_batch_size": 128,
        "vi_lr": 0.01}
    fan = sc.study_settings("vi", **{**kw, "vi": VISettings(prior="fan_in")})
    assert fan["vi_prior"] == "fan_in" and "vi_elbo" not in fan


def test_unknown_or_bad_experiment_options_are_errors(tmp_path):
    with pytest.raises(InputError, match="unknown option"):
        sc.run(tmp_path, quick=True, num_warmups=3)
    with pytest.raises(InputError, match="unknown option"):
        V.run(tmp_path, quick=True, vi_steps=3)
    with pytest.raises(InputError, match="num_samples"):
        sc.run(tmp_path, quick=True, num_samples=0)


def test_proxy_bias_options_honour_zero_and_refuse_unknown(tmp_path):
    from isouq.study.experiments import proxy_bias_2d as p2
    from isouq.study.experiments import proxy_bias_text as pt

    cfg = resolve(p2.PRESETS["quick"], {"prior_precision": 0.0, "width": None})
    assert cfg.prior_precision == 0.0 and cfg.width == p2.PRESETS["quick"].width
    with pytest.raises(InputError, match="unknown option"):
        p2.run(tmp_path, quick=True, widht=8)
    with pytest.raises(InputError, match="unknown option.*epoch"):
        pt.run(tmp_path, quick=True, epoch=2)
    assert pt.pipeline._given({"prior_precision": 0.0}, "prior_precision", 1.0) == 0.0
