from rloo.rollout.sampler import Rollout, rollout, sample_tokens

__all__ = ["Rollout", "rollout", "sample_tokens"]
