"""What the remote producer's link costs (rl.producer_address; docs/async.md "Across machines"):
seconds per weight version (trainer -> producer: the trainable tensors, as RemoteProducer.published
sends them and ReceivedVersions.wait receives them) and per batch (producer -> trainer: a Rollout
as torch.save bytes, as the producer's `put` sends it), two processes on localhost over
rloo.runtime.link.gloo. Median of --reps round trips each, after 2 untimed ones.

    python benchmarks/studies/link_handoff.py --shape M --reps 20 [--out FILE]

The policy is `rloo bench`'s shape (rloo.experiments.bench_assets; random weights, not saved), the
batch is bench's: batch_size 8 x k 4 rows of the shape's longest prompt and max_new_tokens.
Loopback measures the link's own work (copies, pickling, Gloo's framing), not a network: across
machines add bytes / bandwidth.
"""

from __future__ import annotations

import argparse
import io
import json
import socket
import statistics
import time

import torch
import torch.multiprocessing as mp
from transformers import LlamaConfig, LlamaForCausalLM

from rloo.experiments.bench_assets import SHAPES
from rloo.rollout.remote import TAG_BATCH, TAG_WEIGHTS, trainable_names
from rloo.rollout.sampler import Rollout
from rloo.runtime.link.gloo import Link

WARMUP = 2


def _policy(shape) -> torch.nn.Module:
    cfg = LlamaConfig(
        vocab_size=shape.vocab_size or 256,
        hidden_size=shape.hidden,
        num_hidden_layers=shape.layers,
        num_attention_heads=shape.heads,
        intermediate_size=shape.intermediate,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    return LlamaForCausalLM(cfg)


def _batch(shape, rows: int = 32) -> Rollout:
    p, t = shape.max_prompt_tokens, shape.max_new_tokens
    return Rollout(
        prompts=["word " * (p // 2)] * rows,
        completions=["word " * (t // 2)] * rows,
        prompt_ids=torch.randint(0, 1000, (rows, p)),
        prompt_mask=torch.ones(rows, p, dtype=torch.bool),
        completion_ids=torch.randint(0, 1000, (rows, t)),
        completion_mask=torch.ones(rows, t, dtype=torch.bool),
        logprobs=torch.randn(rows, t),
        truncated=torch.zeros(rows, dtype=torch.bool),
        group_size=4,
    )


def _side(rank: int, address: str, shape_name: str, reps: int, out) -> None:
    torch.set_num_threads(1)
    shape = SHAPES[shape_name]
    model = _policy(shape)
    names = trainable_names(model)
    state = model.state_dict()
    link = Link(address, rank, 60)
    version, batch = [], []
    for i in range(WARMUP + reps):
        t0 = time.perf_counter()
        if rank == 0:  # a version out, a batch back (the trainer's two hand-offs per step)
            link.settle(link.send_tensors([state[n] for n in names], TAG_WEIGHTS))
            t1 = time.perf_counter()
            link.recv_object(TAG_BATCH)
        else:
            link.recv_tensors([torch.empty_like(state[n]) for n in names], TAG_WEIGHTS)
            t1 = time.perf_counter()
            link.settle(link.send_object(("batch", i, i, {}, _batch(shape)), TAG_BATCH))
        if i >= WARMUP:
            version.append(t1 - t0)
            batch.append(time.perf_counter() - t1)
    if rank == 0:
        out.put(
            {
                "shape": shape_name,
                "version_bytes": sum(state[n].numel() * state[n].element_size() for n in names),
                "version_s": statistics.median(version),
                "batch_s": statistics.median(batch),
            }
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", default="M", choices=sorted(SHAPES))
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--out")
    args = ap.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{s.getsockname()[1]}"
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_side, args=(r, address, args.shape, args.reps, out)) for r in (0, 1)]
    for p in procs:
        p.start()
    result = out.get(timeout=600)
    for p in procs:
        p.join()
    batch_bytes = len(_pickled(("batch", 0, 0, {}, _batch(SHAPES[args.shape]))))
    result |= {"batch_bytes": batch_bytes, "reps": args.reps, "threads": 1}
    result["version_MB_per_s"] = result["version_bytes"] / result["version_s"] / 1e6
    print(json.dumps(result, indent=1))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)


def _pickled(obj) -> bytes:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


if __name__ == "__main__":
    main()
