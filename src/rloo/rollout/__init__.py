from rloo.rollout.sampler import Rollout, rollout, sample

__all__ = ["Rollout", "rollout", "sample"]
