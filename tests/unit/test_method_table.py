"""The method table (rloo.config.methods) is the one place a method's name is written: every list of
methods is derived from it, a method's settings are its own, and no name is written by hand elsewhere."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import rloo
from rloo.algorithms import REGISTRY
from rloo.config import METHOD_SPECS, ONLINE_ALGORITHMS, RLConfig
from rloo.config.methods import compare_variants
from rloo.errors import ConfigError

SRC = Path(rloo.__file__).parent
# Where a method's name may be written: the table itself, the registry that maps each name to
# its step (checked against the table at import), and the paper's published TL;DR ordering, a
# citation keyed by name (checked against the table below; its home could become a field of the
# table once the table's restructuring has landed).
NAME_HOMES = {"config/methods.py", "algorithms/registry.py", "experiments/compare_order.py"}
# "rloo" is the program's name as well as a method's: these files use it as the former.
PROGRAM_NAME = {
    "cli.py": "the command's name",
    "runtime/runlock.py": "the command named in a lock",
    "runtime/trackers.py": "the default wandb project",
    "experiments/bench.py": "rloo's trainer against TRL's",
}


def _names_written(path: Path) -> list[tuple[int, str]]:
    """(line, name) of each string constant in a source file that is exactly a method's or a
    comparison variant's name."""
    names = set(compare_variants())
    tree = ast.parse(path.read_text())
    return [(n.lineno, n.value) for n in ast.walk(tree) if isinstance(n, ast.Constant) and n.value in names]


def test_no_method_name_is_written_by_hand_outside_the_table():
    found = []
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC).as_posix()
        if rel in NAME_HOMES:
            continue
        for line, name in _names_written(path):
            if not (name == "rloo" and rel in PROGRAM_NAME):
                found.append(f"{rel}:{line}: {name!r}")
    assert not found, "derive these from rloo.config.METHOD_SPECS: " + ", ".join(found)


def test_the_papers_ordering_names_methods_of_the_table():
    from rloo.experiments.compare_order import PAPER_ORDER

    assert {m for m, _ in PAPER_ORDER} <= set(compare_variants())


def test_the_scan_sees_a_name_written_by_hand(tmp_path):
    # the check above must be able to fail: a file listing methods by hand is caught
    (tmp_path / "m.py").write_text('GROUPS = ("rloo", "grpo")\nx = f"{GROUPS} rloo"\n')
    assert _names_written(tmp_path / "m.py") == [(1, "rloo"), (1, "grpo")]


def test_the_registry_holds_every_online_method_of_the_table():
    assert set(REGISTRY) == set(ONLINE_ALGORITHMS) == {n for n, s in METHOD_SPECS.items() if s.online}


def test_every_setting_belongs_to_a_method():
    from rloo.config import AlgorithmSettings

    taken = {k for s in METHOD_SPECS.values() for k in s.settings.model_fields}
    assert taken == set(AlgorithmSettings.model_fields)


@pytest.mark.parametrize(
    ("algorithm", "settings", "takers"),
    [
        ("grpo", {"gae_lambda": 0.9}, "ppo"),
        ("rloo", {"value_model": "head"}, "vanilla_pg or ppo"),
        ("reinforce", {"clip_eps": 0.1}, "rloo, ppo, grpo, dr_grpo or reinforce_pp"),
        ("ppo", {"dpo_beta": 0.5}, "dpo"),
    ],
)
def test_a_setting_of_another_method_is_refused_in_one_line(algorithm, settings, takers):
    with pytest.raises(ConfigError) as e:
        RLConfig(policy="p", algorithm=algorithm, algorithm_settings=settings)
    key = next(iter(settings))
    msg = str(e.value)
    assert f"algorithm_settings.{key} is a setting of {takers}, not of algorithm={algorithm}" in msg
    assert "\n" not in msg


def test_own_settings_and_saved_defaults_are_accepted():
    RLConfig(policy="p", algorithm="ppo", algorithm_settings={"gae_lambda": 0.9, "value_model": "head"})
    # a saved config lists every key at its value: those of other methods are at their defaults
    saved = RLConfig(policy="p", algorithm="rloo").model_dump()
    assert RLConfig(**(saved | {"algorithm": "grpo"})).algorithm == "grpo"
    # `algo:` is still read, as the section's old name
    assert RLConfig(policy="p", algorithm="ppo", algo={"gamma": 0.5}).algorithm_settings.gamma == 0.5


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
            assert RLConfig(**staleness).off_policy_correction == "tis"
        else:
            with pytest.raises(ConfigError, match=f"implemented for {' or '.join(off)} only, got {name}"):
                RLConfig(**staleness)
        if spec.multi_turn:
            assert RLConfig(**env).env == "calculator"
        else:
            with pytest.raises(ConfigError, match=f"env= trains with algorithm={' or '.join(multi)} only"):
                RLConfig(**env)
