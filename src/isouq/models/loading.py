"""``load_model``: a registry name, a local folder or GGUF file, or a hub id → model, tokenizer.

Resolution order for ``name_or_path``: a registry name (``smollm2``, …); an existing path (a
``.gguf`` file, a folder with one ``.gguf``, or a ``save_pretrained`` folder); else a Hugging
Face hub id (``org/name``), downloaded by transformers when online.

Trust boundary: repository code runs only with ``trust_remote_code=True``; weights are read
from safetensors when present, pickled ``.bin`` files only with ``allow_pickle=True`` and then
through ``torch.load(weights_only=True)``; registry files are checked against pinned SHA-256s,
and the SHA-256 of every file read is recorded in :class:`ModelInfo`.
"""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import tempfile
import time
import weakref
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path

import torch

from ..errors import InputError, ModelError
from .cache import forget_gguf_quantizer, read_cache, write_cache
from .files import FileCheck, fetch_hint, installed, locate_part, registry_gguf, sha256_file
from .info import (
    ModelInfo,
    count_params,
    ensure_pad_token,
    has_chat_template,
    has_tied_embeddings,
)
from .options import (
    bnb_config,
    check_device_map,
    check_quantize,
    dtype_kwargs,
    parse_max_memory,
    resolve_device,
    resolve_dtype,
)
from .registry import REGISTRY, ModelEntry, list_models
from .trust import check_remote_code, remote_code_error, use_safetensors_for

HUB_ID = re.compile(r"[A-Za-z0-9][\w.\-]*(/[A-Za-z0-9][\w.\-]*)?")

__all__ = ["ModelInfo", "load_model", "resolve_source"]

#: from_pretrained's placement options (device_map, max_memory, offload_folder) during one
#: load_model call; None: the whole model on ``device``
_PLACEMENT: ContextVar[dict | None] = ContextVar("isouq_placement", default=None)


@dataclass
class _Loaded:
    """What one loading path returns before the common finishing steps."""

    model: torch.nn.Module
    tokenizer: object
    source: str
    files: list[FileCheck]
    verified: bool
    check: str
    cache: str = "n/a"
    revision: str | None = None


def resolve_source(name_or_path) -> tuple[str, object]:
    """("registry", entry) | ("gguf", file) | ("folder", dir) | ("hub", id) for an argument."""
    text = str(name_or_path)
    if isinstance(name_or_path, str) and text in REGISTRY:
        return "registry", REGISTRY[text]
    path = Path(text).expanduser()
    if path.is_file():
        if path.suffix == ".gguf" or _is_gguf(path):
            return "gguf", path
        raise ModelError(
            f"{path} is a file but not a GGUF model; pass a .gguf file or the folder that "
            "save_pretrained() wrote (with config.json)."
        )
    if path.is_dir():
        if (path / "config.json").is_file():
            return "folder", path
        ggufs = sorted(path.glob("*.gguf"))
        if len(ggufs) == 1:
            return "gguf", ggufs[0]
        if ggufs:
            raise ModelError(
                f"{path} holds {len(ggufs)} .gguf files; pass the one to load: "
                + ", ".join(p.name for p in ggufs)
            )
        raise ModelError(f"{path} has neither config.json nor a .gguf file: not a model folder.")
    if HUB_ID.fullmatch(text) and not text.endswith(".gguf"):
        return "hub", text
    raise ModelError(
        f"{text!r} is not a registry name ({', '.join(list_models())}), not an existing file "
        "or folder, and not a hub id ('org/name'). Check the spelling or the path."
    )


def check_loadable(name_or_path) -> None:
    """A ModelError now, before any work, when ``name_or_path`` cannot load: neither a registry
    name, a model file or folder, nor a hub id; or a registry model that is not installed (the
    error says how to fetch it). Hub ids are not checked: that needs the network."""
    kind, what = resolve_source(name_or_path)
    if kind == "registry" and not installed(what):
        raise ModelError(f"model {what.name!r} is not installed. " + fetch_hint(what))


def architectures(name_or_path, *, revision: str | None = None,
                  hub_cache_dir: str | Path | None = None,
                  local_files_only: bool = False) -> list[str]:
    """The ``architectures`` a checkpoint's config names (e.g. ["DebertaV2ForSequenceClassification"]);
    [] for registry and GGUF models (causal LMs). Reads config.json only: no weights, no code."""
    kind, target = resolve_source(name_or_path)
    if kind == "folder":
        return list(json.loads((Path(target) / "config.json").read_text()).get("architectures")
                    or [])
    if kind == "hub":
        from transformers import AutoConfig

        try:
            cfg = AutoConfig.from_pretrained(target, revision=revision, cache_dir=hub_cache_dir,
                                             local_files_only=local_files_only)
        except (OSError, ValueError):  # offline or no such repo: load_model says so clearly
            return []
        return list(getattr(cfg, "architectures", None) or [])
    return []


def vocab_size(name_or_path) -> int | None:
    """The number of token ids the model embeds, read from its config.json or its GGUF header
    without loading weights; None when that cannot be known cheaply (a hub id, a registry model
    not installed or stored in parts and not yet loaded once)."""
    kind, target = resolve_source(name_or_path)
    if kind == "registry":
        cached = read_cache(target.gguf_sha256)
        if cached is not None:
            kind, target = "folder", cached[0]
        elif installed(target) and len(target.parts) == 1:
            kind, target = "gguf", locate_part(target.parts[0], target)
        else:
            return None
    if kind == "folder":
        cfg = json.loads((Path(target) / "config.json").read_text())
        n = cfg.get("vocab_size") or (cfg.get("text_config") or {}).get("vocab_size")
        return int(n) if n else None
    if kind == "gguf":
        from gguf import GGUFReader

        tokens = GGUFReader(target).fields.get("tokenizer.ggml.tokens")
        return len(tokens.data) if tokens is not None else None
    return None


def names_classifier(architecture_names) -> bool:
    """Whether architecture (or class) names include a ``*ForSequenceClassification``."""
    return any(str(a).endswith("ForSequenceClassification") for a in architecture_names)


def is_sequence_classifier(name_or_path, **kw) -> bool:
    """Whether the checkpoint is a ``*ForSequenceClassification`` (an NLI model, say): load it
    with ``model_class=AutoModelForSequenceClassification``."""
    return names_classifier(architectures(name_or_path, **kw))


def load_classifier_or_lm(name_or_path, **kw):
    """``load_model`` of a checkpoint that may be a sequence classifier (an MNLI-style
    entailment model) or a causal LM: the class its config names. Same return and options."""
    if is_sequence_classifier(name_or_path):
        from transformers import AutoModelForSequenceClassification

        kw["model_class"] = AutoModelForSequenceClassification
    return load_model(name_or_path, **kw)


def _is_gguf(path: Path) -> bool:
    with open(path, "rb") as f:
        return f.read(4) == b"GGUF"


def load_model(
    name_or_path: str | Path = "smollm2",
    *,
    device: str = "cpu",
    dtype: str | torch.dtype | None = None,
    trust_remote_code: bool = False,
    revision: str | None = None,
    quantize: str | None = None,
    adapter: str | Path | None = None,
    allow_pickle: bool = False,
    cache: bool = True,
    model_class=None,
    hub_cache_dir: str | Path | None = None,
    local_files_only: bool = False,
    device_map: str | dict | None = None,
    max_memory: str | dict | None = None,
    offload_folder: str | Path | None = None,
) -> tuple[torch.nn.Module, object, ModelInfo]:
    """Load a causal LM and its tokenizer, in eval mode, with a pad token; return provenance.

    Needs the ``llm`` extra (transformers, safetensors, gguf, accelerate).

    Args:
        name_or_path: registry name (default ``"smollm2"``; see ``isouq models``), a local
            ``.gguf`` file or model folder, or a Hugging Face hub id.
        device: ``"cpu"``, ``"cuda[:N]"``, ``"mps"`` or ``"auto"`` (accelerate's device map).
        dtype: ``None`` = float32, ``"auto"`` = the checkpoint's dtype, or a float dtype (name
            or ``torch.dtype``).
        trust_remote_code: allow the repository's own Python code (off by default).
        revision: branch, tag or commit, for hub ids only.
        quantize: ``None``, ``"4bit"`` or ``"8bit"``: quantize on load with bitsandbytes (CPU
            or CUDA); quantized weights are scored as their dequantized values.
        adapter: a PEFT adapter folder (``adapter_config.json`` + weights) put over the base
            model, unmerged (its weights form the ``"adapter"`` parameter set).
        allow_pickle: accept pickled ``.bin`` weights, read with
            ``torch.load(weights_only=True)``.
        cache: keep/use a float32 safetensors copy of dequantized GGUF models under
            ``$ISOUQ_CACHE`` (default ``~/.cache/isouq``), keyed by the GGUF's SHA-256.
        model_class: transformers auto class (default ``AutoModelForCausalLM``).
        hub_cache_dir: passed to transformers for hub ids.
        local_files_only: passed to transformers for hub ids.
        device_map: place a model larger than one device over several (accelerate's device
            map): ``"auto"`` (also ``"balanced"``, ``"sequential"``, ...) fills the GPUs, then
            CPU memory, then disk; or a {module name: device} dict. Offloaded layers are scored
            exactly (their weights are read where accelerate keeps them).
        max_memory: with ``device_map``, the memory each device may take: ``"0=20GB,cpu=60GB"``
            or a dict; what does not fit goes to disk.
        offload_folder: where layers offloaded to disk are written (default: a temporary
            folder removed with the model).

    Returns:
        ``(model, tokenizer, info)``: the model in eval mode; the tokenizer, whose pad token is
        set to eos (or bos/unk) when missing (the embedding matrix is never resized); and a
        ``ModelInfo`` with the files and their SHA-256.
    """
    start = time.perf_counter()
    dev = resolve_device(device)
    want_dtype = resolve_dtype(dtype)
    placement = _placement(device_map, max_memory, offload_folder)
    quant = bnb_config(quantize, dev, want_dtype)
    adapter_dir = check_adapter(adapter)
    kind, target = resolve_source(name_or_path)
    if revision is not None and kind != "hub":
        raise InputError(f"revision={revision!r} applies to hub ids only, not to a {kind} model.")
    if model_class is None:
        from transformers import AutoModelForCausalLM

        model_class = AutoModelForCausalLM
    opts = dict(dtype=want_dtype, quant=quant, device=dev, model_class=model_class)

    token = _PLACEMENT.set(placement)
    try:
        loaded, entry = _load_any(kind, target, name_or_path, cache=cache, revision=revision,
                                  trust_remote_code=trust_remote_code, allow_pickle=allow_pickle,
                                  hub_cache_dir=hub_cache_dir, local_files_only=local_files_only,
                                  **opts)
    finally:
        _PLACEMENT.reset(token)
    model = _finish(loaded.model, want_dtype, dev, quant, placed=placement is not None)
    if placement is not None and placement.get("_tmp"):
        weakref.finalize(model, shutil.rmtree, placement["_tmp"], True)
    if adapter_dir is not None:
        model = put_adapter(model, adapter_dir)
    tok = loaded.tokenizer
    pad = ensure_pad_token(tok, model)
    info = ModelInfo(
        name=str(name_or_path),
        source=loaded.source,
        kind=kind,
        files={**{c.path: c.sha256 for c in loaded.files},
               **{str(adapter_dir / n): h for n, h in adapter_files(adapter_dir).items()}},
        sha256_verified=loaded.verified,
        sha256_check=loaded.check,
        licence=entry.licence if entry else _licence(kind, target),
        n_params=count_params(model),
        tied_embeddings=has_tied_embeddings(model),
        has_chat_template=has_chat_template(tok),
        load_seconds=round(time.perf_counter() - start, 3),
        dtype=str(next(model.parameters()).dtype).removeprefix("torch."),
        device=dev if placement is None else _placed_on(model),
        quantization=_quant_text(quantize, entry, kind),
        cache=loaded.cache,
        revision=loaded.revision,
        adapter=str(adapter_dir) if adapter_dir is not None else None,
        pad_token=pad,
        caveats=list(entry.caveats) if entry else [],
    )
    return model, tok, info


def _placement(device_map, max_memory, offload_folder) -> dict | None:
    """from_pretrained's placement options, checked; None without a device map."""
    device_map = check_device_map(device_map)
    if device_map is None:
        if max_memory is not None or offload_folder is not None:
            raise InputError("max_memory and offload_folder apply with a device map: add "
                             "device_map='auto' (--device-map auto)")
        return None
    out = {"device_map": device_map, "offload_folder": offload_folder}
    if max_memory is not None:
        out["max_memory"] = parse_max_memory(max_memory)
    if offload_folder is None:  # used only if some layers go to disk; removed with the model
        out["offload_folder"] = out["_tmp"] = tempfile.mkdtemp(prefix="isouq-offload-")
    else:
        Path(offload_folder).expanduser().mkdir(parents=True, exist_ok=True)
        out["offload_folder"] = str(Path(offload_folder).expanduser())
    return out


def _placed_on(model) -> str:
    """``device_map``: where the model's modules went, as "cpu+disk", "cuda:0+cuda:1+cpu", …"""
    where = getattr(model, "hf_device_map", None) or {}
    kinds = []
    for d in where.values():
        name = f"cuda:{d}" if isinstance(d, int) else str(d)
        if name not in kinds:
            kinds.append(name)
    return "device_map: " + ("+".join(kinds) if kinds else "one device")


def _load_any(kind, target, name_or_path, *, cache, revision, trust_remote_code, allow_pickle,
              hub_cache_dir, local_files_only, **opts):
    """(loaded, registry entry or None) for a resolved source."""
    entry: ModelEntry | None = None
    if kind == "registry":
        entry = target
        loaded = _load_registry(entry, cache=cache, **opts)
    elif kind == "gguf":
        loaded, entry = _load_user_gguf(target, cache=cache, **opts)
    elif kind == "folder":
        loaded = _load_folder(
            target, trust_remote_code=trust_remote_code, allow_pickle=allow_pickle, **opts
        )
    else:
        loaded = _load_hub(
            target,
            revision=revision,
            trust_remote_code=trust_remote_code,
            allow_pickle=allow_pickle,
            hub_cache_dir=hub_cache_dir,
            local_files_only=local_files_only,
            **opts,
        )

    return loaded, entry


def check_adapter(adapter: str | Path | None) -> Path | None:
    """The adapter folder, checked before any load: it holds ``adapter_config.json`` and
    peft is installed; InputError/ModelError naming the fix otherwise."""
    if adapter is None:
        return None
    folder = Path(adapter).expanduser()
    if not (folder / "adapter_config.json").is_file():
        raise InputError(f"--adapter {adapter}: no adapter_config.json there; pass the folder a "
                         "PEFT adapter was saved to (model.save_pretrained(folder))")
    if importlib.util.find_spec("peft") is None:
        raise ModelError("--adapter needs the peft package: pip install 'isouq[llm]'")
    return folder


#: the files of an adapter folder that PEFT reads: its config and its weights (either format)
ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors", "adapter_model.bin")


def adapter_files(adapter: str | Path | None) -> dict[str, str]:
    """{file name: SHA-256} of the files PEFT reads from an adapter folder (``ADAPTER_FILES``
    present there); {} for None. The folder is checked first (``check_adapter``)."""
    folder = check_adapter(adapter)
    if folder is None:
        return {}
    return {n: sha256_file(folder / n) for n in ADAPTER_FILES if (folder / n).is_file()}


def content_options(quantize: str | None = None, adapter: str | Path | None = None) -> dict:
    """The load options that change what a model computes, as a run's settings record them:
    ``{"quantize": "4bit"}`` and ``{"adapter_sha256": …}`` (one digest of the adapter's files
    by name, so the same adapter in another folder is the same setting). An option not given
    is left out, so the settings of a run made before these options existed compare equal.
    InputError for an unknown ``quantize`` or a folder without an adapter, before any load."""
    from ..data.pairs import content_sha

    out: dict = {} if check_quantize(quantize) is None else {"quantize": quantize}
    if adapter is not None:
        out["adapter_sha256"] = content_sha(adapter_files(adapter))
    return out


def put_adapter(model: torch.nn.Module, folder: Path) -> torch.nn.Module:
    """The base model with the PEFT adapter in ``folder`` over it (unmerged, eval mode)."""
    from peft import PeftModel

    try:
        return PeftModel.from_pretrained(model, str(folder)).eval()
    except (RuntimeError, ValueError, KeyError) as e:
        base = json.loads((folder / "adapter_config.json").read_text()).get(
            "base_model_name_or_path")
        raise ModelError(
            f"the adapter in {folder} does not fit this model ({type(e).__name__}: "
            f"{str(e).splitlines()[0][:160]}); it was made for {base or 'another base model'}: "
            "load that model with it") from None


def _finish(model, dtype, device: str, quant, placed: bool = False) -> torch.nn.Module:
    """Cast and move (unless bitsandbytes or a device map placed it already), eval mode; a
    4-bit model is kept from repacking its weights for bitsandbytes' CPU kernel
    (``quantized.keep_unpacked``: its answers and scores use the same weights)."""
    if quant is None and not placed:
        if isinstance(dtype, torch.dtype) and next(model.parameters()).dtype != dtype:
            model = model.to(dtype)
        if device != "cpu":
            model = model.to(device)
    if quant is not None:
        from ..quantized import keep_unpacked

        keep_unpacked(model)
        own_memory(model)
    model.eval()
    return model


def own_memory(model: torch.nn.Module) -> torch.nn.Module:
    """Copy the CPU weights a quantized model did not quantize (embeddings, norms, head) into
    memory of the process's own. transformers reads safetensors by mapping the file, and such
    weights stay views of the mapping: the whole file, the full-precision weights the quantized
    ones were made from, then stays mapped and its pages resident (SmolLM2 in 4-bit: 405 MiB
    beside 155 MiB of weights). Tied weights stay tied (one copy per parameter). Returns
    ``model``."""
    from ..quantized import is_quantized

    seen: set[int] = set()
    with torch.no_grad():
        for mod in model.modules():
            for t in [*mod._parameters.values(), *mod._buffers.values()]:
                if (t is None or id(t) in seen or t.device.type != "cpu" or is_quantized(t)):
                    continue
                seen.add(id(t))
                t.data = t.data.clone()
    return model


def _quant_text(quantize: str | None, entry: ModelEntry | None, kind: str) -> str:
    base = entry.quantization if entry else ("GGUF, dequantized" if kind == "gguf" else "none")
    return base if quantize is None else f"{base}; bitsandbytes {quantize} (scored as dequantized values)"


def _pretrained_kwargs(dtype, quant, device: str) -> dict:
    kw = dict(dtype_kwargs(dtype), weights_only=True)
    if quant is not None:
        kw.update(quantization_config=quant, device_map={"": device})
    placement = _PLACEMENT.get()
    if placement is not None:  # accelerate's device map (offloaded layers: meta + hooks)
        kw.update({k: v for k, v in placement.items() if not k.startswith("_") and v is not None})
    return kw


def _load_folder_weights(
    model_class, folder: Path, *, use_safetensors, trust, dtype, quant, device, **hub
) -> tuple[torch.nn.Module, object]:
    from transformers import AutoTokenizer

    kw = _pretrained_kwargs(dtype, quant, device)
    if use_safetensors is not None:
        kw["use_safetensors"] = use_safetensors
    model, loading = model_class.from_pretrained(folder, trust_remote_code=trust,
                                                 output_loading_info=True, **kw, **hub)
    check_complete(model, loading.get("missing_keys", []), source=folder)
    tok = AutoTokenizer.from_pretrained(folder, trust_remote_code=trust, **hub)
    return model, tok


def check_complete(model, missing_keys, *, source) -> None:
    """Refuse a model that transformers completed with randomly initialized parameters (the
    checkpoint holds another kind of model, e.g. a classifier loaded as a causal LM): every
    score from it would be noise. ModelError names the checkpoint's own architecture."""
    missing = sorted(missing_keys)
    if not missing:
        return
    own = getattr(model.config, "architectures", None) or ["another kind of model"]
    shown = ", ".join(missing[:3]) + (", …" if len(missing) > 3 else "")
    raise ModelError(
        f"{source} holds {own[0]}, not a {type(model).__name__}: loading it as one leaves "
        f"{len(missing)} parameter tensor(s) randomly initialized ({shown}), so its scores would "
        "be noise. Give a checkpoint of the kind asked for: a causal language model to answer, "
        "judge and score; an MNLI-style classifier only as --entailment-model (semantic entropy)."
    )


def _load_cached_copy(model_class, folder: Path, *, dtype, quant, device):
    """(model, tokenizer) from isouq's own safetensors copy of a dequantized GGUF: no remote
    code, no pickles, no network."""
    return _load_folder_weights(model_class, folder, use_safetensors=True, trust=False,
                                dtype=dtype, quant=quant, device=device, local_files_only=True)


def _from_cache(sha: str, *, dtype, quant, device, model_class):
    """(model, tokenizer, checks) from a verified cached copy, or None on a miss."""
    hit = read_cache(sha)
    if hit is None:
        return None
    folder, checks = hit
    model, tok = _load_cached_copy(model_class, folder, dtype=dtype, quant=quant, device=device)
    return model, tok, checks


def _from_gguf(path: Path, sha: str, *, cache: bool, dtype, quant, device, model_class):
    """Dequantize a GGUF (float32); with ``cache``, save the copy. (model, tok, checks, state)."""
    from transformers import AutoTokenizer

    if quant is not None and not cache:
        raise InputError(
            "quantize with a GGUF model needs cache=True: bitsandbytes loads the dequantized "
            "safetensors copy that the cache keeps."
        )
    if _PLACEMENT.get() is not None and not cache:
        raise InputError("a device map with a GGUF model needs cache=True: accelerate places "
                         "the dequantized safetensors copy that the cache keeps.")
    model = model_class.from_pretrained(
        path.parent, gguf_file=path.name, **dtype_kwargs(torch.float32)
    )
    tok = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    forget_gguf_quantizer(model)
    if not cache:
        return model, tok, [], "off"
    folder, checks = write_cache(model, tok, sha, path.name)
    if quant is not None or _PLACEMENT.get() is not None:
        del model
        model, tok = _load_cached_copy(model_class, folder, dtype=dtype, quant=quant, device=device)
    return model, tok, checks, "built"


def _load_registry(entry: ModelEntry, *, cache: bool, **opts) -> _Loaded:
    sha = entry.gguf_sha256
    got = _from_cache(sha, **opts) if cache else None
    if got is not None:
        model, tok, checks = got
        check = (
            f"ok: {len(checks)} cached file(s) match the manifest of the float32 copy of "
            f"GGUF {sha[:12]}… (pinned by the registry)"
        )
        return _Loaded(model, tok, str(Path(checks[0].path).parent), checks, True, check, "hit")
    path, part_checks = registry_gguf(entry)
    model, tok, cache_checks, state = _from_gguf(path, sha, cache=cache, **opts)
    check = f"ok: {len(part_checks)} file(s) match the registry pins (GGUF {sha[:12]}…)"
    return _Loaded(model, tok, str(path), part_checks + cache_checks, True, check, state)


def _load_user_gguf(path: Path, *, cache: bool, **opts) -> tuple[_Loaded, ModelEntry | None]:
    sha = sha256_file(path)
    entry = next((e for e in REGISTRY.values() if e.gguf_sha256 == sha), None)
    pinned = sha if entry is not None else None
    if entry is not None:
        check = f"ok: the file is registry model {entry.name!r} (SHA-256 {sha[:12]}… pinned)"
    else:
        check = f"recorded: GGUF SHA-256 {sha[:12]}… (user file, nothing pinned to compare)"
    got = _from_cache(sha, **opts) if cache else None
    if got is not None:
        model, tok, checks = got
        source = str(Path(checks[0].path).parent)
        files = [FileCheck(str(path), sha, pinned)] + checks
        return _Loaded(model, tok, source, files, entry is not None, check, "hit"), entry
    model, tok, checks, state = _from_gguf(path, sha, cache=cache, **opts)
    files = [FileCheck(str(path), sha, pinned)] + checks
    return _Loaded(model, tok, str(path), files, entry is not None, check, state), entry


def _hash_folder(folder: Path) -> list[FileCheck]:
    return [FileCheck(str(p), sha256_file(p)) for p in sorted(folder.iterdir()) if p.is_file()]


def _load_folder(folder: Path, *, trust_remote_code: bool, allow_pickle: bool, **opts):
    check_remote_code(folder, trust_remote_code)
    use_st = use_safetensors_for(folder, allow_pickle)
    files = _hash_folder(folder)
    model, tok = _guard_remote_code(
        str(folder),
        lambda: _load_folder_weights(
            opts["model_class"],
            folder,
            use_safetensors=use_st,
            trust=trust_remote_code,
            dtype=opts["dtype"],
            quant=opts["quant"],
            device=opts["device"],
            local_files_only=True,
        ),
    )
    check = f"recorded: SHA-256 of {len(files)} file(s) in the folder (nothing pinned)"
    return _Loaded(model, tok, str(folder), files, False, check)


def _guard_remote_code(where: str, load):
    """Run ``load()``, turning transformers' remote-code refusal and torch's refusal of a
    pickle (weights_only=True) into ModelErrors."""
    import pickle

    try:
        return load()
    except pickle.UnpicklingError as e:
        raise ModelError(
            f"{where}: the pickled weights hold objects that torch.load(weights_only=True) "
            f"refuses to run ({str(e).splitlines()[0][:120]}); convert them to safetensors "
            "where you trust the file, or use another checkpoint") from None
    except ValueError as e:
        if "trust_remote_code" in str(e):
            raise remote_code_error(where) from e
        raise


def _load_hub(
    repo: str, *, revision, trust_remote_code, allow_pickle, hub_cache_dir, local_files_only, **opts
) -> _Loaded:
    hub = dict(revision=revision, cache_dir=hub_cache_dir, local_files_only=local_files_only)
    try:
        model, tok = _guard_remote_code(
            repo,
            lambda: _load_folder_weights(
                opts["model_class"],
                repo,
                use_safetensors=None if allow_pickle else True,
                trust=trust_remote_code,
                dtype=opts["dtype"],
                quant=opts["quant"],
                device=opts["device"],
                **hub,
            ),
        )
    except OSError as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ModelError(
            f"could not load {repo!r} from the Hugging Face hub: {first}. If you are offline, "
            f"pass a local folder or .gguf file, or a registry name ({', '.join(list_models())})"
            "; if the repo has only pickled .bin weights, pass allow_pickle=True."
        ) from e
    snapshot = _hub_snapshot(repo, hub)
    files = _hash_folder(snapshot) if snapshot else []
    check = f"recorded: SHA-256 of {len(files)} cached hub file(s) (nothing pinned)"
    rev = snapshot.name if snapshot else revision
    return _Loaded(model, tok, str(snapshot or repo), files, False, check, revision=rev)


def _hub_snapshot(repo: str, hub: dict) -> Path | None:
    """The local snapshot folder transformers read ``repo`` from (None when unknown)."""
    from transformers.utils import cached_file

    try:
        path = cached_file(repo, "config.json", **{**hub, "local_files_only": True})
    except (OSError, ValueError):
        return None
    return Path(path).parent if path else None


def _licence(kind: str, target) -> str:
    if kind == "gguf":
        return _gguf_licence(Path(target))
    if kind == "folder":
        return _readme_licence(Path(target))
    return "unknown: see the model card on the hub"


def _gguf_licence(path: Path) -> str:
    try:
        from gguf import GGUFReader

        field = GGUFReader(path).fields.get("general.license")
        if field is not None:
            return f"{field.contents()} (GGUF metadata general.license)"
    except Exception:  # noqa: BLE001 - metadata is best effort
        pass
    return "unknown: not recorded in the GGUF metadata"


def _readme_licence(folder: Path) -> str:
    readme = folder / "README.md"
    if readme.is_file():
        m = re.search(
            r"^license:\s*(\S.*)$",
            readme.read_text(encoding="utf-8", errors="replace"),
            re.MULTILINE,
        )
        if m:
            return f"{m.group(1).strip()} (README.md front matter)"
    return "unknown: not recorded in the folder"
