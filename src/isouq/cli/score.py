"""``isouq score``: score (prompt, answer) rows of a JSONL/CSV file; ``isouq merge``: the
per-rank shards of a torchrun ``score`` run, merged in input order."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..choices import SPAN_SPLITTERS
from ..distributed import SHARD_MODES
from ..engines import ALIASES, ENGINES
from ..errors import InputError
from ..runtime import configure
from .extras import require_extras
from .options import (
    add_compile_option,
    add_model_options,
    add_params_option,
    calibration_of,
    load_kw,
    out_file,
    params_value,
    positive_int,
)


def add_to(sub: argparse._SubParsersAction) -> None:
    """Add ``score`` and ``merge`` to the ``isouq`` subcommands."""
    p = sub.add_parser("score", help="score (prompt, answer) rows of a JSONL/CSV file")
    p.add_argument("input", help="JSONL/CSV with 'answer' and 'prompt' or 'question' columns")
    p.add_argument("--out", type=out_file, required=True,
                   help="output JSONL (resumable: done keys skipped)")
    add_model_options(p)
    p.add_argument("--batch-size", type=positive_int, default=16)
    p.add_argument("--method", choices=[*ENGINES, *ALIASES], default=None, metavar="ENGINE",
                   help="the engine (isouq.engines): " + "; ".join(
                       f"{k}: {v}" for k, v in ENGINES.items()) + " (older names: " + ", ".join(
                       f"{k} = {v}" for k, v in ALIASES.items()) + "; default: ghost, or "
                       "forward with a --calibration that reads no gradient score)")
    add_params_option(p)
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
    p.add_argument("--blocks", action="store_true",
                   help="also write each answer's block profile: ‖∇θ_b p̄‖² per block of the "
                        "model (embeddings, each layer, final norm, head), from the same "
                        "backward (a `blocks` object per row; implied by a --calibration that "
                        "reads it)")
    p.add_argument("--hidden", action="store_true",
                   help="also write each answer's mean hidden state at a quarter, half and "
                        "three quarters of the model's depth and its final-norm output, from the "
                        "scores' own forward (a `hidden` object per row, what `isouq calibrate "
                        "--features ... hidden` reads; implied by a --calibration that reads it)")
    add_compile_option(p)
    p.set_defaults(func=cmd_score)

    p = sub.add_parser("merge", help="merge the per-rank shards of a torchrun `score` run")
    p.add_argument("input", help="the input file of the run (gives the row order)")
    p.add_argument("--out", required=True, help="the run's --out")
    p.add_argument("--world-size", type=positive_int, required=True)
    p.add_argument("--remove-shards", action="store_true")
    p.set_defaults(func=cmd_merge)


def cmd_score(args: argparse.Namespace) -> int:
    """Run ``isouq score``: one summary line per stage, then the HTML page if asked."""
    require_extras("llm", "isouq score")
    if args.html is not None and args.spans is None:
        raise InputError("--html writes the answers shaded span by span; add --spans")
    from ..score_run import score_file

    configure()
    for line in score_file(args.input, args.out, model=args.model, load=load_kw(args),
                           method=args.method, params=params_value(args),
                           batch_size=args.batch_size,
                           max_tokens_per_batch=args.max_tokens_per_batch,
                           bucket=not args.no_bucketing, limit=args.limit,
                           on_error=args.on_error, memory_budget=args.memory_budget,
                           calibration=calibration_of(args), spans=args.spans,
                           shard=args.shard, blocks=args.blocks, hidden=args.hidden,
                           compile=args.compile):
        print(line)
    if args.html is not None:
        from ..distributed import dist_env

        if dist_env().is_main:
            from ..runio import read_jsonl
            from ..study.report.spans import spans_page

            rows = [r for r in read_jsonl(args.out) if "spans" in r]
            Path(args.html).write_text(spans_page(rows), encoding="utf-8")
            print(f"{len(rows)} answers shaded span by span -> {args.html}")
    return 0


def cmd_merge(args: argparse.Namespace) -> int:
    """Run ``isouq merge``."""
    from ..data.pairs import scan_pairs
    from ..distributed import merge_shards

    keys = scan_pairs(args.input).keys
    path = merge_shards(args.out, args.world_size, keys, remove=args.remove_shards)
    print(f"merged {args.world_size} shards into {path}")
    return 0
