"""``isouq qa``: the question-answering study (``run``, ``mc``, ``short``, ``long``, ``label``).

The handlers import the study's QA pipelines (``isouq.study.qa``) when they run; the parser
needs only the method registry and the judge's names (torch-free).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from ..choices import DEFAULT_JUDGE_MODEL, DEFAULT_JUDGE_PROMPT, JUDGE_STYLES
from ..methods import METHODS
from ..runtime import configure
from .extras import require_extras
from .options import (
    add_load_options,
    add_methods_option,
    add_model_options,
    add_sampling_options,
    load_kw,
    out_dir,
    out_file,
    positive_int,
    refuse_load_options,
)


def add_to(sub: argparse._SubParsersAction) -> None:
    """Add ``qa`` and its subcommands to the ``isouq`` subcommands."""
    p = sub.add_parser("qa", help="the question-answering study")
    qsub = p.add_subparsers(dest="qa_command", required=True, metavar="SUBCOMMAND")
    _add_run(qsub)
    _add_mc(qsub)
    _add_short(qsub)
    _add_long(qsub)
    _add_label(qsub)


def _add_run(qsub: argparse._SubParsersAction) -> None:
    q = qsub.add_parser("run", help="answers, scores, baselines and correctness per question")
    q.add_argument("--dataset", default="truthfulqa",
                   help="truthfulqa, triviaqa, an exact-label task (compare, units, "
                        "arithmetic, truthfulqa-mc1), or a JSONL path")
    q.add_argument("--data", default=None, help="local file for the dataset (default: shipped)")
    add_model_options(q)
    q.add_argument("--limit", type=positive_int, default=200, help="questions (seeded subset)")
    q.add_argument("--out", type=out_dir, required=True, help="output directory (resumable)")
    add_methods_option(q, "--methods", METHODS, METHODS, "the methods")
    add_sampling_options(q, k=10, what="the entropies and P(True) (Farquhar: 10)")
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


def _add_mc(qsub: argparse._SubParsersAction) -> None:
    q = qsub.add_parser("mc", help="TruthfulQA MC1: the option of highest p̄, exact labels, scored")
    add_model_options(q)
    q.add_argument("--out", type=out_dir, required=True, help="output folder (resumable)")
    q.add_argument("--limit", type=positive_int, default=None, help="first N questions (all 817)")
    q.add_argument("--data", default=None, help="another mc_task.json (default: shipped)")
    q.set_defaults(func=cmd_qa_mc)


def _add_short(qsub: argparse._SubParsersAction) -> None:
    q = qsub.add_parser("short", help="TriviaQA short answers: few-shot prompt, alias-match labels")
    add_model_options(q)
    q.add_argument("--out", type=out_dir, required=True, help="output folder (resumable)")
    q.add_argument("--limit", type=positive_int, default=1000, help="questions (seeded subset)")
    q.add_argument("--seed", type=int, default=0, help="subset and sampling seed")
    add_methods_option(q, "--methods", METHODS, ("gradient", "naive_entropy", "p_true"),
                       "the methods")
    q.add_argument("--entailment-model", default=DEFAULT_JUDGE_MODEL,
                   help="semantic entropy's entailment judge, with --methods semantic_entropy "
                        "(as for `isouq qa run`)")
    q.add_argument("--k", type=positive_int, default=5,
                   help="samples for naive entropy, P(True) and semantic entropy")
    q.add_argument("--batch-size", type=positive_int, default=8)
    q.set_defaults(func=cmd_qa_short)


def _add_long(qsub: argparse._SubParsersAction) -> None:
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
    add_load_options(q)
    q.add_argument("--evaluate-only", action="store_true",
                   help="only rewrite results.json, tables.md and the figure from the rows")
    q.set_defaults(func=cmd_qa_long)


def _add_label(qsub: argparse._SubParsersAction) -> None:
    q = qsub.add_parser("label", help="hand-label answers of a QA run (gold labels)")
    q.add_argument("rows", help="a QA rows file, e.g. results/qa/qa_truthfulqa__smollm2.jsonl")
    q.add_argument("--out", type=out_file, required=True,
                   help="gold JSONL (resumable), e.g. results/qa/gold/truthfulqa__smollm2.gold.jsonl")
    q.add_argument("--sample", type=positive_int, default=None, help="label a random sample of N rows")
    q.add_argument("--seed", type=int, default=7)
    q.add_argument("--labeler", default=None, help="who labels (default: the user name)")
    q.add_argument("--data", default=None, help="the dataset file, to show incorrect answers")
    q.set_defaults(func=cmd_qa_label)


# ---------------------------------------------------------------- handlers
def cmd_qa_run(args: argparse.Namespace) -> int:
    """Run ``isouq qa run`` (resumable; under torchrun, one shard per rank)."""
    require_extras("llm,report", "isouq qa run")
    from ..distributed import device_for, dist_env, init_process_group
    from ..study.qa.runner import QAConfig, QARunner

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
                   data_path=args.data, **load_kw(args))
    path = QARunner(cfg, Path(args.out), env=env).run()
    print(f"qa run complete: {path}")
    return 0


def cmd_qa_mc(args: argparse.Namespace) -> int:
    """Run ``isouq qa mc``."""
    require_extras("llm,report", "isouq qa mc")
    from ..study.qa.mc import run_mc

    configure()
    path = run_mc(args.model, args.out, limit=args.limit, data=args.data, **load_kw(args))
    print(f"qa mc complete: {path}")
    return 0


def cmd_qa_short(args: argparse.Namespace) -> int:
    """Run ``isouq qa short``."""
    require_extras("llm,report", "isouq qa short")
    from ..study.qa.short import run_short

    configure()
    path = run_short(args.model, args.out, limit=args.limit, seed=args.seed,
                     methods=tuple(args.methods), k=args.k, batch_size=args.batch_size,
                     entailment_model=args.entailment_model, **load_kw(args))
    print(f"qa short complete: {path}")
    return 0


def cmd_qa_long(args: argparse.Namespace) -> int:
    """Run ``isouq qa long`` (or, with --evaluate-only, rewrite its tables from the rows)."""
    require_extras("llm,report", "isouq qa long")
    if args.evaluate_only:
        refuse_load_options(args, "--evaluate-only rewrites the tables from the rows")
    from ..study.qa.long import run_long, write_long_results

    configure()
    if args.evaluate_only:
        path = write_long_results(args.out, n_bootstrap=args.n_bootstrap, seed=args.seed)
    else:
        path = run_long(args.model, args.out, settings=tuple(args.settings),
                        questions=args.questions, answers=args.answers, seed=args.seed,
                        short_dir=None if args.short == "none" else args.short,
                        max_new_tokens=args.max_new_tokens, batch_size=args.batch_size,
                        n_bootstrap=args.n_bootstrap, say=print, **load_kw(args))
    print(f"qa long: tables in {path}")
    return 0


def cmd_qa_label(args: argparse.Namespace) -> int:
    """Run ``isouq qa label``: the interactive labelling session."""
    import getpass

    from ..study.qa.hand_labels import label_file

    n = label_file(args.rows, args.out, labeler=args.labeler or f"human: {getpass.getuser()}",
                   sample=args.sample, seed=args.seed, data=args.data)
    print(f"{n} verdicts written to {args.out}")
    return 0
