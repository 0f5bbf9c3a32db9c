"""Sampling a batch with the weights of one version, for the samplers that lag the trainer
(rl.max_staleness = N > 0: the producer process, rloo.rollout.producer, and its in-process stand-in,
rloo.rollout.lagged): rloo's own sampler on the model that holds the version, or with
`generation=vllm` a vLLM engine (rloo.rollout.vllm) started in the sampling process from that model.

The engine gets each version's weights once, when a batch first needs it (`VLLMSampler.sync`, which
also drops the prefixes it cached with the older weights); the batches of one version reuse them.
Its rollouts carry vLLM's own log-probs as `logprobs`: the behaviour policy mu of the update's one
importance weight pi / mu is the lagged engine, so the weight corrects the lag and the engines'
arithmetic together (docs/async.md). Its `vllm/*` metrics compare mu with the lagged policy's
recomputed log-probs: the engines' mismatch alone, without the lag.

Either samples in the trainer's precision (rloo.rollout.settings.sampling_precision): inside the RL
stage's autocast in the trainer's process, inside the one the producer enters
(rloo.rollout.producer.produce) elsewhere; the engine computes in it too (`precision`, handed on).
"""

from __future__ import annotations

import torch

from rloo.config import RLConfig
from rloo.rollout.sampler import Rollout, rollout
from rloo.rollout.vllm import VLLMSampler
from rloo.rollout.vllm_engine import check_device, import_vllm
from rloo.runtime.precision import Precision


class VersionSampler:
    """`(model, version, prompts, generator, rows) -> Rollout`: K samples per prompt drawn with
    `model`, which holds the weights of `version` (the caller loads them from its ring). `precision`:
    the trainer's, for the vLLM engine's dtype (None: `sampling_precision` where the engine starts)."""

    def __init__(self, cfg: RLConfig, tokenizer, precision: Precision | None = None):
        self.cfg, self.tokenizer, self.precision = cfg, tokenizer, precision
        self.engine: VLLMSampler | None = None
        self.synced: int | None = None  # the version the engine holds

    def __call__(self, model: torch.nn.Module, version: int, prompts: list[str], generator, rows=None) -> Rollout:
        cfg = self.cfg
        if cfg.generation != "vllm":
            s, captured = cfg.sampling, cfg.captured_decode
            return rollout(model, self.tokenizer, prompts, cfg.k, s, generator=generator, rows=rows, captured=captured)
        if self.engine is None:  # started here, in the sampling process; it loads `model`'s weights at once
            self.engine = VLLMSampler(cfg, self.tokenizer, model, precision=self.precision)
        elif version != self.synced:
            self.engine.sync(model)
        self.synced = version
        return self.engine(model, prompts, rows=rows, generator=generator)

    def part_metrics(self) -> dict[str, float]:
        """The last batch's sampler/trainer mismatch (vLLM only; rloo.rollout.vllm.mismatch_stats)."""
        return self.engine.part_metrics() if self.engine is not None else {}


def check_lagged_vllm(cfg: RLConfig, device: torch.device) -> None:
    """The trainer's checks of a run whose lagged sampler is vLLM, before its run folder is made:
    vLLM imports here and is built for `device` (one line otherwise). The engine itself starts where
    it samples. With rl.producer_address the producer's machine needs vLLM, not this one."""
    if cfg.generation != "vllm" or not cfg.max_staleness or cfg.producer_address is not None:
        return
    check_device(import_vllm(), device)
