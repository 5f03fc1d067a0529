"""``isouq demo``: the flagship in a minute, and a toy 2D classifier demo.

- LLM (default): the embedded SmolLM2-135M-Instruct answers a few TruthfulQA questions
  (shipped with the package, Apache-2.0) and every answer gets its epistemic ‖∇θ p̄‖² and
  aleatoric (1/T)Σ pₜ(1 − pₜ) from one batched backward pass.
- toy (``--toy``): a tanh MLP trained on the 2D XOR problem; prints summary numbers and saves
  the probability / aleatoric / epistemic maps as a PNG.
"""

from __future__ import annotations

import json
import time
from importlib import resources
from pathlib import Path


def demo_questions() -> list[dict]:
    text = resources.files("isouq.data").joinpath("demo_truthfulqa.jsonl").read_text("utf-8")
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def run_llm(model_name: str = "smollm2", n: int = 8, max_new_tokens: int = 24,
            **load_kw) -> list[dict]:
    """Answer the first ``n`` demo questions greedily, score the answers, print a table;
    ``load_kw`` go to ``models.load_model`` (device, dtype, …)."""
    from .ask import answer_and_score, legend, print_table
    from .models import load_model

    t0 = time.perf_counter()
    model, tok, info = load_model(model_name, **load_kw)
    print(f"loaded {info.name}: {info.n_params:,} parameters ({time.perf_counter() - t0:.1f} s)")
    questions = [q["question"] for q in demo_questions()[:n]]
    rows = answer_and_score(model, tok, questions, max_new_tokens=max_new_tokens)
    print_table(rows)
    print(f"\n{legend(rows)}\n")
    gen, score = (sum(r["seconds"][k] for r in rows) for k in ("generation", "gradient"))
    print(f"generation {gen:.1f} s; scoring all {len(rows)} answers (one backward pass): "
          f"{score:.1f} s; {info.n_params:,} parameters took part")
    return rows


def run_toy(out: Path, seed: int = 0) -> Path:
    """Train a tanh MLP on 2D XOR, score a grid, save the maps; returns the PNG path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from .data.synthetic import make_problem
    from .estimators import score_classifier
    from .models.toy import build, spec_for, train_map

    prob = make_problem("xor", seed=seed, grid_n=80)
    model = build(spec_for(prob, "mlp"), seed=seed)
    train_map(model, prob.X, prob.y, prob.task, prior_precision=1.0)
    s = score_classifier(model, prob.grid)
    acc = float((score_classifier(model, prob.X).probs.argmax(1) == prob.y).float().mean())
    fig, axes = plt.subplots(1, 3, figsize=(13, 4))
    panels = [("p(y=1|x)", s.probs[:, 1]), ("aleatoric p(1−p)", s.aleatoric[:, 1]),
              ("epistemic ‖∇θ p‖²", s.epistemic[:, 1])]
    for ax, (title, v) in zip(axes, panels, strict=False):
        im = ax.imshow(v.reshape(prob.grid_shape).numpy(), origin="lower", extent=prob.extent,
                       cmap="viridis")
        ax.scatter(prob.X[:, 0], prob.X[:, 1], c=prob.y, cmap="coolwarm", s=6,
                   edgecolors="k", linewidths=0.2)
        ax.set_title(title)
        fig.colorbar(im, ax=ax, fraction=0.046)
    fig.suptitle(f"XOR, tanh MLP ({s.params.n_params:,} params), train accuracy {acc:.2f}")
    out.mkdir(parents=True, exist_ok=True)
    png = out / "toy_maps.png"
    fig.savefig(png, dpi=110, bbox_inches="tight")
    plt.close(fig)
    e = s.epistemic[:, 1]
    print(f"train accuracy {acc:.3f}; epistemic over the grid: median {float(e.median()):.3g}, "
          f"max {float(e.max()):.3g} (along the decision boundary, largest where it runs away "
          f"from the training points); aleatoric max {float(s.aleatoric[:, 1].max()):.3f}\n"
          f"maps saved to {png}")
    return png
