"""Typed, validated configs: one per stage, composed for the pipeline.

The lowest layer of rloo: it imports nothing of rloo but `rloo.errors`, so every other package may
use it. `from rloo.config import RLConfig` is the stable import path; the modules are
    base.py      Strict, the base of every section (unknown keys and bad values: one-line ConfigError;
                 inf/nan and bool/str -> number are errors), the tracker names of report_to
    confcheck.py reading YAML (duplicate keys, binary files) and the no-coercion check of Strict
    tasks.py     the task table (a TaskSpec per task: its class, checker, environment, pipeline
                 defaults); every list of tasks is derived from it
    methods.py   the method table (a MethodSpec per method: its settings model, groups, comparison
                 variants); every list of methods is derived from it
    method_settings.py  the built-in methods' own settings, and AlgorithmSettings (every built-in key: the
                 `algorithm_settings:` section's type; a run holds its method's own model)
    sections.py  the stage sections: model shape, SFT, reward model, RL (+ methods), evaluation
    supervised.py  the SFT and reward-model sections (+ model shape), imported through sections.py
    memory.py    micro_batch_size (gradient accumulation) and LoRA, shared by the training stages
    dataset.py   the `dataset:` section (your own data)
    generation.py  the generation keys, and Sampling: what a rollout is asked to do, built once from a config
    stages.py    the stage configs: run-wide keys + a section (`rloo sft|reward|train|eval|pipeline`)
    tools.py     `rloo bench` and `rloo compare`
    loading.py   YAML + key=value overrides -> a config; one-line errors; --help-config
"""

from rloo.config.agents import EnvSettings
from rloo.config.base import MAX_BETA, MAX_GRAD_NORM, MAX_LR, TRACKERS, Strict, normalize_report_to
from rloo.config.dataset import FIELDS, DatasetSettings
from rloo.config.generation import Sampling
from rloo.config.loading import (
    describe_fields,
    describe_validation_error,
    load_config,
    parse_overrides,
    save_config,
    upgrade_saved_config,
)
from rloo.config.method_settings import AlgorithmSettings
from rloo.config.methods import DEFAULT_METHOD, METHOD_SPECS, MethodSpec
from rloo.config.producer import ProduceConfig
from rloo.config.sections import (
    ALGORITHMS,
    GROUP_ALGORITHMS,
    OFFLINE_ALGORITHMS,
    ONLINE_ALGORITHMS,
    Algorithm,
    ArchConfig,
    EvalSettings,
    LoraSettings,
    RewardSettings,
    RLSettings,
    SFTSettings,
)
from rloo.config.stages import (
    EvalConfig,
    PipelineConfig,
    PipelineRewardSettings,
    RewardConfig,
    RLConfig,
    SFTConfig,
)
from rloo.config.tasks import DEFAULT_TASK, TASK_SPECS, TaskSpec, add_task
from rloo.config.tools import COMPARE_METHODS, BenchConfig, CompareConfig

__all__ = [
    "ProduceConfig",
    "Sampling",
    "EnvSettings",
    "Strict",
    "MAX_BETA",
    "MAX_GRAD_NORM",
    "MAX_LR",
    "TRACKERS",
    "normalize_report_to",
    "PipelineRewardSettings",
    "FIELDS",
    "DatasetSettings",
    "LoraSettings",
    "ALGORITHMS",
    "DEFAULT_METHOD",
    "METHOD_SPECS",
    "MethodSpec",
    "COMPARE_METHODS",
    "GROUP_ALGORITHMS",
    "OFFLINE_ALGORITHMS",
    "ONLINE_ALGORITHMS",
    "DEFAULT_TASK",
    "TASK_SPECS",
    "TaskSpec",
    "add_task",
    "Algorithm",
    "AlgorithmSettings",
    "ArchConfig",
    "BenchConfig",
    "CompareConfig",
    "EvalConfig",
    "EvalSettings",
    "PipelineConfig",
    "RewardConfig",
    "RewardSettings",
    "RLConfig",
    "RLSettings",
    "SFTConfig",
    "SFTSettings",
    "describe_fields",
    "describe_validation_error",
    "load_config",
    "parse_overrides",
    "save_config",
    "upgrade_saved_config",
]
