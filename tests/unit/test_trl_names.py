"""A TRL user's key names (RLOOConfig's) are refused with rloo's name for the same thing: one line,
exit 2, nothing written, from the command line, a YAML file and the Python API alike."""

from __future__ import annotations

import pytest
import yaml

from rloo.cli import main
from rloo.config import PipelineConfig, RLConfig, SFTConfig
from rloo.config.base import key_paths
from rloo.config.trl_names import TRL_NAMES
from rloo.errors import ConfigError


def _cli_error(args: list[str], tmp_path, capsys) -> str:
    out = tmp_path / "out"
    rc = main([*args, f"output_dir={out}"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1, err
    assert not out.exists()
    return err


def test_a_renamed_key_names_rloos_key(tmp_path, capsys):
    err = _cli_error(["train", "policy=p", "num_generations=8"], tmp_path, capsys)
    assert "unknown key 'num_generations' for RLConfig (TRL's name; rloo's is k)" in err


def test_a_key_that_counts_differently_says_how(tmp_path, capsys):
    err = _cli_error(["train", "policy=p", "per_device_train_batch_size=8"], tmp_path, capsys)
    assert "(TRL's name; rloo's is batch_size: prompts per step, each sampled k times)" in err
    err = _cli_error(["train", "policy=p", "bf16=true"], tmp_path, capsys)
    assert "(TRL's name; rloo's is dtype: set dtype=bfloat16 (bf16 autocast))" in err


def test_on_the_pipeline_the_key_of_its_section(tmp_path, capsys):
    err = _cli_error(["pipeline", "rl.num_generations=4", "max_completion_length=9"], tmp_path, capsys)
    assert "unknown key 'rl.num_generations' for PipelineConfig (TRL's name; rloo's is rl.k)" in err
    assert "unknown key 'max_completion_length' for PipelineConfig (TRL's name; rloo's is rl.max_new_tokens)" in err


def test_a_key_of_several_sections_names_each(tmp_path, capsys):
    err = _cli_error(["pipeline", "learning_rate=1e-6"], tmp_path, capsys)
    assert "(TRL's name; rloo's is sft.lr or reward.lr or rl.lr)" in err


def test_a_yaml_file_and_the_api_say_the_same(tmp_path, capsys):
    (tmp_path / "trl.yaml").write_text(yaml.safe_dump({"policy": "p", "rloo_k": 4, "learning_rate": 1e-6}))
    err = _cli_error(["train", "--config", str(tmp_path / "trl.yaml")], tmp_path, capsys)
    assert "'rloo_k' for RLConfig (TRL's name; rloo's is k)" in err
    assert "'learning_rate' for RLConfig (TRL's name; rloo's is lr)" in err
    with pytest.raises(
        ConfigError, match=r"'max_prompt_length' for RLConfig \(TRL's name; rloo's is max_prompt_tokens\)"
    ):
        RLConfig(policy="p", max_prompt_length=64)  # type: ignore[call-arg]


def test_without_rloos_key_in_that_config_no_trl_hint():
    with pytest.raises(ConfigError) as e:
        SFTConfig(sft_model="m", num_generations=4)  # type: ignore[call-arg]
    assert "unknown key 'num_generations' for SFTConfig" in str(e.value) and "TRL" not in str(e.value)


def test_every_rloo_key_named_exists():
    paths = set(key_paths(RLConfig)) | set(key_paths(PipelineConfig))
    assert {target for target, _ in TRL_NAMES.values()} <= paths
