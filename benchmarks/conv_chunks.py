"""Per-layer cost of the convolution rule's paths, on the layer shapes of benchmarks/classifiers.py.

For each 3×3 convolution shape (batch, in → out channels, input size, stride) of the
ResNet-10 of ``classifiers.py`` (32×32 inputs at batch 32, 224×224 at batch 8), median seconds
of --repeats calls of the rule's per-example squared norms ‖∇_W sᵢ‖² (``sq_norms`` of its
contribution, end to end) when forced down each path:
- ``gram``: the Gram form over output positions;
- ``one_call``: materialized by ONE weight-gradient convolution with the batch folded into the
  groups;
- ``chunked``: the same in chunks of ``GROUPED_CHUNK_BYTES`` of per-example gradients (what the
  rule runs when it materializes);
- ``per_example``: one ordinary weight-gradient convolution per example;
and ``rule``: whatever the cost rule picks. Every path's norms are checked against the
per-example one (rtol 1e-4).

    python benchmarks/conv_chunks.py --out benchmarks/results/conv_chunks_cpu.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
from torch import nn

from record import save_json

SHAPES = [  # (batch, in channels, out channels, input size, stride)
    (32, 64, 64, 32, 1), (32, 64, 128, 32, 2), (32, 128, 128, 16, 1), (32, 128, 256, 16, 2),
    (32, 256, 256, 8, 1), (32, 256, 512, 8, 2), (32, 512, 512, 4, 1),
    (8, 64, 64, 56, 1), (8, 64, 128, 56, 2), (8, 128, 128, 28, 1), (8, 128, 256, 28, 2),
    (8, 256, 256, 14, 1), (8, 256, 512, 14, 2), (8, 512, 512, 7, 1),
]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None, help="JSON file for the results")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=None)
    a = ap.parse_args()

    from isouq.ghost import conv, factors
    from isouq.ghost.calls import Call
    from isouq.ghost.factors import sq_norms

    if a.threads:
        torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    rule_choose, rule_chunk = factors.choose_gram, conv.GROUPED_CHUNK_BYTES

    def norms(m, call, path):
        factors.choose_gram = rule_choose if path == "rule" else (lambda *p, **k: path == "gram")
        conv.GROUPED_CHUNK_BYTES = {"one_call": 2**62, "per_example": 1}.get(path, rule_chunk)
        try:
            return sq_norms([conv.contributions(m, call)["weight"]], {})
        finally:
            factors.choose_gram, conv.GROUPED_CHUNK_BYTES = rule_choose, rule_chunk

    rows = []
    for N, cin, cout, size, stride in SHAPES:
        m = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        x = torch.randn(N, cin, size, size)
        call = Call(module=m, args=(x,), kwargs={}, output=None)
        call.grad = torch.randn(N, cout, size // stride, size // stride)
        paths = ["rule", "gram", "one_call", "chunked", "per_example"]
        ref = norms(m, call, "per_example")
        secs: dict[str, list[float]] = {p: [] for p in paths}
        for p in paths:  # warm-up and check
            torch.testing.assert_close(norms(m, call, p), ref, rtol=1e-4, atol=0)
        for _ in range(a.repeats):  # round robin: a change of load hits every path alike
            for p in paths:
                t = time.perf_counter()
                norms(m, call, p)
                secs[p].append(time.perf_counter() - t)
        row = {"batch": N, "in": cin, "out": cout, "size": size, "stride": stride}
        row.update({f"{p}_ms": round(1e3 * statistics.median(s), 2) for p, s in secs.items()})
        rows.append(row)
        print(json.dumps(row), flush=True)
    save_json(a.out, {"benchmark": "conv_chunks", "repeats": a.repeats,
                      "grouped_chunk_bytes": rule_chunk}, rows=rows)


if __name__ == "__main__":
    main()
