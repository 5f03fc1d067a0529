"""Checking load options before any heavy work: device, dtype, 4-/8-bit quantization."""

from __future__ import annotations

import importlib.util

import torch

from ..choices import DEVICE_MAPS, QUANTIZE  # the names, listed once (torch-free)
from ..errors import InputError, ModelError


def resolve_device(device: str | torch.device) -> str:
    """A usable device string; "auto" picks cuda when present. ModelError when unavailable."""
    name = str(device)
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    kind = name.split(":")[0]
    if kind == "cpu":
        return name
    if kind == "cuda":
        if not torch.cuda.is_available():
            raise ModelError(
                f"device {name!r} asked for, but this torch ({torch.__version__}) sees no CUDA "
                "GPU. Use device='cpu', or install a CUDA build of torch on a GPU machine."
            )
        index = int(name.split(":")[1]) if ":" in name else 0
        if index >= torch.cuda.device_count():
            raise ModelError(
                f"device {name!r}: only {torch.cuda.device_count()} CUDA device(s) visible; "
                "pick cuda:0 .. cuda:N-1 or check CUDA_VISIBLE_DEVICES."
            )
        return name
    if kind == "mps":
        if not torch.backends.mps.is_available():
            raise ModelError("device 'mps' asked for, but MPS is not available; use 'cpu'.")
        return name
    raise InputError(f"unknown device {name!r}; use 'cpu', 'cuda', 'cuda:N', 'mps' or 'auto'.")


#: accelerate's placements of a model over its devices (``device_map=`` of from_pretrained)
def check_device_map(device_map: str | dict | None) -> str | dict | None:
    """``device_map`` as transformers takes it: None, one of ``DEVICE_MAPS`` or an explicit
    {module name: device} dict; InputError otherwise, and ModelError without accelerate."""
    if device_map is None:
        return None
    if isinstance(device_map, str) and device_map not in DEVICE_MAPS:
        raise InputError(f"device_map {device_map!r}: use one of {', '.join(DEVICE_MAPS)} (or a "
                         "{module: device} dict in Python)")
    if not isinstance(device_map, str | dict):
        raise InputError(f"device_map must be a name or a dict, got {type(device_map).__name__}")
    if importlib.util.find_spec("accelerate") is None:
        raise ModelError("device_map needs the accelerate package: pip install 'isouq[llm]'")
    return device_map


def parse_max_memory(text: str | dict | None) -> dict | None:
    """``"cpu=2GB,0=20GB"`` -> {"cpu": 2·10⁹, 0: 20·10⁹}: the memory accelerate may fill on each
    device (GPU indices as integers, "cpu", "mps"); what does not fit goes to disk. A dict
    passes through. InputError naming the bad part."""
    if text is None or isinstance(text, dict):
        return text
    from accelerate.utils import convert_file_size_to_int

    out: dict = {}
    for part in str(text).split(","):
        key, sep, size = part.strip().partition("=")
        key = key.strip()
        if not sep or not key or not size.strip():
            raise InputError(f"--max-memory {text!r}: give DEVICE=SIZE pairs separated by commas, "
                             "e.g. cpu=2GB or 0=20GB,cpu=60GB")
        dev = int(key) if key.isdigit() else key.removeprefix("cuda:")
        dev = int(dev) if isinstance(dev, str) and dev.isdigit() else dev
        if not isinstance(dev, int) and dev not in ("cpu", "mps", "disk"):
            raise InputError(f"--max-memory {text!r}: unknown device {key!r}; use a GPU index "
                             "(0, 1, …), cpu or mps")
        try:
            out[dev] = convert_file_size_to_int(size.strip())
        except ValueError:
            raise InputError(f"--max-memory {text!r}: {size.strip()!r} is not a size such as "
                             "2GB or 500MiB") from None
    return out


def resolve_dtype(dtype: str | torch.dtype | None) -> torch.dtype | str:
    """torch dtype to load in. None: float32 (what the scores were validated in); "auto":
    the checkpoint's own dtype; names such as "bfloat16" or torch dtypes pass through."""
    if dtype is None:
        return torch.float32
    if isinstance(dtype, torch.dtype) or dtype == "auto":
        return dtype
    value = getattr(torch, str(dtype).removeprefix("torch."), None)
    if not isinstance(value, torch.dtype) or not value.is_floating_point:
        raise InputError(
            f"dtype {dtype!r} is not a floating torch dtype; use None (float32), 'auto', "
            "'float32', 'bfloat16' or 'float16'."
        )
    return value


def dtype_kwargs(dtype: torch.dtype | str) -> dict:
    """``dtype=`` for transformers >= 4.56, ``torch_dtype=`` before."""
    import transformers

    major, minor = (int(x) for x in transformers.__version__.split(".")[:2])
    key = "dtype" if (major, minor) >= (4, 56) else "torch_dtype"
    return {key: dtype}


def check_quantize(quantize: str | None) -> str | None:
    """``quantize`` when it is None, "4bit" or "8bit"; InputError otherwise."""
    if quantize is not None and quantize not in QUANTIZE:
        raise InputError(f"quantize={quantize!r}; use None, '4bit' or '8bit'.")
    return quantize


def bnb_config(quantize: str | None, device: str, dtype: torch.dtype | str):
    """A BitsAndBytesConfig for "4bit"/"8bit" (None: no quantization), on CPU or CUDA.

    Needs the bitsandbytes package (the ``quantize`` extra); ModelError otherwise, before
    loading. The quantized weights are scored as their dequantized values (``params="all"``);
    ``params="trainable"`` leaves them out, as a plain backward does.
    """
    if check_quantize(quantize) is None:
        return None
    if not (device.startswith("cuda") or device == "cpu"):
        raise ModelError(
            f"quantize={quantize!r} runs on a CUDA GPU or the CPU (bitsandbytes), not on "
            f"device={device!r}. Pass device='cuda' or 'cpu', or drop quantize."
        )
    if importlib.util.find_spec("bitsandbytes") is None:
        raise ModelError(
            f"quantize={quantize!r} needs the bitsandbytes package: pip install 'isouq[quantize]'"
        )
    from transformers import BitsAndBytesConfig

    compute = dtype if isinstance(dtype, torch.dtype) else (
        torch.bfloat16 if device.startswith("cuda") else torch.float32)
    if quantize == "8bit":
        return BitsAndBytesConfig(load_in_8bit=True)
    return BitsAndBytesConfig(
        load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=compute
    )
