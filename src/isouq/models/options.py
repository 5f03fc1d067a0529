"""Checking load options before any heavy work: device, dtype, 4-/8-bit quantization."""

from __future__ import annotations

import importlib.util

import torch

from ..errors import InputError, ModelError

QUANTIZE = ("4bit", "8bit")


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


def bnb_config(quantize: str | None, device: str, dtype: torch.dtype | str):
    """A BitsAndBytesConfig for "4bit"/"8bit" (None: no quantization), on CPU or CUDA.

    Needs the bitsandbytes package (the ``quantize`` extra); ModelError otherwise, before
    loading. The quantized weights are scored as their dequantized values (``params="all"``);
    ``params="trainable"`` leaves them out, as a plain backward does.
    """
    if quantize is None:
        return None
    if quantize not in QUANTIZE:
        raise InputError(f"quantize={quantize!r}; use None, '4bit' or '8bit'.")
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
