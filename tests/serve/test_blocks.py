"""Block profiles in the server: a job that asks gets each answer's profile in its
``uncertainty``; a calibration on the block profile gives ``p_correct`` from it; one on another
model's blocks is refused when the engine starts."""

from __future__ import annotations

import numpy as np
import pytest

import isouq
from isouq.calibration import CalibrationError, Calibrator
from isouq.serve.config import ServeSettings
from isouq.serve.engine import Engine, Pair, ScoreJob


def block_calibration(names, seed=0) -> Calibrator:
    rng = np.random.default_rng(seed)
    rows = [{"key": f"k{i}", "model": "tiny", "correct": bool(rng.random() < 0.5),
             "scores": {"mean_prob": float(rng.uniform(0.1, 0.9))},
             "blocks": {b: float(rng.uniform(0.1, 1.0)) for b in names}} for i in range(60)]
    return Calibrator.fit(rows, features=["mean_prob", "blocks"])


def test_a_job_gets_its_block_profile_and_a_block_head_its_p_correct(lm):
    plain = isouq.score_sequences(*lm, ["the cat sat on"], ["the mat"], blocks=True)
    cal = block_calibration(plain.block_names)
    engine = Engine(*lm, ServeSettings(), calibration=cal)
    engine.warm_up()
    asked, silent = engine.run([ScoreJob([Pair("the mat", prompt="the cat sat on")], blocks=True),
                                ScoreJob([Pair("the mat", prompt="the cat sat on")])])
    u = asked.result[0]["uncertainty"]
    assert list(u["blocks"]) == list(plain.block_names)
    assert sum(u["blocks"].values()) == pytest.approx(u["epistemic"], rel=1e-5)
    assert "blocks" not in silent.result[0]["uncertainty"]  # computed for the head, not shown
    want = cal.predict([{"scores": u, "blocks": u["blocks"]}])[0]
    assert u["p_correct"] == pytest.approx(want, rel=1e-6)
    assert silent.result[0]["uncertainty"]["p_correct"] == pytest.approx(want, rel=1e-6)


def test_a_head_on_another_models_blocks_is_refused_at_start(lm):
    engine = Engine(*lm, ServeSettings(),
                    calibration=block_calibration(("transformer.h.0", "transformer.h.1")))
    with pytest.raises(CalibrationError, match="this model's blocks"):
        engine.warm_up()
