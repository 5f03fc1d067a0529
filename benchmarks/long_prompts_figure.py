"""Figure and table of ghost, loop and floor against the prompt length.

Reads the ``score_sequences_t*.json`` files that ``score_sequences.py --prompt-tokens L`` wrote
(one per length) and draws seconds per answer of floor, ghost and loop against the tokens per
row, with loop/ghost and ghost/floor beside; writes ``long_prompts.png`` and ``long_prompts.md``.

    python benchmarks/long_prompts_figure.py --results benchmarks/results --png docs/img/long_prompts.png
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def collect(results: Path) -> list[dict]:
    """One row per length: tokens, batch, seconds per answer of each method, ratios."""
    rows = []
    for f in sorted(results.glob("score_sequences_t*.json")):
        doc = json.loads(f.read_text())
        by = {r["method"]: r for r in doc["rows"]}
        if not {"floor", "ghost", "loop"} <= set(by):
            continue
        g = by["ghost"]
        rows.append({"tokens": g["tokens_padded"], "batch": g["batch"],
                     **{f"{m}_s": by[m]["seconds_per_answer"] for m in ("forward", "floor",
                                                                        "ghost", "loop")
                        if m in by},
                     **{f"{m}_rss_gib": round(by[m]["peak_rss_gib"], 2)
                        for m in ("floor", "ghost", "loop")},
                     "loop/ghost": by["loop"]["seconds_per_answer"] / g["seconds_per_answer"],
                     "ghost/floor": g["seconds_per_answer"] / by["floor"]["seconds_per_answer"]})
    return sorted(rows, key=lambda r: r["tokens"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--results", default="benchmarks/results")
    ap.add_argument("--png", default="benchmarks/results/long_prompts.png")
    a = ap.parse_args()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = collect(Path(a.results))
    if not rows:
        raise SystemExit(f"no score_sequences_t*.json with floor, ghost and loop in {a.results}")
    t = [r["tokens"] for r in rows]
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(9, 3.4))
    for m, style in (("loop", "s--"), ("ghost", "o-"), ("floor", "^:")):
        ax.plot(t, [r[f"{m}_s"] for r in rows], style, label=m)
    ax.set(xscale="log", yscale="log", xlabel="tokens per row (prompt + answer)",
           ylabel="seconds per answer", title="SmolLM2-135M, 2 CPU threads")
    ax.legend()
    bx.plot(t, [r["loop/ghost"] for r in rows], "o-", label="loop / ghost")
    bx.plot(t, [r["ghost/floor"] for r in rows], "^:", label="ghost / floor")
    bx.axhline(1.0, color="grey", lw=0.8)
    bx.set(xscale="log", xlabel="tokens per row (prompt + answer)", ylabel="ratio",
           title="batch 16, 8, 4, 2 as length grows")
    bx.legend()
    fig.tight_layout()
    Path(a.png).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(a.png, dpi=110)
    cols = ["tokens", "batch", "forward_s", "floor_s", "ghost_s", "loop_s", "loop/ghost",
            "ghost/floor", "floor_rss_gib", "ghost_rss_gib", "loop_rss_gib"]
    md = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    md += ["| " + " | ".join(f"{r[c]:.3g}" if isinstance(r[c], float) else str(r[c])
                             for c in cols) + " |" for r in rows]
    (Path(a.results) / "long_prompts.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    main()
