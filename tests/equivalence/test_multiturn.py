"""Multi-turn episodes (issue 30): token in, token out, and one RLOO gradient against a plain reference.

The environment here answers each policy turn with observation ids that depend on the turn, gives
a reward that depends on the turn's ids, and ends after a few turns, so the trajectories of one
batch have different numbers of turns, observations and lengths (some truncated).

The reference, written here and sharing nothing with rloo but the models: one trajectory at a
time, unpadded, no KV cache, the policy's log-prob of its own tokens only:
    eq. 1  R_i = r_i - beta * sum_{t policy} (log pi(y_t|.) - log pi_ref(y_t|.))     (no gradient)
    eq. 4  A_i = R_i - 1/(k-1) * sum_{j != i} R_j
    eq. 5  loss = -1/N * sum_i A_i * sum_{t policy} log pi(y_t|.)
"""

from __future__ import annotations

import pytest
import torch

from helpers.chat_tokenizers import chat_tokenizer
from helpers.grads import GradRecorder
from helpers.tiny_archs import ARCHS, EOS, PAD, V, tiny_lm
from rloo.algorithms.agents import episode_reward, limits
from rloo.algorithms.base import Models
from rloo.algorithms.rloo import rloo_step
from rloo.config import RLConfig, Sampling
from rloo.data.chat_turns import chat_frame
from rloo.envs import EnvSpec, Step, make_env
from rloo.rollout import multiturn
from tolerance import TINY_MODEL_BACKWARD, TINY_MODEL_FORWARD, assert_close

K, BETA, STOP = 4, 0.1, 5
PROMPTS = ["7 8 9", "10 11 12 13 14"]


class Tok:
    """The tiny models' ids as text (only for display: nothing is re-encoded)."""

    eos_token_id, pad_token_id = EOS, PAD

    def batch_decode(self, rows, skip_special_tokens=True):
        return [" ".join(str(t) for t in r if t not in (PAD, EOS)) for r in rows]


class EchoEnv:
    """Answers a turn with 1-3 ids derived from it; reward = share of even ids in the turn; done at
    the third turn or when the turn ends with EOS. Records what it received."""

    stop_ids = (STOP,)
    log: list = []

    def reset(self, prompt):
        self.turns = []
        EchoEnv.log.append(self.turns)
        return [int(w) for w in prompt.split()]

    def step(self, turn):
        self.turns.append(list(turn))
        obs = [20 + (sum(turn) + j) % 15 for j in range(1 + sum(turn) % 3)]
        self.turns.append(obs)
        reward = sum(t % 2 == 0 for t in turn) / len(turn)
        return Step(obs, reward, len(self.turns) >= 6 or turn[-1] == EOS)


def spec(total: int = 20) -> EnvSpec:
    return EnvSpec(EchoEnv, max_turns=3, max_turn_tokens=6, max_total_tokens=total, step_timeout_s=30)


def _episodes(policy, total=20, seed=0, tok=None, chat=None, prefill=True):
    EchoEnv.log.clear()
    envs = [make_env(EchoEnv, V) for _ in range(len(PROMPTS) * K)]
    gen = torch.Generator().manual_seed(seed)
    lim = limits(spec(total))
    tok = Tok() if tok is None else tok
    return multiturn.episodes(
        policy, tok, envs, PROMPTS, K, lim, Sampling(1, 32), generator=gen, chat=chat, prefill_observations=prefill
    )


def _draw_steps(policy_mask: list[bool], prefill: bool) -> list[int]:
    """The decode step at which each policy token of a row was drawn: one step per policy token, and
    one per observation (one forward pass over it) or, token by token, one per observation token."""
    steps, s = [], 0
    for j, p in enumerate(policy_mask):
        if p:
            steps.append(s)
        s += 1 if p or not prefill or j == 0 or policy_mask[j - 1] else 0
    return steps


def _favour(model, token: int, logit: float = 3.0):
    """Add `logit` to `token`'s logit in every forward pass (sampler and reference alike): a chat
    template's end-of-turn is then sampled in about a third of the turns, not 1 in 50."""
    bias = torch.zeros(model.get_output_embeddings().weight.shape[0])
    bias[token] = logit
    model.get_output_embeddings().register_forward_hook(lambda mod, inp, out: out + bias.to(out.dtype))
    return model


def _plain_logprobs(model, prompt: list[int], traj: torch.Tensor) -> torch.Tensor:
    """log pi of every trajectory token (T,) from one unpadded forward pass, no cache."""
    ids = torch.tensor([*prompt, *traj.tolist()])[None]
    logits = model(input_ids=ids, use_cache=False).logits[0, len(prompt) - 1 : -1].float()
    return logits.log_softmax(-1).gather(-1, traj[:, None]).squeeze(-1)


def _rows(roll, i):
    """Row i's unpadded prompt ids, trajectory ids and policy mask."""
    prompt = roll.prompt_ids[i][roll.prompt_mask[i]].tolist()
    real = roll.completion_mask[i]
    return prompt, roll.completion_ids[i][real], roll.policy_mask[i][real]


@pytest.mark.parametrize("templated", [False, True], ids=["ids", "chat_template"])
@pytest.mark.parametrize("arch", ARCHS)
def test_trained_ids_are_the_sampled_ids(arch, templated, monkeypatch):
    """The ids the sampler drew at each step are the trajectory's ids at the policy's positions,
    the environment received exactly those ids turn by turn and its observations follow them
    verbatim (inside the chat template's turn wrappers for a templated tokenizer, whose end-of-turn
    token ends turns); the sampled log-probs equal a plain cache-free forward pass over the trajectory."""
    drawn = []
    real_next = multiturn._next_token

    def spy(*a, **kw):
        tok, lp = real_next(*a, **kw)
        drawn.append(tok.clone())
        return tok, lp

    monkeypatch.setattr(multiturn, "_next_token", spy)
    tok = chat_tokenizer("chatml") if templated else None
    chat = chat_frame(tok) if templated else None
    policy = tiny_lm(arch, tokenizer=tok).eval()
    policy = _favour(policy, chat.eot) if chat else policy
    roll = _episodes(policy, total=40 if templated else 20, tok=tok, chat=chat)
    drawn = torch.stack(drawn, 1)
    pol = roll.policy_mask
    for i in range(len(pol)):
        mask = roll.policy_mask[i][roll.completion_mask[i]]
        assert torch.equal(roll.completion_ids[i][pol[i]], drawn[i, _draw_steps(mask.tolist(), True)]), i
    assert bool((~pol & roll.completion_mask).any()), "no observation tokens: the test checks nothing"
    assert len(set(roll.turns.tolist())) > 1, "every episode had as many turns: the batch is not mixed"
    assert 0 < int(roll.truncated.sum()) < len(roll.truncated), "truncated and finished episodes both wanted"
    ends = [log[j][-1] for log in EchoEnv.log for j in range(0, len(log), 2)]
    if chat:
        assert chat.eot in ends and any(e != chat.eot for e in ends), "turns ending at and before end-of-turn wanted"
    for i, log in enumerate(EchoEnv.log):
        prompt, traj, mask = _rows(roll, i)
        # the trajectory is the env's log (turn, observation, turn, ...) concatenated (a last
        # observation dropped at a limit; each observation in its chat turn), then the policy's
        # turn cut by the token limit, unsent
        parts = [p if j % 2 == 0 or not chat else chat.observation(log[j - 1], p) for j, p in enumerate(log)]
        flat = [t for part in parts for t in part][: len(traj)]
        assert traj[: len(flat)].tolist() == flat, i
        assert bool(mask[len(flat) :].all()), i
        # runs of policy tokens are exactly the turns the env received (a truncated last turn unsent)
        turns, run = [], []
        for t, p in zip(traj.tolist(), mask.tolist(), strict=True):
            if p:
                run.append(t)
            elif run:
                turns, run = [*turns, run], []
        assert turns == log[0::2][: len(turns)], i
        with torch.no_grad():
            plain = _plain_logprobs(policy, prompt, traj)
        # two forward computations of one log-softmax (decode with cache vs one plain pass), each
        # within TINY_MODEL_FORWARD of the log-prob's scale (|log p| + 1)
        assert_close(
            roll.logprobs[i][roll.completion_mask[i]][mask],
            plain[mask],
            2 * TINY_MODEL_FORWARD,
            scale=1 + float(plain.abs().max()),
        )


@pytest.mark.parametrize("templated", [False, True], ids=["ids", "chat_template"])
@pytest.mark.parametrize("arch", ARCHS)
def test_observation_prefill_equals_token_by_token(arch, templated):
    """Each observation in one forward pass (the default) against one token per decode step, same
    seed: the same episodes (ids, masks, turns, rewards, truncations) and the same sampled log-probs
    within the forward tolerance. Both are forward computations of one log-softmax, each within
    TINY_MODEL_FORWARD of it (positions <= 64 here: the attention's sums over them add < 2 * 64 terms
    to tolerance.py's n ~ 660, still < 2**10; the block's masked padding adds exact zeros)."""
    tok = chat_tokenizer("chatml") if templated else None
    chat = chat_frame(tok) if templated else None
    policy = tiny_lm(arch, tokenizer=tok).eval()
    policy = _favour(policy, chat.eot) if chat else policy
    total = 40 if templated else 20
    fast, slow = (_episodes(policy, total=total, tok=tok, chat=chat, prefill=p) for p in (True, False))
    obs = slow.completion_mask & ~slow.policy_mask
    assert int(obs.sum(-1).max()) > 1, "no observation of several tokens: nothing to prefill"
    for name in ("prompt_ids", "completion_ids", "completion_mask", "policy_mask", "truncated", "turns", "env_rewards"):
        assert torch.equal(getattr(fast, name), getattr(slow, name)), name
    scale = 1 + float(slow.logprobs.abs().max())
    assert_close(fast.logprobs, slow.logprobs, 2 * TINY_MODEL_FORWARD, scale=scale)


def _reference_grads(policy, ref, roll, scores):
    """eq. 1, 4, 5 one unpadded trajectory at a time over the policy's tokens (module docstring)."""
    policy.zero_grad(set_to_none=True)
    seq_lp, rewards = [], []
    for i in range(len(roll.prompts)):
        prompt, traj, mask = _rows(roll, i)
        lp = _plain_logprobs(policy, prompt, traj)[mask].sum()
        with torch.no_grad():
            ref_lp = _plain_logprobs(ref, prompt, traj)[mask].sum()
        seq_lp.append(lp)
        rewards.append(float(scores[i]) - BETA * (lp.detach() - ref_lp).item())
    r = torch.tensor(rewards).view(-1, K)
    adv = (r - (r.sum(1, keepdim=True) - r) / (K - 1)).view(-1)
    loss = -(adv * torch.stack(seq_lp)).mean()
    loss.backward()
    return {n: p.grad.detach().clone() for n, p in policy.named_parameters() if p.grad is not None}, loss


@pytest.mark.parametrize("share", [True, False])
@pytest.mark.parametrize("arch", ARCHS)
def test_rloo_step_gradient_equals_reference(arch, share):
    """rloo_step on episodes: its gradient is the plain per-trajectory one, whose sums run over the
    policy's tokens only (a mask that also counted observations gives another gradient)."""
    # another seed for the reference: KL(pi || ref) != 0, so eq. 1's sum over policy tokens is checked too
    policy, ref = tiny_lm(arch), tiny_lm(arch, seed=1).requires_grad_(False).eval()
    cfg = RLConfig(policy="unused", k=K, beta=BETA, lr=1e-2, max_grad_norm=1e6, share_prompt=share)
    opt = GradRecorder(policy)
    models = Models(policy, ref, Tok(), episode_reward, env=spec())
    EchoEnv.log.clear()
    result = rloo_step(models, opt, PROMPTS, cfg, torch.Generator().manual_seed(0))
    stats, roll = result.stats, result.rollout
    assert bool((~roll.policy_mask & roll.completion_mask).any())
    assert abs(stats["reward/kl"]) > 1e-2, "KL ~ 0: eq. 1's sum over the policy's tokens would go unchecked"
    assert stats["gen/length"] == pytest.approx(roll.policy_mask.sum(-1).float().mean().item())
    grads, loss = _reference_grads(policy, ref, roll, episode_reward(roll))
    assert_close(stats["loss/policy"], loss.item(), TINY_MODEL_FORWARD, scale=1 + abs(loss.item()))
    scale = max(float(g.abs().max()) for g in grads.values())
    for name, g in grads.items():
        assert_close(opt.grads[name], g, TINY_MODEL_BACKWARD, scale=scale, msg=name)
