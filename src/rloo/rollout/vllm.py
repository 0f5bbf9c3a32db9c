"""vLLM as the rollout backend (optional, one GPU, `generation=vllm`, `pip install 'rloo[vllm]'`).

The engine is colocated with training on the same GPU (it takes `gpu_memory_utilization` of its
memory) and its weights are replaced by the policy's after every update (`sync`), so samples stay
on-policy. vLLM only samples: the log-probs of the sampled tokens are recomputed by one forward
pass of the policy, so they are exactly the quantity the loss and the KL use (vLLM's own
log-probs may be of the unscaled distribution, depending on its version and settings).
Untested here (no GPU on the development machine); its tests skip without a GPU and vLLM.
"""

from __future__ import annotations

import os

import torch

from rloo.data.collate import encode_prompts
from rloo.errors import RlooError
from rloo.modeling.forward import completion_logprobs
from rloo.rollout.sampler import Rollout


def _require_vllm():
    if not torch.cuda.is_available():
        raise RlooError("generation=vllm needs a CUDA GPU; use generation=sampler on this machine")
    # in-process engine: weights can then be loaded into the model object directly
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    try:
        import vllm
    except ImportError as e:
        raise RlooError("generation=vllm needs vLLM: pip install 'rloo[vllm]'") from e
    return vllm


class VLLMSampler:
    """Rollouts with the layout of `rollout()`: rows grouped by prompt, left-padded prompts,
    right-padded completions ending at the first EOS. `dtype`: what the engine computes in, the
    trainer's compute dtype (`vllm_dtype`), not vLLM's "auto" (the checkpoint's own)."""

    def __init__(
        self,
        model_path: str,
        tokenizer,
        *,
        k: int,
        max_prompt_len: int,
        max_new_tokens: int,
        temperature: float,
        top_p: float,
        seed: int,
        gpu_memory_utilization: float,
        dtype: str = "bfloat16",
        top_k: int = 0,
        min_new_tokens: int = 0,
        repetition_penalty: float = 1.0,
        stop: tuple[str, ...] = (),
    ):
        vllm = _require_vllm()
        self.tokenizer, self.k, self.max_prompt_len = tokenizer, k, max_prompt_len
        self.llm = vllm.LLM(
            model=model_path,
            tokenizer=model_path,
            seed=seed,
            dtype=dtype,
            gpu_memory_utilization=gpu_memory_utilization,
            max_model_len=max_prompt_len + max_new_tokens,
        )
        kw = sampling_params(
            k,
            temperature,
            top_p,
            max_new_tokens,
            tokenizer.eos_token_id,
            top_k=top_k,
            min_new_tokens=min_new_tokens,
            repetition_penalty=repetition_penalty,
            stop=stop,
        )
        self.params = vllm.SamplingParams(**kw)

    @torch.no_grad()
    def sync(self, policy) -> None:
        """Load the policy's current weights into the engine (names are Hugging Face names)."""
        weights = [(n, p.detach()) for n, p in policy.state_dict().items()]
        if hasattr(self.llm, "apply_model"):
            self.llm.apply_model(lambda model: model.load_weights(weights))
        else:  # older vLLM: reach the model through the in-process driver worker
            self.llm.llm_engine.model_executor.driver_worker.model_runner.model.load_weights(weights)
        if hasattr(self.llm, "reset_prefix_cache"):
            self.llm.reset_prefix_cache()  # cached KV of the old weights must not be reused

    @torch.no_grad()
    def __call__(self, policy, prompts: list[str], rows=None) -> Rollout:  # rows: one process, all of them
        from vllm.inputs import TokensPrompt

        device = next(policy.parameters()).device
        enc, n_trunc = encode_prompts(self.tokenizer, prompts, self.max_prompt_len)
        inputs = [TokensPrompt(prompt_token_ids=row[m].tolist()) for row, m in zip(enc.ids, enc.mask, strict=False)]
        outs = self.llm.generate(inputs, self.params, use_tqdm=False)
        pad = self.tokenizer.pad_token_id
        c_ids, c_mask, ended = completion_tensors(outs, pad)
        p_ids = enc.ids.repeat_interleave(self.k, 0).to(device)
        p_mask = enc.mask.repeat_interleave(self.k, 0).to(device)
        c_ids, c_mask = c_ids.to(device), c_mask.to(device)
        lps = completion_logprobs(
            policy, p_ids, p_mask, c_ids, c_mask, temperature=self.params.temperature
        ).masked_fill(~c_mask, 0.0)
        texts = self.tokenizer.batch_decode(c_ids.masked_fill(~c_mask, pad).tolist(), skip_special_tokens=True)
        return Rollout(
            prompts=[p for p in prompts for _ in range(self.k)],
            completions=[t.strip() for t in texts],
            prompt_ids=p_ids,
            prompt_mask=p_mask,
            completion_ids=c_ids,
            completion_mask=c_mask,
            logprobs=lps,
            truncated=~ended.to(device),
            prompts_truncated=n_trunc,
            group_size=self.k,  # rows come in runs of k per prompt: prompt sharing and group metrics use it
            raw_completions=texts,
        )


def sampling_params(
    n: int,
    temperature: float,
    top_p: float,
    max_new_tokens: int,
    eos_id: int,
    *,
    top_k: int = 0,
    min_new_tokens: int = 0,
    repetition_penalty: float = 1.0,
    stop: tuple[str, ...] = (),
) -> dict:
    """vLLM's SamplingParams keywords for rloo's settings (rloo.rollout.decoding): the same names where
    vLLM has them; top_k 0 (all) is vLLM's -1, min_new_tokens its min_tokens (which, as rloo's sampler,
    also holds back stop strings). A stop string stays in the completion as in rloo's sampler; the
    rows are the ids vLLM returned, decoded again (`completion_tensors`). Defaults give the keywords
    of before these settings existed."""
    params = dict(
        n=n, temperature=temperature, top_p=top_p, max_tokens=max_new_tokens, stop_token_ids=[eos_id], seed=None
    )
    if top_k > 0:
        params["top_k"] = top_k
    if min_new_tokens > 0:
        params["min_tokens"] = min_new_tokens
    if repetition_penalty != 1.0:
        params["repetition_penalty"] = repetition_penalty
    if stop:
        params |= dict(stop=list(stop), include_stop_str_in_output=True)
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
