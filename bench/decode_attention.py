"""Decode-step attention: grpokit's C kernel (grpokit/speed/kernels.py) against torch's
scaled_dot_product_attention, at the decode loop's shapes (one query token a row, g query
heads per key/value head, a left-padded bool mask), same process, best of 3 x 200 calls.
Not a test.

    python bench/decode_attention.py [--rows 32 --kv_heads 3 --group 3 --head_dim 64]
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F

from grpokit.speed.kernels import decode_attention


def _time(fn, reps: int = 200) -> float:
    fn()
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        best = min(best, (time.perf_counter() - t0) / reps)
    return best * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=32)
    ap.add_argument("--kv_heads", type=int, default=3)
    ap.add_argument("--group", type=int, default=3)
    ap.add_argument("--head_dim", type=int, default=64)
    ap.add_argument("--slots", default="60,124,200,300,600")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    a = ap.parse_args()
    dt = getattr(torch, a.dtype)
    n, KV, g, D = a.rows, a.kv_heads, a.group, a.head_dim
    torch.manual_seed(0)
    print(f"{n} rows x {KV} kv heads x {g} queries x {D} dims, {a.dtype}, "
          f"{torch.get_num_threads()} threads")  # fmt: skip
    print("| slots | torch ms | kernel ms | torch / kernel | max abs err vs fp32: torch / kernel |")
    print("| ---: | ---: | ---: | ---: | --- |")
    for S in (int(s) for s in a.slots.split(",")):
        print(_row(n, KV, g, D, S, dt))


def _row(n: int, KV: int, g: int, D: int, S: int, dt: torch.dtype) -> str:
    T = S + 16
    q = torch.randn(n, KV, g, D).to(dt)
    k, v = torch.randn(n, KV, T, D).to(dt), torch.randn(n, KV, T, D).to(dt)
    attend = torch.ones(n, S, dtype=torch.bool)
    for i in range(n):
        attend[i, : (i * 7) % 40] = False  # left padding
    mask, scale = attend[:, None, None, :], D**-0.5

    def theirs():
        return F.scaled_dot_product_attention(
            q, k[:, :, :S], v[:, :, :S], attn_mask=mask, scale=scale
        )

    def ours():
        return decode_attention(q, k, v, attend, scale)

    if ours() is None:
        raise SystemExit("the kernel is unavailable here (no C compiler?)")
    exact = F.scaled_dot_product_attention(
        q.float(), k[:, :, :S].float(), v[:, :, :S].float(), attn_mask=mask, scale=scale
    )
    e_t = (theirs().float() - exact).abs().max().item()
    e_o = (ours().float() - exact).abs().max().item()
    tt, to = _time(theirs), _time(ours)
    return f"| {S} | {tt:.3f} | {to:.3f} | {tt / to:.2f} | {e_t:.4f} / {e_o:.4f} |"


if __name__ == "__main__":
    main()
