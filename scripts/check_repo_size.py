"""Keep the repository light: fail on a tracked file over 2 MB or a tracked results/ over budget.

Reads what git tracks (the index: ``git ls-files -s``, each blob's size from
``git cat-file``), not the working tree, so it gives the same answer on CI's clean clone as
before a commit (``git add`` first: a staged file counts). Exit 1, one line per problem, when

- a tracked file is larger than ``MAX_FILE_MB`` and not on the allow-list ``ALLOWED`` (or larger
  than the cap the list gives it): checkpoints and other state a run rewrites belong in a
  git-ignored cache, figures beside ``report.html`` rather than inside it (docs/development.md);
- the tracked files under ``results/`` add up to more than ``RESULTS_BUDGET_MB``.

Exit 2 with one line when the folder is not a git repository. Standard library only (CI runs it
before anything is installed):

    python3 scripts/check_repo_size.py                  # the repository this script is in
    python3 scripts/check_repo_size.py --repo DIR --results-budget-mb 10
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

MB = 1_000_000
#: the largest tracked file, in MB, outside the allow-list
MAX_FILE_MB = 2.0
#: the most the tracked files under ``results/`` may add up to, in MB (75 before the
#: pre-registered fresh questions of results/polygraph_prereg/, about 12 MB when complete)
RESULTS_BUDGET_MB = 90.0
#: result files over MAX_FILE_MB kept as they are, each with the most it may grow to, in MB: the
#: QA runs' answer rows (`isouq report` reads them) and sampled answers (cache/*.samples.jsonl,
#: which a resumed run reuses instead of generating them again)
ALLOWED: dict[str, float] = {
    "results/qa/cache/truthfulqa__smollm2.samples.jsonl": 4.5,
    "results/qa/cache/triviaqa__smollm2.samples.jsonl": 4.5,
    "results/qa_short/cache/triviaqa__smollm2.samples.jsonl": 4.0,
    "results/qa_short/qa_triviaqa__smollm2.jsonl": 3.5,
    "results/qa_mc/mc1_truthfulqa__smollm2.jsonl": 3.0,
    "results/qa_mc/mc1_truthfulqa__qwen2.5-coder-0.5b.jsonl": 2.5,
}


def tracked_sizes(repo: Path) -> dict[str, int]:
    """Bytes of every file git tracks in ``repo`` (its index), by path; submodules left out.

    Raises:
        RuntimeError: ``repo`` is not a git work tree (the message says so).
    """
    ls = subprocess.run(["git", "-C", str(repo), "ls-files", "-s", "-z"], capture_output=True)
    if ls.returncode != 0:
        raise RuntimeError(f"{repo} is not a git work tree ({ls.stderr.decode().strip()}); "
                           "pass --repo with the repository's folder")
    entries = []
    for rec in ls.stdout.split(b"\0"):
        if not rec:
            continue
        head, path = rec.split(b"\t", 1)
        mode, obj, _stage = head.split()
        if mode != b"160000":  # a submodule's commit, not a blob
            entries.append((path.decode("utf-8", "surrogateescape"), obj.decode()))
    if not entries:
        return {}
    cat = subprocess.run(["git", "-C", str(repo), "cat-file", "--batch-check=%(objectsize)"],
                         input="".join(f"{o}\n" for _, o in entries).encode(),
                         capture_output=True, check=True)
    sizes = [int(x) for x in cat.stdout.split()]
    return {p: s for (p, _), s in zip(entries, sizes, strict=True)}


def problems(sizes: dict[str, int], *, max_file_mb: float = MAX_FILE_MB,
             results_budget_mb: float = RESULTS_BUDGET_MB,
             allowed: dict[str, float] | None = None) -> list[str]:
    """What breaks the limits, one line each (empty when the tree is within them).

    Args:
        sizes: bytes by tracked path (:func:`tracked_sizes`).
        max_file_mb: the largest file outside ``allowed``.
        results_budget_mb: the most the files under ``results/`` may add up to.
        allowed: path -> its own cap in MB (default :data:`ALLOWED`).

    Returns:
        The problems, largest files first, the budget last.
    """
    allowed = ALLOWED if allowed is None else allowed
    out = []
    for path, size in sorted(sizes.items(), key=lambda kv: -kv[1]):
        cap = allowed.get(path, max_file_mb)
        if size > cap * MB:
            where = ("over its cap on the allow-list" if path in allowed else
                     "not on the allow-list of scripts/check_repo_size.py")
            out.append(f"{path}: {size / MB:.2f} MB > {cap:g} MB, {where}; keep it out of git "
                       "(a git-ignored cache, figures beside the HTML) or, for a result file "
                       "that must be kept, add it to ALLOWED with a reason")
    results = sum(s for p, s in sizes.items() if p.startswith("results/"))
    if results > results_budget_mb * MB:
        out.append(f"results/: {results / MB:.1f} MB tracked > the budget of "
                   f"{results_budget_mb:g} MB; move bulky state to a git-ignored cache, or "
                   "raise RESULTS_BUDGET_MB (and docs/development.md) with a reason")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repo", type=Path, default=Path(__file__).resolve().parent.parent,
                    help="the repository (default: the one this script is in)")
    ap.add_argument("--max-file-mb", type=float, default=MAX_FILE_MB)
    ap.add_argument("--results-budget-mb", type=float, default=RESULTS_BUDGET_MB)
    args = ap.parse_args(argv)
    try:
        sizes = tracked_sizes(args.repo)
    except RuntimeError as e:
        print(f"check_repo_size: {e}", file=sys.stderr)
        return 2
    found = problems(sizes, max_file_mb=args.max_file_mb,
                     results_budget_mb=args.results_budget_mb)
    results = sum(s for p, s in sizes.items() if p.startswith("results/"))
    largest = max(sizes.items(), key=lambda kv: kv[1], default=("-", 0))
    print(f"check_repo_size: {len(sizes)} tracked files, {sum(sizes.values()) / MB:.1f} MB; "
          f"results/ {results / MB:.1f} of {args.results_budget_mb:g} MB; largest "
          f"{largest[0]} ({largest[1] / MB:.2f} MB)")
    for line in found:
        print(f"check_repo_size: {line}", file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
