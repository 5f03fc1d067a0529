"""Predicted-class scoring of a ResNet-style classifier: isouq against the floor, Opacus, a loop.

Side by side in one process, per setting (input size × batch × classes), median seconds of
--repeats after a warm-up (methods run round robin, so a change of load hits all alike) and
peak extra memory of:
- ``isouq``: ``score_classifier(model, x, classes="predicted")`` end to end (ghost engine),
  as every call after a model's first pays it (the check that examples are independent, one
  forward of one example, is remembered per model and kind of input);
  ``isouq_first_call`` the same call when the check runs (a model's first call);
- ``floor``: forward + backward of the same scalar Σᵢ log p_{cᵢ}(xᵢ) with every weight
  frozen (activation gradients only): what any per-example method must at least pay;
- ``isouq_gn`` / ``opacus_gn``: the same network with GroupNorm instead of BatchNorm (Opacus
  refuses BatchNorm), isouq against Opacus ``GradSampleModule`` per-sample gradients of the
  same scalar, squared norms included;
- ``train_step``: forward + backward of the same scalar with every weight requiring grad (an
  ordinary training step: activation AND batch-summed weight gradients), for scale;
- ``loop``: one forward + backward per example (weights require grad), squared norms.
isouq's (N,) ‖∇θ log p_c‖² is checked against the loop's, and Opacus's against isouq's on the
GroupNorm twin (rtol 1e-3). For every method alike the process keeps freed memory for
reuse (``isouq.runtime.tune_allocator``, as the ``isouq`` command does). Peak memory: on CPU,
the highest running sum of the tensor allocations the torch profiler records during one call;
on CUDA, max_memory_allocated.

    python benchmarks/classifiers.py --out benchmarks/results/classifiers_cpu.json
    python benchmarks/classifiers.py --quick          # small widths, a smoke run
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import time

import torch
from torch import nn

from record import save_json


class BasicBlock(nn.Module):
    """ResNet basic block: two 3×3 convs with a norm each, identity or 1×1 projection skip."""

    def __init__(self, cin: int, cout: int, stride: int, norm):
        super().__init__()
        self.c1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.n1 = norm(cout)
        self.c2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.n2 = norm(cout)
        self.skip = None
        if stride != 1 or cin != cout:
            self.skip = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), norm(cout))

    def forward(self, x):
        h = torch.relu(self.n1(self.c1(x)))
        h = self.n2(self.c2(h))
        return torch.relu(h + (x if self.skip is None else self.skip(x)))


def resnet(classes: int, *, norm: str = "batch", widths=(64, 128, 256, 512), blocks=(1, 1, 1, 1),
           imagenet_stem: bool = True) -> nn.Module:
    """A ResNet (ResNet-10 by default: one basic block per stage; (2, 2, 2, 2) is ResNet-18)."""
    mk = nn.BatchNorm2d if norm == "batch" else (lambda c: nn.GroupNorm(min(32, c // 4), c))
    w0 = widths[0]
    if imagenet_stem:
        stem = [nn.Conv2d(3, w0, 7, 2, 3, bias=False), mk(w0), nn.ReLU(), nn.MaxPool2d(3, 2, 1)]
    else:
        stem = [nn.Conv2d(3, w0, 3, 1, 1, bias=False), mk(w0), nn.ReLU()]
    layers, cin = list(stem), w0
    for i, (w, n) in enumerate(zip(widths, blocks, strict=True)):
        for j in range(n):
            layers.append(BasicBlock(cin, w, 2 if (j == 0 and i > 0) else 1, mk))
            cin = w
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, classes)]
    return nn.Sequential(*layers)


def _trained_like(m: nn.Module) -> nn.Module:
    """Non-trivial running statistics, so eval-mode BatchNorm is not the identity."""
    g = torch.Generator().manual_seed(0)
    for mod in m.modules():
        if isinstance(mod, nn.BatchNorm2d):
            mod.running_mean.copy_(0.1 * torch.randn(mod.num_features, generator=g))
            mod.running_var.copy_(0.5 + torch.rand(mod.num_features, generator=g))
    return m.eval()


def peak_mib(fn, device: str) -> float:
    """Peak extra memory of one fn() call, MiB: CUDA max_memory_allocated; on CPU the highest
    running sum of the tensor allocations and frees the torch profiler records."""
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        fn()
        torch.cuda.synchronize()
        return (torch.cuda.max_memory_allocated() - base) / 2**20
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                profile_memory=True) as prof:
        fn()
    events = sorted((e.start_ns(), e.nbytes()) for e in prof.profiler.kineto_results.events()
                     if e.name() == "[memory]")
    now = peak = 0
    for _, nbytes in events:  # + allocation, − free, in time order
        now += nbytes
        peak = max(peak, now)
    return peak / 2**20


def seconds(fn, device: str) -> float:
    if device == "cuda":
        torch.cuda.synchronize()
    t = time.perf_counter()
    fn()
    if device == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - t


def _log_p(out: torch.Tensor, cls: torch.Tensor) -> torch.Tensor:
    return torch.log_softmax(out, 1).gather(1, cls[:, None])[:, 0]


def floor(model, x, cls):
    """Forward + backward with every weight frozen; as in the ghost engine, the graph starts
    at the first layer's output (no gradient for the input itself)."""
    flags = [(p, p.requires_grad) for p in model.parameters()]
    for p, _ in flags:
        p.requires_grad_(False)
    first = next(m for m in model.modules() if isinstance(m, nn.Conv2d))
    hook = first.register_forward_hook(lambda mod, args, out: out.detach().requires_grad_(True))
    try:
        out = model(x)
        s = _log_p(out, cls)
        assert s.requires_grad, "the floor must run a backward"
        s.sum().backward()
        return out.detach()[:, 0]
    finally:
        hook.remove()
        for p, f in flags:
            p.requires_grad_(f)


def train_step(model, x, cls):
    """An ordinary forward + backward (batch-summed weight gradients, then dropped)."""
    model.zero_grad(set_to_none=True)
    out = model(x)
    _log_p(out, cls).sum().backward()
    model.zero_grad(set_to_none=True)
    return out.detach()[:, 0]


def loop(model, x, cls):
    params = [p for p in model.parameters()]
    rows = []
    for i in range(x.shape[0]):
        s = _log_p(model(x[i : i + 1]), cls[i : i + 1])[0]
        rows.append(sum(g.pow(2).sum() for g in torch.autograd.grad(s, params)))
    return torch.stack(rows)


def opacus_norms(gsm, x, cls):
    gsm.zero_grad(set_to_none=True)
    _log_p(gsm(x), cls).sum().backward()
    sq = sum(p.grad_sample.reshape(x.shape[0], -1).pow(2).sum(1) for p in gsm.parameters())
    for p in gsm.parameters():
        p.grad_sample = None
        p.grad = None
    return sq


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None, help="JSON file for the results")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--blocks", default="1,1,1,1", help="basic blocks per stage (2,2,2,2: ResNet-18)")
    ap.add_argument("--quick", action="store_true", help="widths /4, one repeat: a smoke run")
    ap.add_argument("--no-loop", action="store_true", help="skip the per-example loop")
    ap.add_argument("--note", default="ratios measured side by side in one process",
                    help="what to record about the machine's load (kept in the JSON)")
    a = ap.parse_args()

    import isouq
    from isouq.runtime import tune_allocator

    tuned = tune_allocator()  # as the isouq command does, for every method alike
    if a.threads:
        torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    widths = (16, 32, 64, 128) if a.quick else (64, 128, 256, 512)
    blocks = tuple(int(b) for b in a.blocks.split(","))
    repeats = 1 if a.quick else a.repeats
    settings = [(32, 32, 10), (32, 32, 1000), (224, 8, 10), (224, 8, 1000)]
    try:
        import opacus
    except ImportError:
        opacus = None
    rows = []
    for size, batch, C in settings:
        x = torch.randn(batch, 3, size, size, device=a.device)
        stem = size >= 64
        bn = _trained_like(resnet(C, widths=widths, blocks=blocks, imagenet_stem=stem)).to(a.device)
        gn = resnet(C, norm="group", widths=widths, blocks=blocks, imagenet_stem=stem).to(a.device).eval()
        with torch.no_grad():
            cls_bn, cls_gn = bn(x).argmax(1), gn(x).argmax(1)
        row = {"input": f"{size}x{size}", "batch": batch, "classes": C,
               "n_params": sum(p.numel() for p in bn.parameters())}

        def isouq_fn(m, first=False, x=x, batch=batch):
            def call():
                if first:  # forget that m passed the check: it runs again, as on a first call
                    isouq.estimators._INDEPENDENT.pop(m, None)
                return isouq.score_classifier(m, x, classes="predicted",
                                              batch_size=batch).epistemic_log
            return call

        runs = {"floor": lambda bn=bn, x=x, c=cls_bn: floor(bn, x, c),
                "train_step": lambda bn=bn, x=x, c=cls_bn: train_step(bn, x, c), "isouq": isouq_fn(bn),
                "isouq_first_call": isouq_fn(bn, first=True), "isouq_gn": isouq_fn(gn)}
        if opacus is not None:
            # Opacus hooks the model it wraps, and records only in train mode (GroupNorm: same output)
            gsm = opacus.GradSampleModule(copy.deepcopy(gn).train(), loss_reduction="sum")
            runs["opacus_gn"] = lambda gsm=gsm, x=x, c=cls_gn: opacus_norms(gsm, x, c)
        if not a.no_loop:
            runs["loop"] = lambda bn=bn, x=x, c=cls_bn: loop(bn, x, c)
        res, secs = {}, {k: [] for k in runs}
        for name, fn in runs.items():  # warm-up (the loop is long enough to need none)
            res[name] = fn().detach().float().cpu()
        for _ in range(repeats):  # round robin: a change of load hits every method alike
            for name, fn in runs.items():
                secs[name].append(seconds(fn, a.device))
        for name, fn in runs.items():
            sec, mib = statistics.median(secs[name]), peak_mib(fn, a.device)
            row[f"{name}_s"], row[f"{name}_peak_mib"] = round(sec, 4), round(mib, 1)
            print(f"{row['input']} N={batch} C={C} {name}: {sec:.3f} s, peak +{mib:.0f} MiB", flush=True)
        if opacus is not None:
            gsm._close()
        for ours, ref in (("isouq", "loop"), ("isouq_first_call", "loop"), ("opacus_gn", "isouq_gn")):
            if ours in res and ref in res:
                ok = torch.allclose(res[ours], res[ref], rtol=1e-3, atol=1e-8)
                row[f"{ours}_matches_{ref}"] = bool(ok)
        row["isouq_over_floor"] = round(row["isouq_s"] / row["floor_s"], 3)
        row["isouq_first_call_over_floor"] = round(row["isouq_first_call_s"] / row["floor_s"], 3)
        row["train_step_over_floor"] = round(row["train_step_s"] / row["floor_s"], 3)
        row["isouq_over_train_step"] = round(row["isouq_s"] / row["train_step_s"], 3)
        if "opacus_gn_s" in row:
            row["opacus_gn_over_isouq_gn"] = round(row["opacus_gn_s"] / row["isouq_gn_s"], 3)
        if "loop_s" in row:
            row["loop_over_isouq"] = round(row["loop_s"] / row["isouq_s"], 3)
        rows.append(row)
        print(json.dumps(row), flush=True)
    meta = {"benchmark": "classifiers", "device": a.device, "widths": widths, "blocks": blocks,
            "repeats": repeats, "malloc_tuned": tuned,
            "opacus": getattr(opacus, "__version__", None),
            "command": "python benchmarks/classifiers.py " + " ".join(
                f"--{k.replace('_', '-')}" + ("" if v is True else f" {v}")
                for k, v in vars(a).items() if v not in (None, False) and k not in ("out", "note")),
            "note": a.note}
    save_json(a.out, meta, rows=rows)
    if a.out:
        print("wrote", a.out)


if __name__ == "__main__":
    main()
