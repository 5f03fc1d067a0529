"""What several ``isouq`` commands share: argparse types that refuse bad values at parse time,
option groups (the model and how it loads, the parameters, the sampling settings, a list of
registered methods), and the readers of those options. Torch-free: ``isouq CMD --help`` builds
every parser without importing torch."""

from __future__ import annotations

import argparse
from collections.abc import Iterable
from pathlib import Path

from ..choices import DEVICE_MAPS, QUANTIZE
from ..errors import InputError
from ..methods import METHODS
from ..param_sets import PARAM_SETS


# ---------------------------------------------------------------- argparse types
def whole_number(low: int):
    """argparse type of a count that must be ≥ ``low``."""

    def parse(text: str) -> int:
        try:
            n = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if n < low:
            raise argparse.ArgumentTypeError(f"{n} must be ≥ {low}")
        return n

    return parse


positive_int = whole_number(1)
non_negative_int = whole_number(0)


def real_number(low: float, *, strict: bool):
    """argparse type of a number that must be > ``low`` (``strict``) or ≥ ``low`` (NaN never;
    ``inf`` passes either bound)."""

    def parse(text: str) -> float:
        try:
            x = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not (x > low if strict else x >= low):
            raise argparse.ArgumentTypeError(f"{x} must be {'>' if strict else '≥'} {low:g}")
        return x

    return parse


positive_float = real_number(0.0, strict=True)  # a temperature, a timeout
non_negative_float = real_number(0.0, strict=False)  # a cost that may be 0 or inf


def out_dir(text: str) -> Path:
    """argparse type of an output folder: refused when a file already has its name."""
    path = Path(text)
    if path.exists() and not path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a file; give a folder (it is created)")
    return path


def out_file(text: str) -> Path:
    """argparse type of an output file: refused when a folder already has its name."""
    path = Path(text)
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a folder; give a file name, e.g. "
                                         f"{path / 'scores.jsonl'}")
    return path


# ---------------------------------------------------------------- option groups
def add_model_options(p: argparse.ArgumentParser) -> None:
    """--model and how it loads (:func:`add_load_options`)."""
    p.add_argument("--model", default="smollm2",
                   help="registry name (see `isouq models`), local folder/.gguf, or HF hub id "
                        "(default: smollm2, the embedded SmolLM2-135M-Instruct)")
    add_load_options(p)


def add_load_options(p: argparse.ArgumentParser) -> None:
    """How the model loads (``isouq.models.load_model``'s options), on every command that
    loads one."""
    p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N, mps or auto")
    p.add_argument("--dtype", default=None, help="float32 (default), bfloat16, float16, auto")
    p.add_argument("--trust-remote-code", action="store_true",
                   help="allow a model repository's own Python code to run (off by default)")
    p.add_argument("--allow-pickle", action="store_true",
                   help="accept pickled .bin weights (read with torch.load(weights_only=True))")
    p.add_argument("--quantize", choices=QUANTIZE, default=None,
                   help="quantize on load with bitsandbytes (CPU or CUDA; the quantize extra); "
                        "quantized weights are scored as their dequantized values")
    p.add_argument("--adapter", default=None, metavar="DIR",
                   help="a PEFT adapter folder put over the model (unmerged; where the "
                        "command has --params, --params adapter scores it alone)")
    p.add_argument("--device-map", default=None, choices=DEVICE_MAPS,
                   help="place a model larger than one device with accelerate: auto fills the "
                        "GPUs, then CPU memory, then disk; offloaded layers are scored exactly "
                        "(docs: Distributed runs)")
    p.add_argument("--max-memory", default=None, metavar="DEV=SIZE,...",
                   help="with --device-map: the memory each device may take, e.g. "
                        "0=20GB,cpu=60GB (the rest goes to disk)")
    p.add_argument("--offload-folder", default=None, metavar="DIR",
                   help="with --device-map: where layers offloaded to disk are written "
                        "(default: a temporary folder)")


def add_params_option(p: argparse.ArgumentParser) -> None:
    """Which parameters take part in the gradient (``isouq.param_sets.PARAM_SETS``)."""
    p.add_argument("--params", nargs="+", default=None, metavar="SET|PATTERN",
                   help="a parameter set — " + "; ".join(
                       f"{k}: {v}" for k, v in PARAM_SETS.items())
                   + " — or parameter name patterns (default: all)")


def add_compile_option(p: argparse.ArgumentParser) -> None:
    """``--compile``: graph capture of each batch's ghost backward (``score_sequences(...,
    compile=True)``, ``isouq.capture``), where its checks pass; refused in one line where not."""
    p.add_argument("--compile", action="store_true",
                   help="capture each batch's ghost backward as one graph (compiled autograd), "
                        "offered only where isouq's checks pass on the first batch (the same "
                        "operations and shapes for every batch of a bucket, no value read "
                        "back, no graph break, the eager scores); refused with the reason "
                        "otherwise")


def add_sampling_options(p: argparse.ArgumentParser, *, k: int, what: str) -> None:
    """The sampling settings of the methods that need K sampled answers (one rule for every
    command: ``methods.check_sampling``)."""
    p.add_argument("--k", type=positive_int, default=k, help=f"sampled answers per question, "
                   f"shared by {what}")
    p.add_argument("--k-p-true", type=non_negative_int, default=5,
                   help="sampled answers P(True) shows as brainstormed (Farquhar: 5; 0: none)")
    p.add_argument("--temperature", type=positive_float, default=1.0,
                   help="sampling temperature")
    p.add_argument("--seed", type=int, default=0,
                   help="seed of the samples (for a dataset, also of its subset)")


def add_methods_option(p: argparse.ArgumentParser, flag: str, among: Iterable[str],
                       default: Iterable[str], what: str) -> None:
    """A list of methods of the registry (``isouq.methods.METHODS``), with their help."""
    among = list(among)
    p.add_argument(flag, nargs="+", default=list(default), metavar="METHOD", choices=among,
                   help=f"{what}: " + "; ".join(f"{m}: {METHODS[m].help}" for m in among))


# ---------------------------------------------------------------- readers
#: the load options given only when asked for (:func:`add_load_options`)
LOAD_OPTIONS = ("quantize", "adapter", "device_map", "max_memory", "offload_folder")


def load_kw(args: argparse.Namespace) -> dict:
    """``load_model``'s keyword arguments from :func:`add_load_options`' options."""
    kw = {"device": args.device, "dtype": args.dtype,
          "trust_remote_code": args.trust_remote_code, "allow_pickle": args.allow_pickle}
    kw.update({opt: getattr(args, opt) for opt in LOAD_OPTIONS
               if getattr(args, opt, None) is not None})
    return kw


def refuse_load_options(args: argparse.Namespace, why: str) -> None:
    """InputError naming the load options given to a run that loads no model (``why``)."""
    given = [f"--{o.replace('_', '-')}" for o in LOAD_OPTIONS
             if getattr(args, o, None) is not None]
    if given:
        raise InputError(f"{' '.join(given)}: {why} and loads no model; drop "
                         f"{'it' if len(given) == 1 else 'them'}")


def params_value(args: argparse.Namespace):
    """--params as ``score_sequences`` takes it: a set's name, patterns, or None."""
    if args.params is None:
        return None
    return args.params[0] if len(args.params) == 1 and args.params[0] in (
        *PARAM_SETS, "last_layer") else args.params


def calibration_of(args: argparse.Namespace):
    """The --calibration file, read and checked against --model by name when it records no
    weight hashes (those are compared once the model is loaded); None without the option."""
    if getattr(args, "calibration", None) is None:
        return None
    from ..calibration import Calibrator

    cal = Calibrator.load(args.calibration)
    if not cal.doc["model"].get("sha256"):
        cal.check_model(args.model)
    return cal
