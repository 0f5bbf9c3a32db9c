"""Every online method's update on samples of an older policy (rl.max_staleness, rl.is_correction;
docs/async.md eq. A1-A3) against a plain per-sequence reference (tests/helpers/offpolicy_refs.py),
in test_offpolicy.py's matrix: share_prompt x checkpointing with the LM head in chunks x LoRA x the
four tiny architectures (a covering, not the product), tolerances from tests/tolerance.py. rloo
itself: test_offpolicy.py. At N = 0 without is_correction every method keeps its on-policy code
(the off-policy helpers are never reached; the gradient path is test_gradient_matrix.py's)."""

from __future__ import annotations

import pytest
import torch
from tests.equivalence.test_offpolicy import BETA, CHUNKED_CHECKPOINTED, LORA, PROMPTS, C, K, _cfg, _token_logprobs

from helpers.grads import GradRecorder
from helpers.offpolicy_refs import LOSSES, current_rewards, weights
from helpers.tiny_archs import ARCHS, save_tiny_lm
from rloo.algorithms import make_algorithm
from rloo.config import Sampling
from rloo.rollout import rollout
from rloo.rollout.lagged import shadow_copy
from rloo.training.rl import load_models
from tolerance import TINY_MODEL_BACKWARD, assert_close

ONE_PASS = {"ppo_epochs": 1, "num_minibatches": 1}  # the first minibatch is what GradRecorder records
# a zero-initialised value head: V = 0, and the value loss adds nothing to the policy's gradient
SETTINGS = {
    "vanilla_pg": {"value_model": "head"},
    "ppo": ONE_PASS | {"value_model": "head"},
    "grpo": ONE_PASS,
    "dr_grpo": ONE_PASS,
    "reinforce_pp": ONE_PASS,
}
PAST_BASELINE = 0.3  # reinforce: a baseline from earlier batches (eq. 3), not the first batch's warm start

CASES = [  # method, is_correction, share_prompt, max_staleness, extra settings, arch
    ("reinforce", "tis", True, 1, {}, "llama"),
    ("reinforce", "mis_token", False, 2, LORA, "gpt2"),
    ("vanilla_pg", "tis", True, 1, {}, "gpt_neox"),
    ("vanilla_pg", "mis", False, 1, LORA, "llama"),
    ("ppo", "mis", True, 1, CHUNKED_CHECKPOINTED, "qwen2"),
    ("ppo", "tis_token", False, 2, {}, "llama"),
    ("grpo", "tis", True, 1, CHUNKED_CHECKPOINTED, "llama"),
    ("grpo", "mis_token", True, 1, LORA, "gpt2"),
    ("grpo", "tis", False, 0, {}, "qwen2"),  # lag 0 with a correction: a sampler whose log-probs differ
    ("dr_grpo", "mis", False, 1, {}, "qwen2"),
    ("dr_grpo", "tis_token", True, 1, LORA, "gpt_neox"),
    ("reinforce_pp", "tis", False, 1, {}, "gpt2"),
    ("reinforce_pp", "mis", True, 2, CHUNKED_CHECKPOINTED, "qwen2"),
    ("raft", "none", True, 1, {}, "llama"),
    ("raft", "none", False, 1, LORA, "gpt_neox"),
]


def score_fn(prompts, completions):
    """Scores that vary within every group for all four tiny models (test_offpolicy's reward, by word
    count, is constant on qwen2's, whose completions all run to max_new_tokens: a group-baseline method
    then had a zero gradient and compared 0 with 0)."""
    return [
        len(set(c.split())) / 4 + 0.1 * (sum(map(ord, c)) % 7) + 0.1 * len(p.split())
        for p, c in zip(prompts, completions, strict=True)
    ]


@pytest.fixture(scope="module")
def arch_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("offpolicy-archs")
    return {a: save_tiny_lm(root / a, a) for a in ARCHS}


def _moved_from_ref(policy):
    """pi != pi_ref, as after some updates (LoRA: its adapters): at pi = pi_ref an in-loss KL's gradient
    is 0 (k3'(0) = 0) and its weighting would go unchecked."""
    with torch.no_grad():
        g = torch.Generator().manual_seed(2)
        for p in policy.parameters():
            if p.requires_grad:
                p.add_(0.02 * torch.randn(p.shape, generator=g))


def _behaviour_sampler(models, cfg, share):
    """mu: the policy a few updates ago, here a perturbed copy; its sampler stores mu's log-probs."""
    behaviour = shadow_copy(models.policy)
    with torch.no_grad():
        g = torch.Generator().manual_seed(1)
        for p in behaviour.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=g))

    def sample_with_mu(policy, prompts, rows=None, generator=None):
        s = Sampling(cfg.max_new_tokens, cfg.max_prompt_tokens, share_prompt=share)
        return rollout(behaviour, models.tokenizer, prompts, K, s, generator=torch.Generator().manual_seed(0))

    return sample_with_mu


def _rows(models, roll, correction):
    """Per row (lp with the gradient, mu, ref, w), float64 after the model's float32 pass."""
    out = []
    for i in range(len(roll.prompts)):
        x, real = roll.prompt_ids[i][roll.prompt_mask[i]], roll.completion_mask[i]
        y = roll.completion_ids[i][real]
        lp = _token_logprobs(models.policy, x, y).double()
        with torch.no_grad():
            ref = _token_logprobs(models.ref, x, y).double()
        mu = roll.logprobs[i][real].double()
        out.append((lp, mu, ref, weights(lp, mu, correction, C)))
    return out


def reference_gradient(models, roll, cfg, method, correction, weighted=True):
    """The reference's gradient, its rows and scores; weighted=False: every weight 1 (the uncorrected update)."""
    models.policy.eval()
    rows = _rows(models, roll, correction if weighted else "none")
    scores = torch.tensor(score_fn(roll.prompts, roll.completions), dtype=torch.float64)
    s = cfg.algorithm_settings
    p = dict(beta=BETA, k=K, baseline=PAST_BASELINE, eps=getattr(s, "clip_eps", 0.2), norm_length=cfg.max_new_tokens)
    p["gae_lambda"] = getattr(s, "gae_lambda", 1.0)
    loss = LOSSES[method](rows, scores, p)
    params = [(n, q) for n, q in models.policy.named_parameters() if q.requires_grad]
    grads = torch.autograd.grad(loss, [q for _, q in params])
    models.policy.train()
    return dict(zip([n for n, _ in params], grads, strict=True)), rows, scores


@pytest.mark.parametrize("method,correction,share,lag,extra,arch", CASES)
def test_lagged_gradient_matches_the_per_sequence_reference(
    arch_dirs, tmp_path, method, correction, share, lag, extra, arch
):
    kw = dict(algorithm=method, algorithm_settings=SETTINGS.get(method, {}), is_clip=C, share_prompt=share)
    kw |= dict(max_staleness=lag, is_correction=correction, **extra)
    cfg = _cfg(arch_dirs[arch], tmp_path, **kw)
    models = load_models(cfg, reward_fn=score_fn)
    _moved_from_ref(models.policy)
    models.sampler = _behaviour_sampler(models, cfg, share)
    algo = make_algorithm(cfg, models)
    if method == "reinforce":
        algo.load_state_dict({"baseline": torch.tensor(PAST_BASELINE)})
    opt = GradRecorder(models.policy)
    result = algo.step(models, opt, PROMPTS, cfg, torch.Generator().manual_seed(0))
    expected, rows, scores = reference_gradient(models, result.rollout, cfg, method, correction)
    scale = max(g.abs().max().item() for g in expected.values())
    assert scale > 1e-4  # a gradient to compare (not 0 with 0: rounding alone gives < 1e-8)
    for name, g in expected.items():
        assert_close(opt.grads[name], g, TINY_MODEL_BACKWARD * C, scale=scale, msg=name)
    stats = result.stats
    if correction != "none":  # the weights matter here: the uncorrected update is far outside the tolerance
        plain, _, _ = reference_gradient(models, result.rollout, cfg, method, correction, weighted=False)
        off = max((plain[n] - g).abs().max().item() for n, g in expected.items())
        assert off > 100 * TINY_MODEL_BACKWARD * C * torch.finfo(torch.float32).eps * scale
    assert stats["is/lag"] == 0.0  # this test's sampler is not the lagged one: roll.lag stays 0
    if method == "reinforce":  # eq. 3's update from the behaviour samples' A1 rewards, unweighted
        moved = 0.9 * PAST_BASELINE + 0.1 * current_rewards(rows, scores, BETA).mean()
        assert abs(float(algo.baseline) - float(moved)) < 1e-5 * (1 + abs(float(moved)))
    if correction != "none":  # the batch must exercise both sides of the bound, or the test proves little
        assert 0.0 < stats["is/truncated" if correction.startswith("tis") else "is/masked"] < 1.0, stats
    else:
        assert stats["is/weight_mean"] == 1.0


METHODS = [m for m in LOSSES]


@pytest.mark.parametrize("method", METHODS)
def test_on_policy_path_is_untouched_at_lag_zero(tiny_model_dir, tmp_path, monkeypatch, method):
    """max_staleness=0 without is_correction never reaches a method's off-policy code."""
    import rloo.algorithms.offpolicy as off
    import rloo.algorithms.ppo as ppo_mod
    import rloo.algorithms.raft as raft_mod
    import rloo.algorithms.reinforce as reinforce_mod

    def fail(*a, **kw):
        pytest.fail("off-policy path at lag 0")

    for mod, names in [
        (off, ["proximal_logprobs", "token_weights", "importance_weights"]),
        (ppo_mod, ["token_weights"]),
        (raft_mod, ["as_sampled_stats"]),
        (reinforce_mod, ["current_rewards", "weighted_loss", "update_logprobs"]),
    ]:
        for name in names:
            monkeypatch.setattr(mod, name, fail)
    cfg = _cfg(tiny_model_dir, tmp_path, algorithm=method, algorithm_settings=SETTINGS.get(method, {}))
    assert cfg.off_policy_correction is None
    models = load_models(cfg, reward_fn=score_fn)
    algo = make_algorithm(cfg, models)
    stats = algo.step(models, GradRecorder(models.policy), PROMPTS, cfg, torch.Generator().manual_seed(0)).stats
    assert not any(k.startswith("is/") for k in stats)
