"""Bad input: one clear line from the CLI, exit code 2, and no run folder left behind."""

from __future__ import annotations

import sys
import textwrap

import pytest

from rloo.cli import main


def _run(args, capsys):
    rc = main(args)
    err = capsys.readouterr().err.strip()
    return rc, err


@pytest.fixture()
def reward_module(tmp_path, monkeypatch):
    """A module of deliberately broken reward functions, importable as `badrewards`."""
    (tmp_path / "badrewards.py").write_text(
        textwrap.dedent("""
        def raises(prompts, completions):
            raise RuntimeError("judge offline")
        def wrong_count(prompts, completions):
            return [0.0]
        def nan(prompts, completions):
            return [float("nan")] * len(completions)
        def not_numbers(prompts, completions):
            return ["good"] * len(completions)
    """)
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "badrewards"
    sys.modules.pop("badrewards", None)


@pytest.mark.parametrize(
    "override, message",
    [
        ("bogus=1", "unknown key 'bogus'"),
        ("k=1", "leave-one-out needs k >= 2"),
        ("beta=-0.1", "beta"),
        ("steps=many", "steps"),
    ],
)
def test_invalid_config_values(override, message, tiny_model_dir, tmp_path, capsys):
    out = tmp_path / "run"
    rc, err = _run(
        ["train", f"policy={tiny_model_dir}", f"reward_model={tiny_model_dir}", f"output_dir={out}", override], capsys
    )
    assert rc == 2
    assert message in err
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert not out.exists()


def test_missing_model_path(tmp_path, capsys):
    out = tmp_path / "run"
    rc, err = _run(
        ["train", f"policy={tmp_path / 'nope'}", f"reward_model={tmp_path / 'nope'}", f"output_dir={out}"], capsys
    )
    assert rc == 2 and "does not exist" in err and len(err.splitlines()) == 1
    assert not out.exists()


@pytest.mark.parametrize(
    "fn, message",
    [
        ("raises", "raised RuntimeError: judge offline"),
        ("wrong_count", "returned 1 scores for 2 completions"),
        ("nan", "non-finite score"),
        ("not_numbers", "non-number"),
    ],
)
def test_broken_reward_function(fn, message, reward_module, tiny_model_dir, tmp_path, capsys):
    out = tmp_path / "run"
    rc, err = _run(
        [
            "train",
            f"policy={tiny_model_dir}",
            f"reward_fn={reward_module}:{fn}",
            f"output_dir={out}",
            "k=2",
            "batch_size=2",
            "steps=2",
            "max_new_tokens=4",
        ],
        capsys,
    )
    assert rc == 2, err
    assert message in err and len(err.splitlines()) == 1
    assert not out.exists()


def test_unknown_key_in_yaml(tmp_path, capsys):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("rl:\n  k: 4\n  klcoef: 0.1\n")
    rc, err = _run(["pipeline", "--config", str(cfg), f"output_dir={tmp_path / 'p'}"], capsys)
    assert rc == 2 and "unknown key 'rl.klcoef'" in err
    assert not (tmp_path / "p").exists()
