"""One gradient in every configuration (issue 11, point 3).

A plain reference implementation of RLOO, written here and sharing nothing with rloo but the
model: one sequence at a time, no padding, no KV cache, no chunking, no buckets:
    eq. 1  R_i = r(x, y_i) - beta * (log pi(y_i|x) - log pi_ref(y_i|x))      (no gradient)
    eq. 4  A_i = R_i - 1/(k-1) * sum_{j != i} R_j                              (within a group)
    eq. 5  loss = -1/N * sum_i A_i * log pi(y_i|x)
`rloo_step`'s parameter gradient (models loaded by `rloo.training.rl.load_models`, as
`rloo.train` does) must equal this one under every combination that changes the computation
path: share_prompt x gradient_checkpointing x LoRA x chunked LM head x length buckets x
padded/unpadded prompts x dropout in the model's config x architecture x tied/untied head x
grouped attention (one copy of a prompt's keys/values for its k rows, in sampling and the shared
passes; rloo.modeling.kvcache: on for long prompts only, forced on here for the tiny models) x the
decode steps' swapped linear products (rloo.modeling.few_rows: on by default only on AVX2-only CPUs
with two threads, forced on or off here on every machine) x gradient accumulation (rl.micro_batch_size=1:
each prompt's group of k is its own forward and backward, weighted by its share of the batch; the
reference is still one sum over the whole batch, so a per-micro-batch normaliser fails by 3x).
REINFORCE with its moving-average baseline takes the same update pass; its first step (baseline:
the batch's mean reward, eq. 3 with no past) is checked the same way.
The ratio-based methods (ppo, grpo, rloo_clip; one epoch: their first minibatch is on-policy) must
show log-ratio 0 (ratio 1) and clip fraction 0 on their first minibatch under the same combinations
x minibatches per epoch (1: grpo's and rloo_clip's one minibatch is whole groups, the grouped shared
pass; 2: half the rows at random, whose distinct prompts the shared pass computes once each,
`rloo.modeling.logprob_pass.rows_prompts`; with share_prompt it must run; ppo's policy-and-value
forward is its own).

The default suite runs a pairwise covering of the factors (every pair of values of any two
factors appears in some row); the full product is `-m study` (43 minutes on 2 cores; not in `make test-all`):
    RLOO_MATRIX_JSON=docs/results/gradient-matrix/gradient_matrix.json \
        python -m pytest tests/equivalence/test_gradient_matrix.py -m study
writes the measured errors to docs/results/gradient-matrix/gradient_matrix.<arch>.json (docs/gradient-matrix.md's table
is generated from them by benchmarks/gradient_matrix_table.py).
"""

from __future__ import annotations

import itertools
import json
import os
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import pytest
import torch

from helpers.grads import GradRecorder
from helpers.tiny_archs import ARCHS, save_tiny_lm
from rloo.algorithms import make_algorithm
from rloo.config import METHOD_SPECS, AlgorithmSettings, LoraSettings, RLConfig
from rloo.training.rl import load_models

# ---------------------------------------------------------------------------------------------
# Tolerances: the ONE place. eps = float32 machine epsilon (2^-23 = 1.19e-7).
# Rounding error of a float32 reduction of length n is about sqrt(n)*eps relative to the sum of
# the absolute terms (Higham, probabilistic bound; n*eps worst case). The longest reductions
# here are over the vocabulary (42) and the MLP width (64): sqrt(n) <= 8. A gradient entry
# passes through about 2*(4*L + 2) = 20 such reductions for L = 2 layers (attention scores,
# attention output, two MLP matmuls per layer, the head and the log-softmax; forward and
# backward), so rloo's and the reference's orderings (padding, cache, chunks, buckets, sums over
# rows) may differ by about 20 * 8 * eps = 160 eps relative to the gradient's scale. The scale
# is the largest |entry| of the reference gradient; entries are sums of N*T terms of both signs,
# so a factor 2^3 covers the terms being larger than their sum: GRAD_REL = 2^10 eps = 1.2e-4.
# Log-probs: one log-softmax over 42 logits after the same ~10 forward reductions: about
# 10 * 8 eps relative to the logits' scale (|log p| + 1, a few units here), times 2 for the
# two passes compared (sampling decode vs training pass): LOGRATIO_ABS(scale) = 2^8 eps * scale.
# (Measured errors are listed in docs/gradient-matrix.md: all far below these bounds; the
# mutations they must catch give errors of 1e-2 to 1, see the same page.)
EPS = torch.finfo(torch.float32).eps
GRAD_REL = 2**10 * EPS


def logratio_abs(logprob_scale: float) -> float:
    return 2**8 * EPS * (1.0 + logprob_scale)


# ---------------------------------------------------------------------------------------------

K, BETA, T_MAX = 4, 0.1, 8  # 12 rows of up to 8 tokens: mixed completion lengths with these models
PADDED = ["post : job rent tl;dr :", "post : exam tl;dr :", "post : loan sister car mom tl;dr :"]
UNPADDED = ["post : job rent tl;dr :", "post : exam car tl;dr :", "post : loan sister tl;dr :"]
RATIO_METHODS = ("ppo", "grpo", "rloo_clip")
PG_METHODS = ("rloo", "reinforce")  # one update over every row: rloo's update pass (`update_logprobs`)


def reward_fn(prompts, completions):
    """Deterministic, depends on the tokens: what the reference recomputes from the same texts."""
    return [
        len(c.split()) / 4 - 0.5 * c.count(":") + 0.1 * len(p.split())
        for p, c in zip(prompts, completions, strict=False)
    ]


@dataclass(frozen=True)
class Combo:
    share: bool
    checkpointing: bool
    lora: bool
    chunked: bool
    buckets: str  # "dp": rloo's bucketing; "one": a single padded pass (bucket_overhead huge)
    padded: bool
    dropout: bool  # 0.1 in every dropout key of the model's config (and LoRA's)
    arch: str
    tied: bool
    grouped: bool = False  # GROUPED_MIN_ELEMENTS = 0: grouped attention wherever it can run
    few_rows: bool = False  # the sampler's decode linears as (W x^T)^T (few_rows_pays forced either way)
    micro: bool = False  # rl.micro_batch_size=1: the update accumulated over one micro-batch per prompt
    minibatches: int = 1  # the ratio methods' num_minibatches (2: minibatches of random rows)

    def id(self) -> str:
        return "-".join(f"{f.name}={getattr(self, f.name)}" for f in fields(self))


FACTORS = dict(
    share=(True, False),
    checkpointing=(False, True),
    lora=(False, True),
    chunked=(False, True),
    buckets=("dp", "one"),
    padded=(True, False),
    dropout=(False, True),
    arch=ARCHS,
    tied=(False, True),
    grouped=(False, True),
    few_rows=(False, True),
    micro=(False, True),
    minibatches=(1, 2),
)


def skip_reason(c: Combo) -> str | None:
    """Combinations that would run the same path as another one (not worth a row), with why."""
    if not c.share and c.buckets != "dp":
        return "length buckets exist only in the shared pass"
    if c.grouped and not c.share:
        return "without share_prompt no prompt is shared: grouped attention has nothing to group"
    if c.chunked and (c.lora or c.arch in ("gpt2", "gpt_neox")):
        return "LM head not chunkable (GPT-2/NeoX heads, PEFT wrapper): the same path as chunked off"
    if c.few_rows and (c.checkpointing or c.chunked or c.buckets != "dp" or c.micro or c.minibatches > 1):
        return "the swapped products run in the decode steps only, which these training-pass options do not touch"
    return None


def full_product() -> list[Combo]:
    return [c for c in (Combo(*v) for v in itertools.product(*FACTORS.values())) if skip_reason(c) is None]


def pairwise() -> list[Combo]:
    """A greedy covering array: rows of the full product until every pair of values of two
    factors that occurs in some valid row occurs in a chosen row. Deterministic."""
    rows, names = full_product(), list(FACTORS)

    def pairs(c):
        v = [getattr(c, n) for n in names]
        return {(i, v[i], j, v[j]) for i, j in itertools.combinations(range(len(names)), 2)}

    todo, chosen = set().union(*(pairs(c) for c in rows)), []
    while todo:
        best = max(rows, key=lambda c: len(pairs(c) & todo))
        chosen.append(best)
        todo -= pairs(best)
    return chosen


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("matrix")
    return {
        (a, t, d): save_tiny_lm(root / f"{a}-{t}-{d}", a, tied=t, dropout=0.1 if d else 0.0)
        for a in ARCHS
        for t in (False, True)
        for d in (False, True)
    }


def _config(c: Combo, path: Path, out: Path, algorithm: str = "rloo") -> RLConfig:
    method = "rloo" if algorithm == "rloo_clip" else algorithm
    wanted = dict(ppo_epochs=1, num_minibatches=c.minibatches, value_model="head", rloo_clip=algorithm == "rloo_clip")
    own = METHOD_SPECS[method].settings.model_fields  # a method refuses another method's settings
    algo = AlgorithmSettings(**{k: v for k, v in wanted.items() if k in own})
    return RLConfig(
        policy=str(path),
        output_dir=out,
        k=K,
        beta=BETA,
        max_new_tokens=T_MAX,
        seed=0,
        dtype="float32",
        share_prompt=c.share,
        gradient_checkpointing=c.checkpointing,
        max_grad_norm=1e6,  # the largest allowed (issue 16); a tiny model's gradient norm is far below: no clipping
        max_logits_mb=1e-3 if c.chunked else 256,
        algorithm=method,
        algorithm_settings=algo,
        lora=LoraSettings(r=4, alpha=8, dropout=0.1 if c.dropout else 0.0) if c.lora else None,
        micro_batch_size=1 if c.micro else None,
    )


def _sequence_logprob(model, x: torch.Tensor, y: torch.Tensor, temperature: float) -> torch.Tensor:
    """log pi(y|x) of one unpadded prompt x (P,) and completion y (T,): one plain forward pass."""
    logits = model(input_ids=torch.cat([x, y])[None], use_cache=False).logits[0].float() / temperature
    pred = logits[len(x) - 1 : len(x) + len(y) - 1]  # position P-1+t predicts y_t
    return pred.log_softmax(-1).gather(-1, y[:, None]).sum()


def reference_gradient(models, roll, cfg: RLConfig, method: str = "rloo") -> dict[str, torch.Tensor]:
    """method: "rloo" (eq. 4's leave-one-out baseline) or "reinforce" (eq. 3's moving average, which on
    the first step, with no past batch, is the batch's own mean reward)."""
    policy = models.policy
    was_training = policy.training
    policy.eval()  # the function that sampled
    seqs = [
        (roll.prompt_ids[i][roll.prompt_mask[i]], roll.completion_ids[i][roll.completion_mask[i]])
        for i in range(len(roll.prompts))
    ]
    scores = torch.tensor(reward_fn(roll.prompts, roll.completions), dtype=torch.float64)
    logp = [_sequence_logprob(policy, x, y, cfg.temperature) for x, y in seqs]
    with torch.no_grad():
        ref = torch.stack([_sequence_logprob(models.ref, x, y, cfg.temperature) for x, y in seqs]).double()
    rewards = scores - cfg.beta * (torch.stack(logp).detach().double() - ref)  # eq. 1
    if method == "rloo":
        groups = rewards.view(-1, cfg.k)
        adv = (groups - (groups.sum(1, keepdim=True) - groups) / (cfg.k - 1)).view(-1)  # eq. 4
    else:
        adv = rewards - rewards.mean()  # eq. 3, first step
    loss = -sum(float(a) * lp for a, lp in zip(adv, logp, strict=False)) / len(logp)  # eq. 5
    params = [(n, p) for n, p in policy.named_parameters() if p.requires_grad]
    grads = torch.autograd.grad(loss, [p for _, p in params], allow_unused=True)
    policy.train(was_training)
    return {n: (g if g is not None else torch.zeros_like(p)) for (n, p), g in zip(params, grads, strict=False)}


# ---- one combination ------------------------------------------------------------------------------


def _bucket_patch(monkeypatch, c: Combo):
    if c.buckets == "one":
        from functools import partial

        import rloo.modeling.logprob_pass as lp_pass  # where policy_logprobs looks the shared pass up

        monkeypatch.setattr(
            lp_pass, "completion_logprobs_shared", partial(lp_pass.completion_logprobs_shared, bucket_overhead=10**9)
        )


def run_pg(c: Combo, path: Path, out: Path, method: str = "rloo") -> dict:
    """The first step's gradient (rloo or reinforce) vs the reference's: max |difference| / max |reference entry|."""
    cfg = _config(c, path, out, method)
    models = load_models(cfg, reward_fn=reward_fn)
    opt = GradRecorder(models.policy)
    algo = make_algorithm(cfg, models)
    roll = algo.step(models, opt, PADDED if c.padded else UNPADDED, cfg, torch.Generator().manual_seed(0)).rollout
    ref = reference_gradient(models, roll, cfg, method)
    assert opt.grads is not None and opt.grads.keys() == {n for n, g in ref.items() if n in opt.grads}
    scale = max(g.abs().max().item() for g in ref.values())
    err = max((opt.grads[n] - ref[n]).abs().max().item() for n in opt.grads)
    lengths = roll.completion_mask.sum(-1)
    return {"grad_err_rel": err / scale, "grad_scale": scale, "distinct_lengths": len(set(lengths.tolist()))}


def run_ratio(c: Combo, path: Path, out: Path, method: str, monkeypatch) -> dict:
    """The first minibatch's max |log ratio| and clip fraction (one epoch of c.minibatches), and
    how many of the step's passes were shared passes over random rows."""
    import rloo.algorithms.ppo as ppo
    import rloo.core.estimators as estimators
    import rloo.core.losses as losses
    import rloo.modeling.logprob_pass as lp_pass

    seen = []
    original = losses.ppo_clip_loss

    def recording(logprobs, old_logprobs, advantages, mask=None, clip_eps=0.2):
        loss, stats = original(logprobs, old_logprobs, advantages, mask, clip_eps)
        d = (logprobs - old_logprobs).detach()
        d = d[mask] if mask is not None else d
        seen.append((d.abs().max().item(), old_logprobs.detach().abs().max().item(), float(stats["ppo/clipfrac"])))
        return loss, stats

    for mod in (losses, ppo, estimators):
        monkeypatch.setattr(mod, "ppo_clip_loss", recording)
    random_rows, shared_pass = [], lp_pass.completion_logprobs_shared  # (the buckets' patch, if any)

    def counted(*args, **kwargs):
        random_rows.append(kwargs.get("prompt_of") is not None)
        return shared_pass(*args, **kwargs)

    monkeypatch.setattr(lp_pass, "completion_logprobs_shared", counted)
    cfg = _config(c, path, out, method)
    models = load_models(cfg, reward_fn=reward_fn)
    opt = torch.optim.SGD(models.policy.parameters(), lr=0.0)
    make_algorithm(cfg, models).step(
        models, opt, PADDED if c.padded else UNPADDED, cfg, torch.Generator().manual_seed(0)
    )
    logratio, scale, clipfrac = seen[0]
    return {
        "logratio_max": logratio,
        "logratio_tol": logratio_abs(scale),
        "clipfrac": clipfrac,
        "random_rows_shared": sum(random_rows),
    }


def _grouped_patch(monkeypatch, c: Combo) -> list:
    """With c.grouped: grouped attention wherever it can run; returns the list its calls are counted in."""
    import rloo.modeling.attention as attention
    import rloo.modeling.kvcache as kvcache

    calls = []
    if c.grouped:
        monkeypatch.setattr(kvcache, "GROUPED_MIN_ELEMENTS", 0)
        original = attention.grouped_attention

        def counted(*args, **kwargs):
            calls.append(args[0].requires_grad or torch.is_grad_enabled())
            return original(*args, **kwargs)

        monkeypatch.setattr(attention, "grouped_attention", counted)
    return calls


def _few_rows_patch(monkeypatch, c: Combo) -> list:
    """The sampler's swapped decode products forced on (c.few_rows) or off, whatever the machine;
    returns the list their calls are counted in."""
    import rloo.modeling.few_rows as few_rows
    import rloo.rollout.sampler as sampler

    calls = []
    monkeypatch.setattr(sampler, "few_rows_pays", lambda device: c.few_rows)
    original = few_rows.swapped_linear
    monkeypatch.setattr(few_rows, "swapped_linear", lambda *a: calls.append(1) or original(*a))
    return calls


def _micro_patch(monkeypatch) -> list:
    """Counts the micro-batch backward passes (rloo.algorithms.base.Accumulated) the update runs."""
    from rloo.algorithms.base import Accumulated

    calls, original = [], Accumulated.__call__
    monkeypatch.setattr(Accumulated, "__call__", lambda self: calls.append(len(self.parts)) or original(self))
    return calls


def check_combo(c: Combo, dirs, tmp: Path, monkeypatch, methods=RATIO_METHODS) -> dict:
    path = dirs[(c.arch, c.tied, c.dropout)]
    with monkeypatch.context() as m:
        _bucket_patch(m, c)
        calls = _grouped_patch(m, c)
        swapped = _few_rows_patch(m, c)
        micro = _micro_patch(m)
        row = {"combo": asdict(c)} | {m: run_pg(c, path, tmp / m, m) for m in PG_METHODS}
    for m in PG_METHODS:
        assert row[m]["grad_err_rel"] <= GRAD_REL, (m, c.id(), row)
    assert micro == ([len(PADDED)] * len(PG_METHODS) if c.micro else []), (c.id(), f"micro-batch passes {micro}")
    if c.grouped:  # it ran, in sampling and (with grad) in the policy's gradient pass
        assert calls and any(calls), (c.id(), "grouped attention did not run where forced")
    assert bool(swapped) == c.few_rows, (c.id(), f"swapped decode products ran {len(swapped)} times")
    if c.share and c.buckets == "dp":
        assert row["rloo"]["distinct_lengths"] >= 2, "completions of one length: buckets would not be exercised"
    for method in methods:
        with monkeypatch.context() as m:
            _bucket_patch(m, c)
            _grouped_patch(m, c)
            _few_rows_patch(m, c)
            row[method] = r = run_ratio(c, path, tmp / method, method, m)
        assert r["clipfrac"] == 0.0, (method, c.id(), r)
        assert r["logratio_max"] <= r["logratio_tol"], (method, c.id(), r)
        # random rows (2 minibatches of 6 of 3 prompts' 12 rows: some share a prompt) take the shared
        # pass wherever the run shares prompts, never without share_prompt; one minibatch is whole
        # groups, and so are its micro-batches (rloo.core.accumulation.micro_batches sorts the rows)
        random = c.share and c.minibatches > 1 and method != "ppo"
        assert bool(r["random_rows_shared"]) == random, (method, c.id(), r)
    return row


@pytest.mark.parametrize("i,combo", list(enumerate(pairwise())), ids=[c.id() for c in pairwise()])
def test_pairwise_combination_matches_reference(i, combo, model_dirs, tmp_path, monkeypatch):
    # the default suite runs one ratio method per row, in turn (each on 4-5 rows), the slow test all three
    row = check_combo(combo, model_dirs, tmp_path, monkeypatch, (RATIO_METHODS[i % 3],))
    if os.environ.get("RLOO_MATRIX_JSON"):  # the measured errors, one line per row
        with Path(os.environ["RLOO_MATRIX_JSON"]).with_suffix(".pairwise.jsonl").open("a") as f:
            f.write(json.dumps(row | {"grad_rel_tol": GRAD_REL}) + "\n")


def test_pairwise_design_covers_every_pair():
    rows, names = pairwise(), list(FACTORS)
    full = full_product()
    for a, b in itertools.combinations(names, 2):
        want = {(getattr(c, a), getattr(c, b)) for c in full}
        assert want == {(getattr(c, a), getattr(c, b)) for c in rows}, (a, b)
    assert len(rows) < len(full) / 10


@pytest.mark.slow
@pytest.mark.study
@pytest.mark.parametrize("arch", ARCHS)
def test_full_matrix_matches_reference(arch, model_dirs, tmp_path, monkeypatch):
    """The full product, one architecture per test (688-1008 combinations, 9-12 minutes on 2 cores,
    each with an rloo, a reinforce and three ratio-method steps); RLOO_MATRIX_JSON=path.json writes
    each architecture's measured errors to path.<arch>.json."""
    rows, failures = [], []
    for i, c in enumerate(c for c in full_product() if c.arch == arch):
        try:
            rows.append(check_combo(c, model_dirs, tmp_path / str(i), monkeypatch, RATIO_METHODS))
        except AssertionError as e:
            failures.append(f"{c.id()}: {e}")
    if os.environ.get("RLOO_MATRIX_JSON"):
        out = Path(os.environ["RLOO_MATRIX_JSON"])
        out.with_suffix(f".{arch}.json").write_text(
            json.dumps({"grad_rel_tol": GRAD_REL, "rows": rows, "failures": failures}, indent=1)
        )
    assert not failures, "\n".join(failures[:20])
