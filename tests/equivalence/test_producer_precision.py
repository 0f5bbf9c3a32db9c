"""The rollout producer samples and scores as the in-process lag does (docs/async.md): in the RL
stage's precision, and with the same noise whether or not the step hands the sampler its rows. At
dtype=bfloat16 the stage runs under bf16 autocast, whose context does not cross into the producer's
process, so the producer enters the precision the trainer hands it. Its batches (sampled tokens,
behaviour log-probs mu, scores and reference log-probs) equal the in-process lag's, which samples
inside the stage's autocast, and the trainer's step 2 on them, for the same weights and seed.

Both sides run the same code on the same tensors with the same thread count (the producer's share,
`thread_split`), so the floats are equal, not merely close: bf16 autocast on a CPU without bf16
instructions is emulated, and deterministic, so this holds on every CPU kind and ATen capability."""

from __future__ import annotations

import copy

import pytest
import torch

from rloo.algorithms.base import Scoring
from rloo.config import RLConfig
from rloo.data.prompts import PromptStream
from rloo.rollout.lagged import LaggedSampler
from rloo.rollout.producer import ProducerSampler, ScoredRollout, thread_split
from rloo.runtime.precision import MIN_BF16_WIDTH_SAMPLING, stage_precision
from rloo.training.rl import load_models, producer_scoring

PROMPTS = ["post : job rent tl;dr :", "post : exam tl;dr :", "post : loan sister car mom tl;dr :"]
BATCHES = 3


def _cfg(path, out, dtype: str) -> RLConfig:
    return RLConfig(
        policy=str(path),
        reward_model=str(path),  # a reward model: its scores pass through autocast too, not only pi_ref's
        output_dir=out,
        k=4,
        batch_size=2,
        max_new_tokens=6,
        seed=0,
        max_staleness=1,
        dtype=dtype,
    )


def _move(policy: torch.nn.Module, t: int) -> None:
    """Update t: a distinguishable, seeded change of every weight (the same on both sides)."""
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(10 + t)))


# the RL stage's own wrapper (rloo.training.rl.train): the trainer's sampler is built and called inside it
@stage_precision(min_width=MIN_BF16_WIDTH_SAMPLING)
def _batches(cfg: RLConfig, models, kind: str, step_rows: bool = True) -> list[tuple[torch.Tensor, ...]]:
    """(completion ids, mu, scores, reference log-probs) of BATCHES lagged batches, from the producer
    process (scored there) or the in-process lag (scored by the trainer's step 2). `step_rows`: the
    loop hands the sampler the batch's rows (plain rloo's step), else none (every other method's)."""
    policy, stream = copy.deepcopy(models.policy), PromptStream(PROMPTS, cfg.batch_size, seed=0)
    threads = torch.get_num_threads()
    if kind == "producer":
        sampler = ProducerSampler(
            policy, models.tokenizer, cfg, copy.deepcopy(stream), score=producer_scoring(models, cfg)
        )
    else:
        sampler = LaggedSampler(policy, models.tokenizer, cfg)
        torch.set_num_threads(thread_split(threads)[0])  # the producer's threads: the same arithmetic
    try:
        out = []
        for t in range(BATCHES):
            prompts = stream.next()
            roll = sampler(policy, prompts, rows=(0, len(prompts) * cfg.k) if step_rows else None)
            if kind == "producer":
                assert isinstance(roll, ScoredRollout) and roll.scored is not None
                scores, ref_lp = roll.scored
            else:
                scores, ref_lp = Scoring(models.scorer, models.ref, cfg)(roll)
            out.append((roll.completion_ids, roll.logprobs, scores, ref_lp))
            _move(policy, t)
            sampler.sync(policy)
        return out
    finally:
        getattr(sampler, "close", lambda: None)()
        torch.set_num_threads(threads)


# float32 with rows (the control: no autocast anywhere) in the slow tier; each case starts a producer
# process. Without rows (the loop of a method other than plain rloo) the in-process lag must still draw
# the producer's noise, which the producer always takes from the batch's rows.
@pytest.mark.parametrize(
    ("dtype", "step_rows"),
    [pytest.param("float32", True, marks=pytest.mark.slow), ("bfloat16", True), ("float32", False)],
    ids=["float32", "bfloat16", "float32-no-rows"],
)
def test_the_producer_samples_and_scores_as_the_in_process_lag(tiny_model_dir, tmp_path, dtype, step_rows):
    cfg = _cfg(tiny_model_dir, tmp_path, dtype)
    models = load_models(cfg)
    want = _batches(cfg, models, "in_process", step_rows)
    got = _batches(cfg, models, "producer")
    names = ("tokens", "mu", "scores", "reference log-probs")
    for t, (g, w) in enumerate(zip(got, want, strict=True)):
        for name, a, b in zip(names, g, w, strict=True):
            assert torch.equal(a, b), f"batch {t}: the producer's {name} differ from the in-process lag's"
    if dtype == "bfloat16":  # not vacuous: the stage's bf16 autocast changes mu (fp32 LM head, bf16 body)
        fp32 = _batches(cfg.model_copy(update={"dtype": "float32"}), models, "in_process")
        assert not torch.equal(fp32[0][1], want[0][1])
