"""load_model on tiny random models: families, paths, hub ids, GGUF + cache, trust boundary."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch

from isouq.errors import InputError, ModelError
from isouq.models import (
    REGISTRY,
    architectures,
    check_loadable,
    is_sequence_classifier,
    load_model,
    model_cache_dir,
    resolve_source,
    sha256_file,
)
from isouq.models.registry import PartFile, Wheel


def _logits(model, tok, text="the capital of france is paris"):
    ids = tok(text, return_tensors="pt")
    with torch.no_grad():
        return model(**ids).logits


@pytest.mark.parametrize(
    "family,tied",
    [("llama", True), ("llama", False), ("gpt2", True), ("qwen2", False)],
)
def test_families_from_local_folder(save_tiny, family, tied):
    folder = save_tiny(family, tied)
    model, tok, info = load_model(folder)
    assert info.kind == "folder" and info.source == str(folder)
    assert info.tied_embeddings is tied
    assert info.n_params == sum(p.numel() for p in model.parameters())
    assert not model.training and info.dtype == "float32"
    # eos; for qwen2, transformers' default pad <|endoftext|> lies outside the tiny vocab
    assert tok.pad_token == "</s>" and info.pad_token == "</s>"
    rows = model.get_input_embeddings().weight.shape[0]
    assert rows == model.config.vocab_size and tok.pad_token_id < rows  # never resized
    assert str(folder / "model.safetensors") in info.files
    assert info.files[str(folder / "config.json")] == sha256_file(folder / "config.json")
    assert not info.sha256_verified and info.sha256_check.startswith("recorded")
    assert info.licence.startswith("unknown")
    assert _logits(model, tok).shape[-1] == model.config.vocab_size


def test_existing_pad_token_is_kept(save_tiny):
    _, tok, _ = load_model(save_tiny("llama", pad=True, sub="padded"))
    assert tok.pad_token == "<unk>"


def test_hub_id_like_relative_path_is_local(save_tiny, tmp_path, monkeypatch):
    save_tiny("gpt2", sub="some-org/tiny-gpt2")
    monkeypatch.chdir(tmp_path)
    assert resolve_source("some-org/tiny-gpt2")[0] == "folder"
    _, _, info = load_model("some-org/tiny-gpt2")
    assert info.kind == "folder" and info.tied_embeddings


def test_hub_id_loads_through_transformers_hub_cache(save_tiny, tmp_path, tiny):
    snap = tiny.to_hub_cache(save_tiny("llama", False), tmp_path / "hub", "isouq-test/tiny")
    assert resolve_source("isouq-test/tiny") == ("hub", "isouq-test/tiny")
    model, tok, info = load_model(
        "isouq-test/tiny", hub_cache_dir=tmp_path / "hub", local_files_only=True
    )
    assert info.kind == "hub" and info.revision == snap.name
    assert str(snap / "model.safetensors") in info.files
    assert not info.tied_embeddings and tok.pad_token == "</s>"


def test_hub_id_not_reachable_is_a_clear_error(tmp_path):
    with pytest.raises(ModelError, match="could not load 'isouq-test/absent'.*registry name"):
        load_model("isouq-test/absent", hub_cache_dir=tmp_path / "hub", local_files_only=True)


def test_unknown_argument_and_bad_options(tmp_path, save_tiny):
    with pytest.raises(ModelError, match="not a registry name"):
        load_model(str(tmp_path / "no" / "such" / "dir"))
    with pytest.raises(ModelError, match="neither config.json nor a .gguf"):
        load_model(tmp_path)
    folder = save_tiny("llama")
    with pytest.raises(InputError, match="hub ids only"):
        load_model(folder, revision="main")
    with pytest.raises(InputError, match="floating torch dtype"):
        load_model(folder, dtype="int8")
    with pytest.raises(InputError, match="unknown device"):
        load_model(folder, device="tpu")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only errors")
def test_gpu_only_options_fail_early_on_cpu(save_tiny):
    folder = save_tiny("llama")
    with pytest.raises(ModelError, match="sees no CUDA"):
        load_model(folder, device="cuda")
    from isouq.models.options import bnb_config

    with pytest.raises(ModelError, match="runs on a CUDA GPU or the CPU"):
        bnb_config("4bit", "mps", None)  # CPU and CUDA are bitsandbytes' devices
    with pytest.raises(InputError, match="'4bit' or '8bit'"):
        load_model(folder, quantize="3bit")


def test_dtype_is_applied(save_tiny):
    model, _, info = load_model(save_tiny("qwen2", False), dtype="bfloat16")
    assert info.dtype == "bfloat16" and next(model.parameters()).dtype == torch.bfloat16


def _add_custom_code(folder, model_type: str, marker) -> None:
    cfg = json.loads((folder / "config.json").read_text())
    cfg["model_type"] = model_type
    cfg["auto_map"] = {"AutoConfig": "evil.EvilConfig", "AutoModelForCausalLM": "evil.EvilLM"}
    (folder / "config.json").write_text(json.dumps(cfg))
    (folder / "evil.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n")


def test_remote_code_refused_without_trust(save_tiny, tmp_path):
    folder = save_tiny("llama")
    marker = tmp_path / "code-ran"
    _add_custom_code(folder, "isouq_custom_lm", marker)
    with pytest.raises(ModelError, match="own Python code.*trust_remote_code=True") as e:
        load_model(folder)
    assert "evil.EvilLM" in str(e.value) and "--trust-remote-code" in str(e.value)
    assert not marker.exists()


def test_native_architecture_ignores_auto_map_without_running_it(save_tiny, tmp_path):
    folder = save_tiny("llama")
    marker = tmp_path / "code-ran"
    _add_custom_code(folder, "llama", marker)
    _, _, info = load_model(folder)
    assert info.n_params > 0 and not marker.exists()


def test_remote_code_refused_for_hub_ids(save_tiny, tmp_path, tiny):
    folder = save_tiny("llama")
    marker = tmp_path / "code-ran"
    _add_custom_code(folder, "isouq_custom_lm", marker)
    tiny.to_hub_cache(folder, tmp_path / "hub", "isouq-test/custom")
    with pytest.raises(ModelError, match="trust_remote_code=True"):
        load_model("isouq-test/custom", hub_cache_dir=tmp_path / "hub", local_files_only=True)
    assert not marker.exists()


def _to_pickle(folder) -> None:
    from safetensors.torch import load_file

    state = load_file(folder / "model.safetensors")
    (folder / "model.safetensors").unlink()
    torch.save(state, folder / "pytorch_model.bin")


def test_pickled_weights_refused_then_loaded_weights_only(save_tiny):
    folder = save_tiny("llama", False)
    ref_model, ref_tok, _ = load_model(folder)
    _to_pickle(folder)
    with pytest.raises(ModelError, match="pickled PyTorch weights") as e:
        load_model(folder)
    assert "allow_pickle=True" in str(e.value) and "weights_only=True" in str(e.value)
    model, tok, info = load_model(folder, allow_pickle=True)
    assert str(folder / "pytorch_model.bin") in info.files
    assert torch.equal(_logits(model, tok), _logits(ref_model, ref_tok))


def test_folder_without_weights(save_tiny):
    folder = save_tiny("gpt2")
    (folder / "model.safetensors").unlink()
    with pytest.raises(ModelError, match="no model weights"):
        load_model(folder)


def test_gguf_file_builds_then_hits_cache(tiny_gguf):
    sha = sha256_file(tiny_gguf)
    m1, t1, i1 = load_model(tiny_gguf)
    assert i1.kind == "gguf" and i1.cache == "built" and i1.files[str(tiny_gguf)] == sha
    assert i1.licence.startswith("apache-2.0") and i1.has_chat_template and i1.tied_embeddings
    assert not i1.sha256_verified and "recorded" in i1.sha256_check
    cached = model_cache_dir(sha)
    assert (cached / "model.safetensors").is_file() and (cached / "isouq-cache.json").is_file()
    m2, t2, i2 = load_model(tiny_gguf)
    assert i2.cache == "hit" and i2.source == str(cached)
    assert i2.n_params == i1.n_params and i2.tied_embeddings
    assert torch.equal(_logits(m1, t1), _logits(m2, t2))
    assert t2.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False) == "hi"
    _, _, i3 = load_model(tiny_gguf.parent)  # a folder with a single .gguf
    assert i3.kind == "gguf" and i3.cache == "hit"


def test_gguf_without_cache_and_broken_cache_rebuilt(tiny_gguf):
    _, _, info = load_model(tiny_gguf, cache=False)
    assert info.cache == "off" and not model_cache_dir(sha256_file(tiny_gguf)).exists()
    load_model(tiny_gguf)
    weights = model_cache_dir(sha256_file(tiny_gguf)) / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-8] + b"corrupt!")
    _, _, info = load_model(tiny_gguf)
    assert info.cache == "built"  # the tampered copy failed its manifest and was rebuilt


def _registry_entry_for(path, tiny, fake_wheels, n_parts: int):
    data = path.read_bytes()
    cut = [len(data) * i // n_parts for i in range(n_parts + 1)]
    parts = []
    for i in range(n_parts):
        chunk = data[cut[i] : cut[i + 1]]
        rel = f"tiny_part{i + 1}/data/part{i:02d}.bin"
        fake_wheels(f"tiny-part{i + 1}", rel, chunk)
        parts.append(PartFile(f"tiny-part{i + 1}", rel, tiny.sha(chunk), len(chunk)))
    return replace(
        REGISTRY["smollm2"],
        name="tiny",
        wheels=tuple(Wheel(f"{p.dist}==0.1", "0" * 64, 1) for p in parts),
        parts=tuple(parts),
        gguf_name="tiny.gguf",
        gguf_sha256=tiny.sha(data),
        licence="test licence",
        caveats=("test caveat",),
    )


def test_registry_model_from_split_wheels(tiny_gguf, tiny, fake_wheels, monkeypatch):
    entry = _registry_entry_for(tiny_gguf, tiny, fake_wheels, n_parts=3)
    monkeypatch.setitem(REGISTRY, "tiny", entry)
    check_loadable("tiny")
    _, _, info = load_model("tiny")
    assert info.kind == "registry" and info.cache == "built" and info.sha256_verified
    assert info.licence == "test licence" and info.caveats == ["test caveat"]
    assert sum(1 for f in info.files if "tiny_part" in f) == 3
    _, _, info = load_model("tiny")
    assert info.cache == "hit" and info.sha256_verified and "pinned" in info.sha256_check
    _, _, by_path = load_model(tiny_gguf)  # the same bytes passed as a file are recognised
    assert by_path.sha256_verified and by_path.licence == "test licence"


def test_registry_sha_mismatch_stops_the_load(tiny_gguf, tiny, fake_wheels, monkeypatch):
    entry = _registry_entry_for(tiny_gguf, tiny, fake_wheels, n_parts=1)
    bad = replace(entry, parts=(replace(entry.parts[0], sha256="3" * 64),))
    monkeypatch.setitem(REGISTRY, "tiny", bad)
    with pytest.raises(ModelError, match=r"SHA-256 mismatch.*fetch\(.tiny., force=True\)"):
        load_model("tiny", cache=False)


def test_missing_registry_model_says_how_to_fetch(monkeypatch):
    import tiny as tiny_models

    name = tiny_models.absent_registry_model(monkeypatch)
    with pytest.raises(ModelError, match="not installed.*isouq models --fetch absent"):
        load_model(name)
    with pytest.raises(ModelError, match="not installed.*isouq models --fetch absent"):
        check_loadable(name)  # the same answer without starting a load


def test_check_loadable_accepts_what_loads_and_names_what_does_not(save_tiny, tmp_path):
    check_loadable(save_tiny("llama"))
    check_loadable("smollm2")  # installed by set-up
    check_loadable("some-org/some-model")  # a hub id: not checked offline
    with pytest.raises(ModelError, match="not a registry name"):
        check_loadable(str(tmp_path / "nothing-here"))


def test_architectures_tell_classifiers_from_causal_lms(save_tiny, tmp_path, tiny):
    from transformers import AutoModelForSequenceClassification, BertConfig, BertForSequenceClassification

    lm = save_tiny("llama", False)
    assert architectures(lm) == ["LlamaForCausalLM"] and not is_sequence_classifier(lm)
    nli = tmp_path / "nli"
    BertForSequenceClassification(BertConfig(
        vocab_size=300, hidden_size=8, intermediate_size=16, num_hidden_layers=1,
        num_attention_heads=2, num_labels=3)).save_pretrained(nli)
    tiny.make_tokenizer(False).save_pretrained(nli)
    assert is_sequence_classifier(nli)
    model, _, info = load_model(nli, model_class=AutoModelForSequenceClassification)
    assert type(model).__name__ == "BertForSequenceClassification" and info.kind == "folder"
    # as a causal LM, transformers would build BertLMHeadModel with a random LM head: refused
    with pytest.raises(ModelError, match="BertForSequenceClassification, not a BertLMHeadModel"
                                         ".*randomly initialized"):
        load_model(nli)
    tiny.to_hub_cache(nli, tmp_path / "hub", "isouq-test/nli")
    assert is_sequence_classifier("isouq-test/nli", hub_cache_dir=tmp_path / "hub",
                                  local_files_only=True)
    assert architectures("smollm2") == []  # registry models are causal LMs: nothing is read
    # unreachable: no answer here; load_model then says what is wrong
    assert architectures("isouq-test/absent", hub_cache_dir=tmp_path / "hub",
                         local_files_only=True) == []


class _Payload:
    """An object torch.load(weights_only=True) must refuse to unpickle."""


def test_a_pickle_weights_only_refuses_is_a_model_error(save_tiny):
    folder = save_tiny("llama", False)
    from safetensors.torch import load_file

    state = load_file(folder / "model.safetensors")
    (folder / "model.safetensors").unlink()
    torch.save({**state, "extra": _Payload()}, folder / "pytorch_model.bin")
    with pytest.raises(ModelError, match="refuses to run"):
        load_model(folder, allow_pickle=True)


@pytest.mark.skipif(not __import__("sys").platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize("bits", ["4bit", "8bit"])
def test_a_quantized_model_does_not_keep_its_weights_file_mapped(tiny_llama_dir, bits):
    """transformers maps a safetensors file to load it; the weights bitsandbytes leaves alone
    (embeddings, norms, head) are copied out, so the full-precision file is not kept mapped
    (and resident) beside the quantized weights; tied weights stay tied."""
    import gc
    from pathlib import Path

    pytest.importorskip("bitsandbytes")
    from isouq.quantized import is_quantized

    files = sorted(str(f.resolve()) for f in Path(tiny_llama_dir).glob("*.safetensors"))
    assert files
    model, _, _ = load_model(str(tiny_llama_dir), quantize=bits)
    gc.collect()
    maps = Path("/proc/self/maps").read_text()
    assert not [f for f in files if f in maps]
    assert any(is_quantized(p) for p in model.parameters())
    assert model.lm_head.weight is model.get_input_embeddings().weight
