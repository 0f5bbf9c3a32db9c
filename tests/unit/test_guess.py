"""The guess-a-number game (rloo.tasks.guess, rloo.envs.guess): its rules, its reward, the SFT
traces' format, and episodes played through the multi-turn sampler agreeing with the rules."""

from __future__ import annotations

import pytest
import torch

from rloo.config import Sampling
from rloo.envs import Step, make_env
from rloo.envs.factory import env_factory
from rloo.rollout.multiturn import Limits, episodes
from rloo.tasks import get_task
from rloo.tasks.guess import (
    DECAY,
    GUESS_TURNS,
    HIGH,
    LOW,
    allowed,
    feedback,
    parse_guess,
    play,
    secret,
    win_reward,
)
from rloo.tasks.tokenizer import build_tokenizer

TASK = get_task("guess")
TOK = build_tokenizer(TASK)


def ids(text: str) -> list[int]:
    return TOK(text, add_special_tokens=False)["input_ids"]


def test_rules():
    assert parse_guess(["guess", "7"]) == 7
    assert parse_guess(["guess", "0"]) is None and parse_guess(["guess", "17"]) is None  # out of range / unknown
    assert parse_guess(["7"]) is None and parse_guess(["guess", "7", "7"]) is None
    assert feedback(9, 4) == "higher" and feedback(3, 4) == "lower" and feedback(4, 4) is None
    assert [win_reward(t) for t in (1, 2, 3)] == pytest.approx([1.0, DECAY, DECAY**2])
    assert allowed([(8, "higher"), (12, "lower"), (9, "higher")]) == [10, 11]
    assert allowed([]) == list(range(LOW, HIGH + 1))


def test_secret_is_in_range_and_held_out_games_are_apart():
    train = TASK.examples("train", 400)
    held = {e.prompt for e in TASK.examples("eval", 100)}
    assert all(LOW <= secret(e.prompt) <= HIGH for e in train)
    assert len({secret(e.prompt) for e in train}) == HIGH - LOW + 1
    assert not held & {e.prompt for e in train}
    with pytest.raises(ValueError, match="not a guess prompt"):
        secret("q : 1 + 2 =")


def test_references_are_games_of_the_layout_and_binary_search_is_best():
    """Every SFT trace is `guess <n>` turns, each wrong one followed by its true feedback, at most
    GUESS_TURNS of them, in the task's vocabulary; binary search wins every game within 5 turns."""
    refs = TASK.examples("sft", 300)
    for e in refs:
        words, target = e.reference.split(), secret(e.prompt)
        assert TOK.unk_token_id not in ids(e.prompt + " " + e.reference)
        turns = [words[i : i + 3] for i in range(0, len(words), 3)]
        assert 1 <= len(turns) <= GUESS_TURNS and len(words) <= TASK.max_response_words
        for t in turns:
            g = parse_guess(t[:2])
            assert g is not None and (t[2:] == [feedback(target, g)] if len(t) == 3 else g == target)
    won = [play(e.prompt, e.reference)[0] > 0 for e in refs]
    assert 0.6 < sum(won) / len(won) < 1  # a mediocre player: wins most games, not all
    for e in refs:
        reward, turns = play(e.prompt, TASK.ideal_response(e.prompt))
        assert turns <= 5 and reward == pytest.approx(win_reward(turns))


def test_env_answers_by_the_rules():
    prompt = next(e.prompt for e in TASK.examples("eval", 50) if 2 < secret(e.prompt) < 15)
    target = secret(prompt)
    env = make_env(env_factory("guess", TOK), len(TOK))
    assert TOK.decode(env.reset(prompt)) == prompt
    assert {TOK.convert_ids_to_tokens(i) for i in env.stop_ids} >= {str(n) for n in range(LOW, HIGH + 1)}
    assert env.step(ids(f"guess {target - 1}")) == Step(ids("higher"), None, False)
    assert env.step(ids(f"guess {target + 1}")) == Step(ids("lower"), None, False)
    assert env.step(ids(f"guess {target}")) == Step([], DECAY**2, True)  # won at turn 3
    env.reset(prompt)
    assert env.step(ids("higher 3")) == Step([], 0.0, True)  # not a guess: the game is lost
    env.reset(prompt)
    # a special token inside the turn is part of it (not dropped before parsing): a malformed turn
    assert env.step(ids(f"guess <pad> {target}")) == Step([], 0.0, True)
    assert env.stats() == {}  # no tools


def _imitate_references(model, steps: int = 40) -> None:
    """A few steps of SFT on the references, so that the sampled games have several turns and wins."""
    rows = [ids(f"{e.prompt} {e.reference}") for e in TASK.examples("sft", 64)]
    width = max(map(len, rows))
    batch = torch.tensor([r + [TOK.eos_token_id] * (width - len(r)) for r in rows])
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(steps):
        opt.zero_grad()
        model(input_ids=batch, labels=batch).loss.backward()
        opt.step()


def test_sampled_games_follow_the_rules():
    """Episodes of a random tiny policy through the multi-turn sampler: the policy's tokens are the
    turns the environment answered, the observations are the rules' feedback to them, and the reward
    is the rules' replay of the whole trajectory text (the trained tokens are the played ones)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=len(TOK), hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2
    )
    model = LlamaForCausalLM(cfg)
    _imitate_references(model)
    prompts = [e.prompt for e in TASK.examples("eval", 6)]
    envs = [make_env(env_factory("guess", TOK), len(TOK)) for _ in range(len(prompts) * 4)]
    lim = Limits(max_turns=GUESS_TURNS, max_turn_tokens=3, max_total_tokens=24, step_timeout_s=30)
    roll = episodes(model, TOK, envs, prompts, 4, lim, Sampling(1, 8), generator=torch.Generator().manual_seed(1))
    assert roll.policy_mask is not None and roll.env_rewards is not None and roll.turns is not None
    assert roll.turns.max() >= 3 and (roll.env_rewards > 0).any()  # games of several turns, some won
    for i in range(len(envs)):
        real = roll.completion_mask[i]
        toks, pol = roll.completion_ids[i][real].tolist(), roll.policy_mask[i][real].tolist()
        obs = [t for t, p in zip(toks, pol, strict=True) if not p]
        assert all(TOK.convert_ids_to_tokens(t) in ("higher", "lower") for t in obs)
        if not roll.truncated[i]:
            reward, turns = play(roll.prompts[i], roll.completions[i], GUESS_TURNS)
            assert float(roll.env_rewards[i]) == pytest.approx(reward)
            assert reward == 0 or int(roll.turns[i]) == turns  # a lost game may end on a turn of special tokens only
