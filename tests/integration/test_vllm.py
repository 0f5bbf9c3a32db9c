"""vLLM generation backend: a clean one-line error without a GPU; on a GPU with vLLM, its rollouts
have the sampler's layout and log-probs equal to a policy forward pass."""

from __future__ import annotations

import pytest
import torch

from rloo import RLConfig, RlooError
from rloo.training.rl import load_models


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU error")
def test_vllm_without_gpu_is_a_clear_error(tiny_model_dir, tmp_path):
    cfg = RLConfig(policy=str(tiny_model_dir), output_dir=tmp_path, generation="vllm", reward_fn="math:fsum")
    with pytest.raises(RlooError, match="needs a CUDA GPU"):
        load_models(cfg)


def test_vllm_rollout_on_gpu(tiny_model_dir, tmp_path):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    pytest.importorskip("vllm")
    from rloo.modeling.forward import completion_logprobs
    from rloo.modeling.loading import load_policy
    from rloo.rollout.vllm import VLLMSampler
    policy, tok = load_policy(str(tiny_model_dir), device="cuda")
    s = VLLMSampler(str(tiny_model_dir), tok, k=2, max_prompt_len=16, max_new_tokens=6, temperature=1.0, top_p=1.0,
                    seed=0, gpu_memory_utilization=0.2, dtype="float32")
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(0.01)
    s.sync(policy)
    roll = s(policy, ["post : job rent tl;dr :", "post : exam car tl;dr :"])
    assert roll.completion_ids.shape[0] == 4 and roll.prompts[0] == roll.prompts[1]
    lp = completion_logprobs(policy, roll.prompt_ids, roll.prompt_mask, roll.completion_ids, roll.completion_mask)
    torch.testing.assert_close(roll.logprobs, lp.masked_fill(~roll.completion_mask, 0.0))
