"""Benchmark: per-answer cost of scoring LLM answers, measured side by side in one run.

For a batch of B TruthfulQA (question, best answer) pairs on a model (default: the embedded
SmolLM2-135M-Instruct), each method runs in its own subprocess (so peak RSS is its own):

- forward: one batched forward pass (no gradients) — the price of reading p̄ and aleatoric;
- floor: forward + backward with every weight frozen (activation gradients only) — no
  per-example gradient method can be cheaper;
- full_backward: forward + ordinary backward of Σ p̄ᵢ (weight gradients summed over the batch);
- loop: one backward pass per answer (the paper's way), ``score_sequences(method="loop")``;
- loop_trainable: the loop over the trainable weights only (with ``--quantize``: what a plain
  backward of a 4-bit model differentiates, its 4-bit weights left out);
- ghost: ``score_sequences(method="ghost")``, every answer from one backward pass.

Every method runs on the same pairs, encoded once before any timed call (the floor on their
padded batch, the loop and ghost with ``encoded=``), and is timed by the same wrapper
(:func:`timed`): the ratios compare the same work.

Variants, for before/after comparisons in one run (asked for by name in --methods; each is a
method under the environment it names):

- ghost_unshared: ``ISOUQ_GHOST_SHARE_GRAMS=0``, every parameter on its own (no Gram shared by
  the layers reading one input, no group cost rule: ``ghost/shared.py``);
- ghost_blocks2: ``ISOUQ_GHOST_GRAM_BLOCKS=2``, the shared path's symmetric Grams from their
  blocks on and above the diagonal (3/4 of the products);
- ghost_unaligned, floor_unaligned: ``ISOUQ_TOKEN_MULTIPLE=1``, rows not padded to a multiple of
  8 positions on CUDA (``ghost/factors.py``; no effect on the CPU).

    python benchmarks/score_sequences.py --methods floor ghost ghost_unshared ghost_blocks2 \
        --batch-sizes 16 --rounds 3 --prompt-tokens 256 --tag shared

Reports seconds per answer (median of --repeats after --warmups untimed calls, default 1), the
ratios loop/ghost, ghost/forward and ghost/floor, and peak RSS: the process's peak, loading
included (``peak_rss_gib``), and on Linux the peak over the scoring calls alone, the weights
resident (``peak_rss_scoring_gib``: the allocator's free memory handed back and VmHWM reset
after loading), with the resident memory before the first scoring call (``rss_loaded_gib``:
the model loaded, the allocator's free memory handed back; weights read from a mapped file
count only once touched) and the size of the weights as
stored (``weights_gib``; a 4-bit weight: its packed bytes); writes JSON + Markdown to --out.
A method's time moves by several percent from one process to the next: ``--rounds R`` runs
every method (but the slow loop) in R fresh processes, one round after the other, and reports
the median over rounds, with each round's ghost/floor ratio beside it.

    python benchmarks/score_sequences.py --batch-sizes 16 32 --rounds 3 --out benchmarks/results

With ``--prompt-tokens L`` each question is preceded by few-shot context (other TruthfulQA
questions with their answers) so that prompt + answer come to about L tokens, as with retrieved
context or few-shot examples; the files are then named ``score_sequences_tL.*``:

    python benchmarks/score_sequences.py --prompt-tokens 1024 --batch-sizes 4 --out benchmarks/results

The models people score: ``--quantize 4bit`` (bitsandbytes on load; ghost scores every weight,
the 4-bit ones as their dequantized values; bitsandbytes cannot differentiate a 4-bit weight, so
the loop runs on a float32 twin whose layers hold those dequantized values, the same scores,
and ``loop_trainable`` on the 4-bit model over its trainable weights) and ``--lora R`` (a
random rank-R PEFT adapter on every projection; every method over base weights and adapter);
the files are then named with --tag:

    python benchmarks/score_sequences.py --quantize 4bit --batch-sizes 16 --tag 4bit
    python benchmarks/score_sequences.py --lora 8 --batch-sizes 16 --tag lora8

On a GPU, or where the weights cannot travel: ``--config DIR`` builds the model with random
weights from a saved config and tokenizer (the same architecture costs the same; the scores
are not meaningful), ``--device cuda`` and ``--dtype bfloat16`` place it (times are taken after
a device synchronize; peak memory is then the GPU's ``max_memory_allocated``):

    python benchmarks/score_sequences.py --config DIR --device cuda --batch-sizes 16 32 --tag cuda
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

METHODS = ("forward", "floor", "full_backward", "loop", "loop_trainable", "ghost")
#: methods run once per batch size (slow), not once per round
ONCE = ("loop", "loop_trainable")
#: name: (method, the environment it runs under: read when isouq is imported, in the method's
#: own process)
VARIANTS = {"ghost_unshared": ("ghost", {"ISOUQ_GHOST_SHARE_GRAMS": "0"}),
            "ghost_blocks2": ("ghost", {"ISOUQ_GHOST_GRAM_BLOCKS": "2"}),
            "ghost_unaligned": ("ghost", {"ISOUQ_TOKEN_MULTIPLE": "1"}),
            "floor_unaligned": ("floor", {"ISOUQ_TOKEN_MULTIPLE": "1"})}


def variant_env(method: str) -> dict[str, str]:
    """The environment ``method`` runs under: this one's, with a variant's settings."""
    return {**os.environ, **VARIANTS.get(method, (method, {}))[1]}


def load_pairs(n: int, tokenizer=None, total: int | None = None) -> tuple[list, list[str]]:
    """n (chat prompt, answer) pairs; with ``total``, each prompt led by few-shot context cut so
    that prompt + answer come to about ``total`` tokens."""
    from isouq.data.qa import load_dataset

    items = load_dataset("truthfulqa", limit=None)
    asked, shots = items[:n], items[n:]
    answers = [" " + it.answers[0] for it in asked]
    if total is None:
        return [[{"role": "user", "content": it.question}] for it in asked], answers
    context = tokenizer.encode("\n\n".join(f"Q: {it.question}\nA: {it.answers[0]}"
                                           for it in shots), add_special_tokens=False)
    prompts = []
    for it, a in zip(asked, answers, strict=True):
        room = total - len(tokenizer.encode(it.question + a, add_special_tokens=False)) - 34
        shot = tokenizer.decode(context[:max(room, 0)])
        prompts.append([{"role": "user", "content": f"{shot}\n\nQ: {it.question}"}])
    return prompts, answers


def method_fn(method: str, model, tok, prompts, answers, batch: int):
    """The callable that runs ``method`` once on these pairs (one batch of ``batch``)."""
    import torch

    from isouq.ghost.factors import token_multiple
    from isouq.sequences import collate, encode, input_device, score_sequences, summarize, token_probs

    # the pairs encoded once: the floor's batch (padded as score_sequences pads, a multiple of
    # 8 positions on CUDA) and every score_sequences call below read the same token ids, so no
    # side tokenizes inside the timed call
    enc = encode(tok, prompts, answers)
    b = collate(enc, tok.pad_token_id or 0, multiple=token_multiple(input_device(model)))

    def forward():
        with torch.no_grad():
            token_probs(model, b)

    def floor():
        from floor import activation_gradients_only

        with activation_gradients_only(model):
            p, mask = token_probs(model, b)
            summarize(p, mask)[0].sum().backward()

    def full_backward():
        p, mask = token_probs(model, b)
        summarize(p, mask)[0].sum().backward()
        model.zero_grad(set_to_none=True)

    def loop():
        score_sequences(model, tok, prompts, answers, method="loop", batch_size=batch, encoded=enc)

    def loop_trainable():
        score_sequences(model, tok, prompts, answers, method="loop", batch_size=batch,
                        params="trainable", encoded=enc)

    def ghost():
        score_sequences(model, tok, prompts, answers, method="ghost", batch_size=batch, encoded=enc)

    def ghost_compiled():  # graph capture, where isouq.capture's checks offer it
        score_sequences(model, tok, prompts, answers, method="ghost", batch_size=batch,
                        encoded=enc, compile=True)

    fns = {"forward": forward, "floor": floor, "full_backward": full_backward, "loop": loop,
           "loop_trainable": loop_trainable, "ghost": ghost, "ghost_compiled": ghost_compiled}
    return fns[VARIANTS.get(method, (method,))[0]], b


def timed(fn, warmups: int, repeats: int, cuda: bool) -> tuple[list[float], float]:
    """(seconds of each of ``repeats`` calls after ``warmups`` untimed ones, peak memory in GiB:
    the GPU's max_memory_allocated over the timed calls, else the process's peak RSS, and on
    Linux the peak RSS over these calls alone (None elsewhere))."""
    import torch

    scoring_peak = reset_peak_rss()
    for _ in range(warmups):
        fn()
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        if cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
    peak = (torch.cuda.max_memory_allocated() if cuda
            else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 2**10) / 2**30
    return times, peak, (peak_rss_since_reset() if scoring_peak else None)


def reset_peak_rss() -> bool:
    """Hand the allocator's free memory back to the OS (glibc ``malloc_trim``: what loading freed,
    e.g. the float32 weights a 4-bit model was quantized from, stays resident otherwise, since
    the isouq allocator settings keep freed memory), then reset the process's peak RSS (Linux:
    VmHWM, by writing 5 to /proc/self/clear_refs); whether it could."""
    import ctypes
    import ctypes.util

    try:
        ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: nothing to hand back
        pass
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def rss_gib() -> float:
    """The process's resident memory now in GiB (Linux: VmRSS)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 2**10 / 2**30
    raise RuntimeError("no VmRSS in /proc/self/status")


def peak_rss_since_reset() -> float:
    """The process's peak RSS in GiB since :func:`reset_peak_rss` (VmHWM)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 2**10 / 2**30
    raise RuntimeError("no VmHWM in /proc/self/status")


def dequantized_twin(model):
    """A float32 copy of a bitsandbytes 4-bit model whose every ``Linear4bit`` is an
    ``nn.Linear`` holding the dequantized weight (and the bias): it computes what the 4-bit
    model computes, and autograd can differentiate every weight."""
    import copy

    import bitsandbytes as bnb
    import torch
    from torch import nn

    from isouq.quantized import dequantized

    twin = copy.deepcopy(model)
    for mod in list(twin.modules()):
        for name, child in list(mod.named_children()):
            if isinstance(child, bnb.nn.Linear4bit):
                w = dequantized(child.weight).float()
                lin = nn.Linear(w.shape[1], w.shape[0], bias=child.bias is not None)
                with torch.no_grad():
                    lin.weight.copy_(w)
                    if child.bias is not None:
                        lin.bias.copy_(child.bias.float())
                setattr(mod, name, lin)
    return twin


def add_lora(model, r: int):
    """The model under a PEFT LoRA adapter of rank ``r`` on every attention and MLP projection,
    with random (not zero) B, so that the adapter changes the outputs as a trained one does."""
    import peft
    import torch

    torch.manual_seed(0)
    targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    cfg = peft.LoraConfig(r=r, lora_alpha=2 * r, target_modules=targets, lora_dropout=0.0,
                          init_lora_weights=False)
    return peft.get_peft_model(model, cfg).eval()


def run_one(method: str, model_name: str, batch: int, repeats: int, threads: int,
            total: int | None = None, config: str | None = None, device: str = "cpu",
            dtype: str = "float32", warmups: int = 1, quantize: str | None = None,
            lora: int | None = None) -> dict:
    import torch

    from isouq.models import load_model
    from isouq.quantized import autograd_ready
    from isouq.runtime import tune_allocator

    tuned = tune_allocator()  # as the isouq command does, for every method alike
    torch.set_num_threads(threads)
    if config:
        from random_weights import random_model  # benchmarks/random_weights.py

        model, tok, name, n_params = random_model(config, device=device)
    else:
        model, tok, info = load_model(model_name, quantize=quantize)
        name, n_params = info.name, info.n_params
    if quantize is None:
        model.to(device=device, dtype=getattr(torch, dtype))
    if lora:
        model = add_lora(model, lora)
    cuda = torch.device(device).type == "cuda"
    # the weights as stored (a 4-bit weight: its packed bytes; quantization constants left out)
    weights = sum(t.numel() * t.element_size()
                  for t in (*model.parameters(), *model.buffers())) / 2**30
    prompts, answers = load_pairs(batch, tok, total)
    loop_params = None
    if quantize == "4bit" and method == "loop":  # bitsandbytes cannot differentiate 4-bit weights
        model, loop_params = dequantized_twin(model), "every weight, on the float32 twin"
    elif method == "loop_trainable":
        loop_params = "trainable weights"
    fn, b = method_fn(method, model, tok, prompts, answers, batch)
    loaded = rss_gib() if reset_peak_rss() else None  # the model resident, nothing scored yet
    with autograd_ready(model):
        times, peak, scoring_peak = timed(fn, warmups, repeats, cuda)
    return {
        "method": method, "batch": batch, "tokens_padded": int(b.input_ids.shape[1]),
        "answer_tokens_mean": float(b.answer_mask.sum(1).float().mean()),
        "seconds_batch": statistics.median(times), "seconds_per_answer":
        statistics.median(times) / batch, "repeats": repeats,
        "peak_rss_gib": peak, "peak_rss_scoring_gib": scoring_peak, "rss_loaded_gib": loaded,
        "device": torch.cuda.get_device_name() if cuda else "cpu",
        "dtype": dtype, "model": name, "n_params": n_params, "malloc_tuned": tuned,
        "quantize": quantize, "lora": lora, "loop_params": loop_params, "weights_gib": weights,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[16, 32])
    ap.add_argument("--methods", nargs="+", default=list(METHODS),
                    choices=[*METHODS, *VARIANTS])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--warmups", type=int, default=1, help="untimed calls before the repeats")
    ap.add_argument("--rounds", type=int, default=1,
                    help="fresh processes per method (the loop: one), one round after another")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--prompt-tokens", type=int, default=None, metavar="L",
                    help="lead each question with few-shot context to about L tokens in all")
    ap.add_argument("--config", default=None, metavar="DIR",
                    help="random weights of the config (and tokenizer) saved in DIR")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    ap.add_argument("--quantize", default=None, choices=["4bit", "8bit"],
                    help="quantize the model on load (bitsandbytes); with 4bit the loop runs on a "
                         "float32 twin of the dequantized weights (4-bit weights cannot be "
                         "differentiated), loop_trainable on the model over its trainable weights")
    ap.add_argument("--lora", type=int, default=None, metavar="R",
                    help="put a random PEFT LoRA adapter of rank R on every projection")
    ap.add_argument("--tag", default=None, help="suffix of the result files' names")
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--child", nargs=2, metavar=("METHOD", "BATCH"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        print(json.dumps(run_one(a.child[0], a.model, int(a.child[1]), a.repeats, a.threads,
                                 a.prompt_tokens, a.config, a.device, a.dtype, a.warmups,
                                 a.quantize, a.lora)))
        return
    rows, ratios = [], []
    for batch in a.batch_sizes:
        runs: dict[str, list[dict]] = {m: [] for m in a.methods}
        for rnd in range(a.rounds):
            for m in a.methods:
                if m in ONCE and rnd:
                    continue
                reps = 1 if m in ONCE else a.repeats
                cmd = [sys.executable, __file__, "--child", m, str(batch), "--model", a.model,
                       "--repeats", str(reps), "--threads", str(a.threads)]
                if a.prompt_tokens:
                    cmd += ["--prompt-tokens", str(a.prompt_tokens)]
                if a.config:
                    cmd += ["--config", a.config]
                cmd += ["--device", a.device, "--dtype", a.dtype, "--warmups", str(a.warmups)]
                cmd += ["--quantize", a.quantize] if a.quantize else []
                cmd += ["--lora", str(a.lora)] if a.lora else []
                out = subprocess.run(cmd, capture_output=True, text=True, check=True,
                                     env=variant_env(m)).stdout
                runs[m].append(json.loads(out.strip().splitlines()[-1]))
                print(f"batch {batch} {m:>13} (round {rnd + 1}): "
                      f"{runs[m][-1]['seconds_per_answer']:.3f} s/answer, "
                      f"peak RSS {runs[m][-1]['peak_rss_gib']:.2f} GiB", flush=True)
        for _m, rs in runs.items():
            row = dict(rs[0])
            per_round = [r["seconds_per_answer"] for r in rs]
            row.update(seconds_per_answer=statistics.median(per_round),
                       seconds_batch=statistics.median(r["seconds_batch"] for r in rs),
                       peak_rss_gib=max(r["peak_rss_gib"] for r in rs),
                       peak_rss_scoring_gib=max((r["peak_rss_scoring_gib"] for r in rs
                                                 if r.get("peak_rss_scoring_gib") is not None),
                                                default=None),
                       rounds_seconds_per_answer=per_round)
            rows.append(row)
        t = {r["method"]: r["seconds_per_answer"] for r in rows if r["batch"] == batch}
        ratio = {"batch": batch}
        for num, den in (("loop", "ghost"), ("loop_trainable", "ghost"), ("ghost", "forward"),
                         ("ghost", "floor"), ("floor", "forward"),
                         ("ghost_unaligned", "floor_unaligned"),
                         *((v, base) for v, (base, _) in VARIANTS.items())):
            # those the methods run allow
            if num in t and den in t:
                ratio[f"{num}/{den}"] = t[num] / t[den]
        if "ghost" in t and "floor" in t:
            ratio["ghost/floor by round"] = ", ".join(
                f"{g['seconds_per_answer'] / f['seconds_per_answer']:.2f}"
                for g, f in zip(runs["ghost"], runs["floor"], strict=True))
        if len(ratio) > 1:
            ratios.append(ratio)
    doc = {"machine": {"platform": platform.platform(), "cpus": os.cpu_count(),
                       "threads": a.threads, "processor": platform.processor()},
           "date": time.strftime("%Y-%m-%d %H:%M"), "rounds": a.rounds, "rows": rows,
           "ratios": ratios}
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = ("score_sequences" + (f"_t{a.prompt_tokens}" if a.prompt_tokens else "")
            + (f"_{a.tag}" if a.tag else ""))
    (out / f"{stem}.json").write_text(json.dumps(doc, indent=2))
    from isouq.runio import markdown_table

    md = ["# score_sequences benchmark\n",
          f"{doc['date']}, {doc['machine']}; median of {a.rounds} round(s) of fresh processes\n\n",
          markdown_table([{k: r.get(k) for k in ("batch", "method", "tokens_padded",
                                                  "seconds_per_answer", "peak_rss_gib",
                                                  "peak_rss_scoring_gib", "rss_loaded_gib")}
                          for r in rows]), "\n", markdown_table(ratios)]
    (out / f"{stem}.md").write_text("".join(md))
    print("".join(md[2:]))


if __name__ == "__main__":
    main()
