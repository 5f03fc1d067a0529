"""--quantize, --adapter and the placement options on the study commands that load a model
(``isouq qa mc``, ``qa run``, ``qa short``, ``qa long``) and on ``isouq demo``: the options reach
the model under study, its rows record them, a resume with others is refused."""

from __future__ import annotations

import hashlib
import json
import shutil

import pytest
import torch

from isouq.cli import main
from isouq.data.pairs import content_sha
from isouq.errors import InputError
from isouq.runio import read_jsonl
from isouq.study.qa import mc
from isouq.study.qa.runner import QAConfig, QARunner

from .conftest import _build_tokenizer
from .test_qa_mc import brute_force

MC = [("What is the capital of France?", ["Paris", "London", "blue"], 0),
      ("Who wrote Hamlet?", ["William Shakespeare", "Paris", "True"], 0)]


@pytest.fixture(scope="module")
def lm_dir(tmp_path_factory):
    """A tiny random Llama whose quantized layers have multiples of 64 inputs and of 32 outputs
    (what bitsandbytes' CPU kernel needs once it packs the weights for a forward without
    gradients)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    tok = _build_tokenizer()  # the QA tests' BPE tokenizer: P(True)'s A and B are tokens
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=128, bos_token_id=tok.bos_token_id,
                      eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                      tie_word_embeddings=False)
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():  # sharper next-token distributions than N(0, 0.02)
        model.lm_head.weight.normal_(0, 1.0)
    d = tmp_path_factory.mktemp("lm")
    model.save_pretrained(d)
    tok.save_pretrained(d)
    return d


def _adapter(lm_dir, where, seed: int):
    peft = pytest.importorskip("peft")
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    cfg = peft.LoraConfig(r=2, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    peft.get_peft_model(AutoModelForCausalLM.from_pretrained(lm_dir), cfg).save_pretrained(where)
    return where


@pytest.fixture
def mc_file(tmp_path):
    rows = [{"question": q, "mc1_targets": {o: int(i == lab) for i, o in enumerate(opts)}}
            for q, opts, lab in MC]
    path = tmp_path / "mc.json"
    path.write_text(json.dumps(rows))
    return path


def _mc(lm_dir, out, mc_file, *extra):
    return main(["qa", "mc", "--model", str(lm_dir), "--out", str(out), "--data", str(mc_file),
                 *extra])


def _option_probs(model, tok, rows):
    return [[brute_force(model, tok, r["prompt"], c)[0] for c in r["options"]] for r in rows]


def test_qa_mc_quantize_4bit_is_applied_recorded_and_a_resume_with_another_refused(
        lm_dir, mc_file, tmp_path, capsys):
    """The rows' option probabilities are those of the model transformers loads in 4-bit
    itself (not the float one); settings and run.json say 4bit; a resume with --quantize 8bit
    or without --quantize is refused in one line naming the setting."""
    pytest.importorskip("bitsandbytes")
    from transformers import AutoModelForCausalLM, AutoTokenizer, BitsAndBytesConfig

    out = tmp_path / "out"
    assert _mc(lm_dir, out, mc_file, "--quantize", "4bit") == 0
    rows = read_jsonl(mc.rows_path(out, str(lm_dir)))
    assert len(rows) == 2 and all(r["settings"]["quantize"] == "4bit" for r in rows)
    run = json.loads(mc.rows_path(out, str(lm_dir)).with_suffix(".run.json").read_text())
    assert run["settings"]["quantize"] == "4bit"
    assert "bitsandbytes 4bit" in run["model_info"]["quantization"]

    tok = AutoTokenizer.from_pretrained(lm_dir)
    q4 = AutoModelForCausalLM.from_pretrained(
        lm_dir, device_map={"": "cpu"}, quantization_config=BitsAndBytesConfig(
            load_in_4bit=True, bnb_4bit_quant_type="nf4",
            bnb_4bit_compute_dtype=torch.float32)).eval()
    for m in q4.modules():  # the weights as loaded (no repacking for the CPU kernel)
        if hasattr(m, "support_avx512bf16_for_cpu"):
            m.support_avx512bf16_for_cpu = False
    want = _option_probs(q4, tok, rows)
    full = _option_probs(AutoModelForCausalLM.from_pretrained(lm_dir).eval(), tok, rows)
    for r, w, f in zip(rows, want, full, strict=True):
        assert r["option_mean_prob"] == pytest.approx(w, rel=1e-4)
        assert r["option_mean_prob"] != pytest.approx(f, rel=1e-4)  # the 4-bit model, indeed

    before = mc.rows_path(out, str(lm_dir)).read_text()
    capsys.readouterr()
    for other, shown in ((["--quantize", "8bit"], "('4bit', '8bit')"), ([], "('4bit', None)")):
        assert _mc(lm_dir, out, mc_file, "--limit", "1", *other) == 2
        err = capsys.readouterr().err.strip()
        assert "other settings" in err and f"'quantize': {shown}" in err and "\n" not in err
    assert mc.rows_path(out, str(lm_dir)).read_text() == before


def test_qa_mc_adapter_is_applied_recorded_by_content_and_resumes_from_a_copy(
        lm_dir, mc_file, tmp_path, capsys):
    """--adapter: the option probabilities are the PEFT model's; the rows record the adapter's
    digest, run.json its folder and its files' SHA-256; the same adapter copied elsewhere
    resumes (nothing recomputed), another adapter is refused."""
    peft = pytest.importorskip("peft")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from isouq.models.files import sha256_file

    ad = _adapter(lm_dir, tmp_path / "adapter", seed=1)
    out = tmp_path / "out"
    assert _mc(lm_dir, out, mc_file, "--adapter", str(ad)) == 0
    path = mc.rows_path(out, str(lm_dir))
    rows = read_jsonl(path)
    files = {n: sha256_file(ad / n) for n in ("adapter_config.json",
                                             "adapter_model.safetensors")}
    assert all(r["settings"]["adapter_sha256"] == content_sha(files) for r in rows)
    assert "quantize" not in rows[0]["settings"]
    info = json.loads(path.with_suffix(".run.json").read_text())["model_info"]
    assert info["adapter"] == str(ad)
    assert info["files"][str(ad / "adapter_model.safetensors")] == \
        files["adapter_model.safetensors"]

    tok = AutoTokenizer.from_pretrained(lm_dir)
    lm = peft.PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(lm_dir),
                                        str(ad)).eval()
    base = AutoModelForCausalLM.from_pretrained(lm_dir).eval()
    for r, w, b in zip(rows, _option_probs(lm, tok, rows), _option_probs(base, tok, rows),
                       strict=True):
        assert r["option_mean_prob"] == pytest.approx(w, rel=1e-5)
        assert r["option_mean_prob"] != pytest.approx(b, rel=1e-5)

    before = path.read_text()
    copy = shutil.copytree(ad, tmp_path / "elsewhere")
    assert _mc(lm_dir, out, mc_file, "--adapter", str(copy)) == 0
    assert path.read_text() == before
    other = _adapter(lm_dir, tmp_path / "other", seed=2)
    capsys.readouterr()
    assert _mc(lm_dir, out, mc_file, "--adapter", str(other)) == 2
    assert "'adapter_sha256'" in capsys.readouterr().err
    assert _mc(lm_dir, out, mc_file, "--adapter", str(tmp_path / "none")) == 2
    assert "adapter_config.json" in capsys.readouterr().err
    assert path.read_text() == before


def test_rows_of_a_run_made_before_the_options_still_resume(tiny_lm, tok, tmp_path):
    """Rows and run.json without quantize/adapter (an older isouq) resume without the options,
    and are refused with them (absent = None)."""
    items = [(f"question {i}", ["a", "b"], 0) for i in range(2)]
    rows = [{"question": q, "mc1_targets": {o: int(i == lab) for i, o in enumerate(opts)}}
            for q, opts, lab in items]
    data = tmp_path / "mc.json"
    data.write_text(json.dumps(rows))
    loads = []

    def loader(name):
        loads.append(name)
        return tiny_lm, tok, "tiny"

    path = mc.run_mc("tiny", tmp_path / "out", data=str(data), limit=1, loader=loader,
                     progress=False)
    assert set(read_jsonl(path)[0]["settings"]) == set(mc.SETTINGS) | {"data"}
    mc.run_mc("tiny", tmp_path / "out", data=str(data), loader=loader, progress=False)
    assert len(read_jsonl(path)) == 2
    with pytest.raises(InputError, match="'quantize': \\(None, '8bit'\\)"):
        mc.run_mc("tiny", tmp_path / "out", data=str(data), quantize="8bit", loader=loader,
                  progress=False)

    # qa run: a run.json whose config predates the options
    runner = QARunner(QAConfig(model="tiny", judge_model=None), tmp_path / "qa", loader=loader)
    runner.paths["run"].parent.mkdir(parents=True, exist_ok=True)
    old = runner._config_as_recorded()
    for k in ("quantize", "adapter", "device_map", "max_memory", "offload_folder"):
        old.pop(k)
    runner.paths["run"].write_text(json.dumps({"config": old}))
    runner._check_resume({"q": {"key": "q", "scores": {}}})
    again = QARunner(QAConfig(model="tiny", judge_model=None, quantize="4bit"),
                     tmp_path / "qa", loader=loader)
    with pytest.raises(InputError, match="'quantize': \\(None, '4bit'\\)"):
        again._check_resume({"q": {"key": "q", "scores": {}}})


def test_qa_run_loads_the_model_under_study_with_the_options_and_the_judge_without(
        tmp_path, monkeypatch):
    """qa run (and qa short, its subclass): the options go to the model under study only; a
    judge naming the same model loads apart, without them; without options the two share one
    load. run.json's config records the options and the adapter's digest."""
    import isouq.models as models

    calls = []

    def fake(name, **kw):
        calls.append((name, kw))
        return object(), object(), object()

    monkeypatch.setattr(models, "load_model", fake)
    ad = tmp_path / "ad"
    ad.mkdir()
    (ad / "adapter_config.json").write_text("{}")
    cfg = QAConfig(model="m", judge_model="m", quantize="8bit", adapter=str(ad),
                   device_map="auto", max_memory="cpu=1GB")
    runner = QARunner(cfg, tmp_path / "out")
    study, judge = runner.load("m", study=True), runner.load("m")
    assert study is not judge and runner.load("m", study=True) is study
    assert calls[0][1] == {"device": "cpu", "dtype": None, "trust_remote_code": False,
                                "allow_pickle": False, "quantize": "8bit", "adapter": str(ad),
                                "device_map": "auto", "max_memory": "cpu=1GB"}
    assert not {"quantize", "adapter", "device_map", "max_memory"} & set(calls[1][1])
    rec = runner._config_as_recorded()
    assert rec["quantize"] == "8bit" and rec["adapter"] == str(ad)
    assert rec["adapter_sha256"] == content_sha({"adapter_config.json":
                                                 hashlib.sha256(b"{}").hexdigest()})
    calls.clear()
    plain = QARunner(QAConfig(model="m", judge_model="m"), tmp_path / "out2")
    assert plain.load("m", study=True) is plain.load("m") and len(calls) == 1


def test_the_cli_passes_the_options_to_every_study_command(tmp_path, monkeypatch):
    """qa run, qa short, qa mc and qa long take the options and hand them on (the model under
    study); qa long refuses an adapter over several models."""
    import isouq.study.qa.long as long
    import isouq.study.qa.mc as mcmod
    import isouq.study.qa.short as short

    seen = {}
    monkeypatch.setattr(QARunner, "run", lambda self: seen.setdefault("run", self.cfg) and "x")
    monkeypatch.setattr(mcmod, "run_mc", lambda *a, **kw: seen.setdefault("mc", kw) and "x")
    monkeypatch.setattr(short, "run_short", lambda *a, **kw: seen.setdefault("short", kw) and "x")
    monkeypatch.setattr(long, "run_long", lambda *a, **kw: seen.setdefault("long", kw) and "x")
    opts = ["--quantize", "4bit", "--device-map", "auto", "--max-memory", "cpu=2GB",
            "--offload-folder", str(tmp_path / "off")]
    for cmd in ("run", "mc", "short", "long"):
        assert main(["qa", cmd, "--out", str(tmp_path / cmd), *opts]) == 0
    for got in (vars(seen["run"]), seen["mc"], seen["short"], seen["long"]):
        assert (got["quantize"], got["device_map"], got["max_memory"], got["offload_folder"]) \
            == ("4bit", "auto", "cpu=2GB", str(tmp_path / "off"))
    monkeypatch.undo()
    with pytest.raises(InputError, match="--adapter fits one base model"):
        long.run_long(["a", "b"], tmp_path / "l", adapter=str(tmp_path))


@pytest.mark.parametrize("argv, problem", [
    (["demo", "--toy", "--quantize", "4bit"], "--quantize: --toy trains its own small network"),
    (["qa", "long", "--evaluate-only", "--adapter", "x", "--device-map", "auto"],
     "--adapter --device-map: --evaluate-only rewrites the tables"),
])
def test_options_of_a_run_that_loads_no_model_are_refused_in_one_line(argv, problem, tmp_path,
                                                                      capsys):
    assert main([*argv, "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert problem in err and "loads no model" in err and "\n" not in err


def test_kept_short_rows_made_with_other_load_options_are_refused(tmp_path):
    """qa long reuses the kept qa short answers only when their run used the same quantize and
    adapter (a run.json without them: None)."""
    from isouq.study.qa.long import kept_short_rows

    rows = tmp_path / "qa_triviaqa__m.jsonl"
    rows.write_text(json.dumps({"key": "short-tqa-1", "answer": "x", "correct": 1}) + "\n")
    assert set(kept_short_rows(tmp_path, "m", {})) == {"tqa-1"}
    with pytest.raises(InputError, match="--short none"):
        kept_short_rows(tmp_path, "m", {"quantize": "4bit"})
    rows.with_suffix(".run.json").write_text(json.dumps({"config": {"quantize": "4bit"}}))
    assert set(kept_short_rows(tmp_path, "m", {"quantize": "4bit"})) == {"tqa-1"}
    with pytest.raises(InputError, match="'quantize': \\('4bit', None\\)"):
        kept_short_rows(tmp_path, "m", {})


def test_demo_takes_an_adapter(lm_dir, tmp_path, capsys):
    """isouq demo --adapter: the demo answers with the PEFT model (its parameter count)."""
    peft = pytest.importorskip("peft")
    from transformers import AutoModelForCausalLM

    ad = _adapter(lm_dir, tmp_path / "adapter", seed=1)
    assert main(["demo", "--model", str(lm_dir), "--adapter", str(ad), "-n", "1",
                 "--max-new-tokens", "2"]) == 0
    lm = peft.PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(lm_dir), str(ad))
    n = sum(p.numel() for p in lm.parameters())
    assert f"{n:,} parameters" in capsys.readouterr().out
