"""The method table (rloo.config.methods) is the one place a method's name is written: every list of
methods is derived from it, a method's settings are its own, and no name is written by hand elsewhere."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from pydantic import BaseModel, Field

import rloo
from rloo.algorithms import REGISTRY
from rloo.config import (
    METHOD_SPECS,
    ONLINE_ALGORITHMS,
    AlgorithmSettings,
    CompareConfig,
    MethodSpec,
    PipelineConfig,
    RLConfig,
    load_config,
    upgrade_saved_config,
)
from rloo.config.methods import add_method, compare_variants, one_of
from rloo.errors import ConfigError
from rloo.experiments.compare import method_config

SRC = Path(rloo.__file__).parent
BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
# Where a method's name may be written: the table itself, the registry that maps each name to
# its step (checked against the table at import), and the paper's published TL;DR ordering, a
# citation keyed by name (checked against the table below; its home could become a field of the
# table once the table's restructuring has landed).
NAME_HOMES = {"config/methods.py", "algorithms/registry.py", "experiments/compare/order.py"}
# "rloo" is the program's name as well as a method's: these files use it as the former.
PROGRAM_NAME = {
    "cli.py": "the command's name",
    "runtime/runfolder/lock.py": "the command named in a lock",
    "runtime/tracking/trackers.py": "the default wandb project",
    "experiments/bench.py": "rloo's trainer against TRL's",
    "experiments/bench_report.py": "rloo bench's trainer names (rloo, rloo-vllm) against TRL's",
    "benchmarks/studies/bench_vllm_table.py": "rloo bench's trainer names (rloo, rloo-vllm) against TRL's",
    "benchmarks/gpu_check.py": "rloo's trainer against TRL's",
    "benchmarks/gpu_bench.py": "rloo bench's trainer names (rloo, with captured_decode off and on) against TRL's",
    "benchmarks/gpu_check_async.py": "rloo bench's trainer names (rloo, rloo-n1)",
    "benchmarks/memory_sweep.py": "rloo's trainer against TRL's",
    "benchmarks/mutation_check.py": "the package's folder, src/rloo",
    "benchmarks/gpu_check_parts.py": "the package's folder, src/rloo (is one on PYTHONPATH?)",
}


def _names_written(path: Path) -> list[tuple[int, str]]:
    """(line, name) of each string constant in a source file that is exactly a method's or a
    comparison variant's name."""
    names = set(compare_variants())
    tree = ast.parse(path.read_text())
    return [(n.lineno, n.value) for n in ast.walk(tree) if isinstance(n, ast.Constant) and n.value in names]


def _sources():
    """(shown path, file) of every Python file of rloo and of benchmarks/ (the studies' scripts included)."""
    yield from ((p.relative_to(SRC).as_posix(), p) for p in sorted(SRC.rglob("*.py")))
    yield from ((f"benchmarks/{p.relative_to(BENCHMARKS).as_posix()}", p) for p in sorted(BENCHMARKS.rglob("*.py")))


def test_no_method_name_is_written_by_hand_outside_the_table():
    # benchmarks/ too (fails on main: gradient_matrix_table.py listed ppo, grpo, rloo_clip by hand)
    found = []
    for rel, path in _sources():
        if rel in NAME_HOMES:
            continue
        for line, name in _names_written(path):
            if not (name == "rloo" and rel in PROGRAM_NAME):
                found.append(f"{rel}:{line}: {name!r}")
    assert not found, "derive these from rloo.config.METHOD_SPECS: " + ", ".join(found)


def test_the_papers_ordering_names_methods_of_the_table():
    from rloo.experiments.compare.order import PAPER_ORDER

    assert {m for m, _ in PAPER_ORDER} <= set(compare_variants())


def test_the_scan_sees_a_name_written_by_hand(tmp_path):
    # the check above must be able to fail: a file listing methods by hand is caught
    (tmp_path / "m.py").write_text('GROUPS = ("rloo", "grpo")\nx = f"{GROUPS} rloo"\n')
    assert _names_written(tmp_path / "m.py") == [(1, "rloo"), (1, "grpo")]


def test_the_registry_holds_every_online_method_of_the_table():
    assert set(REGISTRY) == set(ONLINE_ALGORITHMS) == {n for n, s in METHOD_SPECS.items() if s.online}


@pytest.fixture
def restore_table():
    """The method table as it was, after a test that adds to it."""
    specs = dict(METHOD_SPECS)
    yield
    METHOD_SPECS.clear()
    METHOD_SPECS.update(specs)


def test_every_setting_belongs_to_a_method():
    taken = {k for s in METHOD_SPECS.values() for k in s.settings.model_fields}
    assert taken == set(AlgorithmSettings.model_fields)


@pytest.mark.parametrize(
    ("algorithm", "settings", "takers"),
    [
        ("grpo", {"gae_lambda": 0.9}, "ppo"),
        ("rloo", {"value_model": "head"}, "vanilla_pg or ppo"),
        ("reinforce", {"clip_eps": 0.1}, "rloo, ppo, grpo, dr_grpo or reinforce_pp"),
        ("ppo", {"dpo_beta": 0.5}, "dpo"),
        # at its default value, too: given, it is a mistake (on main this passed silently)
        ("grpo", {"gae_lambda": 0.95}, "ppo"),
        ("rloo", {"value_model": "separate"}, "vanilla_pg or ppo"),
    ],
)
def test_a_setting_of_another_method_is_refused_in_one_line(algorithm, settings, takers):
    with pytest.raises(ConfigError) as e:
        RLConfig(policy="p", algorithm=algorithm, algorithm_settings=settings)
    key = next(iter(settings))
    msg = str(e.value)
    assert f"algorithm_settings.{key} is a setting of {takers}, not of algorithm={algorithm}" in msg
    assert "\n" not in msg


def test_a_setting_given_in_yaml_or_on_the_command_line_is_refused_whatever_its_value(tmp_path):
    # fails on main: a setting of another method at its default value passed silently there
    yml = tmp_path / "grpo.yaml"
    yml.write_text("policy: p\nalgorithm: grpo\nalgorithm_settings:\n  gae_lambda: 0.95\n")
    with pytest.raises(ConfigError, match="algorithm_settings.gae_lambda is a setting of ppo, not of algorithm=grpo"):
        load_config(RLConfig, yml)
    with pytest.raises(ConfigError, match="rl.algo.whiten_advantages is a setting of vanilla_pg or ppo, not of"):
        load_config(PipelineConfig, None, ["rl.algorithm=rloo", "rl.algo.whiten_advantages=true"])
    # a model's explicitly set keys count, its defaults do not
    with pytest.raises(ConfigError, match="gamma is a setting of vanilla_pg or ppo"):
        RLConfig(policy="p", algorithm_settings=AlgorithmSettings(gamma=1.0))
    assert RLConfig(policy="p", algorithm_settings=AlgorithmSettings(kl_estimator="k3")).algorithm_settings.kl_estimator


def test_each_method_holds_its_own_settings_and_a_saved_config_reads_back():
    for name, spec in METHOD_SPECS.items():
        cfg = RLConfig(policy="p", algorithm=name)
        assert type(cfg.algorithm_settings) is spec.settings_model
        assert set(cfg.model_dump()["algorithm_settings"]) == set(spec.settings_model.model_fields)
        assert RLConfig(**cfg.model_dump()) == cfg  # a run's config.yaml loads back as itself
    RLConfig(policy="p", algorithm="ppo", algorithm_settings={"gae_lambda": 0.9, "value_model": "head"})
    # `algo:` is still read, as the section's old name
    assert RLConfig(policy="p", algorithm="ppo", algo={"gamma": 0.5}).algorithm_settings.gamma == 0.5
    # switching the method of a saved config keeps the former method's keys: refused, not dropped
    with pytest.raises(ConfigError, match="rloo_clip is a setting of rloo, not of algorithm=grpo"):
        RLConfig(**(RLConfig(policy="p").model_dump() | {"algorithm": "grpo"}))
    # and assigning another method alone leaves settings that are not its own
    cfg = RLConfig(policy="p", algorithm="grpo")
    with pytest.raises(ConfigError, match="algorithm_settings holds GRPOSettings, not PPOSettings"):
        cfg.algorithm = "ppo"


def test_a_config_saved_with_every_methods_keys_compares_equal_after_upgrade():
    # before each method had its own model, a run's config.yaml listed all 21 keys at their values
    old = RLConfig(policy="p", algorithm="grpo").model_dump(mode="json")
    old["algo"] = AlgorithmSettings().model_dump(mode="json")
    del old["algorithm_settings"]
    assert upgrade_saved_config(old) == RLConfig(policy="p", algorithm="grpo").model_dump(mode="json")


def test_a_config_yaml_saved_with_every_methods_keys_is_read_by_config_again(tmp_path):
    # a run's config.yaml from before each method had its own model (every method's keys, the others'
    # at their defaults) fed back with --config; refused key by key before loading.py took it
    import yaml

    every = AlgorithmSettings().model_dump(mode="json") | {"drop_zero_variance": True}
    pipe = PipelineConfig(task="summarize", rl={"algorithm": "grpo"}).model_dump(mode="json")
    pipe["rl"]["algorithm_settings"] = every
    f = tmp_path / "old.yaml"
    for pipeline in (True, False):
        old = RLConfig(policy="p", algorithm="grpo").model_dump(mode="json") | {"algorithm_settings": every}
        f.write_text(yaml.safe_dump(pipe if pipeline else old))
        cfg = load_config(PipelineConfig, f).rl if pipeline else load_config(RLConfig, f)
        assert type(cfg.algorithm_settings) is METHOD_SPECS["grpo"].settings_model
        assert cfg.algorithm_settings.drop_zero_variance is True
    # another method's key away from its default is still refused; a hand-written file is taken as written
    old["algorithm_settings"]["gae_lambda"] = 0.5
    f.write_text(yaml.safe_dump(old))
    with pytest.raises(ConfigError, match="gae_lambda is a setting of ppo, not of algorithm=grpo"):
        load_config(RLConfig, f)


def test_compare_shares_one_section_and_gives_each_method_its_own_keys(tmp_path):
    cfg = CompareConfig(rl={"algorithm_settings": {"gae_lambda": 0.9, "clip_eps": 0.1, "kl_level": "token"}})
    pipe = PipelineConfig(task="summarize", output_dir=tmp_path, rl=cfg.rl)
    runs = {m: method_config(cfg, pipe, m, tmp_path / m).algorithm_settings for m in ("rloo", "ppo", "ppo_lambda1")}
    assert (runs["rloo"].clip_eps, runs["rloo"].kl_level) == (0.1, "token") and not hasattr(runs["rloo"], "gae_lambda")
    assert (runs["ppo"].gae_lambda, runs["ppo"].clip_eps, runs["ppo_lambda1"].gae_lambda) == (0.9, 0.1, 1.0)
    # a key no method takes, or a value one of its methods refuses, is refused in the shared section too
    with pytest.raises(ConfigError, match="unknown key 'rl.algorithm_settings.gae_lamda'"):
        CompareConfig(rl={"algorithm_settings": {"gae_lamda": 0.9}})
    with pytest.raises(ConfigError, match="rl.algorithm_settings.clip_eps: Input should be greater than 0"):
        CompareConfig(rl={"algorithm_settings": {"clip_eps": -1.0}})


def test_a_method_brings_its_own_settings_as_a_model_or_a_dict(restore_table):
    class Scale(BaseModel):  # a plain pydantic model: rloo adds its rules (unknown keys refused)
        toy_scale: float = Field(default=1.0, gt=0)

    # fails on main: add_method refused settings that were not keys of AlgorithmSettings
    add_method(MethodSpec("toy_a", "", Scale))
    add_method(MethodSpec("toy_b", "", {"toy_temperature": (float, 2.0), "kl_estimator": (str, "k1")}))
    assert (
        RLConfig(policy="p", algorithm="toy_a", algorithm_settings={"toy_scale": 3.0}).algorithm_settings.toy_scale == 3
    )
    assert RLConfig(policy="p", algorithm="toy_b").algorithm_settings.toy_temperature == 2.0  # type: ignore[attr-defined]
    with pytest.raises(ConfigError, match="algorithm_settings.toy_scale: Input should be greater than 0"):
        RLConfig(policy="p", algorithm="toy_a", algorithm_settings={"toy_scale": 0})
    with pytest.raises(ConfigError, match="algorithm_settings.toy_scale is a setting of toy_a, not of algorithm=rloo"):
        RLConfig(policy="p", algorithm_settings={"toy_scale": 2.0})
    with pytest.raises(ConfigError, match="algorithm_settings.clip_eps is a setting of .*, not of algorithm=toy_a"):
        RLConfig(policy="p", algorithm="toy_a", algorithm_settings={"clip_eps": 0.2})
    with pytest.raises(ConfigError, match="unknown key 'algorithm_settings.toy_scal'"):
        RLConfig(policy="p", algorithm="toy_a", algorithm_settings={"toy_scal": 2.0})
    shared = CompareConfig(methods=["toy_a", "rloo"], rl={"algorithm_settings": {"toy_scale": 5.0}})
    assert shared.rl.algorithm_settings.toy_scale == 5.0  # type: ignore[attr-defined]
    with pytest.raises(TypeError, match="toy_c: settings must be a pydantic model or a dict of fields"):
        MethodSpec("toy_c", "", int)  # type: ignore[arg-type]


def test_group_methods_need_k_of_two_with_their_reason():
    for name, spec in METHOD_SPECS.items():
        if spec.groups:
            with pytest.raises(ConfigError, match="k >= 2 samples per prompt .*got k=1"):
                RLConfig(policy="p", algorithm=name, k=1)
        else:
            assert RLConfig(policy="p", algorithm=name, k=1).k == 1


def test_off_policy_and_env_are_refused_for_methods_whose_spec_lacks_the_flag():
    # the table's flags decide: a method without off_policy/multi_turn gets one line naming those with it
    off = [n for n, s in METHOD_SPECS.items() if s.off_policy]
    multi = [n for n, s in METHOD_SPECS.items() if s.multi_turn]
    assert off and multi
    for name, spec in METHOD_SPECS.items():
        if not spec.online:
            continue
        staleness = dict(policy="p", algorithm=name, max_staleness=1)
        env = dict(policy="p", algorithm=name, env="calculator")
        if spec.off_policy:
            assert RLConfig(**staleness).off_policy_correction == ("tis" if spec.importance else "none")
        else:
            with pytest.raises(ConfigError, match=f"implemented for {' or '.join(off)} only, got {name}"):
                RLConfig(**staleness)
        if spec.multi_turn:
            assert RLConfig(**env).env == "calculator"
        else:
            why = "its value model and GAE" if spec.value_model else ""
            with pytest.raises(ConfigError, match=f"env= trains with algorithm={one_of(multi)} only.*{why}"):
                RLConfig(**env)
