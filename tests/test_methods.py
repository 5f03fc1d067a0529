"""The registry of uncertainty methods for answers: one definition that every user reads."""

import pytest

from isouq.errors import InputError
from isouq.methods import (
    BASELINES,
    METHODS,
    SCORES,
    check_methods,
    check_sampling,
    evaluated_labels,
    evaluated_methods,
)


@pytest.mark.parametrize("name", list(METHODS))
def test_each_method_runs_through_a_function_and_writes_known_scores(name):
    import isouq.study.qa.methods as run

    m = METHODS[name]
    fn = run.RUNNERS[name]  # registered by the QA pipeline, one per method
    assert callable(fn) and fn.__name__ in run.__all__
    assert set(run.RUNNERS) == set(METHODS)
    assert set(m.writes) <= set(SCORES)
    assert all(set(feats) <= set(SCORES) for _, feats in m.evaluated_as)


def test_the_evaluation_and_the_cli_read_the_registry():
    from isouq.cli import build_parser
    from isouq.evaluation.rows import BASELINES as EVAL_BASELINES
    from isouq.evaluation.rows import GRADIENT_METHODS
    from isouq.evaluation.rows import METHODS as EVAL_METHODS

    assert EVAL_METHODS == evaluated_methods()
    assert set(GRADIENT_METHODS) | set(EVAL_BASELINES) == set(EVAL_METHODS)
    assert GRADIENT_METHODS == evaluated_labels(ours=True) and "p̄" in EVAL_BASELINES
    args = build_parser().parse_args(["qa", "run", "--out", "x"])
    assert args.methods == list(METHODS)
    args = build_parser().parse_args(
        ["qa", "short", "--out", "x", "--methods", "gradient", "semantic_entropy",
         "--entailment-model", "nli"])
    assert args.methods == ["gradient", "semantic_entropy"] and args.entailment_model == "nli"
    args = build_parser().parse_args(["ask", "q", "--baselines", *reversed(BASELINES)])
    assert check_methods(args.baselines, among=BASELINES) == list(BASELINES)


def test_unknown_methods_are_named_with_the_choices():
    with pytest.raises(InputError, match="unknown method 'perplexity'; choose from gradient"):
        check_methods(["gradient", "perplexity"])
    with pytest.raises(InputError, match="choose from naive_entropy, semantic_entropy, p_true"):
        check_methods(["gradient"], among=BASELINES)
    assert check_methods(["p_true", "gradient", "p_true"]) == ["gradient", "p_true"]


@pytest.mark.parametrize("names, kw, problem", [
    (["naive_entropy"], dict(k=1, k_p_true=0, temperature=1.0), "at least 2 sampled answers"),
    (["semantic_entropy", "p_true"], dict(k=1, k_p_true=1, temperature=1.0), "semantic_entropy"),
    (["p_true"], dict(k=3, k_p_true=4, temperature=1.0), "k_p_true=4"),
    (["p_true"], dict(k=3, k_p_true=-1, temperature=1.0), "k_p_true=-1"),
    (["naive_entropy"], dict(k=3, k_p_true=0, temperature=0.0), "temperature=0.0"),
])
def test_one_rule_for_the_sampling_settings(names, kw, problem):
    with pytest.raises(InputError, match=problem):
        check_sampling(names, **kw)


def test_settings_of_methods_that_do_not_sample_are_not_checked():
    check_sampling(["gradient"], k=1, k_p_true=9, temperature=0.0)
    check_sampling(["p_true"], k=1, k_p_true=0, temperature=1.0)  # P(True) needs no 2 samples


def test_a_batch_without_a_sampler_says_so():
    from isouq.study.qa.methods import AnswerBatch, run_methods

    batch = AnswerBatch(None, None, ["q"], ["q"], ["a"], [[1]])
    with pytest.raises(InputError, match="need sampled answers"):
        run_methods(batch, ["naive_entropy"])
