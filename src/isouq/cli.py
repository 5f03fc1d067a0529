"""The ``isouq`` command. Every user-facing job is a subcommand; see ``isouq --help``.

Science lives in the library; this module parses arguments, sets up progress and files, and
turns user errors (``IsouqError``) into one clean line and exit status 2.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import time
from pathlib import Path

from .distributed import SHARD_MODES
from .errors import InputError, IsouqError, require
from .llm.prompts import JUDGE_STYLES
from .methods import BASELINES, METHODS
from .models.options import DEVICE_MAPS
from .param_sets import PARAM_SETS
from .runtime import configure
from .study.qa.runner import DEFAULT_JUDGE_MODEL, DEFAULT_JUDGE_PROMPT

SPAN_SPLITTERS = ("sentences", "lines")  # isouq.spans.SPLITTERS (not imported: torch-free)

EXPERIMENTS = {
    "validation": "isouq.study.experiments.validation",
    "scaling": "isouq.study.experiments.scaling",
    "proxy-bias-2d": "isouq.study.experiments.proxy_bias_2d",
    "proxy-bias-text": "isouq.study.experiments.proxy_bias_text",
    "classifiers": "isouq.study.experiments.classifiers",
}


# What needs more than torch and numpy (the core), by the extra that installs it.
EXTRA_MODULES = {
    "llm": ("transformers", "safetensors", "gguf", "accelerate", "peft"),
    "quantize": ("bitsandbytes",),
    "report": ("scipy", "sklearn", "statsmodels", "matplotlib"),
    "reference": ("jax", "numpyro"),
    "serve": ("fastapi", "uvicorn", "prometheus_client", "pydantic"),
}
EXPERIMENT_EXTRAS = {"validation": "reference,report", "scaling": "reference,report",
                     "proxy-bias-2d": "report", "proxy-bias-text": "llm,report",
                     "classifiers": "report"}


def require_extras(extras: str, what: str) -> None:
    """Raise MissingExtraError naming ``pip install 'isouq[EXTRAS]'`` if a module is missing."""
    mods = [m for e in extras.split(",") for m in EXTRA_MODULES[e]]
    require(*mods, extra=extras, what=what)


def _require_for(args) -> None:
    """Before a command imports an optional package, say which extra it needs."""
    cmd = args.command
    if cmd in ("ask", "score") or (cmd == "demo" and not args.toy):
        require_extras("llm", f"isouq {cmd}")
    elif cmd == "demo":
        require_extras("report", "isouq demo --toy")
    elif cmd in ("report", "calibrate"):
        require_extras("report", f"isouq {cmd}")
    elif cmd == "serve":
        require_extras("llm,serve", "isouq serve")
    elif cmd == "qa" and args.qa_command in ("run", "mc", "short", "long"):
        require_extras("llm,report", f"isouq qa {args.qa_command}")


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


def positive_float(text: str) -> float:
    """argparse type of a quantity that must be > 0 (a temperature)."""
    try:
        x = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not x > 0:
        raise argparse.ArgumentTypeError(f"{x} must be > 0")
    return x


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


def _model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="smollm2",
                   help="registry name (see `isouq models`), local folder/.gguf, or HF hub id "
                        "(default: smollm2, the embedded SmolLM2-135M-Instruct)")
    _load_args(p)


def _load_args(p: argparse.ArgumentParser) -> None:
    """How the model loads (``isouq.models.load_model``'s options), on every command that
    loads one."""
    p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N, mps or auto")
    p.add_argument("--dtype", default=None, help="float32 (default), bfloat16, float16, auto")
    p.add_argument("--trust-remote-code", action="store_true",
                   help="allow a model repository's own Python code to run (off by default)")
    p.add_argument("--allow-pickle", action="store_true",
                   help="accept pickled .bin weights (read with torch.load(weights_only=True))")
    p.add_argument("--quantize", choices=["4bit", "8bit"], default=None,
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


def _params_arg(p: argparse.ArgumentParser) -> None:
    """Which parameters take part in the gradient (``isouq.params.PARAM_SETS``)."""
    p.add_argument("--params", nargs="+", default=None, metavar="SET|PATTERN",
                   help="a parameter set — " + "; ".join(
                       f"{k}: {v}" for k, v in PARAM_SETS.items())
                   + " — or parameter name patterns (default: all)")


def _params_value(args):
    """--params as ``score_sequences`` takes it: a set's name, patterns, or None."""
    if args.params is None:
        return None
    return args.params[0] if len(args.params) == 1 and args.params[0] in (
        *PARAM_SETS, "last_layer") else args.params


def _sampling_args(p: argparse.ArgumentParser, *, k: int, what: str) -> None:
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


def _methods_arg(p: argparse.ArgumentParser, flag: str, among, default, what: str) -> None:
    """A list of methods of the registry (``isouq.methods.METHODS``), with their help."""
    p.add_argument(flag, nargs="+", default=list(default), metavar="METHOD", choices=list(among),
                   help=f"{what}: " + "; ".join(f"{m}: {METHODS[m].help}" for m in among))


#: the load options given only when asked for (``_load_args``)
_LOAD_OPTIONS = ("quantize", "adapter", "device_map", "max_memory", "offload_folder")


def _load_kw(args) -> dict:
    """``load_model``'s keyword arguments from ``_load_args``' options."""
    kw = {"device": args.device, "dtype": args.dtype,
          "trust_remote_code": args.trust_remote_code, "allow_pickle": args.allow_pickle}
    kw.update({opt: getattr(args, opt) for opt in _LOAD_OPTIONS
               if getattr(args, opt, None) is not None})
    return kw


def _refuse_load_options(args, why: str) -> None:
    """InputError naming the load options given to a run that loads no model (``why``)."""
    given = [f"--{o.replace('_', '-')}" for o in _LOAD_OPTIONS
             if getattr(args, o, None) is not None]
    if given:
        raise InputError(f"{' '.join(given)}: {why} and loads no model; drop "
                         f"{'it' if len(given) == 1 else 'them'}")


def _load(args):
    from .models import load_model

    return load_model(args.model, **_load_kw(args))


# ---------------------------------------------------------------- commands
def cmd_demo(args) -> int:
    from . import demo

    configure()
    if args.toy:
        _refuse_load_options(args, "--toy trains its own small network")
        demo.run_toy(Path(args.out), seed=args.seed)
    else:
        demo.run_llm(args.model, n=args.n, max_new_tokens=args.max_new_tokens, **_load_kw(args))
    return 0


def cmd_ask(args) -> int:
    import json

    from .ask import ask, legend, print_spans, print_table

    configure()
    if args.html is not None and args.spans is None:
        raise InputError("--html writes the answers shaded sentence by sentence; add --spans")
    if args.html is not None:
        from .score_run import check_out

        check_out(args.html)
    questions = list(args.questions)
    if args.file is not None:
        if args.file == "-":
            text = sys.stdin.read()
        elif not Path(args.file).is_file():
            raise InputError(f"--file {args.file} does not exist; give a text file with one "
                             "question per line, or - for standard input")
        else:
            text = Path(args.file).read_text("utf-8")
        questions += [line for line in text.splitlines() if line.strip()]
    load = _load_kw(args)
    judge_load = {k: v for k, v in load.items() if k not in ("quantize", "adapter")}
    got = ask(questions, model=args.model, load=load, baselines=args.baselines,
              entailment_model=args.entailment_model, entailment_load=judge_load,
              reference=args.reference, calibration=_calibration(args),
              params=_params_value(args), k=args.k, k_p_true=args.k_p_true,
              temperature=args.temperature, seed=args.seed, max_new_tokens=args.max_new_tokens,
              batch_size=args.batch_size, spans=args.spans)
    rows, reference, cal = got.rows, got.reference, got.calibration
    if args.json:
        for r in rows:
            print(json.dumps(r, ensure_ascii=False))
    else:
        print_table(rows)
        print(f"\n{legend(rows)}")
        if reference is not None:
            print(f"pct = percentile among {len(reference)} answers of {args.model} in "
                  f"{args.reference} ({', '.join(sorted({r['dataset'] for r in reference}))})")
        if cal is not None:
            print(cal.describe())
        if args.spans is not None:
            print_spans(rows)
    if args.html is not None:
        from .study.report.spans import spans_page

        Path(args.html).write_text(spans_page(rows), encoding="utf-8")
        print(f"answers shaded {args.spans[:-1]} by {args.spans[:-1]} -> {args.html}",
              file=sys.stderr if args.json else sys.stdout)
    return 0


def _calibration(args):
    """The --calibration file, read and checked against --model by name when it records no
    weight hashes (those are compared once the model is loaded); None without the option."""
    if getattr(args, "calibration", None) is None:
        return None
    from .calibration import Calibrator

    cal = Calibrator.load(args.calibration)
    if not cal.doc["model"].get("sha256"):
        cal.check_model(args.model)
    return cal


def cmd_score(args) -> int:
    from .score_run import score_file

    configure()
    params = _params_value(args)
    if args.html is not None and args.spans is None:
        raise InputError("--html writes the answers shaded span by span; add --spans")
    for line in score_file(args.input, args.out, model=args.model, load=_load_kw(args),
                           method=args.method, params=params, batch_size=args.batch_size,
                           max_tokens_per_batch=args.max_tokens_per_batch,
                           bucket=not args.no_bucketing, limit=args.limit,
                           on_error=args.on_error, memory_budget=args.memory_budget,
                           calibration=_calibration(args), spans=args.spans,
                           shard=args.shard):
        print(line)
    if args.html is not None:
        from .distributed import dist_env

        if dist_env().is_main:
            from .runio import read_jsonl
            from .study.report.spans import spans_page

            rows = [r for r in read_jsonl(args.out) if "spans" in r]
            Path(args.html).write_text(spans_page(rows), encoding="utf-8")
            print(f"{len(rows)} answers shaded span by span -> {args.html}")
    return 0


def cmd_serve(args) -> int:
    from .memory_plan import parse_bytes
    from .serve.config import ServeSettings
    from .serve.server import resolve_api_key, run_server

    configure()
    settings = ServeSettings(
        model_id=args.model, max_batch=args.max_batch, max_wait_ms=args.max_wait_ms,
        max_queue=args.max_queue, request_timeout_s=args.request_timeout,
        max_body_bytes=args.max_body_bytes, max_messages=args.max_messages,
        max_prompt_tokens=args.max_prompt_tokens, max_answer_tokens=args.max_answer_tokens,
        max_new_tokens=args.max_new_tokens, max_n=args.max_n, max_pairs=args.max_pairs,
        memory_budget=None if args.memory_budget is None else parse_bytes(args.memory_budget),
        params=_params_value(args), api_key=resolve_api_key(args.api_key))
    run_server(args.model, load=_load_kw(args), calibration=_calibration(args),
               settings=settings, host=args.host, port=args.port, log_level=args.log_level)
    return 0


def cmd_merge(args) -> int:
    from .data.pairs import scan_pairs
    from .distributed import merge_shards

    keys = scan_pairs(args.input).keys
    path = merge_shards(args.out, args.world_size, keys, remove=args.remove_shards)
    print(f"merged {args.world_size} shards into {path}")
    return 0


def cmd_models(args) -> int:
    from . import models

    if args.fetch:
        models.fetch(args.fetch)
        return 0
    for name in models.list_models():
        e = models.get_entry(name)
        mark = "installed" if models.installed(name) else "not installed"
        default = " (default)" if name == models.DEFAULT_MODEL else ""
        print(f"{name}{default}: {mark}\n  {e.describe()}")
    return 0


def cmd_experiment(args) -> int:
    mod = importlib.import_module(EXPERIMENTS[args.name])
    configure()
    opts = {k: v for k, v in vars(args).items()
            if k not in ("command", "name", "out", "quick", "seed", "device", "func")}
    t0 = time.perf_counter()
    path = mod.run(Path(args.out), quick=args.quick, seed=args.seed, device=args.device, **opts)
    print(f"{args.name}: results in {path} ({time.perf_counter() - t0:.0f} s)")
    return 0


def cmd_qa_run(args) -> int:
    from .distributed import device_for, dist_env, init_process_group
    from .study.qa.runner import QAConfig, QARunner

    configure()
    env = dist_env()
    args.device = device_for(env, args.device)
    init_process_group(env, args.device)
    cfg = QAConfig(dataset=args.dataset, model=args.model, limit=args.limit, seed=args.seed,
                   methods=tuple(args.methods), k=args.k, k_p_true=args.k_p_true,
                   temperature=args.temperature, max_new_tokens=args.max_new_tokens,
                   batch_size=args.batch_size,
                   judge_model=None if args.judge_model == "none" else args.judge_model,
                   judge_prompt=args.judge_prompt, entailment_model=args.entailment_model,
                   data_path=args.data, **_load_kw(args))
    path = QARunner(cfg, Path(args.out), env=env).run()
    print(f"qa run complete: {path}")
    return 0


def cmd_qa_mc(args) -> int:
    from .study.qa.mc import run_mc

    configure()
    path = run_mc(args.model, args.out, limit=args.limit, data=args.data, **_load_kw(args))
    print(f"qa mc complete: {path}")
    return 0


def cmd_qa_short(args) -> int:
    from .study.qa.short import run_short

    configure()
    path = run_short(args.model, args.out, limit=args.limit, seed=args.seed,
                     methods=tuple(args.methods), k=args.k, batch_size=args.batch_size,
                     entailment_model=args.entailment_model, **_load_kw(args))
    print(f"qa short complete: {path}")
    return 0


def cmd_qa_long(args) -> int:
    from .study.qa.long import run_long, write_long_results

    configure()
    if args.evaluate_only:
        _refuse_load_options(args, "--evaluate-only rewrites the tables from the rows")
        path = write_long_results(args.out, n_bootstrap=args.n_bootstrap, seed=args.seed)
    else:
        path = run_long(args.model, args.out, settings=tuple(args.settings),
                        questions=args.questions, answers=args.answers, seed=args.seed,
                        short_dir=None if args.short == "none" else args.short,
                        max_new_tokens=args.max_new_tokens, batch_size=args.batch_size,
                        n_bootstrap=args.n_bootstrap, say=print, **_load_kw(args))
    print(f"qa long: tables in {path}")
    return 0


def cmd_qa_label(args) -> int:
    import getpass

    from .study.qa.hand_labels import label_file

    n = label_file(args.rows, args.out, labeler=args.labeler or f"human: {getpass.getuser()}",
                   sample=args.sample, seed=args.seed, data=args.data)
    print(f"{n} verdicts written to {args.out}")
    return 0


def cmd_calibrate(args) -> int:
    from .calibrate_run import run_calibration, summary

    path = run_calibration(args.rows, args.out, labels=args.labels, max_risk=args.max_risk,
                           delta=args.delta, model=args.model, gold=args.gold or (),
                           seed=args.seed)
    print(summary(path))
    return 0


def cmd_report(args) -> int:
    from .study.report.build import build_report

    opts = {"n_bootstrap": args.n_bootstrap, "max_span_answers": args.max_span_answers}
    path = build_report([Path(p) for p in args.inputs], Path(args.out),
                        **{k: v for k, v in opts.items() if v is not None})
    print(f"report written to {path}")
    return 0


# ---------------------------------------------------------------- parser
def build_parser(argv: list[str]) -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="isouq",
        description="Uncertainty from gradient norms: epistemic ‖∇θ p‖², aleatoric p(1−p).",
    )
    sub = ap.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("demo", help="the flagship in a minute: SmolLM2 answers, scored")
    _model_args(p)
    p.add_argument("-n", type=positive_int, default=8, help="number of demo questions (≤ 8)")
    p.add_argument("--max-new-tokens", type=positive_int, default=24)
    p.add_argument("--toy", action="store_true",
                   help="instead: train a small classifier on 2D XOR and plot its maps")
    p.add_argument("--out", type=out_dir, default="runs/demo",
                   help="where --toy saves its figure")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser("ask", help="answer your questions and say how far to trust each answer")
    _model_args(p)
    _params_arg(p)
    p.add_argument("questions", nargs="*", help="questions, each in quotes")
    p.add_argument("--file", default=None,
                   help="a text file with one question per line (- reads standard input)")
    p.add_argument("--max-new-tokens", type=positive_int, default=50)
    p.add_argument("--batch-size", type=positive_int, default=16)
    p.add_argument("--reference", default=None,
                   help="QA rows of the same model (e.g. results/qa): adds each score's "
                        "percentile among that model's answers")
    p.add_argument("--calibration", default=None, metavar="FILE",
                   help="a calibration.json of `isouq calibrate` for this model: adds P(correct) "
                        "(and withheld, when it holds a threshold)")
    p.add_argument("--json", action="store_true",
                   help="one JSON object per answer (all scores and timings) instead of a table")
    _methods_arg(p, "--baselines", BASELINES, (),
                 "also the QA study's sampling baselines (K sampled answers per question; "
                 "semantic entropy also loads --entailment-model)")
    _sampling_args(p, k=10, what="the baselines")
    p.add_argument("--entailment-model", default=DEFAULT_JUDGE_MODEL,
                   help="semantic entropy's entailment judge (as for `isouq qa run`)")
    p.add_argument("--spans", nargs="?", const="sentences", choices=SPAN_SPLITTERS,
                   default=None, help="also score each answer sentence by sentence (or line by "
                   "line) and mark the least trusted (docs: Span scores)")
    p.add_argument("--html", default=None, metavar="FILE",
                   help="with --spans: write the answers, each span shaded by its score, to FILE")
    p.set_defaults(func=cmd_ask)

    p = sub.add_parser("score", help="score (prompt, answer) rows of a JSONL/CSV file")
    p.add_argument("input", help="JSONL/CSV with 'answer' and 'prompt' or 'question' columns")
    p.add_argument("--out", type=out_file, required=True,
                   help="output JSONL (resumable: done keys skipped)")
    _model_args(p)
    p.add_argument("--batch-size", type=positive_int, default=16)
    p.add_argument("--method", choices=["ghost", "per_example", "per_token", "loop"],
                   default="ghost", help="the engine (isouq.engines): ghost (every answer of a "
                   "batch from one backward), per_example (one backward per answer, the "
                   "paper's way; older name loop), per_token (the paper's comparison)")
    _params_arg(p)
    p.add_argument("--limit", type=positive_int, default=None, help="score only the first N rows")
    p.add_argument("--max-tokens-per-batch", type=positive_int, default=None,
                   help="cap on padded tokens per batch (rows × longest), to fit memory")
    p.add_argument("--no-bucketing", action="store_true",
                   help="score in input order instead of sorted by length")
    p.add_argument("--calibration", default=None, metavar="FILE",
                   help="a calibration.json of `isouq calibrate` for this model: each row gets "
                        "p_correct (and withheld, when it holds a threshold)")
    p.add_argument("--memory-budget", default=None, metavar="SIZE",
                   help="e.g. 8GB: batches are cut so that the predicted peak memory of the "
                        "process fits (docs: Speed and memory)")
    p.add_argument("--on-error", choices=["skip", "stop"], default="skip",
                   help="a row that cannot be scored: write an error row and go on (skip, the "
                        "default) or stop the run")
    p.add_argument("--spans", choices=SPAN_SPLITTERS, default=None,
                   help="also score each answer's sentences (or lines): a `spans` list per row "
                        "(docs: Span scores)")
    p.add_argument("--html", default=None, metavar="FILE",
                   help="with --spans: also write the scored answers, each span shaded by its "
                        "score, to FILE")
    p.add_argument("--shard", choices=SHARD_MODES, default=None,
                   help="under torchrun: split the weights over the ranks with FSDP2, each "
                        "rank holding 1/W of the model and scoring its own rows (docs: "
                        "Distributed runs)")
    p.set_defaults(func=cmd_score)

    p = sub.add_parser("serve", help="an OpenAI-compatible HTTP server whose answers carry "
                                     "their uncertainty (docs: serve.md)")
    _model_args(p)
    p.add_argument("--calibration", default=None, metavar="FILE",
                   help="a calibration.json of `isouq calibrate` for this model: every answer "
                        "gets p_correct (and withheld, when it holds a threshold)")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=whole_number(0), default=8000)
    p.add_argument("--api-key", default=None,
                   help="require 'Authorization: Bearer KEY' on every endpoint but /health "
                        "(default: the ISOUQ_API_KEY environment variable, else none)")
    _params_arg(p)
    p.add_argument("--max-batch", type=positive_int, default=16,
                   help="answers scored together in one backward pass (memory grows with it)")
    p.add_argument("--memory-budget", default=None, metavar="SIZE",
                   help="e.g. 8GB: a batch whose predicted peak memory is over it is scored in "
                        "as few passes as fit; a request that cannot fit alone gets 413")
    p.add_argument("--max-wait-ms", type=float, default=5.0,
                   help="how long a request waits for others to share its batch")
    p.add_argument("--max-queue", type=positive_int, default=64,
                   help="requests waiting; more are answered 429 with Retry-After")
    p.add_argument("--request-timeout", type=positive_float, default=120.0, metavar="SECONDS",
                   help="a request not answered by then gets 504")
    p.add_argument("--max-body-bytes", type=positive_int, default=1 << 20)
    p.add_argument("--max-messages", type=positive_int, default=64)
    p.add_argument("--max-prompt-tokens", type=positive_int, default=2048)
    p.add_argument("--max-answer-tokens", type=positive_int, default=1024,
                   help="tokens of an answer sent to /v1/score")
    p.add_argument("--max-new-tokens", type=positive_int, default=256,
                   help="the largest max_tokens a request may ask for")
    p.add_argument("--max-n", type=positive_int, default=8, help="the largest n (choices)")
    p.add_argument("--max-pairs", type=positive_int, default=64,
                   help="pairs per /v1/score request (and prompts × n per /v1/completions)")
    p.add_argument("--log-level", default="info",
                   choices=["critical", "error", "warning", "info", "debug"])
    p.set_defaults(func=cmd_serve)

    p = sub.add_parser("merge", help="merge the per-rank shards of a torchrun `score` run")
    p.add_argument("input", help="the input file of the run (gives the row order)")
    p.add_argument("--out", required=True, help="the run's --out")
    p.add_argument("--world-size", type=positive_int, required=True)
    p.add_argument("--remove-shards", action="store_true")
    p.set_defaults(func=cmd_merge)

    p = sub.add_parser("models", help="list the named models (or --fetch one)")
    p.add_argument("--fetch", metavar="NAME", help="install an optional model's wheels")
    p.set_defaults(func=cmd_models)

    p = sub.add_parser("experiment", help="reproduce one of the paper's experiments")
    esub = p.add_subparsers(dest="name", required=True, metavar="NAME")
    for name, modname in EXPERIMENTS.items():
        e = esub.add_parser(name, help=f"the {name} experiment")
        e.add_argument("--out", type=out_dir, required=True,
                       help="output directory (results.json, PNGs)")
        e.add_argument("--quick", action="store_true", help="a small run (minutes)")
        e.add_argument("--seed", type=int, default=0)
        e.add_argument("--device", default="cpu")
        e.set_defaults(func=cmd_experiment)
        if len(argv) > 1 and argv[0] == "experiment" and argv[1] == name:
            require_extras(EXPERIMENT_EXTRAS[name], f"isouq experiment {name}")
            importlib.import_module(modname).add_arguments(e)

    p = sub.add_parser("qa", help="the question-answering study")
    qsub = p.add_subparsers(dest="qa_command", required=True, metavar="SUBCOMMAND")
    q = qsub.add_parser("run", help="answers, scores, baselines and correctness per question")
    q.add_argument("--dataset", default="truthfulqa", help="truthfulqa, triviaqa, or a JSONL path")
    q.add_argument("--data", default=None, help="local file for the dataset (default: shipped)")
    _model_args(q)
    q.add_argument("--limit", type=positive_int, default=200, help="questions (seeded subset)")
    q.add_argument("--out", type=out_dir, required=True, help="output directory (resumable)")
    _methods_arg(q, "--methods", METHODS, METHODS, "the methods")
    _sampling_args(q, k=10, what="the entropies and P(True) (Farquhar: 10)")
    q.add_argument("--max-new-tokens", type=positive_int, default=50)
    q.add_argument("--batch-size", type=positive_int, default=8)
    q.add_argument("--judge-model", default=DEFAULT_JUDGE_MODEL,
                   help="LLM judge of correctness ('none': lexical labels only)")
    q.add_argument("--judge-prompt", default=DEFAULT_JUDGE_PROMPT, choices=JUDGE_STYLES,
                   help="'farquhar2024': their prompt as is; 'strict': the same with explicit "
                        "rules, for small judges; 'contrast': strict plus the dataset's known "
                        "incorrect answers (TruthfulQA; elsewhere = strict). See README; rows "
                        "judged otherwise are re-judged")
    q.add_argument("--entailment-model", default=None,
                   help="semantic-entropy entailment: an MNLI-style classifier (e.g. "
                        "microsoft/deberta-large-mnli, Farquhar et al.'s kind) or a causal LM "
                        "asked with Farquhar's prompt (default: the judge model)")
    q.set_defaults(func=cmd_qa_run)
    q = qsub.add_parser("mc", help="TruthfulQA MC1: the option of highest p̄, exact labels, scored")
    _model_args(q)
    q.add_argument("--out", type=out_dir, required=True, help="output folder (resumable)")
    q.add_argument("--limit", type=positive_int, default=None, help="first N questions (all 817)")
    q.add_argument("--data", default=None, help="another mc_task.json (default: shipped)")
    q.set_defaults(func=cmd_qa_mc)
    q = qsub.add_parser("short", help="TriviaQA short answers: few-shot prompt, alias-match labels")
    _model_args(q)
    q.add_argument("--out", type=out_dir, required=True, help="output folder (resumable)")
    q.add_argument("--limit", type=positive_int, default=1000, help="questions (seeded subset)")
    q.add_argument("--seed", type=int, default=0, help="subset and sampling seed")
    _methods_arg(q, "--methods", list(METHODS), ("gradient", "naive_entropy", "p_true"),
                 "the methods")
    q.add_argument("--entailment-model", default=DEFAULT_JUDGE_MODEL,
                   help="semantic entropy's entailment judge, with --methods semantic_entropy "
                        "(as for `isouq qa run`)")
    q.add_argument("--k", type=positive_int, default=5,
                   help="samples for naive entropy, P(True) and semantic entropy")
    q.add_argument("--batch-size", type=positive_int, default=8)
    q.set_defaults(func=cmd_qa_short)
    q = qsub.add_parser("long", help="long answers (5 TriviaQA questions per prompt), every "
                                     "sentence labelled by alias match: span scores vs baselines")
    q.add_argument("--model", nargs="+", default=["smollm2"],
                   help="registry names, folders or hub ids, run one after the other")
    q.add_argument("--settings", nargs="+", choices=["composed", "generated"],
                   default=["composed", "generated"],
                   help="composed: the model's own short answers as the sentences; generated: "
                        "its answer to the prompt, lines aligned by number")
    q.add_argument("--out", type=out_dir, required=True, help="output folder (resumable)")
    q.add_argument("--short", default="results/qa_short",
                   help="the kept `qa short` rows ('none': answer every question here)")
    q.add_argument("--questions", type=positive_int, default=1050,
                   help="TriviaQA questions (the seeded subset of `qa short`), 5 per prompt")
    q.add_argument("--answers", type=positive_int, default=None,
                   help="at most this many prompts per model and setting (default: all)")
    q.add_argument("--seed", type=int, default=0, help="the subset's seed (as `qa short`)")
    q.add_argument("--max-new-tokens", type=positive_int, default=64,
                   help="the generated answers' length cap")
    q.add_argument("--batch-size", type=positive_int, default=2,
                   help="answers per scoring pass (each is 6 rows)")
    q.add_argument("--n-bootstrap", type=positive_int, default=1000,
                   help="resamples of the answers for the intervals")
    _load_args(q)
    q.add_argument("--evaluate-only", action="store_true",
                   help="only rewrite results.json, tables.md and the figure from the rows")
    q.set_defaults(func=cmd_qa_long)
    q = qsub.add_parser("label", help="hand-label answers of a QA run (gold labels)")
    q.add_argument("rows", help="a QA rows file, e.g. results/qa/qa_truthfulqa__smollm2.jsonl")
    q.add_argument("--out", type=out_file, required=True,
                   help="gold JSONL (resumable), e.g. results/qa/gold/truthfulqa__smollm2.gold.jsonl")
    q.add_argument("--sample", type=positive_int, default=None, help="label a random sample of N rows")
    q.add_argument("--seed", type=int, default=7)
    q.add_argument("--labeler", default=None, help="who labels (default: the user name)")
    q.add_argument("--data", default=None, help="the dataset file, to show incorrect answers")
    q.set_defaults(func=cmd_qa_label)

    p = sub.add_parser("calibrate", help="P(correct) from the scores, fitted on labelled rows; "
                                         "optionally a threshold with an error-rate guarantee")
    p.add_argument("rows", nargs="+", help="labelled rows: files or folders of `isouq qa run` "
                                           "(or JSONL with the scores and a 0/1 'correct')")
    p.add_argument("--out", type=out_dir, required=True,
                   help="output folder (calibration.json, crossfit.jsonl, results.json, PNGs)")
    p.add_argument("--labels", choices=["hand", "judge", "lexical"], default="judge",
                   help="which labels: hand (gold/ beside the rows, or --gold), the LLM judge's "
                        "(default), or lexical matching")
    p.add_argument("--gold", nargs="+", default=None, metavar="PATH",
                   help="hand-label files or folders (default: gold/ beside the rows)")
    p.add_argument("--max-risk", type=float, default=None, metavar="A",
                   help="withhold answers so that the error rate among those kept is ≤ A ...")
    p.add_argument("--delta", type=float, default=0.1, metavar="D",
                   help="... with probability ≥ 1 − D (Learn then Test; default 0.1)")
    p.add_argument("--model", default=None,
                   help="the model to calibrate, when the rows hold several or name none")
    p.add_argument("--seed", type=int, default=0, help="folds and split")
    p.set_defaults(func=cmd_calibrate)

    p = sub.add_parser("report", help="one HTML report from results dirs and QA runs")
    p.add_argument("inputs", nargs="+", help="results.json dirs/files and QA JSONL dirs/files")
    p.add_argument("--out", type=out_dir, required=True, help="output folder (report.html, …)")
    p.add_argument("--n-bootstrap", type=positive_int, default=None)
    p.add_argument("--max-span-answers", type=non_negative_int, default=None, metavar="N",
                   help="answers scored span by span (isouq score --spans) shaded in the "
                        "report, at most (default 50; the rest are counted in its tables)")
    p.set_defaults(func=cmd_report)
    return ap


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        args = build_parser(argv).parse_args(argv)
        _require_for(args)
        return args.func(args)
    except IsouqError as e:
        print(f"isouq: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("isouq: interrupted; rows already written are kept (re-run to resume)",
              file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
