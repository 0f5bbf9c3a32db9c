"""The package layout's rules (docs/architecture.md) that no linter checks: file length, imports
inside functions, one algorithm registry, the renamed settings section. The import direction and
the absence of cycles are checked by `lint-imports` (pyproject.toml, `make lint`)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import yaml

from rloo.algorithms import REGISTRY, make_algorithm, supports_distributed
from rloo.config import ALGORITHMS, OFFLINE_ALGORITHMS, ONLINE_ALGORITHMS, CompareConfig, RLConfig, load_config
from rloo.errors import RlooError
from rloo.training.common import prepare_output_dir

SRC = Path(__file__).resolve().parents[2] / "src" / "rloo"
ROOT = SRC.parents[1]

# Imports allowed inside a function: optional dependencies, the CLI's lazy subcommands, the
# public API's lazy attributes, and heavy imports needed only on one path (each has a comment).
LAZY_OK = {
    "cli.py": {
        "rloo.training.sft",
        "rloo.training.reward",
        "rloo.training.rl",
        "rloo.training.evaluate",
        "rloo.training.pipeline",
        "rloo.experiments.bench",
        "rloo.experiments.compare",
        "rloo.data.preflight",
        "rloo.runtime.inputs.user_code",  # --plugin only
        "rloo.rollout.producer",  # rloo produce
    },
    "modeling/lora.py": {"peft"},
    "rollout/vllm_engine.py": {"vllm", "vllm.platforms"},  # optional: import errors become one line
    "training/rl.py": {"rloo.rollout.vllm"},
    "experiments/bench.py": {"trl"},
    "experiments/bench_trl.py": {"trl", "datasets"},
    "data/tables.py": {"datasets"},
    "training/handed.py": {"datasets"},  # dataset= of the Python API only: a 1-3 s import
    "training/callbacks.py": {"transformers.trainer_callback"},  # callbacks= only: seconds to import
    # the pipeline's length survey on a dataset (its tokenizer loader imports transformers): the preflight stays light
    "data/survey.py": {"rloo.runtime.inputs.saved_tokenizer"},
    "runtime/tracking/trackers.py": {"torch.utils.tensorboard", "wandb"},
    "runtime/inputs/sizes.py": {"torch"},  # GPU memory only for device=cuda: the CLI's preflight stays torch-free
    "eval/plots.py": {"matplotlib", "matplotlib.pyplot"},
    "experiments/compare/plots.py": {"matplotlib", "matplotlib.pyplot"},
}


def _sources():
    return sorted(SRC.rglob("*.py"))


def test_no_source_file_over_300_lines():
    long = {str(p.relative_to(SRC)): n for p in _sources() if (n := len(p.read_text().splitlines())) > 300}
    assert not long, f"split these modules (docs/architecture.md): {long}"


def _function_imports(path: Path) -> set[str]:
    found = set()
    for fn in ast.walk(ast.parse(path.read_text())):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for node in ast.walk(fn):
                if isinstance(node, ast.Import):
                    found |= {a.name for a in node.names}
                elif isinstance(node, ast.ImportFrom):
                    found.add(node.module or "")
    return found


def test_imports_inside_functions_are_only_the_allowed_lazy_ones():
    extra = {}
    for p in _sources():
        rel = str(p.relative_to(SRC))
        bad = _function_imports(p) - LAZY_OK.get(rel, set())
        if bad:
            extra[rel] = sorted(bad)
    assert not extra, f"move these imports to the top of the module (or fix the layering): {extra}"


def test_the_allow_list_is_not_stale():
    stale = {rel: sorted(mods - _function_imports(SRC / rel)) for rel, mods in LAZY_OK.items()}
    assert not {k: v for k, v in stale.items() if v}


def test_one_registry_covers_exactly_the_configs_online_algorithms():
    assert set(REGISTRY) == set(ONLINE_ALGORITHMS)
    assert set(ONLINE_ALGORITHMS) | set(OFFLINE_ALGORITHMS) == set(ALGORITHMS)
    with pytest.raises(ValueError, match="not an online method"):
        make_algorithm(RLConfig(policy="p", algorithm="dpo"), models=None)  # type: ignore[arg-type]


def test_only_plain_rloo_declares_torchrun_support():
    assert supports_distributed(RLConfig(policy="p"))
    assert supports_distributed(RLConfig(policy="p", max_staleness=2))  # each process lags alike
    assert not supports_distributed(RLConfig(policy="p", algorithm_settings={"kl_level": "token"}))
    assert not any(supports_distributed(RLConfig(policy="p", algorithm=a)) for a in ALGORITHMS if a != "rloo")


def test_algo_is_still_accepted_for_the_algorithm_settings_section(tmp_path):
    old = tmp_path / "old.yaml"
    old.write_text("policy: p\nalgorithm: ppo\nalgo:\n  gae_lambda: 0.5\n")
    cfg = load_config(RLConfig, old, ["algo.clip_eps=0.1"])
    assert cfg.algorithm_settings.gae_lambda == 0.5 and cfg.algorithm_settings.clip_eps == 0.1
    assert (
        load_config(RLConfig, None, ["policy=p", "algorithm_settings.ppo_epochs=3"]).algorithm_settings.ppo_epochs == 3
    )


def test_the_saved_comparison_config_with_algo_sections_still_loads():
    saved = ROOT / "docs" / "results" / "compare" / "config.yaml"
    assert "  algo:" in saved.read_text()
    assert load_config(CompareConfig, saved).rl.algorithm_settings.dpo_pairs > 0


def test_a_run_folder_saved_with_the_old_section_name_is_still_recognised(tmp_path):
    cfg = RLConfig(policy="p", output_dir=tmp_path / "run")
    old = cfg.model_dump(mode="json")
    old["algo"] = old.pop("algorithm_settings")
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "config.yaml").write_text(yaml.safe_dump(old, sort_keys=False))
    with pytest.raises(RlooError, match="already holds this run"):
        prepare_output_dir(cfg)
    assert prepare_output_dir(cfg, overwrite=True) == tmp_path / "run"
    assert "algorithm_settings:" in (tmp_path / "run" / "config.yaml").read_text()
