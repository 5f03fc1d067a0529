"""`isouq ask --baselines`: the QA study's sampling baselines on the user's own questions."""

import json
import math

import pytest

from isouq.ask import answer_and_score
from isouq.cli import main
from isouq.llm.prompts import qa_prompts

QUESTIONS = ["What is the capital of France?", "Who wrote Hamlet?", "What colour is the sky?"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, tiny_lm, tok):
    d = tmp_path_factory.mktemp("tinyllama")
    tiny_lm.save_pretrained(d)
    tok.save_pretrained(d)
    return d


class ConstantJudge:
    """An entailment judge that gives every pair the same NLI label."""

    def __new__(cls, label):
        from isouq.study.qa.baselines.semantic_entropy import EntailmentJudge

        class Judge(EntailmentJudge):
            name = f"constant-{label}"

            def predict_labels(self, items):
                return [label] * len(items)

        return Judge()


def test_baselines_come_from_one_seeded_sample_set(tiny_lm, tok):
    from isouq.llm.generation import sample_completions
    from isouq.study.qa.baselines.p_true import p_true
    from isouq.study.qa.baselines.semantic_entropy import CONTRADICTION, ENTAILMENT

    model = tiny_lm
    kw = dict(k=4, k_p_true=2, max_new_tokens=5, seed=3)
    sampled = sample_completions(model, tok, qa_prompts(tok, QUESTIONS), k=4, seed=3,
                                 keys=QUESTIONS, max_new_tokens=5)
    rows = answer_and_score(model, tok, QUESTIONS,
                            baselines=["p_true", "semantic_entropy", "naive_entropy"],
                            judge=ConstantJudge(CONTRADICTION), **kw)
    pt = p_true(model, tok, QUESTIONS, [r["answer"] for r in rows], brainstormed=sampled, k=2)
    for r, s, want in zip(rows, sampled, pt, strict=True):
        assert r["samples"] == s.texts
        lps = [c.mean_logprob for c in s.completions]
        assert r["scores"]["naive_entropy"] == pytest.approx(-sum(lps) / len(lps), rel=1e-6)
        assert r["scores"]["p_true"] == pytest.approx(want.value, rel=1e-6)
        assert 0 <= r["scores"]["p_true"] <= 1
        # never-equivalent judge: one meaning per distinct text, p(text) ∝ Σ exp(ℓ_k)
        mass: dict[str, float] = {}
        for t, lp in zip(s.texts, lps, strict=True):
            mass[t] = mass.get(t, 0.0) + math.exp(lp)
        total = sum(mass.values())
        brute = -sum(m / total * math.log(m / total) for m in mass.values())
        assert r["scores"]["semantic_entropy"] == pytest.approx(brute, rel=1e-6, abs=1e-12)
        assert len(set(r["semantic_clusters"])) == len(mass)
        assert set(r["seconds"]) >= {"naive_entropy", "semantic_entropy", "p_true"}
    again = answer_and_score(model, tok, QUESTIONS, baselines=["semantic_entropy"],
                             judge=ConstantJudge(ENTAILMENT), **kw)
    assert all(r["scores"]["semantic_entropy"] == 0 and set(r["semantic_clusters"]) == {0}
               for r in again)
    assert all("p_true" not in r["scores"] for r in again)


def test_cli_baselines_json_and_table(model_dir, capsys):
    base = ["ask", "--model", str(model_dir), "--max-new-tokens", "4",
            "--baselines", "naive_entropy", "p_true", "--k", "3", "--k-p-true", "2"]
    assert main([*base, "--json", *QUESTIONS[:2]]) == 0
    got = [json.loads(line) for line in capsys.readouterr().out.splitlines()
           if line.startswith("{")]
    assert len(got) == 2 and all(len(r["samples"]) == 3 and 0 <= r["scores"]["p_true"] <= 1
                                 and r["scores"]["naive_entropy"] >= 0 for r in got)
    assert all("semantic_entropy" not in r["scores"] for r in got)
    assert main([*base, QUESTIONS[0]]) == 0
    out = capsys.readouterr().out
    assert "naive H" in out and "P(True)" in out and "entropy of K sampled answers" in out



def test_entailment_model_not_installed_is_said_before_any_model_loads(model_dir, capsys,
                                                                        monkeypatch):
    import isouq.models
    import tiny

    loaded = []
    monkeypatch.setattr(isouq.models, "load_model", lambda *a, **k: loaded.append(a))
    name = tiny.absent_registry_model(monkeypatch)
    assert main(["ask", QUESTIONS[0], "--model", str(model_dir), "--baselines",
                 "semantic_entropy", "--entailment-model", name]) == 2
    err = capsys.readouterr().err
    assert f"'{name}' is not installed" in err and "Traceback" not in err
    assert loaded == []
