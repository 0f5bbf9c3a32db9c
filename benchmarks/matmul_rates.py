"""fp32 matmul rates at the shapes of the M benchmark model (hidden 512, MLP 1376, vocabulary
8192): decode (32 rows, one token each; 128 for comparison) against the batched passes (2048 rows), and the memory
read bandwidth. Shows why M's sampling phase runs far below the machine's matmul peak.

    python benchmarks/matmul_rates.py      # prints a markdown table (docs/bench.md)
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from microbench import median_ms

SHAPES = [(512, 512), (512, 1376), (1376, 512), (512, 8192)]  # (in, out): q/o, gate/up, down, LM head


def _ms(fn, reps: int = 30) -> float:
    return median_ms(fn, reps)


def main(threads: int = 2) -> None:
    torch.set_num_threads(threads)
    print(f"torch {torch.__version__}, {threads} threads\n")
    print("| (in, out) | weight MB | 32 rows: ms | GFLOP/s | 128 rows: ms | GFLOP/s | 2048 rows: ms | GFLOP/s |")
    print("|---|---|---|---|---|---|---|---|")
    for i, o in SHAPES:
        w = torch.randn(o, i)
        cells = []
        for rows in (32, 128, 2048):
            x = torch.randn(rows, i)
            ms = _ms(lambda x=x, w=w: F.linear(x, w))
            cells += [f"{ms:.2f}", f"{2 * rows * i * o / ms / 1e6:.0f}"]
        print(f"| ({i}, {o}) | {w.numel() * 4 / 1e6:.1f} | " + " | ".join(cells) + " |")
    x = torch.randn(25_000_000)
    ms = _ms(lambda: x.sum(), reps=10)
    print(f"\nmemory read bandwidth (sum of 100 MB): {x.numel() * 4 / ms / 1e6:.1f} GB/s")


if __name__ == "__main__":
    main()
