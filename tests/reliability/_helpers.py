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


def hold_lock(folder: str, ready: str, seconds: float, die: bool = False, shared: bool = False) -> None:
    """Child process: take `folder`'s run lock the way rloo.runtime.runfolder.lock does (flock on .rloo.lock, a
    JSON record of pid and host), write `ready`, then hold it for `seconds`, or die by SIGKILL
    while holding it (`die`: the lock file stays behind, naming a dead process). `shared`: the
    shared lock every running `rloo compare` holds on its study folder (rloo.runtime.runfolder.sharedlock)."""
    import fcntl
    import os
    import signal
    import socket
    import time

    Path(folder).mkdir(parents=True, exist_ok=True)
    fd = os.open(Path(folder) / ".rloo.lock", os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
    os.write(
        fd,
        json.dumps(
            {"pid": os.getpid(), "host": socket.gethostname(), "started": time.time(), "command": "test holder"}
        ).encode(),
    )
    Path(ready).write_text(str(os.getpid()))
    if die:
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(seconds)
