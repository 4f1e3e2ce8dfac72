"""The decode loop's products at a few rows: plain ``F.linear`` against oneDNN-packed weights
(what ``grpokit/speed/fastdecode.py`` uses) and MKL's packed GEMM. Not a test.

    python bench/decode_products.py            # SmolLM2-135M's shapes, float32, 32/24/16 rows
    python bench/decode_products.py --dtype bfloat16

Prints milliseconds per product and the largest difference to ``F.linear``.
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F

# (out, in) of SmolLM2-135M's fused q/k/v, o, fused gate/up, down and output layer
SHAPES = {"qkv": (960, 576), "o": (576, 576), "gate_up": (3072, 576), "down": (576, 1536),
          "head": (49152, 576)}  # fmt: skip


def ms(fn, x, reps: int = 60) -> float:
    for _ in range(5):
        fn(x)
    t0 = time.perf_counter()
    for _ in range(reps):
        fn(x)
    return (time.perf_counter() - t0) / reps * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--rows", default="32,24,16")
    a = ap.parse_args()
    dt = getattr(torch, a.dtype)
    torch.manual_seed(0)
    print(f"threads {torch.get_num_threads()}, {a.dtype}")
    for m in (int(r) for r in a.rows.split(",")):
        for name, (n, k) in SHAPES.items():
            w, x = (torch.randn(n, k) * 0.05).to(dt), torch.randn(m, k).to(dt)
            ref = F.linear(x, w)
            plain = ms(lambda x, w=w: F.linear(x, w), x)
            row = [f"rows {m} {name:8s}", f"F.linear {plain:.3f} ms"]
            packed = torch.ops.mkldnn._reorder_linear_weight(w, None)

            def onednn(x, packed=packed):
                return torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], "")

            diff = (onednn(x) - ref).abs().max().item()
            row.append(f"oneDNN packed {ms(onednn, x):.3f} ms (max diff {diff:.1e})")
            if dt == torch.float32:
                pm = torch.ops.mkl._mkl_reorder_linear_weight(w, m)

                def mkl(x, pm=pm, w=w, m=m):
                    return torch.ops.mkl._mkl_linear(x, pm, w, None, m)

                diff = (mkl(x) - ref).abs().max().item()
                row.append(f"MKL packed {ms(mkl, x):.3f} ms (max diff {diff:.1e})")
            print(" | ".join(row), flush=True)


if __name__ == "__main__":
    main()
