"""Measure the cost of the scaling study's HMC per size and project a full run.

Per width w (MLP(w,w), 4-class rings, N = 400, the kept study's settings: plain HMC,
trajectory length 1, 2 chains, float64): (1) the time of one gradient of the log posterior,
(2) a short checkpointed run (``--warmup`` warmup iterations in segments of ``--every``)
giving seconds per leapfrog step with both chains running (the first segment, which
compiles, is left out). The projection for a full run (1,000 warmup + 1,000 draws per chain)
is  seconds/step × steps/iteration × 2,000, with steps/iteration from the kept full runs'
sampling phase (``results/scaling/sizes.jsonl``) extrapolated as a power law in D, times the
warmup's extra steps (``--warmup-factor``); a width without a short run gets the sampler's
seconds/step of the largest short-run width scaled by the ratio of gradient times (the
gradient is timed at every width). ``--reuse`` keeps the short runs already in ``--out``
(gradients are timed again). Writes ``--out`` (JSON) and prints a table.

    nice -n 19 .venv/bin/python scripts/hmc_cost.py --widths 64 128 256 \
        --out results/scaling/cost.json
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

import numpy as np


def gradient_seconds(specs: dict, X, y, rounds: int = 5) -> dict[int, float]:
    """Seconds per value-and-gradient of the potential energy, per width (one core, compiled).

    Widths are timed round robin, ``rounds`` times, and each keeps its fastest round, so a
    load that comes and goes (a shared machine) moves every width alike and the ratios hold.
    """
    import jax
    from numpyro.infer.util import initialize_model

    from isouq.study.reference.model import bnn_model

    fns = {}
    for w, spec in specs.items():
        info = initialize_model(jax.random.PRNGKey(0), bnn_model(spec, "multiclass", 1.0),
                                model_args=(X, y))
        g = jax.jit(jax.value_and_grad(info.potential_fn))
        z = info.param_info.z
        jax.block_until_ready(g(z))
        fns[w] = (g, z, max(2, int(1e6 / spec.n_params)))
    best = {w: float("inf") for w in specs}
    for _ in range(rounds):
        for w, (g, z, n) in fns.items():
            t = time.perf_counter()
            for _ in range(n):
                jax.block_until_ready(g(z))
            best[w] = min(best[w], (time.perf_counter() - t) / n)
    return best


def steps_model(rows: list[dict]) -> tuple[float, float]:
    """(a, b) of steps/iteration ≈ a · D^b fitted to the kept HMC rows with w ≥ 32."""
    pts = [(r["n_params"], r["reference"]["num_steps_mean"]) for r in rows
           if r["study"] == "hmc" and r["width"] >= 32]
    D, s = np.log([p[0] for p in pts]), np.log([p[1] for p in pts])
    b, loga = np.polyfit(D, s, 1)
    return float(np.exp(loga)), float(b)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--widths", type=int, nargs="+", default=[64, 128, 256])
    ap.add_argument("--project", type=int, nargs="+", default=[256, 512, 1028],
                    help="widths to project a full run for")
    ap.add_argument("--warmup", type=int, default=30, help="short-run warmup iterations")
    ap.add_argument("--every", type=int, default=10, help="iterations per segment")
    ap.add_argument("--warmup-factor", type=float, default=1.15,
                    help="leapfrog steps of a whole run / (2000 × sampling-phase steps)")
    ap.add_argument("--reuse", action="store_true",
                    help="keep the short runs of --out, time only the gradients again")
    ap.add_argument("--rows", default="results/scaling/sizes.jsonl")
    ap.add_argument("--out", default="results/scaling/cost.json")
    args = ap.parse_args()

    import isouq.study.reference as R  # noqa: I001  (first: float64)
    import jax.numpy as jnp

    R.prepare_jax()  # one JAX device per core, before JAX computes: the two chains together

    from isouq.data.synthetic import make_problem
    from isouq.runio import machine_label, read_jsonl
    from isouq.study.experiments.scaling import spec_for_width
    from isouq.study.reference.checkpoint import read_meta

    p = make_problem("multiclass_rings", seed=0, grid_n=10)
    X, y = jnp.asarray(p.X.numpy(), jnp.float64), jnp.asarray(p.y.numpy())
    old = {m["width"]: m for m in json.loads(Path(args.out).read_text())["measured"]} \
        if args.reuse else {}
    measured = []
    widths = sorted(set(args.widths) | set(args.project))
    grads = gradient_seconds({w: spec_for_width(w) for w in widths}, X, y)
    print("gradient ms:", {w: round(1e3 * g, 2) for w, g in grads.items()}, flush=True)
    for w in widths:
        spec = spec_for_width(w)
        D = spec.n_params
        if w not in args.widths:
            continue
        if w in old:
            measured.append({**old[w], "gradient_ms": round(1e3 * grads[w], 3)})
            continue
        with tempfile.TemporaryDirectory() as tmp:
            R.hmc_reference(p, spec, num_warmup=args.warmup, num_samples=1, num_chains=2,
                            seed=0, checkpoint=Path(tmp) / "ck", checkpoint_every=args.every)
            log = read_meta(Path(tmp) / "ck")["log"]
        later = [x for x in log[1:] if x["stop"] <= args.warmup]
        sec = sum(x["seconds"] for x in later)
        steps = sum(x["leapfrog_steps"] for x in later) / 2  # per chain: chains run together
        row = {"width": w, "n_params": D, "gradient_ms": round(1e3 * grads[w], 3),
               "sampler_ms_per_step": round(1e3 * sec / steps, 3),
               "short_run_steps_per_iteration": round(steps / sum(x["stop"] - x["start"]
                                                                    for x in later), 1)}
        measured.append(row)
        print(json.dumps(row), flush=True)

    a, b = steps_model(read_jsonl(args.rows))
    top = max(measured, key=lambda m: m["n_params"])
    proj = []
    for w in args.project:
        D = spec_for_width(w).n_params
        ms = next((m["sampler_ms_per_step"] for m in measured if m["width"] == w),
                  top["sampler_ms_per_step"] * grads[w] / grads[top["width"]])
        spi = a * D**b
        hours = ms / 1e3 * spi * 2000 * args.warmup_factor / 3600
        proj.append({"width": w, "n_params": D, "gradient_ms": round(1e3 * grads[w], 3),
                     "ms_per_step": round(ms, 2), "steps_per_iteration": round(spi, 1),
                     "wall_hours_2_cores": round(hours, 2), "cpu_hours": round(2 * hours, 2)})
    doc = {"machine": machine_label(), "cpu_count": os.cpu_count(),
           "load_average_at_end": os.getloadavg(), "short_run_warmup": args.warmup,
           "measured": measured,
           "steps_model": {"a": a, "b": b, "fit": "steps/iteration = a·D^b, kept rows w ≥ 32"},
           "ms_per_step_model": "measured short run, else the largest one's × gradient ratio",
           "warmup_factor": args.warmup_factor, "projection": proj,
           "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S")}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")
    for r in proj:
        print(json.dumps(r))


if __name__ == "__main__":
    main()
