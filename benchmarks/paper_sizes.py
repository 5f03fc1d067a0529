"""Benchmark: the paper's four LLM architectures on a GPU, side by side in one run.

The paper times its gradient method on one H100 (TruthfulQA answers, seconds per answer,
generation excluded): OLMo 1B 0.06, Llama 3.2 3B 0.08, Llama 2 7B (AWQ) 0.12, Phi-4 (14B) 0.15.
This builds each architecture with random weights from its config (``benchmarks/configs/``:
config files are small and travel; weights do not; the same architecture costs the same), in
``--dtype`` (bfloat16 by default), and times, for the first B TruthfulQA (question, best answer)
pairs at each batch size B, three methods, each in its own process per model:

- floor: forward + backward of Σ p̄ᵢ with every weight frozen (activation gradients only) — no
  per-example gradient method can be cheaper;
- full_backward: forward + an ordinary backward of Σ p̄ᵢ (the batch's summed weight gradient);
- ghost: ``score_sequences(method="ghost")``, every answer's ‖∇θ p̄ᵢ‖² from one backward;
- asked for by name, floor_unaligned and ghost_unaligned: the same without rows padded to a
  multiple of 8 positions (``ISOUQ_TOKEN_MULTIPLE=1``), the before/after of that padding;
- asked for by name, ghost_compiled: ghost with graph capture (``compile=True``), on the same
  card, pairs and timing wrapper as the eager floor and ghost (its first, untimed calls run the
  capture's checks and compile; where capture is refused the row keeps the reason).

Every method reads the same pairs, encoded once, and is timed by one wrapper
(``score_sequences.timed``).

Seconds per answer are the median of --repeats timed calls after --warmups, divided by B, each
taken after a device synchronize; peak memory is the GPU's ``max_memory_allocated`` during the
timed calls of that batch size. Prompts are tokenized by one tokenizer for all four models
(``--tokenizer``; ids folded into a smaller vocabulary, ``random_weights.FoldedTokenizer``). A
batch size that does not fit is recorded as ``"oom": true``. With ``--profile MODEL:B`` the
floor and ghost of that model and batch are also run under torch.profiler, and the operator
tables and kernel counts are written beside the JSON.

    python benchmarks/paper_sizes.py --tokenizer DIR --device cuda --out OUT
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).parent
CONFIGS = HERE / "configs"
MODELS = ("olmo-1b", "llama-3.2-3b", "llama-2-7b", "phi-4")
PAPER_SECONDS = {"olmo-1b": 0.06, "llama-3.2-3b": 0.08, "llama-2-7b": 0.12, "phi-4": 0.15}
METHODS = ("floor", "full_backward", "ghost")
#: asked for by name: rows not padded to 8 positions (``score_sequences.VARIANTS``)
UNALIGNED = ("floor_unaligned", "ghost_unaligned")
#: asked for by name: ghost with graph capture (``compile=True``; a refusal is kept as such)
COMPILED = ("ghost_compiled",)


def config_dir(model: str) -> str:
    """The config folder of a model named in ``configs/``, or a folder path as given."""
    return str(CONFIGS / model) if (CONFIGS / model).is_dir() else model


def child(model_dir: str, method: str, batches: list[int], tokenizer: str, device: str,
          dtype: str, warmups: int, repeats: int, quantize: str | None = None) -> list[dict]:
    """Load one random-weight model and time ``method`` at every batch size (one process);
    ``quantize="4bit"``: its linear layers as bitsandbytes NF4 (ghost scores every weight,
    the 4-bit ones as their dequantized values)."""
    import torch

    from isouq.errors import IsouqError
    from isouq.quantized import autograd_ready
    from random_weights import random_model
    from score_sequences import load_pairs, method_fn, timed

    t0 = time.perf_counter()
    model, tok, name, n_params = random_model(model_dir, device=device, dtype=dtype,
                                              tokenizer=tokenizer)
    if quantize == "4bit":
        from random_weights import quantize_4bit

        model = quantize_4bit(model)
    load_s = time.perf_counter() - t0
    cuda = torch.device(device).type == "cuda"
    rows = []
    for batch in batches:
        row = {"model": Path(model_dir).name + ("-4bit" if quantize else ""), "method": method,
               "batch": batch, "dtype": dtype, "quantize": quantize,
               "n_params": n_params, "load_seconds": load_s,
               "device": torch.cuda.get_device_name() if cuda else "cpu"}
        try:
            prompts, answers = load_pairs(batch)
            fn, b = method_fn(method, model, tok, prompts, answers, batch)
            with autograd_ready(model):
                times, peak, _ = timed(fn, warmups, repeats, cuda)
            row.update(tokens_padded=int(b.input_ids.shape[1]),
                       answer_tokens_mean=float(b.answer_mask.sum(1).float().mean()),
                       seconds_batch=statistics.median(times),
                       seconds_per_answer=statistics.median(times) / batch,
                       seconds_all=times, peak_gib=peak, oom=False)
        except torch.OutOfMemoryError:
            row.update(oom=True)
        except IsouqError as e:  # compile=True not offered here: the reason, one line
            row.update(oom=False, refused=str(e))
        if cuda:
            torch.cuda.empty_cache()
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def profile(model_dir: str, batch: int, tokenizer: str, device: str, dtype: str,
            out: Path) -> dict:
    """Floor and ghost of one model and batch under torch.profiler: the operator tables (by
    device time and by host time) go to ``out/profile_<model>_b<batch>_<method>.txt``."""
    import torch
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    from random_weights import random_model
    from score_sequences import load_pairs, method_fn

    model, tok, _, _ = random_model(model_dir, device=device, dtype=dtype, tokenizer=tokenizer)
    prompts, answers = load_pairs(batch)
    cuda = torch.device(device).type == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    summary = {}
    for method in ("floor", "ghost"):
        fn, _ = method_fn(method, model, tok, prompts, answers, batch)
        for _ in range(3):
            fn()
        sync()
        with torch_profile(activities=activities) as prof:
            for _ in range(3):
                fn()
            sync()
        ka = prof.key_averages()
        kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
        launches = [e for e in prof.events() if e.name in ("cudaLaunchKernel", "cuLaunchKernel",
                                                           "cudaLaunchKernelExC")]
        summary[method] = {
            "kernels_per_call": len(kernels) / 3, "launches_per_call": len(launches) / 3,
            "device_seconds_per_call": sum(e.device_time_total for e in ka) / 3 / 1e6,
        }
        (out / f"profile_{Path(model_dir).name}_b{batch}_{method}.txt").write_text(
            "by device time\n" + ka.table(sort_by="self_device_time_total", row_limit=40)
            + "\n\nby host time\n" + ka.table(sort_by="self_cpu_time_total", row_limit=40))
    print(json.dumps({"profile": Path(model_dir).name, "batch": batch, **summary}), flush=True)
    return summary


def table(rows: list[dict]) -> list[dict]:
    """One row per (model, batch): seconds per answer of each method, the ratios and the paper."""
    out = []
    for m in dict.fromkeys(r["model"] for r in rows):
        for b in sorted({r["batch"] for r in rows if r["model"] == m}):
            got = {r["method"]: r for r in rows if r["model"] == m and r["batch"] == b}
            t = {k: r["seconds_per_answer"] for k, r in got.items()
                 if not r.get("oom") and "seconds_per_answer" in r}
            row = {"model": m, "params_B": round(next(iter(got.values()))["n_params"] / 1e9, 2),
                   "batch": b}
            row.update({f"{k} s/answer": t.get(k) for k in METHODS})
            for k in (*UNALIGNED, *COMPILED):
                if k in t:
                    row[f"{k} s/answer"] = t[k]
            if {"ghost_unaligned", "floor_unaligned"} <= t.keys():
                row["unaligned ghost/floor"] = t["ghost_unaligned"] / t["floor_unaligned"]
            row["ghost/floor"] = t["ghost"] / t["floor"] if {"ghost", "floor"} <= t.keys() else None
            if "ghost_compiled" in got:  # eager and compiled, on the same card and pairs
                row["compiled ghost/floor"] = (t["ghost_compiled"] / t["floor"]
                                               if {"ghost_compiled", "floor"} <= t.keys()
                                               else got["ghost_compiled"].get("refused"))
            row["ghost/(fwd+full bwd)"] = (t["ghost"] / t["full_backward"]
                                           if {"ghost", "full_backward"} <= t.keys() else None)
            row["ghost peak GiB"] = got["ghost"].get("peak_gib") if "ghost" in got else None
            row["paper s/answer"] = PAPER_SECONDS.get(m)
            out.append(row)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=list(MODELS))
    ap.add_argument("--methods", nargs="+", default=list(METHODS), choices=[*METHODS, *UNALIGNED, *COMPILED])
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 16, 64])
    ap.add_argument("--tokenizer", required=True, help="folder of a saved tokenizer")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16", "float16"])
    ap.add_argument("--warmups", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--profile", default=None, metavar="MODEL:B")
    ap.add_argument("--quantize", default=None, choices=["4bit"],
                    help="linear layers as bitsandbytes NF4 (compute in --dtype)")
    ap.add_argument("--tag", default=None, help="suffix of the result files' names")
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--child", nargs=2, metavar=("MODEL", "METHOD"), help=argparse.SUPPRESS)
    ap.add_argument("--profile-child", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    if a.child:
        child(config_dir(a.child[0]), a.child[1], a.batch_sizes, a.tokenizer, a.device,
              a.dtype, a.warmups, a.repeats, a.quantize)
        return
    if a.profile_child:
        m, b = a.profile.rsplit(":", 1)
        profile(config_dir(m), int(b), a.tokenizer, a.device, a.dtype, out)
        return
    from score_sequences import variant_env

    stem = "paper_sizes" + (f"_{a.tag}" if a.tag else "")
    rows: list[dict] = []
    failures = []
    for m in a.models:
        for method in a.methods:
            cmd = [sys.executable, __file__, "--child", m, method, "--tokenizer", a.tokenizer,
                   "--device", a.device, "--dtype", a.dtype, "--warmups", str(a.warmups),
                   "--repeats", str(a.repeats), "--batch-sizes", *map(str, a.batch_sizes)]
            cmd += ["--quantize", a.quantize] if a.quantize else []
            t0 = time.perf_counter()
            proc = subprocess.run(cmd, capture_output=True, text=True, env=variant_env(method))
            got = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
            rows += got
            if proc.returncode:
                failures.append({"model": m, "method": method, "stderr": proc.stderr[-2000:]})
                print(proc.stderr[-2000:], file=sys.stderr)
            print(f"{m} {method}: {len(got)} batch sizes, {time.perf_counter() - t0:.0f} s",
                  flush=True)
            doc = {"date": time.strftime("%Y-%m-%d %H:%M"), "dtype": a.dtype,
                   "warmups": a.warmups, "repeats": a.repeats, "tokenizer": a.tokenizer,
                   "paper_seconds_per_answer": PAPER_SECONDS, "rows": rows,
                   "table": table(rows), "failures": failures}
            (out / f"{stem}.json").write_text(json.dumps(doc, indent=2))  # after every process
    if a.profile:
        proc = subprocess.run([sys.executable, __file__, "--profile-child", "--profile", a.profile,
                               "--tokenizer", a.tokenizer, "--device", a.device, "--dtype",
                               a.dtype, "--out", str(out)], capture_output=True, text=True)
        print(proc.stdout[-3000:], proc.stderr[-3000:])
    from isouq.runio import markdown_table

    print(markdown_table(table(rows)))


if __name__ == "__main__":
    main()
