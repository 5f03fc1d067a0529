"""Graph capture, opt-in (``score_sequences(..., compile=True)``, ``isouq.capture``): its four
checks each able to fail, a refusal in one line naming the check, and, where they pass, the
captured backward's scores equal to brute-force per-example gradients."""

from __future__ import annotations

import pytest
import torch

import isouq
import tiny
from isouq import capture
from isouq.errors import CaptureRefused
from isouq.tokens import Encoded

PROMPTS = ["what is the capital of france", "who wrote hamlet"]
ANSWERS = ["paris", "shakespeare wrote hamlet"]


def test_same_sequence_tells_shapes_apart():
    x = torch.randn(4, 3)
    assert capture.same_sequence(lambda: x * 2, lambda: x * 3).passed
    v = capture.same_sequence(lambda: x[:2] * 2, lambda: x[:3] * 2)
    assert not v.passed and "aten.slice" in v.detail and "(2, 3)" in v.detail


def test_no_host_read_sees_item_and_masks_but_not_the_skipped_module():
    x = torch.randn(5)
    assert capture.no_host_read(lambda: x.exp()).passed
    v = capture.no_host_read(lambda: (float(x.sum()), x[x > 0]))
    assert not v.passed and "_local_scalar_dense ×1" in v.detail and "index ×1" in v.detail

    class Reads(torch.nn.Module):
        def forward(self, t):
            return t * float(t.max())

    m = Reads()
    assert not capture.no_host_read(lambda: m(x)).passed
    assert capture.no_host_read(lambda: m(x), skip=m).passed


def test_no_graph_break_names_the_break_in_a_backward_hook():
    from isouq.passes import captured

    def backward(hook):
        w = torch.randn(3, requires_grad=True)
        y = w * 2
        y.register_hook(hook)
        with captured():
            y.sum().backward()

    def breaks(g):
        return g * len(globals())  # a builtin dynamo cannot trace

    v = capture.no_graph_break(lambda: backward(breaks))
    assert not v.passed and "globals" in v.detail
    assert capture.no_graph_break(lambda: backward(lambda g: g * 2)).passed


def test_exact_compares_scores():
    a = torch.tensor([1.0, 2.0])
    assert capture.exact(a, a * (1 + 1e-7)).passed
    assert "differ by up to 0.1" in capture.exact(a, a * 1.1).detail


def test_the_two_batches_share_a_bucket_and_differ():
    enc = [Encoded([2, 5, 6], [7, 8, 9]), Encoded([2, 5], [7])]
    a, b = capture.bucket_pairs(enc, 2)
    assert [e.length for e in a] == [e.length for e in reversed(b)]
    assert b[1].answer == [8, 9] and b[1].prompt == [2, 5, 6, 7]


@pytest.mark.parametrize("kw, words", [({"spans": "sentences"}, "without spans"),
                                       ({"method": "per_example"}, "method='ghost'")])
def test_compile_refuses_what_it_does_not_capture(kw, words):
    model, tok = tiny.causal_lm("llama"), tiny.tokenizer()
    with pytest.raises(CaptureRefused, match=words) as e:
        isouq.score_sequences(model, tok, PROMPTS, ANSWERS, compile=True, **kw)
    assert "\n" not in str(e.value) and "score without compile=True" in str(e.value)


def test_a_failing_check_refuses_in_one_line_naming_it(monkeypatch):
    """The refusal names the check and what it found (here the bucket check, made to see a
    difference)."""
    model, tok = tiny.causal_lm("llama"), tiny.tokenizer()
    monkeypatch.setattr(capture, "bucket_pairs", lambda enc, rows: (list(enc[:rows]),
                                                                    list(enc[:1])))
    with pytest.raises(CaptureRefused, match="the same_sequence check failed") as e:
        isouq.score_sequences(model, tok, PROMPTS, ANSWERS, compile=True)
    assert "\n" not in str(e.value)


def test_where_the_checks_pass_the_captured_scores_are_exact():
    """A one-layer Llama: every check passes, compile=True is offered, and its scores equal
    one autograd backward per answer (the paper's way)."""
    import transformers as tf

    torch.manual_seed(0)
    cfg = tf.LlamaConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=4, num_key_value_heads=2, vocab_size=tiny.VOCAB,
                         pad_token_id=0, bos_token_id=2, eos_token_id=3)
    model, tok = tf.LlamaForCausalLM(cfg).eval(), tiny.tokenizer()
    got = isouq.score_sequences(model, tok, PROMPTS, ANSWERS, compile=True)
    (verdicts,) = capture._VERDICTS[model].values()
    assert [v.check for v in verdicts] == list(capture.CHECKS) and all(v.passed for v in verdicts)
    ref = isouq.score_sequences(model, tok, PROMPTS, ANSWERS, method="per_example")
    torch.testing.assert_close(got.epistemic, ref.epistemic, rtol=1e-5, atol=0)
    torch.testing.assert_close(got.mean_prob, ref.mean_prob, rtol=1e-6, atol=0)
    # the next call of the bucket reuses the captured graph: no check, no compile again
    from torch._dynamo.utils import counters

    graphs = counters["stats"]["unique_graphs"]
    again = isouq.score_sequences(model, tok, PROMPTS, ANSWERS, compile=True)
    assert counters["stats"]["unique_graphs"] == graphs
    torch.testing.assert_close(again.epistemic, ref.epistemic, rtol=1e-5, atol=0)


def test_isouq_score_compile_refuses_in_one_line(tiny_llama_dir, tmp_path, capsys):
    """``isouq score --compile`` where capture is not offered (span scores): exit status 2 and
    one line naming why; no row is written as failed."""
    from isouq.cli import main

    inp = tmp_path / "in.jsonl"
    inp.write_text("".join(f'{{"key": "{i}", "prompt": "what is the cat", "answer": '
                           f'"the cat sat. the dog sat."}}\n' for i in range(2)))
    out = tmp_path / "out.jsonl"
    code = main(["score", str(inp), "--out", str(out), "--model", str(tiny_llama_dir),
                 "--spans", "sentences", "--compile"])
    said = [ln for ln in capsys.readouterr().err.splitlines() if "compile=True" in ln]
    assert code == 2 and len(said) == 1 and "without spans" in said[0]
    assert not out.exists() or not out.read_text().strip()
