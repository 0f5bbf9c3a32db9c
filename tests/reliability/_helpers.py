"""Shared pieces of the fault-injection suite: rewards, parameter comparison, run configs."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file

PROMPTS = [
    "post : job rent tl;dr :",
    "post : exam car tl;dr :",
    "post : loan sister tl;dr :",
    "post : dog park friend tl;dr :",
    "post : boss late work tl;dr :",
]


def reward_short(prompts, completions):
    """Prefers short completions: a signal that moves a tiny policy within a few steps."""
    return [-len(c.split()) / 10 for c in completions]


def params(model_dir: Path) -> dict[str, torch.Tensor]:
    return load_file(str(Path(model_dir) / "model.safetensors"))


def assert_same_params(a: Path, b: Path) -> None:
    pa, pb = params(a), params(b)
    assert pa.keys() == pb.keys()
    differ = [k for k in pa if not torch.equal(pa[k], pb[k])]
    assert not differ, (
        f"{len(differ)} tensors differ, e.g. {differ[0]}: max |diff| "
        f"{(pa[differ[0]] - pb[differ[0]]).abs().max().item():.3g}"
    )


def assert_params_moved(start: Path, end: Path) -> None:
    pa, pb = params(start), params(end)
    assert any(not torch.equal(pa[k], pb[k]) for k in pa), "training did not change any parameter"


def metric_steps(run: Path, key: str = "loss/policy") -> list[int]:
    recs = [json.loads(x) for x in (Path(run) / "metrics.jsonl").read_text().splitlines()]
    return [r["step"] for r in recs if key in r]


def leftovers(folder: Path) -> list[str]:
    """Temp files and folders of interrupted writes (none may survive a handled failure)."""
    return [
        str(p)
        for p in Path(folder).rglob("*")
        if p.name.startswith((".tmp", ".old")) or p.name.endswith((".tmp", ".old"))
    ]
