"""``isouq ask``: answer the user's questions and say how far to trust each answer."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ..choices import DEFAULT_JUDGE_MODEL, SPAN_SPLITTERS
from ..errors import InputError
from ..methods import BASELINES
from ..runtime import configure
from .extras import require_extras
from .options import (
    add_methods_option,
    add_model_options,
    add_params_option,
    add_sampling_options,
    calibration_of,
    load_kw,
    params_value,
    positive_int,
)


def add_to(sub: argparse._SubParsersAction) -> None:
    """Add ``ask`` to the ``isouq`` subcommands."""
    p = sub.add_parser("ask", help="answer your questions and say how far to trust each answer")
    add_model_options(p)
    add_params_option(p)
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
                   help="one JSON object per answer (all scores and timings), printed a batch at "
                        "a time as each is done, instead of a table")
    add_methods_option(p, "--baselines", BASELINES, (),
                       "also the QA study's sampling baselines (K sampled answers per question; "
                       "semantic entropy also loads --entailment-model)")
    add_sampling_options(p, k=10, what="the baselines")
    p.add_argument("--entailment-model", default=DEFAULT_JUDGE_MODEL,
                   help="semantic entropy's entailment judge (as for `isouq qa run`)")
    p.add_argument("--spans", nargs="?", const="sentences", choices=SPAN_SPLITTERS,
                   default=None, help="also score each answer sentence by sentence (or line by "
                   "line) and mark the least trusted (docs: Span scores)")
    p.add_argument("--html", default=None, metavar="FILE",
                   help="with --spans: write the answers, each span shaded by its score, to FILE")
    p.set_defaults(func=cmd_ask)


def _questions(args: argparse.Namespace) -> list[str]:
    """The questions given, then those of --file (one per line, blank lines skipped)."""
    questions = list(args.questions)
    if args.file is not None:
        if args.file == "-":
            text = sys.stdin.read()
        elif not Path(args.file).exists() or Path(args.file).is_dir():
            # exists, not is_file: a pipe (bash's <(...)) is a file to read too
            raise InputError(f"--file {args.file} is not a file; give a text file with one "
                             "question per line, or - for standard input")
        else:
            text = Path(args.file).read_text("utf-8")
        questions += [line for line in text.splitlines() if line.strip()]
    return questions


def cmd_ask(args: argparse.Namespace) -> int:
    """Run ``isouq ask``: the table (or JSON rows), then the spans and the HTML page if asked."""
    require_extras("llm", "isouq ask")
    if args.html is not None and args.spans is None:
        raise InputError("--html writes the answers shaded sentence by sentence; add --spans")
    questions = _questions(args)
    from ..ask import ask, legend, print_spans, print_table

    configure()
    if args.html is not None:
        from ..score_run import check_out

        check_out(args.html)
    load = load_kw(args)
    judge_load = {k: v for k, v in load.items() if k not in ("quantize", "adapter")}
    def print_json(rows: list[dict]) -> None:  # each batch as it is done
        for r in rows:
            print(json.dumps(r, ensure_ascii=False), flush=True)

    got = ask(questions, model=args.model, load=load, baselines=args.baselines,
              entailment_model=args.entailment_model, entailment_load=judge_load,
              reference=args.reference, calibration=calibration_of(args),
              params=params_value(args), k=args.k, k_p_true=args.k_p_true,
              temperature=args.temperature, seed=args.seed, max_new_tokens=args.max_new_tokens,
              batch_size=args.batch_size, spans=args.spans,
              on_rows=print_json if args.json else None, progress=sys.stderr.isatty())
    rows, reference, cal = got.rows, got.reference, got.calibration
    if not args.json:
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
        from ..study.report.spans import spans_page

        Path(args.html).write_text(spans_page(rows), encoding="utf-8")
        print(f"answers shaded {args.spans[:-1]} by {args.spans[:-1]} -> {args.html}",
              file=sys.stderr if args.json else sys.stdout)
    return 0
