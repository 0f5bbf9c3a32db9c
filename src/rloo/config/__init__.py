"""Typed, validated configs: one per stage, composed for the pipeline (see config/sections.py).

The lowest layer of rloo: it imports nothing of rloo but `rloo.errors`, so every other package may
use it. `from rloo.config import RLConfig` is the stable import path; the modules below are how the
definitions are organised.
"""

from rloo.config.dataset import FIELDS, DatasetSettings, LoraSettings
from rloo.config.sections import (ALGORITHMS, COMPARE_METHODS, GROUP_ALGORITHMS, TASK_NAMES, AlgoSettings,
                                  ArchConfig, BenchConfig, CompareConfig, EvalConfig, EvalSettings, PipelineConfig,
                                  RewardConfig, RewardSettings, RLConfig, RLSettings, SFTConfig, SFTSettings,
                                  describe_fields, describe_validation_error, load_config, parse_overrides,
                                  save_config)

__all__ = ["FIELDS", "DatasetSettings", "LoraSettings", "ALGORITHMS", "COMPARE_METHODS", "GROUP_ALGORITHMS",
           "TASK_NAMES", "AlgoSettings", "ArchConfig", "BenchConfig", "CompareConfig", "EvalConfig", "EvalSettings",
           "PipelineConfig", "RewardConfig", "RewardSettings", "RLConfig", "RLSettings", "SFTConfig", "SFTSettings",
           "describe_fields", "describe_validation_error", "load_config", "parse_overrides", "save_config"]
