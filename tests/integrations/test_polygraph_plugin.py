"""The LM-Polygraph plugin inside LM-Polygraph 0.7 (skipped where it is not installed, as in
CI's venv): its UEManager, its factories (module-path loading) and ``estimate_uncertainty``
give isouq's scores equal to ``isouq score`` on the same (prompt, generated token ids) pairs."""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("lm_polygraph")

from lm_polygraph.defaults.register_default_stat_calculators import (  # noqa: E402
    register_default_stat_calculators,
)
from lm_polygraph.estimators import MaximumSequenceProbability  # noqa: E402
from lm_polygraph.utils.builder_enviroment_stat_calculator import (  # noqa: E402
    BuilderEnvironmentStatCalculator,
)
from lm_polygraph.utils.dataset import Dataset  # noqa: E402
from lm_polygraph.utils.estimate_uncertainty import estimate_uncertainty  # noqa: E402
from lm_polygraph.utils.factory_estimator import FactoryEstimator  # noqa: E402
from lm_polygraph.utils.factory_stat_calculator import (  # noqa: E402
    StatCalculatorContainer,
    create_stat_calculator,
)
from lm_polygraph.utils.generation_parameters import GenerationParameters  # noqa: E402
from lm_polygraph.utils.manager import UEManager  # noqa: E402
from lm_polygraph.utils.model import WhiteboxModel  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402

from isouq.errors import ModelError  # noqa: E402
from isouq.integrations import polygraph as pg  # noqa: E402
from isouq.integrations.polygraph_stats import HIDDEN_STATS  # noqa: E402
from isouq.models import load_model  # noqa: E402

from .conftest import QUESTIONS, isouq_score  # noqa: E402

MAX_NEW = 5


def whitebox(model_dir, instruct: bool) -> WhiteboxModel:
    model, tok, _ = load_model(str(model_dir))
    # eager attention: LM-Polygraph's default greedy calculator asks for attention weights
    model.set_attn_implementation("eager")
    tok.padding_side = "left"
    return WhiteboxModel(model, tok, str(model_dir), "CausalLM",
                         GenerationParameters(max_new_tokens=MAX_NEW), instruct=instruct)


def calculators():
    # no attentions/hidden states: the tiny model runs SDPA, and these estimators need neither
    return register_default_stat_calculators("Whitebox", output_attentions=False,
                                             output_hidden_states=False)


def run_manager(model, texts, estimators, extra_calculators=()):
    man = UEManager(Dataset(texts, [""] * len(texts), batch_size=3), model, estimators,
                    builder_env_stat_calc=BuilderEnvironmentStatCalculator(model),
                    available_stat_calculators=calculators() + list(extra_calculators),
                    generation_metrics=[], ue_metrics=[], processors=[],
                    ignore_exceptions=False, verbose=False, max_new_tokens=MAX_NEW,
                    save_stats=list(pg.STATS))
    man()
    return man


@pytest.mark.parametrize("instruct", [False, True])
def test_manager_scores_equal_isouq_score(tiny_llama_dir, tmp_path, instruct):
    model = whitebox(tiny_llama_dir, instruct)
    texts = [f"question {q} answer" for q in QUESTIONS]
    shared = [pg.load_estimator(OmegaConf.create({"score": s, "calculator": True}))
              for s in pg.ESTIMATORS]
    man = run_manager(model, texts, [MaximumSequenceProbability(), *shared],
                      [pg.calculator_container()])
    tokens = man.stats["greedy_tokens"]
    assert len(tokens) == len(texts) and all(len(t) >= 2 for t in tokens)
    cli = isouq_score(tiny_llama_dir, pg.lm_polygraph_prompts(texts, instruct), tokens, tmp_path)
    for s in pg.ESTIMATORS:
        got = np.array(man.estimations["sequence", pg.ESTIMATORS[s]])
        assert np.allclose(got, [r[s] for r in cli], rtol=2e-4, atol=1e-9), s
    assert np.allclose(man.stats["isouq_mean_prob"], [r["mean_prob"] for r in cli], rtol=2e-4)
    # the estimators alone (no calculator registered) give the same numbers
    alone = run_manager(model, texts, [pg.load_estimator({"score": s}) for s in pg.ESTIMATORS])
    for s in pg.ESTIMATORS:
        assert np.allclose(alone.estimations["sequence", pg.ESTIMATORS[s]],
                           man.estimations["sequence", pg.ESTIMATORS[s]], rtol=1e-6)


def test_estimate_uncertainty(tiny_llama_dir, tmp_path):
    model = whitebox(tiny_llama_dir, instruct=True)
    text = "question who wrote hamlet"
    out = estimate_uncertainty(model, pg.IsouqEpistemic(), text)
    assert out.estimator == "IsouqEpistemic"
    # LM-Polygraph's own greedy tokens for the same input (estimate_uncertainty drops the last)
    greedy = run_manager(model, [text], [MaximumSequenceProbability()]).stats["greedy_tokens"]
    cli = isouq_score(tiny_llama_dir, pg.lm_polygraph_prompts([text], True), greedy, tmp_path)
    assert out.uncertainty == pytest.approx(cli[0]["epistemic"], rel=2e-4)


def test_loaded_by_module_path_through_lm_polygraphs_factories():
    est = FactoryEstimator()("isouq.integrations.polygraph",
                             OmegaConf.create({"score": "epistemic_log", "calculator": True}))
    assert str(est) == "IsouqEpistemicLog" and est.stats_dependencies == ["isouq_epistemic_log"]
    assert isinstance(est, pg.IsouqEstimator) and est.level == "sequence"
    calc = create_stat_calculator("isouq.integrations.polygraph",
                                  OmegaConf.create({"batch_size": 4}), None)
    assert calc.stats == [*pg.STATS, *pg.BLOCK_STATS, *HIDDEN_STATS, pg.METHOD_STAT]
    assert calc.stat_dependencies == ["greedy_tokens"]
    assert calc.batch_size == 4
    # as polygraph_eval reads a config's stat_calculators entry
    sc = StatCalculatorContainer(name=pg.CALCULATOR, builder="isouq.integrations.polygraph",
                                 cfg=OmegaConf.create({}), stats=list(pg.STATS),
                                 dependencies=["greedy_tokens"])
    assert sc.builder == "isouq.integrations.polygraph"
    with pytest.raises(pg.InputError, match="not one of isouq's estimators"):
        pg.load_estimator({"score": "entropy"})
    import pickle  # the classes pickle by name (saved managers, worker processes)

    assert type(pickle.loads(pickle.dumps(est))) is type(est)


def test_a_vllm_model_is_refused_in_one_line():
    from lm_polygraph.model_adapters import WhiteboxModelvLLM

    class Engine:  # stands in for vllm.LLM: only what WhiteboxModelvLLM's constructor reads
        def get_tokenizer(self):
            class Tok:
                eos_token = "</s>"
            return Tok()

    class SamplingParams:  # stands in for vllm.SamplingParams
        pass

    model = WhiteboxModelvLLM(Engine(), sampling_params=SamplingParams(), device="cpu")
    stats = {"model": model, "input_texts": ["who wrote hamlet"], "greedy_tokens": [[5, 6]]}
    with pytest.raises(ModelError) as e:
        pg.IsouqEpistemic()(stats)
    msg = str(e.value)
    assert "WhiteboxModelvLLM" in msg and "vLLM runs the model without autograd" in msg
    assert "\n" not in msg


def test_gradients_are_on_inside_no_grad(tiny_llama_dir):
    model = whitebox(tiny_llama_dir, instruct=False)
    texts = [f"question {q}" for q in QUESTIONS[:2]]
    with torch.no_grad():
        man = run_manager(model, texts, [pg.IsouqEpistemic()])
    assert all(v > 0 for v in man.estimations["sequence", "IsouqEpistemic"])


def test_the_classes_are_plain_subclasses_and_the_base_is_not_an_estimator():
    from lm_polygraph.estimators.estimator import Estimator

    from isouq.integrations import polygraph_classes as classes

    for score, name in pg.ESTIMATORS.items():
        cls = getattr(pg, name)
        assert cls is getattr(classes, name) and issubclass(cls, Estimator)
        assert cls.score == score and cls.__module__ == classes.__name__
    with pytest.raises(TypeError, match="base of isouq's estimators; use one of them"):
        pg.IsouqEstimator()


def test_block_profiles_and_a_learned_p_correct_in_the_manager(tiny_llama_dir, tmp_path):
    """The calculator with ``blocks`` writes each answer's profile (summing to its epistemic);
    IsouqPCorrect gives 1 − P(correct) of a calibration reading the profile, as the calibration
    itself gives it on the same rows."""
    from isouq.calibration import Calibrator

    model = whitebox(tiny_llama_dir, False)
    texts = [f"question {q} answer" for q in QUESTIONS]
    calc = pg.load_stat_calculator({"blocks": True})
    hf, tok, instruct = pg.unwrap(model)
    greedy = [tok("the cat sat", add_special_tokens=False)["input_ids"]] * len(texts)
    stats = calc({"greedy_tokens": greedy}, texts, model)
    blocks = np.asarray(stats["isouq_blocks"], dtype=float)
    np.testing.assert_allclose(blocks.sum(1), stats["isouq_epistemic"], rtol=1e-5)
    names = list(stats["isouq_block_names"][0])
    assert names[0] == "model.embed_tokens" and "model.layers.0" in names
    rng = np.random.default_rng(0)
    rows = [{"key": f"k{i}", "model": "m", "correct": bool(rng.random() < 0.5),
             "scores": {"mean_prob": float(rng.uniform(0.1, 0.9)),
                        "epistemic": float(rng.uniform(1, 2))},
             "blocks": {b: float(rng.uniform(0.1, 1)) for b in names}} for i in range(60)]
    path = Calibrator.fit(rows, features=["mean_prob", "blocks"]).save(tmp_path / "c.json")
    est = pg.load_estimator({"score": "p_correct", "calibration": str(path)})
    assert est.needs_blocks
    got = est({"model": model, "input_texts": texts, "greedy_tokens": greedy})
    want = 1 - Calibrator.load(path).predict(pg.stats_rows(stats, len(texts)))
    np.testing.assert_allclose(got, want, rtol=1e-6)


def test_hidden_states_and_a_probe_p_correct_in_the_manager(tiny_llama_dir, tmp_path):
    """The calculator with ``hidden`` writes each answer's mean hidden states; IsouqPCorrect of
    a calibration whose probe reads them computes them itself (calculator: false) and gives
    1 − P(correct) as the calibration gives it on the same rows."""
    from isouq.calibration import Calibrator

    model = whitebox(tiny_llama_dir, False)
    texts = [f"question {q} answer" for q in QUESTIONS]
    hf, tok, instruct = pg.unwrap(model)
    greedy = [tok("the cat sat", add_special_tokens=False)["input_ids"]] * len(texts)
    stats = pg.load_stat_calculator({"hidden": True})({"greedy_tokens": greedy}, texts, model)
    states = stats["isouq_hidden"][0]
    assert list(states)[-1] == "hidden_states[-1]" and len(stats["isouq_hidden"]) == len(texts)
    rng = np.random.default_rng(0)
    rows = []
    for i in range(80):
        h = {n: list(rng.normal(size=len(v))) for n, v in states.items()}
        rows.append({"key": f"k{i}", "model": "m", "hidden": h,
                     "correct": bool(h["hidden_states[-1]"][0] > 0),
                     "scores": {"mean_prob": float(rng.uniform(0.1, 0.9))}})
    path = Calibrator.fit(rows, features=["mean_prob", "hidden"]).save(tmp_path / "c.json")
    est = pg.load_estimator({"score": "p_correct", "calibration": str(path)})
    assert est.needs_hidden
    got = est({"model": model, "input_texts": texts, "greedy_tokens": greedy})
    want = 1 - Calibrator.load(path).predict(pg.stats_rows(stats, len(texts)))
    np.testing.assert_allclose(got, want, rtol=1e-6)


def test_a_p_correct_that_reads_no_gradient_skips_the_backward(tiny_llama_dir, tmp_path):
    """IsouqPCorrect of a calibration on p̄ and the aleatoric score computes the stats with the
    forward pass only (no gradient score in them) and gives what the calibration gives on the
    full scores; an epistemic estimator on the same stats then computes the gradient scores."""
    from isouq.calibration import Calibrator

    model = whitebox(tiny_llama_dir, False)
    texts = [f"question {q} answer" for q in QUESTIONS]
    hf, tok, instruct = pg.unwrap(model)
    greedy = [tok("the cat sat", add_special_tokens=False)["input_ids"]] * len(texts)
    rng = np.random.default_rng(0)
    rows = [{"key": f"k{i}", "model": "m", "correct": bool(rng.random() < 0.5),
             "scores": {"mean_prob": float(rng.uniform(0.1, 0.9)),
                        "aleatoric": float(rng.uniform(0.05, 0.2))}} for i in range(60)]
    path = Calibrator.fit(rows, features=["mean_prob", "aleatoric"]).save(tmp_path / "c.json")
    est = pg.load_estimator({"score": "p_correct", "calibration": str(path)})
    assert not est.needs_backward
    stats = {"model": model, "input_texts": texts, "greedy_tokens": greedy}
    got = est(stats)
    assert stats[pg.METHOD_STAT] == "forward" and np.isnan(stats["isouq_epistemic"]).all()
    full = pg.load_stat_calculator({})({"greedy_tokens": greedy}, texts, model)
    want = 1 - Calibrator.load(path).predict(pg.stats_rows(full, len(texts)))
    np.testing.assert_allclose(got, want, rtol=1e-5)
    epi = pg.load_estimator({"score": "epistemic"})(stats)
    np.testing.assert_allclose(epi, full["isouq_epistemic"], rtol=1e-5)
    assert stats[pg.METHOD_STAT] == "ghost"
