"""Data parallelism under `torchrun`, in one place so the training loop stays one loop.

Launched by `torchrun --nproc_per_node P rloo train ...` every process runs the same loop:

- every process draws the same global batch of B prompts from an identically seeded stream
  and keeps its contiguous block of B/P prompts (`shard`): a prompt's K completions are sampled,
  scored and baselined on one process, so the leave-one-out baseline (eq. 4) sees its whole group;
- sampling noise is drawn for the global batch and sliced (`sample_tokens(rows=...)`), so the tokens do
  not depend on P; the loss is a mean over each process's N/P rows and DDP / FSDP average the
  gradients, which is the gradient of the mean over all N rows: one process with the same global
  batch takes the same step (tests/equivalence/test_distributed.py checks the parameters);
- metrics are means over processes, extremes (is/ratio_max) extremes over them and adv/std the std
  over every row (`mean_metrics`); files are written by rank 0 only;
- at rl.max_staleness > 0 each process samples its share with its own lagged sampler or producer
  (rloo.rollout.producer), with the same global-batch noise: the same tokens as one process.

`parallel=ddp` replicates the policy (DistributedDataParallel); `parallel=fsdp` shards it with
FSDP2 (`torch.distributed.fsdp.fully_shard`, one unit per decoder layer) for models that do not
fit on one device. Frozen models (reference, reward) are replicated.
"""

from __future__ import annotations

import gc
import math
import os
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.fsdp import FSDPModule, fully_shard
from torch.distributed.tensor import DTensor
from torch.nn.parallel import DistributedDataParallel as DDP

from rloo.errors import Interrupted, RlooError, option
from rloo.runtime import peers as _peers


@dataclass
class Dist:
    rank: int = 0
    world: int = 1
    local_rank: int = 0
    parallel: str = "ddp"
    owns_group: bool = False  # we created the process group, so we destroy it
    peers: tuple[_peers.Peer, ...] = ()  # every process of the run, by rank (rloo.runtime.peers)

    @property
    def enabled(self) -> bool:
        return self.world > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def device(self, device: str) -> str:
        """`cuda` becomes this process's GPU (`cuda:LOCAL_RANK`) under torchrun."""
        return f"cuda:{self.local_rank}" if self.enabled and device == "cuda" else device

    def shard(self, prompts: list[str], k: int) -> tuple[list[str], tuple[int, int]]:
        """This process's block of the global prompt batch, and its rows (offset, total) of the
        B*K completions."""
        n = len(prompts) // self.world
        local = prompts[self.rank * n : (self.rank + 1) * n]
        return local, (self.rank * n * k, len(prompts) * k)

    def wrap(self, model):
        """DDP or FSDP2 around the trainable policy (unchanged in a single process)."""
        if not self.enabled:
            return model
        if self.parallel == "fsdp":
            for layer in _decoder_layers(model):
                fully_shard(layer)
            fully_shard(model)
            return model
        ids = [self.local_rank] if torch.cuda.is_available() and next(model.parameters()).is_cuda else None
        return DDP(model, device_ids=ids)

    def mean_metrics(self, stats: dict[str, float]) -> dict[str, float]:
        """Each metric averaged over processes (every process has the same number of rows); an
        extreme (`_extreme`: is/ratio_max, completions/max_length) is the extreme over processes, and
        a population std beside its mean (adv/std, adv/mean) the std over every process's rows."""
        if not self.enabled:
            return stats
        spreads = [k for k in stats if k.endswith("/std") and f"{k[:-4]}/mean" in stats]
        # through the second moment: E[x^2] = std^2 + mean^2 per process, averaged (equal row counts)
        stats = stats | {k: float(stats[k]) ** 2 + float(stats[f"{k[:-4]}/mean"]) ** 2 for k in spreads}
        out = {}
        for op, keys in _by_reduction(stats).items():
            t = torch.tensor([float(stats[k]) for k in keys], dtype=torch.float64, device=comm_device())
            dist.all_reduce(t, op=op)
            scale = self.world if op == dist.ReduceOp.SUM else 1
            out |= {k: float(v) / scale for k, v in zip(keys, t.tolist(), strict=True)}
        return out | {k: math.sqrt(max(out[k] - out[f"{k[:-4]}/mean"] ** 2, 0.0)) for k in spreads}

    def all_done(self, done: torch.Tensor) -> bool:
        """Stop sampling only when every process is done: FSDP forward passes are collectives."""
        flag = done.all().to(device=comm_device(), dtype=torch.int32).reshape(1)
        dist.all_reduce(flag, op=dist.ReduceOp.MIN)
        return bool(flag.item())

    def barrier(self) -> None:
        if self.enabled:
            dist.barrier()

    def saveable(self, model):
        """Something with `save_pretrained` holding the full weights. Under FSDP this gathers the
        shards (a collective: every process must call it); only rank 0 should then save."""
        model = unwrap(model)
        if not (self.enabled and self.parallel == "fsdp"):
            return model
        sd = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        # getattr: third-party: a remote-code config may lack the key, a model the private _tied_weights_keys
        if getattr(model.config, "tie_word_embeddings", False):
            # gathered shards no longer share storage, so save_pretrained would not see the tie and
            # would write the tied copy (e.g. lm_head.weight) too; drop it as an unsharded save does
            for key in getattr(model, "_tied_weights_keys", None) or {}:
                sd.pop(key, None)
        return _WithStateDict(model, sd)

    def step_kwargs(self, rows: tuple[int, int]) -> dict:
        """Extra arguments of a step that declares `distributed` (rloo.algorithms.base.Algorithm):
        global-batch sampling rows (and a shared stop under FSDP, whose per-token collective is kept
        off the single-process decode loop); rows are passed in one process too, so one process
        samples exactly as P do."""
        return {"rows": rows} | ({"all_done": self.all_done} if self.enabled and self.parallel == "fsdp" else {})

    def eval_kwargs(self) -> dict:
        """Extra arguments of an evaluation's sampling: the shared stop under FSDP (as `step_kwargs`)."""
        return {"all_done": self.all_done} if self.enabled and self.parallel == "fsdp" else {}

    def checkpoint_role(self) -> tuple[bool, str | None]:
        """(does this process write checkpoints, a note to print once when it never does). Only
        rank 0 writes (DDP replicas are identical). Under FSDP a checkpoint would need the shards
        gathered; not implemented: the final model is saved, checkpoints are skipped with a note."""
        if self.enabled and self.parallel == "fsdp":
            return False, "parallel=fsdp: checkpoints are not written (only the final model)"
        return self.is_main, None

    def peer_gone(self) -> bool:
        """Whether a process of the run on this host is gone (then torchrun's SIGTERM is not the user's)."""
        return bool(_peers.gone_ranks(self.peers, self.rank))

    @contextmanager
    def lost_peers_reported(self, newest: Callable[[], Path | None]) -> Iterator[None]:
        """Within this block a failure caused by a lost process (a collective's error, torchrun's
        SIGTERM: anything but rloo's own errors) becomes one line naming the rank that is gone and the
        checkpoint to resume from (`newest()`: the newest complete one); further SIGTERMs are ignored."""
        try:
            yield
        except BaseException as e:
            if not self.enabled or (isinstance(e, RlooError) and not isinstance(e, Interrupted)):
                raise
            failed = _peers.collective_failed(e)
            gone = _peers.gone_ranks(self.peers, self.rank, _peers.GONE_WAIT_S if failed else 0.0)
            if not gone and not failed:
                raise
            if threading.current_thread() is threading.main_thread():  # torchrun's SIGTERM: already said
                signal.signal(signal.SIGTERM, signal.SIG_IGN)
            then = _peers.how_to_resume(newest())
            line = _peers.lost_line(gone, self.peers, self.rank, then) if gone else None
            raise RlooError(line or _peers.unknown_line(e, self.rank, self.world, then)) from e

    def close(self) -> None:
        """Let go of the process group, first running the collector: a DDP wrapper left in a reference
        cycle holds the group, and with it Gloo's worker threads, until it is collected. Collected
        during interpreter shutdown, a worker freeing a collective's tensor there takes the GIL and
        aborts the process ("terminate called without an active exception": a finished torchrun run
        reported as failed, 1 launch in ~30 under load). Then the group, where this process made it."""
        if self.enabled:
            gc.collect()
        if self.owns_group and dist.is_initialized():
            dist.destroy_process_group()


def _extreme(key: str) -> str | None:
    """The reduction ("max" or "min") of a metric that is an extreme of this process's rows, else None."""
    name = key.rsplit("/", 1)[-1]
    for word in ("max", "min"):
        if name == word or name.startswith(f"{word}_") or name.endswith(f"_{word}"):
            return word
    return None


def _by_reduction(stats: dict[str, float]) -> dict:
    """The metrics' keys grouped by the all_reduce that combines them over processes, in a fixed
    order (every process must issue the same collectives)."""
    ops = {None: dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}
    groups: dict = {}
    for key in sorted(stats):
        groups.setdefault(ops[_extreme(key)], []).append(key)
    return groups


def comm_device() -> torch.device:
    """The device a collective's tensors must be on: this process's GPU under NCCL (which takes no CPU
    tensors: "No backend type associated with device type cpu"), else the CPU (gloo, no group)."""
    if dist.is_available() and dist.is_initialized() and dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


class _WithStateDict:
    def __init__(self, model, state_dict):
        self.model, self.state_dict = model, state_dict

    def save_pretrained(self, path, **kw):
        self.model.save_pretrained(path, state_dict=self.state_dict, **kw)


def _decoder_layers(model) -> list[torch.nn.Module]:
    """The repeated transformer blocks: the natural FSDP units (one all-gather per block)."""
    blocks = [m for m in model.modules() if isinstance(m, torch.nn.ModuleList) and len(m) > 0]
    if not blocks:
        raise RlooError(f"parallel=fsdp: found no transformer block list in {type(model).__name__}")
    return list(max(blocks, key=len))


def is_wrapped(model) -> bool:
    """Trained by several processes: its forward must go through DDP / FSDP in one pass."""
    return isinstance(model, (DDP, FSDPModule))


@contextmanager
def gradient_sync(model, sync: bool) -> Iterator[None]:
    """Around a micro-batch's forward and backward (gradient accumulation): with sync False the
    gradient is only accumulated locally (DDP's no_sync, FSDP2's set_requires_gradient_sync(False));
    the last micro-batch syncs, reducing the summed gradient once. Unwrapped models: no-op."""
    if sync or not is_wrapped(model):
        yield
    elif isinstance(model, DDP):
        with model.no_sync():
            yield
    else:
        model.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            model.set_requires_gradient_sync(True)


def full_tensor(t: torch.Tensor) -> torch.Tensor:
    """The whole value of an FSDP2 DTensor (gathered from every process: a collective), else `t`."""
    return t.full_tensor() if isinstance(t, DTensor) else t


def unwrap(model):
    """The model under a DDP wrapper (FSDP2 shards in place and needs no unwrapping)."""
    return model.module if isinstance(model, DDP) else model


def check_supported(cfg, resume: bool) -> None:
    """What data-parallel training does not do (yet), as one clear error. (Which algorithms may run
    under torchrun is theirs to declare: rloo.algorithms.supports_distributed.)"""
    if cfg.parallel == "fsdp" and (resume or cfg.lora is not None):
        raise RlooError(f"parallel=fsdp does not support {option('resume')} or lora yet; use parallel=ddp")
    if cfg.max_staleness and cfg.parallel == "fsdp":  # the sampler's copy of the weights is a whole one
        raise RlooError("max_staleness > 0 under torchrun takes parallel=ddp (each process samples with whole weights)")
    if cfg.producer_address is not None:
        raise RlooError(
            "rl.producer_address serves one trainer process; under torchrun each process starts its own "
            "producer beside it: leave producer_address unset"
        )


def init(device: str, parallel: str, batch_size: int) -> Dist:
    """Join the process group when launched by torchrun (WORLD_SIZE > 1); a no-op otherwise."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world == 1:
        return Dist(parallel=parallel)
    if batch_size % world:
        raise RlooError(
            f"batch_size={batch_size} prompts must divide evenly over {world} processes "
            f"(the global batch is split by prompt, keeping each prompt's k samples together)"
        )
    rank, local = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
    owns = not dist.is_initialized()
    if owns:
        cuda = device.startswith("cuda")
        if cuda:
            torch.cuda.set_device(local)
        dist.init_process_group("nccl" if cuda else "gloo")
    peers: list = [None] * world  # who the others are, for a survivor's line if one is lost
    dist.all_gather_object(peers, _peers.this_process())
    return Dist(rank=rank, world=world, local_rank=local, parallel=parallel, owns_group=owns, peers=tuple(peers))
