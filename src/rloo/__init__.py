"""rloo: fine-tune language models from feedback with REINFORCE Leave-One-Out.

from rloo import RLConfig, train
train(RLConfig(policy="my-sft-model", output_dir="runs/mine"), prompts=prompts, reward_fn=my_reward)
"""

import importlib

from rloo.config import EvalConfig, PipelineConfig, RewardConfig, RLConfig, SFTConfig, load_config
from rloo.errors import ConfigError, RewardError, RlooError

__version__ = "0.1.0"


def __getattr__(name):
    # Recipes import torch and transformers; load them on first use so `import rloo` and the
    # CLI's --help stay fast.
    lazy = {
        "sft": ("rloo.training.sft", "sft"),
        "train_reward": ("rloo.training.reward", "train_reward"),
        "train": ("rloo.training.rl", "train"),
        "evaluate": ("rloo.training.evaluate", "evaluate"),
        "pipeline": ("rloo.training.pipeline", "pipeline"),
        "get_task": ("rloo.tasks", "get_task"),
    }
    if name in lazy:
        mod, attr = lazy[name]
        return getattr(importlib.import_module(mod), attr)
    raise AttributeError(f"module 'rloo' has no attribute {name!r}")


__all__ = [
    "SFTConfig",
    "RewardConfig",
    "RLConfig",
    "EvalConfig",
    "PipelineConfig",
    "load_config",
    "RlooError",
    "ConfigError",
    "RewardError",
    "sft",
    "train_reward",
    "train",
    "evaluate",
    "pipeline",
    "get_task",
]
