"""Does a policy use the guess game's feedback? It plays held-out games, and each of its guesses is
checked against what the feedback so far allows (rloo.tasks.guess.allowed) (docs/agents.md).

    python benchmarks/studies/agents_game_guess_feedback.py MODEL_DIR [MODEL_DIR ...] [--prompts 100 --n 8 --seed 0]

Prints per model: success rate, turns per episode, the share of guesses the feedback allows
(inside the range left by the higher/lower answers, not tried before; the references: 0.79,
binary search: 1), the share of repeated guesses, and the mean distance of a guess from the middle
of the allowed range in units of its width (binary search: 0.03, the references: 0.78).
"""

from __future__ import annotations

import argparse

import torch

from rloo.config import Sampling
from rloo.envs import make_env
from rloo.envs.factory import env_factory
from rloo.modeling.loading import load_policy
from rloo.rollout.multiturn import Limits, episodes
from rloo.tasks import get_task
from rloo.tasks.guess import GUESS_TURNS, allowed, feedback, parse_guess, secret


def guesses(prompt: str, completion: str) -> list[tuple[int, list[tuple[int, str]]]]:
    """The game's guesses, each with the history (guess, answer) before it."""
    words, history, out = completion.split(), [], []
    for j in range(0, len(words), 3):
        g = parse_guess(words[j : j + 2])
        if g is None:
            break
        out.append((g, list(history)))
        answer = feedback(secret(prompt), g)
        if answer is None:
            break
        history.append((g, answer))
    return out


@torch.no_grad()
def measure(path: str, prompts: list[str], n: int, seed: int) -> dict:
    model, tok = load_policy(path)
    model.eval()
    gen = torch.Generator().manual_seed(seed)
    lim = Limits(GUESS_TURNS, 3, 3 * GUESS_TURNS, 30.0)
    wins = turns = ok = rep = total = 0
    off = 0.0
    for i in range(0, len(prompts), 16):
        chunk = prompts[i : i + 16]
        envs = [make_env(env_factory("guess", tok), len(tok)) for _ in range(len(chunk) * n)]
        roll = episodes(model, tok, envs, chunk, n, lim, Sampling(1, 8), generator=gen)
        assert roll.env_rewards is not None and roll.turns is not None
        wins += int((roll.env_rewards > 0).sum())
        turns += float(roll.turns.sum())
        for p, c in zip(roll.prompts, roll.completions, strict=True):
            for g, hist in guesses(p, c):
                room = allowed(hist)
                total += 1
                ok += g in room
                rep += g in [h for h, _ in hist]
                if room:
                    off += abs(g - (room[0] + room[-1]) / 2) / max(1, room[-1] - room[0] + 1)
    games = len(prompts) * n
    return {
        "success": wins / games,
        "turns": turns / games,
        "allowed": ok / max(total, 1),
        "repeats": rep / max(total, 1),
        "off_middle": off / max(total, 1),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("models", nargs="+")
    ap.add_argument("--prompts", type=int, default=100)
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    prompts = [e.prompt for e in get_task("guess").examples("eval", args.prompts, seed=args.seed)]
    for path in args.models:
        m = measure(path, prompts, args.n, args.seed)
        print(path + ": " + ", ".join(f"{k} {v:.3f}" for k, v in m.items()))


if __name__ == "__main__":
    main()
