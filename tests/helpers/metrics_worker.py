"""Run by tests/unit/test_distributed_metrics.py under `torchrun --nproc_per_node 2`: each process
combines its own metrics with rloo.runtime.distributed.Dist.mean_metrics and writes the result to
OUT/metrics.<rank>.json."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch.distributed as dist

from rloo.runtime.distributed import init

if __name__ == "__main__":
    d = init("cpu", "ddp", batch_size=2)
    try:
        r = d.rank
        stats = {
            "loss": 1.0 + r,  # mean 1.5
            "is/ratio_max": [3.0, 5.0][r],  # max 5
            "is/ratio_min": [0.25, 0.5][r],  # min 0.25
            "completions/max_length": [7.0, 4.0][r],  # max 7
            "is/lag": 2.0,
            "adv/mean": [0.0, 2.0][r],  # rows with mean 0 and std 1 here, mean 2 and std 1 there:
            "adv/std": 1.0,  # over all of them mean 1, E[x^2] = (1 + 5) / 2 = 3, std sqrt(3 - 1)
        }
        out = d.mean_metrics(stats)
        Path(sys.argv[1], f"metrics.{r}.json").write_text(json.dumps(out))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    os._exit(0)
