"""rloo: fine-tune language models from feedback with REINFORCE Leave-One-Out.

from rloo import RLConfig, train
train(RLConfig(policy="my-sft-model", output_dir="runs/mine"), prompts=prompts, reward_fn=my_reward)
train(RLConfig(output_dir="runs/mine"), model=model, tokenizer=tok, dataset=ds, reward_fn=my_reward)
"""

import importlib
import os

from rloo.runtime.threadpolicy import spin_default

# MKL's conditional numerical reproducibility: without it MKL's threaded sgemm takes other code paths
# for operands at other addresses (measured: the same nn.Linear products differ in the last bits with
# 2 threads when a weight moves by 8 bytes), and addresses differ between processes, so two identical
# runs did not repeat. MKL reads this at its first call, so it is set before rloo touches torch;
# a value of your own is kept (docs/reliability.md, "Every CPU kind").
os.environ.setdefault("MKL_CBWR", "AUTO")
# A short OpenMP spin before an idle thread sleeps: libgomp's default spin made two threads 3.6x slower
# than one on a busy machine (rloo.runtime.threadpolicy). libgomp reads it once, when torch loads it,
# so it is set here, before rloo imports torch; the user's GOMP_SPINCOUNT or OMP_WAIT_POLICY is kept.
os.environ.update(spin_default(os.environ))

from rloo.config import EvalConfig, PipelineConfig, RewardConfig, RLConfig, SFTConfig, load_config
from rloo.errors import ConfigError, RewardError, RlooError

__version__ = "0.1.0"


def __getattr__(name):
    # Recipes import torch and transformers; load them on first use so `import rloo` and the
    # CLI's --help stay fast.
    lazy = {
        "sft": ("rloo.training.api", "sft"),  # the stages, plus model=, tokenizer=, dataset=, callbacks=
        "train_reward": ("rloo.training.api", "train_reward"),
        "train": ("rloo.training.api", "train"),
        "evaluate": ("rloo.training.evaluate", "evaluate"),
        "pipeline": ("rloo.training.pipeline", "pipeline"),
        "get_task": ("rloo.tasks", "get_task"),
    }
    if name in lazy:
        mod, attr = lazy[name]
        # getattr: the lazy export's table names the attribute: a module __getattr__
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
