"""Span scores (isouq.spans): the splitters, token ↔ character mapping, exactness against a
brute-force backward per span on several model families, and one-line errors for bad spans."""

from __future__ import annotations

import pytest
import torch

import isouq
import tiny
from isouq.errors import InputError
from isouq.sequences import encode
from isouq.spans import (
    SpanSequenceScores,
    _assign,
    answer_offsets,
    resolve_spans,
    split_lines,
    split_sentences,
)

PROMPTS = ["what is the capital of france", "who wrote hamlet", "why is the sky blue"]
ANSWERS = [
    "paris is the capital. the cat sat on the mat! why no",
    "shakespeare wrote hamlet.\nthe moon is made of cheese? yes because the rock",
    "because the sky is blue. a dog sat. no",
]


def texts(text, ranges):
    return [text[a:b] for a, b in ranges]


# ------------------------------------------------------------------ splitters
@pytest.mark.parametrize("text, want", [
    ("Paris is the capital. It is large!  Is it? Yes…", ["Paris is the capital.", "It is large!",
                                                       "Is it?", "Yes…"]),
    ("It costs 3.14 dollars, e.g. in Paris. Dr. Who said so.",
     ["It costs 3.14 dollars, e.g. in Paris.", "Dr. Who said so."]),
    ("J. K. Rowling wrote it. The U.S. agreed.", ["J. K. Rowling wrote it.", "The U.S. agreed."]),
    ("Steps:\n1. Boil water.\n2. Add tea.", ["Steps:", "1. Boil water.", "2. Add tea."]),
    ("He was born in 1564. He died later.", ["He was born in 1564.", "He died later."]),
    ("Made in the U.S. It sold. The U.S. dollar fell, etc. and No. 5 won at 5 p.m. Then a fig. "
     "Fig. 3 shows it.", ["Made in the U.S.", "It sold.",
                          "The U.S. dollar fell, etc. and No. 5 won at 5 p.m.", "Then a fig.",
                          "Fig. 3 shows it."]),
    ('She said "no." Then she left.', ['She said "no."', "Then she left."]),
    ("no final stop", ["no final stop"]),
    ("  \n ", []),
])
def test_split_sentences(text, want):
    got = split_sentences(text)
    assert texts(text, got) == want
    assert all(text[a:b] == text[a:b].strip() for a, b in got)


def test_split_lines():
    text = "first line\n\n  second  \nthird"
    assert texts(text, split_lines(text)) == ["first line", "second", "third"]


# ------------------------------------------------------------------ tokens ↔ characters
def test_a_token_goes_where_its_first_non_blank_character_is():
    text = "Yes. No. Maybe"
    ranges = split_sentences(text)  # (0, 4), (5, 8), (9, 14)
    # " No" begins with a blank: it goes to "No."; ". M" straddles: it goes where "." is
    offsets = [(0, 3), (3, 4), (4, 7), (7, 10), (10, 14)]
    assert _assign(text, offsets, ranges) == [[0, 1], [2, 3], [4]]
    # a blank-only token between spans enters no span; one inside a span stays there
    assert _assign("a b  c", [(0, 1), (1, 2), (2, 3), (3, 5), (5, 6)], [(0, 3), (5, 6)]) == \
        [[0, 1, 2], [4]]


def bpe_tokenizer():
    """A byte-level BPE tokenizer (GPT-2's scheme) trained on the spot: tokens that carry their
    leading blank, punctuation, line breaks, characters of several bytes."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=320, special_tokens=["[PAD]", "[BOS]", "[EOS]"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tk.train_from_iterator([*BPE_ANSWERS, *PROMPTS] * 5, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tk, pad_token="[PAD]", bos_token="[BOS]",
                                   eos_token="[EOS]")


BPE_ANSWERS = ["Paris is the capital. It has a café ✓!\nThe Seine runs through it.",
               "Shakespeare wrote Hamlet, e.g. in 1600. Dr. Who did not."]


def bpe_llama(vocab: int):
    import transformers as tf

    torch.manual_seed(0)
    cfg = tf.LlamaConfig(vocab_size=vocab, hidden_size=16, intermediate_size=32,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         pad_token_id=0, bos_token_id=1, eos_token_id=2)
    return tf.LlamaForCausalLM(cfg).eval()


def test_offsets_of_text_and_of_token_ids_agree():
    tok = bpe_tokenizer()
    for ans in BPE_ANSWERS:
        ids = encode(tok, [PROMPTS[0]], [ans])[0].answer
        text, off = answer_offsets(tok, ans, ids)
        assert text == ans and len(off) == len(ids)
        dtext, doff = answer_offsets(tok, ids, ids)  # token ids: the decoded text
        assert dtext == ans and len(doff) == len(ids)
        a = resolve_spans(tok, [ans], "sentences")[0]
        b = resolve_spans(tok, [ids], "sentences")[0]
        assert a.ranges == b.ranges and a.tokens == b.tokens
    a = resolve_spans(tok, BPE_ANSWERS, "sentences")
    assert [texts(r.text, r.ranges) for r in a] == [
        ["Paris is the capital.", "It has a café ✓!", "The Seine runs through it."],
        ["Shakespeare wrote Hamlet, e.g. in 1600.", "Dr. Who did not."]]
    # every token of an answer is in one sentence, except the blanks between them
    for r, ans in zip(a, BPE_ANSWERS, strict=True):
        ids = encode(tok, [PROMPTS[0]], [ans])[0].answer
        got = sorted(t for tk in r.tokens for t in tk)
        assert got == sorted(set(got)) and got[0] == 0 and got[-1] == len(ids) - 1


def test_span_scores_with_a_byte_level_bpe_tokenizer():
    tok = bpe_tokenizer()
    model = bpe_llama(len(tok))
    res = isouq.score_sequences(model, tok, PROMPTS[:2], BPE_ANSWERS, spans="sentences")
    resolved = resolve_spans(tok, BPE_ANSWERS, "sentences")
    for i, ans in enumerate(BPE_ANSWERS):
        for s, toks in zip(res.spans[i], resolved[i].tokens, strict=True):
            epi, mean, _ = brute_span(model, tok, PROMPTS[i], ans, toks)
            assert s.epistemic == pytest.approx(epi, rel=1e-5)
            assert s.mean_prob == pytest.approx(mean, rel=1e-5)


# ------------------------------------------------------------------ exactness
def brute_span(model, tok, prompt, answer, tokens):
    """(‖∇θ p̄‖², p̄, aleatoric) of the answer tokens ``tokens``, from the whole (prompt,
    answer) row alone, by autograd over every parameter."""
    e = encode(tok, [prompt], [answer])[0]
    ids = torch.tensor([e.prompt + e.answer])
    params = [p for p in model.parameters()]
    flags = [p.requires_grad for p in params]
    for p in params:
        p.requires_grad_(True)
    try:
        logits = model(input_ids=ids).logits[0].float()
        P = len(e.prompt)
        lp = torch.log_softmax(logits[P - 1:-1], -1).gather(1, ids[0, P:, None])[:, 0]
        pk = lp.exp()[list(tokens)]
        mean = pk.mean()
        gs = torch.autograd.grad(mean, params, allow_unused=True)
    finally:
        for p, f in zip(params, flags, strict=True):
            p.requires_grad_(f)
    sq = sum(float(g.double().pow(2).sum()) for g in gs if g is not None)
    pk = pk.detach()
    return sq, float(mean.detach()), float((pk * (1 - pk)).mean())


@pytest.mark.filterwarnings("ignore:isouq ghost norms")  # OPT's position embedding: fallback
@pytest.mark.parametrize("family", ["llama", "llama-tied", "gpt2", "gpt_neox", "qwen2",
                                    "gemma3", "opt", "phi3"])
def test_span_scores_match_a_brute_force_backward_per_span(family):
    tok, model = tiny.tokenizer(), tiny.causal_lm(family)
    res = isouq.score_sequences(model, tok, PROMPTS, ANSWERS, spans="sentences", batch_size=2)
    assert isinstance(res, SpanSequenceScores)
    resolved = resolve_spans(tok, ANSWERS, "sentences")
    for i, (p, a) in enumerate(zip(PROMPTS, ANSWERS, strict=True)):
        assert len(res.spans[i]) == len(resolved[i].tokens) == 3
        for s, toks in zip(res.spans[i], resolved[i].tokens, strict=True):
            epi, mean, alea = brute_span(model, tok, p, a, toks)
            assert s.epistemic == pytest.approx(epi, rel=1e-5), (family, i, s.text)
            assert s.mean_prob == pytest.approx(mean, rel=1e-5)
            assert s.aleatoric == pytest.approx(alea, rel=1e-5)
            assert s.epistemic_log == pytest.approx(epi / mean**2, rel=1e-5)
            assert s.n_tokens == len(toks)
            assert a[s.start:s.end] == s.text
        epi, mean, _ = brute_span(model, tok, p, a, range(int(res.n_tokens[i])))
        assert float(res.epistemic[i]) == pytest.approx(epi, rel=1e-5)


def test_whole_answer_scores_are_unchanged_and_loop_agrees():
    tok, model = tiny.tokenizer(), tiny.causal_lm("llama")
    plain = isouq.score_sequences(model, tok, PROMPTS, ANSWERS, per_param=True)
    res = isouq.score_sequences(model, tok, PROMPTS, ANSWERS, spans="sentences", per_param=True)
    for f in ("epistemic", "aleatoric", "mean_prob", "per_param"):
        torch.testing.assert_close(getattr(res, f), getattr(plain, f), rtol=1e-5, atol=0)
    assert torch.equal(res.n_tokens, plain.n_tokens)
    assert res.params == plain.params and res.row_scores(1) == pytest.approx(plain.row_scores(1))
    assert res.extra["span_strategy"] == "retain"
    loop = isouq.score_sequences(model, tok, PROMPTS, ANSWERS, spans="sentences", method="loop")
    rows = isouq.score_sequences(model, tok, PROMPTS, ANSWERS, spans="sentences",
                                 span_strategy="rows", batch_size=2)
    assert loop.extra["span_strategy"] == rows.extra["span_strategy"] == "rows"
    for a, b, c in zip(res.spans, loop.spans, rows.spans, strict=True):
        for x, y, z in zip(a, b, c, strict=True):
            assert x.epistemic == pytest.approx(y.epistemic, rel=1e-5)
            assert x.epistemic == pytest.approx(z.epistemic, rel=1e-5)
            assert (x.mean_prob, x.n_tokens) == pytest.approx((z.mean_prob, z.n_tokens), rel=1e-6)
    torch.testing.assert_close(rows.epistemic, plain.epistemic, rtol=1e-5, atol=0)
    with pytest.raises(InputError, match="span_strategy='retain' runs ghost backwards"):
        isouq.score_sequences(model, tok, PROMPTS, ANSWERS, spans="sentences",
                              span_strategy="retain", method="per_example")


def test_batch_size_and_padding_never_change_a_span_score():
    tok, model = tiny.tokenizer(), tiny.causal_lm("gpt2")
    one = isouq.score_sequences(model, tok, PROMPTS, ANSWERS, spans="lines", batch_size=1)
    all_ = isouq.score_sequences(model, tok, PROMPTS, ANSWERS, spans="lines", batch_size=3,
                                 padding_side="right")
    for a, b in zip(one.spans, all_.spans, strict=True):
        for x, y in zip(a, b, strict=True):
            assert (x.text, x.start, x.end, x.n_tokens) == (y.text, y.start, y.end, y.n_tokens)
            assert x.epistemic == pytest.approx(y.epistemic, rel=1e-5)


def test_character_ranges_in_the_given_order():
    tok, model = tiny.tokenizer(), tiny.causal_lm("qwen2")
    a = ANSWERS[0]  # "paris is the capital. the cat sat on the mat! why no"
    claims = [[(22, 45), (0, 5)]]  # "the cat sat on the mat!", "paris"
    res = isouq.score_sequences(model, tok, PROMPTS[:1], [a], spans=claims)
    assert [s.text for s in res.spans[0]] == ["the cat sat on the mat!", "paris"]
    resolved = resolve_spans(tok, [a], claims)[0]
    for s, toks in zip(res.spans[0], resolved.tokens, strict=True):
        assert s.epistemic == pytest.approx(brute_span(model, tok, PROMPTS[0], a, toks)[0],
                                            rel=1e-5)
    d = res.row_spans(0)[1]
    assert {k: d[k] for k in ("text", "start", "end")} == {"text": "paris", "start": 0, "end": 5}
    assert set(d["scores"]) == set(res.row_scores(0)) and d["n_tokens"] == 1


# ------------------------------------------------------------------ bad input
@pytest.mark.parametrize("spans, words", [
    ([[(0, 99)]], ["answer 0", "outside", "≤ 52"]),
    ([[(5, 5)]], ["answer 0", "empty"]),
    ([[(9, 5)]], ["answer 0", "empty"]),
    ([[(5, 6)]], ["answer 0", "empty"]),  # a blank only
    ([[(0, 10), (6, 20)]], ["answer 0", "overlap", "disjoint"]),
    ([[]], ["answer 0", "no spans"]),
    ([[(0, 5)], [(0, 3)]], ["2 for 1 answers"]),
    ("paragraphs", ["not one of sentences, lines"]),
    ([[(1, 3)]], ["answer 0", "no token of its own", "widen"]),  # inside "paris"
    ([["a", 3]], ["answer 0", "not a (start, end) pair"]),
])
def test_bad_spans_are_one_line_naming_the_answer_and_the_fix(spans, words):
    tok, model = tiny.tokenizer(), tiny.causal_lm("llama")
    with pytest.raises(InputError) as e:
        isouq.score_sequences(model, tok, PROMPTS[:1], ANSWERS[:1], spans=spans)
    msg = str(e.value)
    assert "\n" not in msg and all(w in msg for w in words), msg


def test_a_splitter_that_finds_no_sentence_names_the_key():
    tok = tiny.tokenizer()
    with pytest.raises(InputError, match=r"answer 'q7': the sentences splitter found no "
                                         r"sentence.*without spans"):
        resolve_spans(tok, ["   "], "sentences", keys=["q7"])


# ------------------------------------------------------------------ where users see answers
def test_cli_knows_the_splitters():
    from isouq.cli import SPAN_SPLITTERS
    from isouq.spans import SPLITTERS

    assert SPAN_SPLITTERS == SPLITTERS


def test_score_cli_writes_a_spans_list_per_row(tiny_llama_dir, tmp_path, capsys):
    import json

    from isouq.cli import main
    from isouq.runio import read_jsonl

    inp = tmp_path / "in.jsonl"
    rows = [{"id": "a", "prompt": PROMPTS[0], "answer": ANSWERS[0]},
            {"id": "b", "question": PROMPTS[1], "answer": ANSWERS[1]},
            {"id": "blank", "prompt": PROMPTS[2], "answer": "[UNK]"}]
    inp.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "out.jsonl"
    argv = ["score", str(inp), "--out", str(out), "--model", str(tiny_llama_dir),
            "--spans", "sentences"]
    html = tmp_path / "answers.html"
    assert main([*argv, "--html", str(html)]) == 0
    page = html.read_text()
    assert page.count('class="s') == 7 and "paris is the capital.</span> <span" in page
    got = {r["key"]: r for r in read_jsonl(out)}
    assert [s["text"] for s in got["a"]["spans"]] == ["paris is the capital.",
                                                     "the cat sat on the mat!", "why no"]
    assert len(got["b"]["spans"]) == 3 and len(got["blank"]["spans"]) == 1
    model, tok = tiny.causal_lm("llama-tied"), tiny.tokenizer()
    ref = isouq.score_sequences(model, tok, [PROMPTS[0]], [ANSWERS[0]], spans="sentences")
    for s, r in zip(got["a"]["spans"], ref.row_spans(0), strict=True):
        assert s["scores"]["epistemic"] == pytest.approx(r["scores"]["epistemic"], rel=1e-5)
        assert (s["start"], s["end"], s["n_tokens"]) == (r["start"], r["end"], r["n_tokens"])
    assert got["a"]["scores"]["epistemic"] == pytest.approx(float(ref.epistemic[0]), rel=1e-5)
    # another splitter on the same --out is a resume with other settings: refused
    assert main([*argv[:-1], "lines"]) == 2
    assert "spans" in capsys.readouterr().err


def test_score_cli_spans_of_token_id_answers_index_their_decoded_text(tiny_llama_dir, tmp_path):
    import json

    from isouq.cli import main
    from isouq.runio import read_jsonl

    inp = tmp_path / "in.jsonl"
    inp.write_text(json.dumps({"id": "k1", "prompt": "who wrote hamlet", "answer": [5, 6]})
                   + "\n" + json.dumps({"id": "k2", "prompt": "who", "answer": "yes. no."})
                   + "\n")
    out = tmp_path / "out.jsonl"
    assert main(["score", str(inp), "--out", str(out), "--model", str(tiny_llama_dir),
                 "--spans", "lines"]) == 0
    got = {r["key"]: r for r in read_jsonl(out)}
    assert len(got["k1"]["spans"]) == 1 and len(got["k2"]["spans"]) == 1


def test_ask_spans_prints_each_sentence_and_writes_html(tiny_llama_dir, tmp_path, capsys):
    from isouq.cli import main

    html = tmp_path / "answers.html"
    assert main(["ask", "--model", str(tiny_llama_dir), "--max-new-tokens", "6", "--spans",
                 "--html", str(html), *PROMPTS[:2]]) == 0
    out = capsys.readouterr().out
    assert "epi. log" in out and "sentence" in out and "who wrote hamlet" in out
    page = html.read_text()
    assert page.startswith("<!doctype html>") and "epistemic_log" in page
    assert page.count('class="s') >= 2 and "<script" not in page


def test_html_needs_spans(capsys, tmp_path):
    from isouq.cli import main

    assert main(["ask", "--html", "x.html", "who wrote hamlet"]) == 2
    assert "add --spans" in capsys.readouterr().err
    (tmp_path / "in.jsonl").write_text('{"prompt": "who", "answer": "yes"}\n')
    assert main(["score", str(tmp_path / "in.jsonl"), "--out", str(tmp_path / "o.jsonl"),
                 "--html", "x.html"]) == 2
    assert "add --spans" in capsys.readouterr().err


def test_ask_rows_carry_the_span_scores_of_their_tokens():
    from isouq.ask import answer_and_score
    from isouq.llm.generation import generate_greedy
    from isouq.llm.prompts import qa_prompts

    model, tok = tiny.causal_lm("llama-tied"), tiny.tokenizer()
    rows = answer_and_score(model, tok, PROMPTS, max_new_tokens=6, batch_size=2,
                            spans="sentences")
    prompts = qa_prompts(tok, PROMPTS)
    gens = generate_greedy(model, tok, prompts, max_new_tokens=6)
    for r, p, g in zip(rows, prompts, gens, strict=True):
        if not g.token_ids:
            assert r["spans"] == []
            continue
        ref = isouq.score_sequences(model, tok, [p], [g.token_ids], spans="sentences")
        assert [s["text"] for s in r["spans"]] == [s.text for s in ref.spans[0]]
        assert r["spans"][0]["scores"]["epistemic"] == pytest.approx(ref.spans[0][0].epistemic,
                                                                     rel=1e-5)
        assert "spans" in r["seconds"]


def test_spans_page_shades_spans_by_the_default_span_score():
    from isouq.defaults import SPAN_SCORE
    from isouq.study.report.spans import LEGEND, shades, spans_page

    def sp(text, start, v):
        return {"text": text, "start": start, "end": start + len(text), "n_tokens": 1,
                "scores": {"epistemic_log": v, "epistemic": v, "aleatoric": v / 1000,
                           "mean_prob": 1 - v / 1000}}

    row = {"key": "0", "question": "q <b>?", "answer": "One. Two. Three.",
           "spans": [sp("One.", 0, 1.0), sp("Two.", 5, 100.0), sp("Three.", 10, 50.5)]}
    assert SPAN_SCORE in LEGEND
    assert shades(row["spans"]) == pytest.approx([0.0, 1.0, 0.5])
    assert shades(row["spans"], "epistemic_log") == pytest.approx([0.0, 1.0, 0.8516], abs=1e-4)
    assert shades(row["spans"], "mean_prob") == pytest.approx([0.0, 1.0, 0.5])  # low p̄: dark
    page = spans_page([row])
    assert "q &lt;b&gt;?" in page and page.count('class="s') == 3
    assert 'class="s worst"' in page and "One.</span> <span" in page
