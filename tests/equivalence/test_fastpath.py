"""Fast paths equal the plain computation: prompt computed once per group of k.

Inputs have mixed prompt lengths (left padding) and mixed completion lengths (right padding,
including a one-token completion and one that fills T), so a wrong position id, a cache/mask
misalignment or a gradient that does not flow back through the shared prompt shows up.
Tolerances: tests/tolerance.py (float32 eps x the quantity's scale x the computation's factor).
"""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaForSequenceClassification

from helpers.tiny_archs import EOS, PAD, V, tiny_config, tiny_lm
from rloo.algorithms.rloo import Models, rloo_step
from rloo.config import RLConfig, Sampling
from rloo.modeling.forward import chunked_head, completion_logprobs, reward_scores
from rloo.modeling.forward_shared import completion_logprobs_shared, group_prompts, reward_scores_shared
from rloo.rewards import RewardModelScorer
from rloo.rollout.sampler import sample_tokens
from tolerance import TINY_MODEL_BACKWARD, TINY_MODEL_FORWARD, assert_close

pytestmark = pytest.mark.equivalence

B, K, P, T = 3, 3, 7, 6


def _config():
    return tiny_config("llama")


def _policy(seed=0):
    return tiny_lm("llama", seed=seed)


def _reward_model(seed=1):
    torch.manual_seed(seed)
    cfg = _config()
    cfg.num_labels = 1
    return LlamaForSequenceClassification(cfg).float()


def _batch(seed=0):
    """Grouped rows: prompt lengths 7, 3, 5 (left-padded); completion lengths mixed in 0..T."""
    g = torch.Generator().manual_seed(seed)
    p_len = torch.tensor([7, 3, 5])
    p_mask = torch.arange(P)[None, :] >= (P - p_len)[:, None]
    p_ids = torch.randint(2, V, (B, P), generator=g).masked_fill(~p_mask, PAD)
    c_len = torch.tensor([6, 1, 4, 2, 6, 3, 5, 1, 6])
    c_mask = torch.arange(T)[None, :] < c_len[:, None]
    c_ids = torch.randint(2, V, (B * K, T), generator=g).masked_fill(~c_mask, PAD)
    return p_ids.repeat_interleave(K, 0), p_mask.repeat_interleave(K, 0), c_ids, c_mask


@pytest.mark.parametrize("temperature,overhead", [(1.0, 0), (0.7, 0), (1.0, 10**9)])
def test_shared_logprobs_and_gradients_equal_plain(temperature, overhead):
    """overhead 0: one pass per distinct completion length (bucketed); 10**9: a single padded pass."""
    p_ids, p_mask, c_ids, c_mask = _batch()
    weights = torch.randn(B * K, T, generator=torch.Generator().manual_seed(3))
    results = []
    for shared in (False, True):
        model = _policy()
        args = (model, p_ids, p_mask, c_ids, c_mask)
        lp = (
            completion_logprobs_shared(*args, k=K, temperature=temperature, bucket_overhead=overhead)
            if shared
            else completion_logprobs(*args, temperature=temperature)
        )
        (lp * weights).masked_fill(~c_mask, 0.0).sum().backward()
        results.append((lp.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}))
    (lp0, g0), (lp1, g1) = results
    assert_close(lp1[c_mask], lp0[c_mask], TINY_MODEL_FORWARD)
    for name in g0:  # every parameter, including the embeddings of prompt-only tokens
        assert_close(g1[name], g0[name], TINY_MODEL_BACKWARD, msg=f"gradient of {name}")


@pytest.mark.parametrize("overhead", [0, 10**9])
def test_shared_reward_scores_equal_plain_including_empty_completion(overhead):
    p_ids, p_mask, c_ids, c_mask = _batch(seed=1)
    c_mask[4] = False  # an empty completion: pooled at the prompt's last token
    rm = _reward_model().eval()
    with torch.no_grad():
        plain = reward_scores(rm, p_ids, p_mask, c_ids, c_mask)
        shared = reward_scores_shared(rm, p_ids, p_mask, c_ids, c_mask, k=K, bucket_overhead=overhead)
    assert_close(shared, plain, TINY_MODEL_FORWARD)
    assert plain.std() > 0  # the scores differ between rows, so equality is not trivial


def test_shared_prefill_sampling_equals_plain():
    model = _policy().eval()
    p_ids, p_mask, _, _ = _batch()
    s, ids = Sampling(T, p_ids.shape[1]), dict(eos_id=EOS, pad_id=PAD)
    plain = sample_tokens(model, p_ids, p_mask, s, **ids, generator=torch.Generator().manual_seed(5))
    shared = sample_tokens(model, p_ids[::K], p_mask[::K], s, **ids, generator=torch.Generator().manual_seed(5), k=K)
    # same noise, so the same tokens: a token could only flip if rounding moved a probability
    # across the exponential race's margin, which at float32 eps is a ~1e-6 chance per draw
    assert torch.equal(shared[0], plain[0]) and torch.equal(shared[1], plain[1])
    assert_close(shared[2], plain[2], TINY_MODEL_FORWARD)
    # the sampled log-probs are the training forward's log-probs (no recomputation needed)
    lp = completion_logprobs(model, p_ids, p_mask, plain[0], plain[1])
    assert_close(plain[2][plain[1]], lp[plain[1]], TINY_MODEL_FORWARD)


def test_group_prompts_rejects_ungrouped_rows():
    p_ids, p_mask, _, _ = _batch()
    with pytest.raises(ValueError, match="not grouped"):
        group_prompts(p_ids.roll(1, dims=0), p_mask.roll(1, dims=0), K)
    with pytest.raises(ValueError, match="groups of k"):
        group_prompts(p_ids[:-1], p_mask[:-1], K)


@pytest.mark.parametrize(
    "rows",
    [
        [7, 0, 4, 8, 1],  # random rows: prompts 2, 0, 1, 2, 0 (two share a prompt twice, one is alone)
        [3, 4, 5, 2, 1],  # a whole group (3 4 5) among rows of another, unsorted
        [8, 6],  # two rows of one prompt only
    ],
)
@pytest.mark.parametrize("checkpointing", [False, True])
def test_minibatch_of_random_rows_shares_prompts_and_equals_plain(rows, checkpointing, monkeypatch):
    """A minibatch of random rows (the group methods' num_minibatches > 1, micro-batches): each of
    its distinct prompts is computed once, in the rows' order, with the plain pass's log-probs and
    gradients. The shared pass ran (counted), for rows that are not whole groups."""
    import rloo.modeling.logprob_pass as lp_pass
    from rloo.modeling.loading import enable_gradient_checkpointing

    p_ids, p_mask, c_ids, c_mask = _batch(seed=2)
    r = torch.tensor(rows)
    weights = torch.randn(len(rows), T, generator=torch.Generator().manual_seed(4))
    calls, shared_pass = [], lp_pass.completion_logprobs_shared
    monkeypatch.setattr(
        lp_pass, "completion_logprobs_shared", lambda *a, **kw: calls.append(kw) or shared_pass(*a, **kw)
    )
    results = []
    for share in (False, True):
        model = _policy()
        if checkpointing:
            enable_gradient_checkpointing(model)
        lp = lp_pass.policy_logprobs(model, p_ids, p_mask, c_ids, c_mask, k=K, share=share, rows=r)
        (lp * weights).masked_fill(~c_mask[r], 0.0).sum().backward()
        results.append((lp.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}))
    assert len(calls) == 1 and calls[0]["prompt_of"] is not None  # the random rows' shared pass ran
    (lp0, g0), (lp1, g1) = results
    assert_close(lp1[c_mask[r]], lp0[c_mask[r]], TINY_MODEL_FORWARD)
    for name in g0:
        assert_close(g1[name], g0[name], TINY_MODEL_BACKWARD, msg=f"gradient of {name}")


def test_rows_prompts_and_distinct_prompts():
    from rloo.modeling.forward_shared import distinct_prompts
    from rloo.modeling.logprob_pass import rows_prompts

    assert rows_prompts(torch.tensor([9, 2, 10, 0]), 4).tolist() == [1, 0, 1, 0]
    assert rows_prompts(torch.tensor([0, 5, 9]), 4) is None  # no two rows share a prompt: plain
    assert rows_prompts(torch.tensor([0, 1]), 1) is None
    p_ids, p_mask, _, _ = _batch()
    ids, mask = distinct_prompts(p_ids[[7, 0, 8]], p_mask[[7, 0, 8]], torch.tensor([1, 0, 1]))
    want_ids, want_mask = group_prompts(p_ids, p_mask, K)
    assert torch.equal(ids, want_ids[[0, 2]]) and torch.equal(mask, want_mask[[0, 2]])
    with pytest.raises(ValueError, match="different prompts"):
        distinct_prompts(p_ids[[7, 0]], p_mask[[7, 0]], torch.tensor([0, 0]))


class _Tok:
    """Just enough of a tokenizer for rollout(): integer-string prompts, no decoding needed."""

    eos_token_id, pad_token_id = EOS, PAD

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [int(t) for t in text.split()]}

    def batch_decode(self, rows, skip_special_tokens=True):
        return [" ".join(map(str, r)) for r in rows]

    def get_vocab(self):
        return {str(i): i for i in range(V)}


class _GradRecorder:
    """Stands in for the optimizer: keeps the (clipped) gradient rloo_step hands to `step()`.
    Parameters after an AdamW step are not comparable across arithmetic (tests/tolerance.py)."""

    def __init__(self, params):
        self.params, self.grads = list(params), None

    def zero_grad(self, set_to_none=True):
        for p in self.params:
            p.grad = None

    def step(self):
        self.grads = [p.grad.detach().clone() for p in self.params]


def test_rloo_step_shared_equals_plain():
    """One whole RLOO step (sampling, reward model, reference, loss, clipped gradient); the update
    that follows is the same AdamW function of these gradients on both paths."""
    prompts = ["5 6 7 8 9 10 11", "12 13 14", "15 16 17 18 19"]
    after = []
    for share in (False, True):
        policy, ref, tok = _policy(), _policy().requires_grad_(False).eval(), _Tok()
        scorer = RewardModelScorer(_reward_model().eval(), tok, policy_tokenizer=tok, share_prompt=share)
        cfg = RLConfig(policy="unused", k=K, beta=0.1, max_new_tokens=T, lr=1e-2, share_prompt=share)
        opt = _GradRecorder(policy.parameters())
        r = rloo_step(Models(policy, ref, tok, scorer), opt, prompts, cfg, torch.Generator().manual_seed(0))
        after.append((r.stats, r.rollout, r.rewards, opt.grads))
    (s0, roll0, r0, g0), (s1, roll1, r1, g1) = after
    assert torch.equal(roll1.completion_ids, roll0.completion_ids)  # same noise, same tokens (see above)
    assert_close(r1, r0, TINY_MODEL_FORWARD)
    # scalars: means of N terms, each within the forward bound of its own scale; the loss is a
    # mean of A_i * log pi(y_i) whose terms cancel (sum A = 0), so its scale is mean |A_i log pi(y_i)|
    seq_lp = roll0.logprobs.sum(-1).abs()
    scales = {
        "loss/policy": float(
            (r0.view(-1, K) - r0.view(-1, K).mean(1, keepdim=True)).abs().flatten().mul(K / (K - 1)).mul(seq_lp).mean()
        ),
        "reward/score": abs(s0["reward/score"]),
        "reward/kl": abs(s0["reward/kl"]) + float(seq_lp.mean()),
        "grad/norm": s0["grad/norm"],
    }
    for key, scale in scales.items():
        assert_close(
            s1[key], s0[key], TINY_MODEL_BACKWARD if key == "grad/norm" else TINY_MODEL_FORWARD, scale=scale, msg=key
        )
    for a, b in zip(g1, g0, strict=False):
        assert_close(a, b, TINY_MODEL_BACKWARD)


def test_reused_prefill_gives_same_logprobs_and_gradients():
    """The sampling prefill (kept with its graph) stands in for the policy's prompt pass."""
    from rloo.modeling.forward_shared import group_prompts
    from rloo.modeling.kvcache import prefill_prompts

    p_ids, p_mask, c_ids, c_mask = _batch()
    grads = []
    for reuse in (False, True):
        model = _policy()
        pre = prefill_prompts(model, *group_prompts(p_ids, p_mask, K)) if reuse else None
        lp = completion_logprobs_shared(model, p_ids, p_mask, c_ids, c_mask, k=K, prefill=pre)
        lp.masked_fill(~c_mask, 0.0).sum().backward()
        grads.append((lp.detach(), [p.grad.clone() for p in model.parameters()]))
    assert_close(grads[1][0], grads[0][0], TINY_MODEL_FORWARD)
    for a, b in zip(grads[1][1], grads[0][1], strict=False):
        assert_close(a, b, TINY_MODEL_BACKWARD)
    with pytest.raises(ValueError, match="other prompts"):
        completion_logprobs_shared(_policy(), p_ids.flip(0), p_mask.flip(0), c_ids, c_mask, k=K, prefill=pre)


def test_no_prefill_reuse_with_dropout():
    from rloo.modeling.kvcache import has_dropout
    from rloo.rollout import rollout

    model = _policy()
    assert not has_dropout(model)
    model.config.attention_dropout = 0.1
    assert has_dropout(model)
    roll = rollout(model, _Tok(), ["5 6 7", "8 9"], K, Sampling(3, 8), keep_prefill=True)
    assert roll.prefill is None


@pytest.mark.parametrize("shared,tied", [(False, False), (True, False), (True, True)])
def test_chunked_lm_head_equals_full_logits(shared, tied):
    """A logits budget below the batch's (N, T, V) size sends the passes through the chunked LM
    head (logits recomputed in backward): same log-probs and parameter gradients, including with
    the head tied to the input embeddings."""
    p_ids, p_mask, c_ids, c_mask = _batch()
    weights = torch.randn(B * K, T, generator=torch.Generator().manual_seed(4))
    results = []
    for budget in (1024, 0.001):  # 0.001 MB: chunks of 6 positions (V = 40)
        model = tiny_lm("llama", tied=tied)
        args = (model, p_ids, p_mask, c_ids, c_mask)
        lp = (
            completion_logprobs_shared(*args, k=K, temperature=0.7, max_logits_mb=budget, bucket_overhead=0)
            if shared
            else completion_logprobs(*args, temperature=0.7, max_logits_mb=budget)
        )
        (lp * weights).masked_fill(~c_mask, 0.0).sum().backward()
        results.append((lp.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}))
    (lp0, g0), (lp1, g1) = results
    assert_close(lp1[c_mask], lp0[c_mask], TINY_MODEL_FORWARD)
    assert (model.lm_head.weight is model.model.embed_tokens.weight) == tied
    assert chunked_head(model, c_ids.numel(), 0.001) is not None and chunked_head(model, c_ids.numel(), 1024) is None
    assert g0["model.embed_tokens.weight"].abs().sum() > 0
    for name in g0:
        assert_close(g1[name], g0[name], TINY_MODEL_BACKWARD, msg=f"gradient of {name}")


def test_ppo_pass_with_chunked_head_equals_full_logits():
    """PPO's joint policy + value pass: same log-probs, values and gradients with the chunked head."""
    from rloo.algorithms.ppo import ValueFunction

    p_ids, p_mask, c_ids, c_mask = _batch()
    results = []
    for budget in (1024, 0.001):
        policy = _policy()
        value = object.__new__(ValueFunction)  # a linear value head on the policy's last hidden state
        value.kind = "head"
        torch.manual_seed(5)
        value.model = torch.nn.Linear(policy.config.hidden_size, 1)
        lp, v = value.forward(policy, p_ids, p_mask, c_ids, c_mask, 0.8, max_logits_mb=budget)
        (lp.masked_fill(~c_mask, 0).sum() + v.masked_fill(~c_mask, 0).sum()).backward()
        results.append((lp.detach(), v.detach(), {n: p.grad.clone() for n, p in policy.named_parameters()}))
    (lp0, v0, g0), (lp1, v1, g1) = results
    assert chunked_head(policy, c_ids.numel(), 0.001) is not None and chunked_head(policy, c_ids.numel(), 1024) is None
    assert_close(lp1[c_mask], lp0[c_mask], TINY_MODEL_FORWARD)
    assert_close(v1, v0, TINY_MODEL_FORWARD)
    for name in g0:
        assert_close(g1[name], g0[name], TINY_MODEL_BACKWARD, msg=f"gradient of {name}")


@pytest.mark.parametrize("arch", ["llama", "gpt2", "gpt_neox", "qwen2"])
def test_dpo_pairs_shared_prompt_equal_plain(arch):
    """DPO's pair log-probs with each pair's prompt computed once for its chosen and rejected rows
    (`rloo.training.dpo._pair_logprobs`, share=True) against the plain pass: values, and the gradient
    of the DPO loss (eq. 7) against fixed reference log-probs; mixed prompt and completion lengths,
    the pairs taken in a shuffled order as the DPO epochs take them."""
    from types import SimpleNamespace

    from rloo.core.losses import dpo_loss
    from rloo.training.dpo import _pair_logprobs

    # 3 pairs: rows i (chosen) and 3 + i (rejected) share prompt i, as encode_pairs lays them out;
    # prompts of 7, 3 and 5 tokens, completions of 6, 1, 4 (chosen) and 2, 6, 3 (rejected)
    p_ids, p_mask, c_ids, c_mask = _batch()
    prompts = SimpleNamespace(ids=p_ids[::K].repeat(2, 1), mask=p_mask[::K].repeat(2, 1))
    comps = SimpleNamespace(ids=c_ids[:6], mask=c_mask[:6])
    idx = torch.tensor([2, 0, 1])
    ref_c, ref_r = torch.tensor([-9.0, -7.5, -8.0]), torch.tensor([-8.0, -9.5, -6.0])
    results = []
    for share in (False, True):
        model = tiny_lm(arch, seed=0)
        chosen, rejected = _pair_logprobs(model, prompts, comps, idx, "cpu", share)
        loss, _ = dpo_loss(chosen, rejected, ref_c, ref_r, 0.1)
        loss.backward()
        results.append((chosen.detach(), rejected.detach(), {k: p.grad.clone() for k, p in model.named_parameters()}))
    (c0, r0, g0), (c1, r1, g1) = results
    with torch.no_grad():  # the plain values are pair idx[j]'s chosen and rejected rows, computed alone
        model = tiny_lm(arch, seed=0)
        for rows, got in ((idx, c0), (idx + 3, r0)):
            lp = completion_logprobs(
                model,
                p_ids[::K].repeat(2, 1)[rows],
                p_mask[::K].repeat(2, 1)[rows],
                *(t[rows] for t in (comps.ids, comps.mask)),
            )
            alone = (lp * comps.mask[rows]).sum(-1)
            assert_close(got, alone, TINY_MODEL_FORWARD, scale=float(alone.abs().max()) * T)
    # summed over <= T tokens: the sum's scale is the sum of |log p| (the plain values' magnitude x T)
    assert_close(c1, c0, TINY_MODEL_FORWARD, scale=float(c0.abs().max()) * T)
    assert_close(r1, r0, TINY_MODEL_FORWARD, scale=float(r0.abs().max()) * T)
    for name in g0:
        assert_close(g1[name], g0[name], TINY_MODEL_BACKWARD, msg=f"{arch}: gradient of {name}")


@pytest.mark.parametrize("arch", ["llama", "gpt2", "gpt_neox", "qwen2"])
def test_reward_pairs_shared_prompt_equal_plain(arch):
    """Reward-model training's pair scores with each pair's prompt computed once for its chosen and
    rejected rows (`rloo.training.reward._score`, share=True) against the plain pass: scores, and the
    gradient of the Bradley-Terry loss; mixed prompt and completion lengths, an empty completion,
    pairs in a shuffled order; and each pair's scores against the pair scored alone."""
    from types import SimpleNamespace

    from transformers import AutoModelForSequenceClassification

    from rloo.core.losses import bradley_terry_loss
    from rloo.training.reward import _score

    def rm():
        torch.manual_seed(1)
        config = tiny_config(arch)
        config.num_labels = 1
        return AutoModelForSequenceClassification.from_config(config).float()

    p_ids, p_mask, c_ids, c_mask = _batch()
    prompts = SimpleNamespace(ids=p_ids[::K].repeat(2, 1), mask=p_mask[::K].repeat(2, 1))
    comp_mask = c_mask[:6].clone()
    comp_mask[4] = False  # pair 1's rejected completion is empty: scored at its prompt's last token
    comps = SimpleNamespace(ids=c_ids[:6], mask=comp_mask)
    idx = torch.tensor([2, 0, 1])
    results = []
    for share in (False, True):
        model = rm()
        chosen, rejected = _score(model, prompts, comps, idx, "cpu", share)
        bradley_terry_loss(chosen, rejected)[0].backward()
        results.append((chosen.detach(), rejected.detach(), {k: p.grad.clone() for k, p in model.named_parameters()}))
    (c0, r0, g0), (c1, r1, g1) = results
    with torch.no_grad():
        model = rm()
        for rows, got in ((idx, c0), (idx + 3, r0)):
            alone = reward_scores(model, prompts.ids[rows], prompts.mask[rows], comps.ids[rows], comps.mask[rows])
            assert_close(got, alone, TINY_MODEL_FORWARD)
    assert_close(c1, c0, TINY_MODEL_FORWARD)
    assert_close(r1, r0, TINY_MODEL_FORWARD)
    for name in g0:
        assert_close(g1[name], g0[name], TINY_MODEL_BACKWARD, msg=f"{arch}: gradient of {name}")
