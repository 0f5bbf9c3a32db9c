"""Observations in one forward pass against one token per decode step: the calculator task's episodes
(docs/agents.md, "Costs and limits"), both paths side by side in one process, alternated.

    python benchmarks/episode_prefill.py [--threads 1] [--reps 3] [--rounds 3] [--json FILE]
    REPEAT=8 python benchmarks/episode_prefill.py      # each observation repeated 8 times (4 -> 32 tokens)

The pipeline's calculator policy shape (the small Llama of `arch`'s defaults, the task's word
tokenizer), briefly fine-tuned on the tool-calling references (SFT_STEPS Adam steps) so that its episodes
call the tool (`call calc ... end`, then the observation `out <digits>`, then `ans ...`); then
batches of the RL stage's size (16 prompts x k=4, the pipeline's env_settings) played with
`prefill_observations` True and False from the same seed: the same episodes (checked), and per
batch the CPU time (time.process_time, median over reps), the decode steps (forward passes after
the prompt pass), tool calls and observation tokens per episode. Prints the load average.
"""

from __future__ import annotations

import json
import os
import statistics
import time

import torch

from microbench import script_args
from rloo.config.sections import ArchConfig
from rloo.envs import make_env
from rloo.envs.calculator import CalculatorEnv
from rloo.modeling.loading import build_llama
from rloo.rollout.multiturn import Limits, episodes
from rloo.tasks import get_task
from rloo.tasks.tokenizer import build_tokenizer

SFT_STEPS = 60
REPEAT = int(os.environ.get("REPEAT", "1"))  # longer observations: `out 3 8 2` repeated (1: the task's)
# the pipeline's limits, room for the longer observations
LIMITS = Limits(max_turns=3, max_turn_tokens=12, max_total_tokens=24 + 4 * (REPEAT - 1), step_timeout_s=30.0)


class LongerObservations(CalculatorEnv):
    def step(self, turn):
        out = super().step(turn)
        out.observation = out.observation * REPEAT
        return out


def fine_tune(model, tok, task, steps: int) -> None:
    """A few Adam steps on prompt + tool-calling reference, so the episodes call the tool."""
    rows = [tok(f"{e.prompt} {task.ideal_response(e.prompt)}")["input_ids"] for e in task.examples("sft", 64)]
    width = max(map(len, rows))
    batch = torch.tensor([r + [tok.eos_token_id] * (width - len(r) + 1) for r in rows])
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    model.train()
    for _ in range(steps):
        opt.zero_grad()
        model(input_ids=batch, labels=batch).loss.backward()
        opt.step()
    model.eval()


def play(model, tok, prompts: list[str], k: int, prefill: bool, steps: list[int]):
    envs = [make_env(lambda: LongerObservations(tok), len(tok)) for _ in range(len(prompts) * k)]
    gen = torch.Generator().manual_seed(0)
    before = len(steps)
    roll = episodes(
        model, tok, envs, prompts, k, LIMITS, max_prompt_len=16, generator=gen, prefill_observations=prefill
    )
    return roll, len(steps) - before - 1  # less the prompt pass


def main() -> None:
    args = script_args(__doc__, threads=1, reps=3, rounds=3)
    torch.set_num_threads(args.threads)
    task = get_task("calculator")
    tok = build_tokenizer(task)
    torch.manual_seed(0)
    model = build_llama(ArchConfig(), tok, seed=0)
    fine_tune(model, tok, task, SFT_STEPS)
    calls: list[int] = []
    model.model.register_forward_pre_hook(lambda *_: calls.append(1))
    prompts = [e.prompt for e in task.examples("eval", 16)]
    for prefill in (True, False):  # warm-up, untimed
        play(model, tok, prompts, 4, prefill, calls)
    load = os.getloadavg()
    times: dict[bool, list[float]] = {True: [], False: []}
    out: dict = {}
    for _ in range(args.rounds):
        for prefill in (True, False):
            for _ in range(args.reps):
                t = time.process_time()
                roll, n_steps = play(model, tok, prompts, 4, prefill, calls)
                times[prefill].append(time.process_time() - t)
            obs = (roll.completion_mask & ~roll.policy_mask).sum(-1).float().mean().item()
            out[prefill] = {"roll": roll, "steps": n_steps, "tool_calls": roll.env_stats.get("env/tool_calls", 0.0)}
            out[prefill]["observation_tokens"] = obs
    same = all(
        torch.equal(getattr(out[True]["roll"], f), getattr(out[False]["roll"], f))
        for f in ("completion_ids", "policy_mask")
    )
    rows = {}
    for prefill, name in ((True, "one pass per observation"), (False, "one token per step")):
        med = statistics.median(times[prefill])
        o = out[prefill]
        rows[name] = {
            "cpu_s": med,
            "decode_steps": o["steps"],
            "tool_calls": o["tool_calls"],
            "obs_tokens": o["observation_tokens"],
        }
        print(
            f"{name:26s} CPU {med * 1e3:7.1f} ms / batch of 64 episodes (median of {len(times[prefill])}), "
            f"{o['steps']} decode steps, tool calls {o['tool_calls']:.2f} and observation tokens "
            f"{o['observation_tokens']:.2f} per episode"
        )
    ratio = rows["one token per step"]["cpu_s"] / rows["one pass per observation"]["cpu_s"]
    print(
        f"token-by-token / prefill CPU time: {ratio:.2f}x; same episodes: {same}; "
        f"threads {args.threads}; REPEAT={REPEAT}"
    )
    print(f"load average before: {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}, after: {os.getloadavg()[0]:.1f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": rows, "ratio": ratio, "same": same, "load": [load, os.getloadavg()]}, f, indent=2)


if __name__ == "__main__":
    main()
