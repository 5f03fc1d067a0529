"""Benchmark: the host work of one scoring call, counted (no GPU needed): aten operations per
decoder layer, fixed operations per call, host syncs and device→host copies, the floor against
``score_sequences(method="ghost")``.

On a GPU every aten operation that computes (views and metadata excluded) is about one kernel
launch and its share of Python and dispatcher work on the host; a host sync (a value or a size
read back) stalls the host until the device's queue drains. Which operations run does not depend
on the device, so they are counted here on the CPU with a ``TorchDispatchMode``, for a tiny
random Llama (hidden 16, as in issue 64) and a narrow one (hidden 256: every Linear weight in the
Gram form, as at the real sizes), float32 and bfloat16, at two depths: the slope between them is
the operations per decoder layer, the rest the fixed operations per call.

Both sides run through one wrapper (:func:`counted`), from the same token ids (one batch of
``--rows`` pairs drawn once, :func:`pairs`):

- ``floor``: written here, with no isouq code: the input embeddings made leaves that require
  grad, every weight frozen, the model's forward, each answer's mean token probability p̄ by
  hand, one backward of Σ p̄ (activation gradients only), p̄ copied to the host;
- ``ghost``: the public ``isouq.score_sequences(..., encoded=...)`` on the same token ids.

What is counted:

- ``ops``: aten operations dispatched (views, metadata and ``lift_fresh`` excluded: :data:`VIEWS`);
- ``reads``: operations that make the host wait for a value or a size the device computes
  (:data:`READS`: ``_local_scalar_dense`` (``.item()``, ``int(t)``, ``bool(t)``), ``nonzero``,
  ``masked_select``, ``unique``, indexing with a boolean mask, ``equal``);
- ``copies``: device→host copies asked for (``Tensor.cpu()``, ``Tensor.tolist()``, counted with a
  ``TorchFunctionMode``; ``.to(device)`` is left out: on a CPU-only machine it cannot be told
  apart from a host→device move, and the library copies results back with ``.cpu()``);
- ``syncs`` = reads + copies (a ``.cpu()`` of a device tensor waits for it).

``--path cuda`` counts what CUDA runs where it differs from the CPU (the paths the library takes
on CUDA, emulated on the CPU as one operation each): a shared-input group's summed Gram as one
product of the gradients side by side (``ghost.shared.CONCAT_DEVICES``), a half-precision Gram
multiplied into float32 by one ``bmm`` (``out_dtype``), and ``F.rms_norm`` as one fused kernel.

    python benchmarks/host_ops.py                      # writes the JSON and docs/tables/host_ops.md
    git worktree add /tmp/before REV && python benchmarks/host_ops.py --src /tmp/before/src \\
        --tag before --no-table
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import random
import subprocess
import sys
import time
from contextlib import ExitStack, contextmanager
from pathlib import Path

HERE = Path(__file__).parent
ROOT = HERE.parent
#: aten operations that only make views or read metadata (no kernel on CUDA)
VIEWS = frozenset({
    "aten.view", "aten.t", "aten.transpose", "aten._unsafe_view", "aten.slice", "aten.detach",
    "aten.unsqueeze", "aten.squeeze", "aten.expand", "aten.alias", "aten.as_strided",
    "aten.permute", "aten.select", "aten._reshape_alias", "aten.split", "aten.unbind",
    "aten.split_with_sizes", "aten.lift_fresh", "aten.promote_types", "aten.is_same_size",
    "aten.sym_size", "aten.sym_stride", "aten.sym_numel", "aten.sym_storage_offset",
    "aten.result_type", "aten._has_compatible_shallow_copy_type", "aten.is_nonzero",
    "aten.diagonal", "aten.view_as_real", "aten.view_as_complex", "aten.unfold",
})
#: operations whose result value or size the host reads (it waits for the device)
READS = frozenset({"aten._local_scalar_dense", "aten.nonzero", "aten.masked_select",
                   "aten.unique", "aten._unique", "aten._unique2", "aten.unique_dim",
                   "aten.unique_consecutive", "aten.equal"})
#: indexing operations whose boolean mask makes a data-dependent shape (a read of its count)
MASK_INDEXING = frozenset({"aten.index", "aten.index_put", "aten.index_put_",
                           "aten._index_put_impl_"})
WIDTHS = {"tiny": 16, "narrow": 256}
DEPTHS = (2, 4)
VOCAB = 64
PAD = 0


# ------------------------------------------------------------------ counting
def _has_mask(args) -> bool:
    import torch

    for a in args:
        if isinstance(a, list | tuple) and _has_mask(a):
            return True
        if isinstance(a, torch.Tensor) and a.dtype in (torch.bool, torch.uint8):
            return True
    return False


@contextmanager
def counting():
    """Within it, every aten operation, host read and device→host copy is counted; yields a
    ``Counter`` with keys ``op:NAME``, ``read:NAME`` and ``copy:NAME``."""
    import torch
    from torch.overrides import TorchFunctionMode
    from torch.utils._python_dispatch import TorchDispatchMode

    seen: collections.Counter = collections.Counter()

    class Ops(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            name = str(func.overloadpacket)
            if name not in VIEWS:
                seen[f"op:{name}"] += 1
            if name in READS or (name in MASK_INDEXING and _has_mask(args[1:2])):
                seen[f"read:{name}"] += 1
            return func(*args, **(kwargs or {}))

    class Copies(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            if func in (torch.Tensor.cpu, torch.Tensor.tolist):
                seen[f"copy:{func.__name__}"] += 1
            return func(*args, **(kwargs or {}))

    with Copies(), Ops():
        yield seen


def counted(fn) -> dict:
    """The one wrapper both sides run through: ``fn`` twice uncounted (first-call checks, and
    the caches the second call builds from them, are not per call), then once counted:
    {"ops", "reads", "copies", "by_op", "by_read", "by_copy"}."""
    fn()
    fn()
    with counting() as seen:
        fn()
    pick = lambda kind: {k.split(":", 1)[1]: v for k, v in sorted(seen.items())  # noqa: E731
                         if k.startswith(kind + ":")}
    by_op, by_read, by_copy = pick("op"), pick("read"), pick("copy")
    return {"ops": sum(by_op.values()), "reads": sum(by_read.values()),
            "copies": sum(by_copy.values()), "by_op": by_op, "by_read": by_read,
            "by_copy": by_copy}


# ------------------------------------------------------------------ the batch and the model
def pairs(rows: int, seed: int = 0) -> list[tuple[list[int], list[int]]]:
    """``rows`` (prompt ids, answer ids) pairs of different lengths (so padding matters), ids
    drawn in [4, VOCAB): the same ones for both sides."""
    rng = random.Random(seed)
    return [([2] + [rng.randrange(4, VOCAB) for _ in range(3 + (5 * i) % 7)],
             [rng.randrange(4, VOCAB) for _ in range(1 + (3 * i) % 5)]) for i in range(rows)]


def build_model(depth: int, width: str, dtype: str):
    """A random Llama of ``depth`` decoder layers, ``width`` (:data:`WIDTHS`) wide, in eval
    mode, untied, its norm weights moved off 1 (so that their gradients are not trivial)."""
    import torch
    import transformers as tf

    torch.manual_seed(0)
    d = WIDTHS[width]
    cfg = tf.LlamaConfig(hidden_size=d, intermediate_size=2 * d, num_hidden_layers=depth,
                         num_attention_heads=4, num_key_value_heads=2, vocab_size=VOCAB,
                         pad_token_id=PAD, bos_token_id=2, eos_token_id=3,
                         tie_word_embeddings=False)
    model = tf.LlamaForCausalLM(cfg)
    with torch.no_grad():
        for p in model.parameters():
            if p.ndim == 1:
                p.add_(0.1 * torch.randn_like(p))
    return model.to(getattr(torch, dtype)).eval()


def floor_fn(model, enc: list[tuple[list[int], list[int]]]):
    """The floor, with no isouq code: forward + backward of Σ p̄ with every weight frozen (the
    input embeddings are the leaves that require grad), p̄ copied to the host."""
    import torch

    L = max(len(p) + len(a) for p, a in enc)
    ids = torch.tensor([p + a + [PAD] * (L - len(p) - len(a)) for p, a in enc])
    att = torch.tensor([[1] * (len(p) + len(a)) + [0] * (L - len(p) - len(a)) for p, a in enc])
    scored = torch.tensor([[False] * len(p) + [True] * len(a) + [False] * (L - len(p) - len(a))
                           for p, a in enc])[:, 1:]
    T = torch.tensor([float(len(a)) for _, a in enc])
    for w in model.parameters():
        w.requires_grad_(False)
    emb = model.get_input_embeddings()

    def run():
        x = emb(ids).detach().requires_grad_(True)
        logits = model(inputs_embeds=x, attention_mask=att).logits[:, :-1]
        lp = torch.log_softmax(logits.float(), -1).gather(-1, ids[:, 1:, None])[..., 0]
        p_bar = (lp.exp() * scored).sum(1) / T
        p_bar.sum().backward()
        return p_bar.detach().cpu()

    return run


def ghost_fn(model, enc: list[tuple[list[int], list[int]]], compile: bool = False):
    """``isouq.score_sequences`` on the same token ids (``encoded=``; the texts are only
    counted), every pair in one batch."""
    from types import SimpleNamespace

    import isouq
    from isouq.tokens import Encoded

    tok = SimpleNamespace(pad_token_id=PAD)
    encoded = [Encoded(list(p), list(a)) for p, a in enc]
    texts = ["·"] * len(enc)
    kw = {"compile": True} if compile else {}
    return lambda: isouq.score_sequences(model, tok, texts, texts, encoded=encoded,
                                         batch_size=len(enc), **kw)


# ------------------------------------------------------------------ the CUDA path, emulated
@contextmanager
def cuda_path():
    """Within it, the library takes its CUDA paths on the CPU, each operation CUDA runs as one
    counted as one: groups' summed Grams as one product of the gradients side by side, a
    half-precision Gram multiplied into float32 by one ``bmm``, ``F.rms_norm`` fused."""
    import types

    import torch
    import torch.nn.functional as F

    import isouq.ghost.factors as factors
    import isouq.ghost.norms as norms
    import isouq.ghost.shared as shared

    lib = torch.library.Library("host_ops_emulated", "FRAGMENT")  # noqa: TOR901
    lib.define("bmm_f32(Tensor x, Tensor y) -> Tensor")
    lib.define("bmm_f32_out(Tensor x, Tensor y, Tensor(a!) out) -> ()")
    lib.define("rms_norm(Tensor x, int[] shape, float eps) -> Tensor")
    lib.impl("bmm_f32", lambda x, y: torch.bmm(x.float(), y.float()), "CPU")

    def bmm_f32_out(x, y, out) -> None:
        torch.bmm(x.float(), y.float(), out=out)

    lib.impl("bmm_f32_out", bmm_f32_out, "CPU")
    lib.impl("rms_norm", lambda x, s, e: F.rms_norm(x, s, eps=e), "CPU")
    ops = torch.ops.host_ops_emulated
    with ExitStack() as stack:
        saved = shared.CONCAT_DEVICES
        shared.CONCAT_DEVICES = saved | {"cpu"}
        stack.callback(setattr, shared, "CONCAT_DEVICES", saved)
        if hasattr(factors, "f32_product"):  # this checkout: one place multiplies into float32
            saved_fp = factors.f32_product

            def f32_product(x, y, out=None):
                if x.dtype not in factors.LOW_PRECISION:
                    return saved_fp(x, y, out=out)
                if out is None:
                    return ops.bmm_f32(x, y)
                ops.bmm_f32_out(x, y, out)
                return out

            factors.f32_product = f32_product
            stack.callback(setattr, factors, "f32_product", saved_fp)
        else:  # an earlier checkout: bmm_f32
            saved_bmm = factors.bmm_f32
            factors.bmm_f32 = lambda x, y: (ops.bmm_f32(x, y) if x.dtype != torch.float32
                                            else saved_bmm(x, y))
            stack.callback(setattr, factors, "bmm_f32", saved_bmm)
        fused = types.SimpleNamespace(**vars(F))
        fused.rms_norm = lambda x, shape, weight=None, eps=None: ops.rms_norm(
            x, list(shape), float(eps if eps is not None else torch.finfo(x.dtype).eps))
        stack.callback(setattr, norms, "F", norms.F)
        norms.F = fused
        yield


# ------------------------------------------------------------------ one configuration
def measure(width: str, dtype: str, path: str, rows: int) -> dict:
    """Floor and ghost of one (width, dtype, path): counts at each depth of :data:`DEPTHS`,
    the slope (per layer) and the intercept (fixed per call)."""
    import torch

    torch.set_num_threads(1)
    enc = pairs(rows)
    out = {"width": width, "hidden": WIDTHS[width], "dtype": dtype, "path": path, "rows": rows,
           "tokens_padded": max(len(p) + len(a) for p, a in enc), "depths": list(DEPTHS)}
    with cuda_path() if path == "cuda" else ExitStack():
        for method, make in (("floor", floor_fn), ("ghost", ghost_fn)):
            runs = [counted(make(build_model(d, width, dtype), enc)) for d in DEPTHS]
            (d0, d1), (r0, r1) = DEPTHS, runs
            per_layer = (r1["ops"] - r0["ops"]) / (d1 - d0)
            out[method] = {
                "per_layer": per_layer, "fixed": r0["ops"] - d0 * per_layer,
                "reads": r0["reads"], "copies": r0["copies"],
                "reads_grow_with_depth": r1["reads"] != r0["reads"],
                "by_op_per_layer": _per_layer(r0["by_op"], r1["by_op"], d1 - d0),
                "runs": runs}
    return out


def _per_layer(a: dict, b: dict, layers: int) -> dict:
    diff = collections.Counter(b)
    diff.subtract(a)
    return {k: v / layers for k, v in sorted(diff.items()) if v}


def row_of(m: dict, before: dict | None = None) -> dict:
    """One line of the table: the floor's and ghost's counts and ghost − floor, and, given the
    same configuration's row ``before`` (another checkout's), its ghost − floor."""
    f, g = m["floor"], m["ghost"]
    row = {"model": f"Llama {m['width']} (hidden {m['hidden']})", "dtype": m["dtype"],
           "path": m["path"], "floor ops / layer": f["per_layer"],
           "ghost ops / layer": g["per_layer"],
           "ghost − floor / layer": g["per_layer"] - f["per_layer"],
           "fixed ghost − floor / call": g["fixed"] - f["fixed"],
           "host reads (floor, ghost)": f"{f['reads']}, {g['reads']}",
           "device→host copies (floor, ghost)": f"{f['copies']}, {g['copies']}",
           "ghost − floor syncs": (g["reads"] + g["copies"]) - (f["reads"] + f["copies"])}
    if before is not None:
        b = row_of(before)
        row.update({f"{k} (before)": b[k] for k in ("ghost − floor / layer",
                                                    "fixed ghost − floor / call",
                                                    "ghost − floor syncs")})
    return row


TARGETS = ("Targets (issue 64; float32, the CPU path, the public API): ghost − floor ≤ 16 "
           "operations per decoder layer, ≤ 40 fixed per call, at most one host sync per call "
           "beyond the floor's and one device→host copy of the results per batch.")


def markdown(doc: dict) -> str:
    """The docs table (``docs/tables/host_ops.md``, written by this script): the table alone
    (what it was counted on is in the JSON: commit, date, rows, depths)."""
    from isouq.runio import markdown_table

    return markdown_table(doc["table"], floatfmt=".4g")


def matching(measured: list[dict], path: Path | None) -> list[dict | None]:
    """Each measured configuration's row in the kept result file ``path`` (None: not there)."""
    if path is None or not path.exists():
        return [None] * len(measured)
    kept = json.loads(path.read_text())["measured"]
    key = lambda m: (m["width"], m["dtype"], m["path"], m["rows"])  # noqa: E731
    by = {key(m): m for m in kept}
    return [by.get(key(m)) for m in measured]


def main() -> None:
    from record import source_commit  # benchmarks/, on the path when run as a script

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--widths", nargs="+", default=list(WIDTHS), choices=list(WIDTHS))
    ap.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"],
                    choices=["float32", "bfloat16"])
    ap.add_argument("--paths", nargs="+", default=["cpu", "cuda"], choices=["cpu", "cuda"])
    ap.add_argument("--rows", type=int, default=4, help="answers in the one batch")
    ap.add_argument("--src", default=None, help="another checkout's src/ to count instead")
    ap.add_argument("--tag", default=None, help="suffix of the result file's name")
    ap.add_argument("--out", default=str(HERE / "results"))
    ap.add_argument("--table", default=str(ROOT / "docs" / "tables" / "host_ops.md"),
                    help="where the Markdown table goes")
    ap.add_argument("--no-table", action="store_true", help="write no Markdown table")
    ap.add_argument("--before", default=str(HERE / "results" / "host_ops_before.json"),
                    help="a kept result of another checkout (--tag before): its ghost − floor "
                         "beside this one's in the table, where it has the configuration")
    ap.add_argument("--child", nargs=3, metavar=("WIDTH", "DTYPE", "PATH"),
                    help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        print(json.dumps(measure(*a.child, rows=a.rows)))
        return
    src = Path(a.src).resolve() if a.src else (ROOT / "src").resolve()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(src), str(HERE)])}
    measured = []
    for width in a.widths:
        for dtype in a.dtypes:
            for path in a.paths:
                # each in a process of its own: the emulated CUDA path patches the library
                res = subprocess.run([sys.executable, __file__, "--child", width, dtype, path,
                                      "--rows", str(a.rows)], env=env, capture_output=True,
                                     text=True)
                if res.returncode != 0:
                    raise SystemExit(f"{width} {dtype} {path}: {res.stderr[-3000:]}")
                measured.append(json.loads(res.stdout.strip().splitlines()[-1]))
                print(json.dumps(row_of(measured[-1]), ensure_ascii=False), flush=True)
    before = None if a.tag == "before" else Path(a.before)
    doc = {"date": time.strftime("%Y-%m-%d %H:%M"), "src": str(src),
           "commit": source_commit(src), "rows": a.rows, "depths": list(DEPTHS),
           "targets": TARGETS,
           "before": None if before is None or not before.exists() else {
               k: json.loads(before.read_text()).get(k) for k in ("commit", "date")},
           "table": [row_of(m, b) for m, b in zip(measured, matching(measured, before),
                                                  strict=True)],
           "measured": measured}
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = "host_ops" + (f"_{a.tag}" if a.tag else "")
    (out / f"{stem}.json").write_text(json.dumps(doc, indent=1, ensure_ascii=False) + "\n")
    if not a.no_table:
        table = Path(a.table)
        table.parent.mkdir(parents=True, exist_ok=True)
        table.write_text(markdown(doc))
    print(markdown(doc))


if __name__ == "__main__":
    main()
