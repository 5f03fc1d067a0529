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


@pytest.mark.parametrize("route, body", [
    ("/v1/score", {"prompt": "the cat sat on", "answer": "the mat"}),
    ("/v1/completions", {"prompt": "the cat sat on", "max_tokens": 3, "temperature": 0}),
    ("/v1/ask", {"question": "where is the cat", "max_tokens": 3}),
])
def test_a_request_asks_for_the_block_profile_with_blocks_true(lm, route, body):
    """``"blocks": true`` on the HTTP API: each answer's profile, summing to its epistemic;
    without it none; ``headline_by`` names p̄ (no calibration)."""
    from fastapi.testclient import TestClient

    from .conftest import make_app

    def uncertainty(doc):
        if "data" in doc:
            return doc["data"][0]["uncertainty"]
        return doc["choices"][0]["uncertainty"] if "choices" in doc else doc["uncertainty"]

    with TestClient(make_app(lm)) as c:
        asked = c.post(route, json={**body, "blocks": True})
        silent = c.post(route, json=body)
        bad = c.post(route, json={**body, "blocks": "layers"})
    assert asked.status_code == 200, asked.text
    u, plain = uncertainty(asked.json()), uncertainty(silent.json())
    assert u["blocks"] and sum(u["blocks"].values()) == pytest.approx(u["epistemic"], rel=1e-5)
    assert "blocks" not in plain
    assert u["headline_by"] == plain["headline_by"] == "mean_prob"
    assert bad.status_code == 422 and "blocks" in bad.text


def probe_calibration(states: dict, seed=0) -> Calibrator:
    """A calibration whose probe reads ``states`` ({name: (d,) one answer's state}), fitted on
    rows whose states are those widths and whose label lives in the first coordinate."""
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(80):
        h = {n: list(rng.normal(size=len(v))) for n, v in states.items()}
        rows.append({"key": f"k{i}", "model": "tiny", "hidden": h,
                     "correct": bool(h[next(iter(h))][0] > 0),
                     "scores": {"mean_prob": float(rng.uniform(0.1, 0.9))}})
    return Calibrator.fit(rows, features=["mean_prob", "hidden"])


def test_a_probe_head_gets_the_hidden_states_and_never_shows_them(lm):
    plain = isouq.score_sequences(*lm, ["the cat sat on"], ["the mat"], hidden=True)
    cal = probe_calibration(plain.row_hidden(0))
    assert cal.needs_hidden
    engine = Engine(*lm, ServeSettings(), calibration=cal)
    engine.warm_up()
    (job,) = engine.run([ScoreJob([Pair("the mat", prompt="the cat sat on")])])
    u = job.result[0]["uncertainty"]
    assert "hidden" not in u and u["headline_by"] == "p_correct"
    want = cal.predict([{"scores": plain.row_scores(0), "hidden": plain.row_hidden(0)}])[0]
    assert u["p_correct"] == pytest.approx(want, rel=1e-5)
    other = probe_calibration({"hidden_states[9]": plain.row_hidden(0)["hidden_states[-1]"]})
    with pytest.raises(CalibrationError, match="probe reads hidden_states\\[9\\].*--hidden"):
        Engine(*lm, ServeSettings(), calibration=other).warm_up()
