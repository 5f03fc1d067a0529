"""scripts/polygraph/prereg_verdict.py: the pre-registered verdict of one answer set, fitted
from a kept benchmark file, its features and cached states, then judged from the kept
out-of-fold file alone; a kept file of another pre-registration is refused. Needs no
LM-Polygraph: the kept files are written here."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import by_path

ROOT = Path(__file__).resolve().parents[2]


def _script():
    return by_path.module("scripts/polygraph/prereg_verdict.py")


def _answer_set(tmp_path: Path, prereg_sha: str, n: int = 150, seed: int = 0) -> Path:
    """A complete kept file of truthfulqa × smollm2 whose ROUGE-L the epistemic score tells,
    with its features rows and cached states (the second state tells a little too)."""
    rng = np.random.default_rng(seed)
    results = tmp_path / "polygraph_prereg"
    (results / "features").mkdir(parents=True)
    cache = tmp_path / "cache"
    cache.mkdir()
    questions, feats, layers = [], [], []
    for i in range(n):
        e = rng.normal()
        rouge = float(np.clip(0.5 + 0.35 * e + 0.15 * rng.normal(), 0, 1))
        mp = float(rng.uniform(0.3, 0.9))
        key = f"q{i}"
        questions.append({"key": key, "quality": {"Rouge_rougeL": rouge, "Accuracy": 0.0}})
        feats.append({"key": key, "scores": {
            "epistemic": float(np.exp(e)), "epistemic_log": float(np.exp(e) / mp ** 2),
            "aleatoric": float(rng.uniform(0.05, 0.2)), "mean_prob": mp,
            "seq_logprob": float(5 * np.log(mp))},
            "blocks": {"model.layers.0": float(np.exp(e + rng.normal())),
                       "model.layers.1": float(np.exp(rng.normal()))}})
        layers.append({"key": key, "layers": [1, -1],
                       "states": [list(rng.normal(size=4)),
                                  list(rng.normal(size=4) + [0.3 * e, 0, 0, 0])]})
    questions.append({"key": "lost", "quality": {"Rouge_rougeL": 0.2}})
    feats.append({"key": "lost", "error": "its text does not tokenize into its kept length"})
    (results / "polygraph__truthfulqa__smollm2.json").write_text(json.dumps({
        "dataset": "truthfulqa", "model": "smollm2", "complete": True,
        "preregistration": {"sha256": prereg_sha}, "questions": questions}))
    (results / "features" / "truthfulqa__smollm2.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in feats))
    (cache / "polygraph_prereg__truthfulqa__smollm2.layers.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in layers))
    return results


PREREG = """version: 9
answer_sets:
  primary_quality: {truthfulqa: {metric: Rouge_rougeL}}
  sets:
    - {dataset: truthfulqa, model: smollm2}
predictors:
  msp: "MSP's map"
  isouq_head: {features: [mean_prob, epistemic, blocks, hidden]}
  forward_only_head: {features: [mean_prob, hidden]}
fresh_sets: {}
"""


@pytest.fixture
def verdict(tmp_path, monkeypatch):
    mod = _script()
    monkeypatch.setattr(mod, "CACHE", tmp_path / "cache")
    monkeypatch.setattr(mod, "SEEDS", (0, 1))
    monkeypatch.setattr(mod, "N_BOOTSTRAP", 1000)
    # fewer candidates than the pre-registered menu: a faster test of the same code
    monkeypatch.setattr(mod, "FORWARD_FEATURES", ("mean_prob", "hidden"))
    monkeypatch.setattr(mod, "ISOUQ_FEATURES", ("mean_prob", "epistemic", "blocks", "hidden"))
    return mod


def test_fit_then_judge_from_the_kept_file(tmp_path, verdict):
    prereg = tmp_path / "v9.yaml"
    prereg.write_text(PREREG)
    results = _answer_set(tmp_path, verdict.sha256(prereg))
    assert verdict.main(["--fit", "--prereg", str(prereg), "--results", str(results)]) == 0
    kept = json.loads((results / "verdict" / "truthfulqa__smollm2.oof.json").read_text())
    assert kept["left_out"] == 1 and len(kept["keys"]) == 150 and kept["seeds"] == [0, 1]
    assert set(kept["oof"]) == {"MSP's map", "forward-only head", "isouq head"}
    assert all(np.shape(v) == (2, 150) for v in kept["oof"].values())
    doc = json.loads((results / "verdict" / "verdict.json").read_text())
    assert doc["preregistration"]["sha256"] == verdict.sha256(prereg)
    rows = {(r["predictor"], r["against"]): r for r in doc["rows"]}
    head = rows["isouq head", "MSP's map"]
    assert head["verdict"] == "ahead" and head["family"] == 1 and head["repeats"] == 2
    assert head["metric"] == "Rouge_rougeL" and head["correct"] + head["wrong"] == 150
    assert rows["isouq head", "forward-only head"]["verdict"] in ("ahead", "within noise")
    assert "| smollm2 × truthfulqa |" in (results / "verdict" / "verdict.md").read_text()
    # step 2 alone, from the kept file: the same verdict
    again = verdict.judge_kept(results / "verdict", prereg)
    assert again["rows"] == doc["rows"]
    # a later pre-registration that inherits the set judges it in its family from the earlier
    # one's kept files (checked against the earlier one's hash); its own sets come beside it
    earlier = tmp_path / "v9r.yaml"
    earlier.write_text(PREREG.replace("fresh_sets: {}", f"fresh_sets: {{results: {results}}}"))
    later = tmp_path / "v10.yaml"
    later.write_text(PREREG.replace("model: smollm2}", "model: gemma3-270m}") + (
        f"inherits:\n  preregistration: {earlier}\n  sets:\n"
        "    - {dataset: truthfulqa, model: smollm2}\n"))
    verdict.read_prereg(later)
    with pytest.raises(SystemExit, match="not evidence"):   # the kept file carries v9's hash
        verdict.judge_kept(tmp_path / "v10_verdict", later)
    kept = results / "polygraph__truthfulqa__smollm2.json"
    kept.write_text(kept.read_text().replace(verdict.sha256(prereg), verdict.sha256(earlier)))
    inherited = verdict.judge_kept(tmp_path / "v10_verdict", later)
    assert inherited["rows"] == doc["rows"] and inherited["answer_sets_expected"] == 2
    assert inherited["inherited"]["truthfulqa__smollm2"]["sha256"] == verdict.sha256(earlier)


def test_the_answer_sets_and_their_quality_are_the_preregistrations(tmp_path):
    """Both kept pre-registrations read: their answer sets, primary quality and folders."""
    verdict = _script()
    for path, n, folder in ((ROOT / "configs/preregistration/v1.yaml", 4,
                             "results/polygraph_prereg"),
                            (ROOT / "configs/preregistration/v2.yaml", 12,
                             "results/polygraph_tasks_prereg"),
                            (ROOT / "configs/preregistration/v3.yaml", 9,
                             "results/polygraph_tasks_prereg_v3")):
        assert str(verdict.read_prereg(path)) == folder and len(verdict.SETS) == n
    # v3's family: its nine sets and SmolLM2's three of v2, none twice
    assert len(set(verdict.SETS) | set(verdict.INHERITED)) == 12
    assert {m for _, m in verdict.INHERITED} == {"smollm2"}
    assert verdict.PRIMARY == {"compare": "Accuracy", "units": "Accuracy",
                               "truthfulqa-mc1": "Accuracy"}
    verdict.read_prereg(ROOT / "configs/preregistration/v1.yaml")
    assert verdict.PRIMARY == {"triviaqa": "Accuracy", "truthfulqa": "Rouge_rougeL"}
    # v4: v1's 1.5B sets made again without pads; v1's two others inherited, a family of 4
    assert str(verdict.read_prereg(ROOT / "configs/preregistration/v4.yaml")) == \
        "results/polygraph_prereg_v4"
    assert {m for _, m in verdict.SETS} == {"qwen2.5-coder-1.5b"}
    assert len(set(verdict.SETS) | set(verdict.INHERITED)) == 4
    assert {f for _, f in verdict.INHERITED.values()} == {
        Path("configs/preregistration/v1.yaml")}
    assert verdict.PRIMARY == {"triviaqa": "Accuracy", "truthfulqa": "Rouge_rougeL"}
    other = tmp_path / "other.yaml"
    other.write_text(PREREG.replace("[mean_prob, hidden]", "[mean_prob]"))
    with pytest.raises(SystemExit, match="this script fits"):
        verdict.read_prereg(other)


def test_another_preregistration_is_refused(tmp_path, verdict):
    prereg = tmp_path / "v9.yaml"
    prereg.write_text(PREREG)
    results = _answer_set(tmp_path, "0" * 64, n=40)
    with pytest.raises(SystemExit, match="not evidence for this verdict"):
        verdict.main(["--fit", "--prereg", str(prereg), "--results", str(results)])


def test_the_runner_refuses_a_run_it_does_not_know_before_it_starts_any():
    """scripts/polygraph/prereg_runs.sh PREREG:MODEL...: an unknown run is one line naming the
    runs it knows, exit status 2, before any worktree, benchmark or fit (a known run named
    first is not started)."""
    import subprocess

    script = ROOT / "scripts/polygraph/prereg_runs.sh"
    res = subprocess.run(["bash", str(script), "v2:smollm2", "v2:smollm2x"],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 2
    assert res.stdout.count("\n") == 1   # that line alone: nothing was started
    assert "no run 'v2:smollm2x'" in res.stdout and "v2:smollm2 " in res.stdout
    assert "v2:gemma3-270m" not in res.stdout   # void: not to be fitted again by default
    assert "v3:gemma3-270m" in res.stdout
    assert "v4:qwen2.5-coder-1.5b" in res.stdout and "v1:qwen2.5-coder-1.5b" not in res.stdout


@pytest.mark.parametrize("prereg, model, dataset, expected", [
    ("v1", "qwen2.5-coder-1.5b", "triviaqa", "--limit 1500 --after 500"),
    ("v2", "smollm2", "truthfulqa-mc1", "--limit 1000 --after 500"),
    ("v3", "gemma3-270m", "compare", "--limit 1500 --after 1000"),
    ("v3", "gemma3-270m", "truthfulqa-mc1", "--limit 1000 --after 500"),
    ("v3", "qwen2.5-coder-0.5b", "units", "--limit 1000 --after 500"),
    ("v4", "qwen2.5-coder-1.5b", "truthfulqa", "--limit 1500 --after 500"),
])
def test_the_runner_takes_each_sets_questions_from_its_preregistration(prereg, model, dataset,
                                                                        expected):
    """prereg_runs.sh's questions(): the fresh items of an answer set, read from the
    pre-registration's fresh_sets (per model in v3: Gemma's compare and units are new items)."""
    import subprocess

    script = ROOT / "scripts/polygraph/prereg_runs.sh"
    fn = subprocess.run(["sed", "-n", "/^questions()/,/^}/p", str(script)],
                        capture_output=True, text=True, check=True).stdout
    res = subprocess.run(["bash", "-c", f"{fn}\nquestions {prereg} {model} {dataset}"],
                         capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == expected


def test_the_design_set_is_judged_by_the_same_rule(tmp_path, verdict, monkeypatch):
    """--design: every kept design-set file (no pre-registration hash; its states' cache
    without a folder tag) fitted and judged as the fresh sets are, into DESIGN/verdict."""
    prereg = tmp_path / "v9.yaml"
    prereg.write_text(PREREG)
    results = _answer_set(tmp_path, None)
    monkeypatch.setattr(verdict, "DESIGN", results)
    cache = tmp_path / "cache"
    (cache / "polygraph_prereg__truthfulqa__smollm2.layers.jsonl").rename(
        cache / "truthfulqa__smollm2.layers.jsonl")
    assert verdict.main(["--fit", "--design", "--prereg", str(prereg)]) == 0
    doc = json.loads((results / "verdict" / "verdict.json").read_text())
    assert doc["design_set"] == str(results) and doc["answer_sets_judged"] == 1
    head = next(r for r in doc["rows"] if r["against"] == "MSP's map")
    assert head["repeats"] == 2 and head["verdict"] == "ahead"
    # a file made under a pre-registration is not design set
    kept = results / "polygraph__truthfulqa__smollm2.json"
    kept.write_text(kept.read_text().replace('"preregistration": {"sha256": null}',
                                             '"preregistration": {"sha256": "ab"}'))
    (results / "verdict" / "truthfulqa__smollm2.oof.json").unlink()
    with pytest.raises(SystemExit, match="not design set"):
        verdict.main(["--fit", "--design", "--prereg", str(prereg)])


def test_an_answer_set_too_small_to_fit_is_reported_without_a_verdict(tmp_path, verdict):
    """One answer of a class cannot be cross-fitted: the set is kept, unfitted,
    and shown as not rankable; the run goes on."""
    prereg = tmp_path / "v9.yaml"
    prereg.write_text(PREREG.replace("metric: Rouge_rougeL", "metric: Accuracy"))
    results = _answer_set(tmp_path, verdict.sha256(prereg), n=60)
    kept = results / "polygraph__truthfulqa__smollm2.json"
    doc = json.loads(kept.read_text())
    for i, q in enumerate(doc["questions"]):
        q["quality"]["Accuracy"] = 1.0 if i == 0 else 0.0
    kept.write_text(json.dumps(doc))
    assert verdict.main(["--fit", "--prereg", str(prereg), "--results", str(results)]) == 0
    oof = json.loads((results / "verdict" / "truthfulqa__smollm2.oof.json").read_text())
    assert oof["oof"] == {} and "too few" in oof["not_fitted"]
    got = json.loads((results / "verdict" / "verdict.json").read_text())
    assert [r["verdict"] for r in got["rows"]] == [None, None]
    assert {r["family"] for r in got["rows"]} == {0}
    row = (results / "verdict" / "verdict.md").read_text().splitlines()[2]
    assert row.startswith("| smollm2 × truthfulqa | Accuracy | 1 / 59 | n/a | n/a |")
    assert "not rankable" in row
