"""KV-cached sampling that returns the sampled tokens' log-probabilities.

The log-probabilities come out of generation, so no second forward pass recomputes them for
the KL term (they are log pi_theta of the policy that sampled, eq. 1).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from rloo.config import Sampling
from rloo.data.collate import encode_prompts, position_ids
from rloo.modeling.attention import uses_rloo_attention
from rloo.modeling.few_rows import few_rows_linears, few_rows_pays
from rloo.modeling.kvcache import (
    Prefill,
    expanded,
    grouped_cache,
    grouped_pays,
    has_dropout,
    preallocate,
    prefill_prompts,
)
from rloo.modeling.kvcache import cache_kwarg as _cache_kwarg
from rloo.modeling.layer_checkpoint import cache_keeping_checkpointing
from rloo.rollout.captured import CaptureFailed, captured_sample, decodes_captured, fall_back
from rloo.rollout.captured_step import StepSettings
from rloo.rollout.decode_steps import Decoder, Draw, Ends, decode, row_noise
from rloo.rollout.decoding import StopStrings, shaping
from rloo.rollout.draw import _inverse_cdf, _next_token, uniforms  # noqa: F401 (re-exported: tests, multiturn)


@dataclass
class Rollout:
    """N = B*K completions; rows k*i .. k*i+K-1 belong to prompt i."""

    prompts: list[str]  # (N,) prompt text of each row
    completions: list[str]  # (N,) decoded completion text (special tokens dropped), stripped
    prompt_ids: Tensor  # (N, P) left-padded
    prompt_mask: Tensor  # (N, P) bool
    completion_ids: Tensor  # (N, T) right-padded
    completion_mask: Tensor  # (N, T) bool, True up to and including the first EOS (or stop-string end)
    logprobs: Tensor  # (N, T) log pi(y_t|...) at sampling time, 0 where mask is False
    truncated: Tensor  # (N,) bool, hit max_new_tokens without EOS or a stop string
    prompts_truncated: int = 0  # prompts cut to fit the prompt-length limit
    group_size: int = 1  # K: rows come in runs of K sharing one prompt
    lag: int = 0  # updates the trainer made since the weights that sampled (rl.max_staleness)
    prefill: Prefill | None = None  # the policy's graph-carrying prompt pass, when kept for the update
    # (N,) decoded text before stripping: what a reward model on another tokenizer reads, in the
    # layout it was trained on (datasets give responses as " text"); None: same as `completions`
    raw_completions: list[str] | None = None
    # (N, T) the sampling engine's own log-probs of the sampled tokens, when it is not the policy
    # (generation=vllm: mu, beside `logprobs`' recomputed pi unless rl.is_correction makes mu the behaviour)
    sampler_logprobs: Tensor | None = None
    # (N,) values a training step recorded per completion (score, kl, advantage), for sample tables
    per_sample: dict[str, Tensor] = field(default_factory=dict)

    def record(self, **values: Tensor) -> None:
        """Keep detached (N,) copies of per-completion values (shown by
        rloo.runtime.tracking.trackers.sample_rows)."""
        self.per_sample.update({k: v.detach().float().cpu() for k, v in values.items()})


def _decoding_cache(model, pre: Prefill, k: int, max_new_tokens: int, grouped: bool | None):
    """The cache the N = B*k rows decode into, and the extra model inputs it needs: one copy of each
    prompt's keys/values (`grouped_cache`) or k copies (`expanded`), with room for max_new_tokens.
    `grouped` (CPU models on rloo_sdpa only); None: where it pays (`grouped_pays`: long prompts).
    The same attention either way, summed in another order."""
    # rloo_sdpa computes a CPU model's attention in fp32 (rloo.modeling.attention): keep the cache there
    on_rloo_sdpa = pre.ids.device.type == "cpu" and uses_rloo_attention(model)
    dtype = torch.float32 if on_rloo_sdpa else None
    if grouped is None:
        grouped = on_rloo_sdpa and grouped_pays(pre.cache, k)
    elif grouped and not on_rloo_sdpa:
        raise ValueError("grouped decoding needs a CPU model on rloo_sdpa (rloo.modeling.attention)")
    if grouped:
        cache = grouped_cache(pre.cache, k, max_new_tokens, dtype)
        return cache, {"rloo_grouped": cache}
    cache = expanded(pre.cache, k)
    preallocate(cache, max_new_tokens, dtype)
    return cache, {}


def _start(model, prompt_ids, prompt_mask, k: int, max_new_tokens: int, prefill, grouped) -> tuple[Tensor, Decoder]:
    """The prompts' pass (or `prefill`, already run): the first token's (N, V) logits, N = B*k, and
    the decoder of the tokens after it (its cache: `_decoding_cache`)."""
    kw, pos = _cache_kwarg(model), position_ids(prompt_mask)
    pre = prefill if prefill is not None else prefill_prompts(model, prompt_ids, prompt_mask)
    logits = pre.last_logits.detach().float()
    if k > 1:
        logits, pos = logits.repeat_interleave(k, dim=0), pos.repeat_interleave(k, dim=0)
    cache, kw_grouped = _decoding_cache(model, pre, k, max_new_tokens, grouped)
    mask = prompt_mask.long().repeat_interleave(k, dim=0)
    return logits, Decoder(model, {kw: cache, **kw_grouped}, mask, pos[:, -1:] + 1)


@torch.no_grad()
def sample_tokens(
    model,
    prompt_ids: Tensor,
    prompt_mask: Tensor,
    s: Sampling,
    *,
    eos_id: int,
    pad_id: int,
    stops: StopStrings | None = None,
    generator: torch.Generator | None = None,
    k: int = 1,
    prefill: Prefill | None = None,
    rows: tuple[int, int] | None = None,
    all_done=None,
    grouped: bool | None = None,
    few_rows: bool | None = None,
    captured: str = "off",
) -> tuple[Tensor, Tensor, Tensor]:
    """Sample completions as `s` asks. (B,P),(B,P) -> ids (N,T), mask (N,T), logprobs (N,T); N = B*k,
    T <= s.max_new_tokens.

    With k > 1 each prompt is prefilled once and its KV cache repeated k times (rows k*i ..
    k*i+k-1 continue prompt i): the same distribution as k copies of the prompt, at 1/k the
    prefill cost.
    log-probs are of the temperature-scaled distribution of the raw logits, before top-k, top-p,
    min_new_tokens and the repetition penalty (rloo.rollout.decoding): the same quantity the
    training forward pass computes, so the policy gradient and KL agree with each other, but with
    those settings not with the distribution sampled from (`off_policy_note`); s.truncated_logprobs:
    of the top-k/top-p truncated distribution drawn from (rl.logprobs_under=truncated). temperature 0:
    greedy (argmax) decoding, log-probs at temperature 1. A row ends at EOS (forbidden before
    min_new_tokens tokens) or, after min_new_tokens tokens, at the token whose text completes a
    stop string ending past theirs (`stops`: s.stop compiled for the tokenizer with
    after=s.min_new_tokens, vLLM's rule); tokens after its end are padding, masked.
    Stops as soon as every row has ended (`all_done(done)` decides when given, so that
    processes whose forward passes are collectives (FSDP) stop together).
    `rows=(offset, total)`: these rows of a global batch sampled by several processes, each drawing
    the same noise (rloo.rollout.decode_steps.row_noise): tokens independent of the split.
    `grouped`: the k rows of a prompt decode against one copy of its keys/values (`_decoding_cache`).
    `few_rows`: the decode steps' linear layers take the product the other way round
    (rloo.modeling.few_rows); None: where that was measured faster (`few_rows_pays`). The same
    products, summed in another order.
    `captured` (rl.captured_decode: auto/on/off): decode with the captured step where it serves
    (rloo.rollout.captured: one fixed-shape step over a static cache, a CUDA graph on CUDA; its noise
    is `rows`' up-front uniforms, (0, N) without rows), else the eager loop; off (the default here).
    """
    N, T = prompt_ids.shape[0] * k, s.max_new_tokens
    use_few_rows = few_rows_pays(prompt_ids.device) if few_rows is None else few_rows
    noise = None
    if decodes_captured(captured, model, prompt_ids.device, grouped, all_done):
        pre = prefill if prefill is not None else prefill_prompts(model, prompt_ids, prompt_mask)
        noise = row_noise(rows or (0, N), T, N, generator, prompt_ids.device)
        assert noise is not None  # rows given: the (T, N) uniforms
        try:
            with few_rows_linears(model, use_few_rows):
                return captured_sample(model, pre, k, noise, StepSettings(s, eos_id, pad_id), stops, use_few_rows)
        except CaptureFailed as e:  # the eager loop decodes from the same prompt pass and uniforms
            fall_back(captured, str(e))
            prefill = pre
    noise = row_noise(rows, T, N, generator, prompt_ids.device) if noise is None else noise
    logits, dec = _start(model, prompt_ids, prompt_mask, k, T, prefill, grouped)
    shape = shaping(prompt_ids, prompt_mask, k, logits.shape[-1], eos_id, s)
    draw = Draw(s, generator, noise, shape)
    ends = Ends(eos_id, s.min_new_tokens, stops, all_done)
    done = torch.zeros(N, dtype=torch.bool, device=prompt_ids.device)
    with few_rows_linears(model, use_few_rows):
        return decode(logits, dec, draw, ends, done, pad_id, T)


def rollout(
    model,
    tokenizer,
    prompts: list[str],
    k: int,
    s: Sampling,
    *,
    generator: torch.Generator | None = None,
    keep_prefill: bool = False,
    rows: tuple[int, int] | None = None,
    all_done=None,
    captured: str = "off",
) -> Rollout:
    """k completions for each prompt as `s` asks, rows grouped by prompt. s.share_prompt: prefill each
    prompt once and share its KV cache among its k samples (same distribution, less compute).
    keep_prefill (with share_prompt): run that prompt pass with autograd on and return it in the
    Rollout, for the policy-gradient pass to reuse (skipped for models with dropout, whose
    train-mode pass differs). rows/all_done/captured: see `sample_tokens`. A stop string stays in the
    completion: its text is the decoding of the tokens sampled up to the one completing it."""
    device = next(model.parameters()).device
    enc, n_trunc = encode_prompts(tokenizer, prompts, s.max_prompt_tokens)
    p_ids = enc.ids.repeat_interleave(k, dim=0).to(device)
    p_mask = enc.mask.repeat_interleave(k, dim=0).to(device)
    was_training = model.training
    model.eval()
    share = s.share_prompt
    src_ids, src_mask, g = (enc.ids.to(device), enc.mask.to(device), k) if share else (p_ids, p_mask, 1)
    pre, stops = None, StopStrings(tokenizer, s.stop, after=s.min_new_tokens) if s.stop else None
    if share and keep_prefill and not has_dropout(model):
        with torch.enable_grad(), cache_keeping_checkpointing(model):  # checkpointed when the model asks
            pre = prefill_prompts(model, src_ids, src_mask)
    c_ids, c_mask, lps = sample_tokens(
        model,
        src_ids,
        src_mask,
        s,
        eos_id=tokenizer.eos_token_id,
        pad_id=tokenizer.pad_token_id,
        stops=stops,
        generator=generator,
        k=g,
        prefill=pre,
        rows=rows,
        all_done=all_done,
        captured=captured,
    )
    model.train(was_training)
    completions = Completions(c_ids, c_mask, lps, stops)
    return completions.as_rollout(tokenizer, prompts, k, p_ids, p_mask, prompts_truncated=n_trunc, prefill=pre)


@dataclass
class Completions:
    """What `sample` returned: ids (N,T), mask (N,T), log-probs (N,T), and the stop strings it ended rows at."""

    ids: Tensor
    mask: Tensor
    logprobs: Tensor
    stops: StopStrings | None

    def as_rollout(self, tokenizer, prompts, k, p_ids, p_mask, prompts_truncated: int, prefill) -> Rollout:
        """The Rollout of these completions of `prompts` (k each): texts decoded, truncation marked."""
        ended = ((self.ids == tokenizer.eos_token_id) & self.mask).any(-1)
        if self.stops is not None:  # a row's text contains a stop string only if it ended there (`sample`)
            ended = ended | self.stops.hits(self.ids, self.mask)
        pad = tokenizer.pad_token_id
        texts = tokenizer.batch_decode(self.ids.masked_fill(~self.mask, pad).tolist(), skip_special_tokens=True)
        return Rollout(
            prompts=[p for p in prompts for _ in range(k)],
            completions=[t.strip() for t in texts],
            prompt_ids=p_ids,
            prompt_mask=p_mask,
            completion_ids=self.ids,
            completion_mask=self.mask,
            logprobs=self.logprobs,
            truncated=~ended,
            prompts_truncated=prompts_truncated,
            group_size=k,
            prefill=prefill,
            raw_completions=texts,
        )
