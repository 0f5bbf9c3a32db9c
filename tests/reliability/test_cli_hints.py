"""Mistakes a new user makes with their own data and keys: caught before any model loads, in one line
that says what to type (issue 32, item 6), and Ctrl-C reported as an interruption, not an error."""

from __future__ import annotations

import json
import re

import pytest

import rloo.cli as cli
import rloo.training.rl as rl_mod
import rloo.training.sft as sft_mod
from rloo.cli import main
from rloo.config import load_config
from rloo.errors import ConfigError, Interrupted


@pytest.mark.parametrize("command", list(cli.COMMANDS))
def test_each_subcommands_help_example_is_one_of_its_keys(command, capsys):
    with pytest.raises(SystemExit):
        main([command, "--help"])
    example = re.search(r"e\.g\. (\S+=\S+)", capsys.readouterr().out.replace("\n", " ")).group(1)
    try:
        load_config(cli.COMMANDS[command][0], None, [example])
    except ConfigError as e:  # a missing required key is fine here; an unknown one is the bug
        assert "unknown key" not in str(e), f"rloo {command} --help suggests {example}: {e}"


@pytest.mark.parametrize(
    "args, hint",
    [
        (["pipeline", "rl.setps=10"], "unknown key 'rl.setps' for PipelineConfig (did you mean 'rl.steps'?)"),
        (["pipeline", "steps=10"], "unknown key 'steps' for PipelineConfig (did you mean 'rl.steps'?)"),
        (["train", "policy=p", "setps=10"], "(did you mean 'steps'?)"),
        # the pipeline's spelling given to a stage: drop the section's prefix
        (["train", "policy=p", "rl.max_staleness=1"], "(write max_staleness=... without the 'rl.' prefix"),
        (["sft", "sft.epochs=1"], "unknown key 'sft' for SFTConfig (write epochs=... without the 'sft.' prefix"),
    ],
)
def test_unknown_keys_say_what_was_meant(args, hint, capsys):
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert hint in err and len(err.splitlines()) == 1, err


@pytest.fixture
def data(tmp_path):
    (tmp_path / "cols.jsonl").write_text(json.dumps({"question": "post : job tl;dr :", "answer": " job"}) + "\n")
    rows = [{"info": {"post": f"post {i}"}, "summaries": [{"text": "a"}, {"text": "b"}], "choice": 0} for i in range(4)]
    (tmp_path / "cmp.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "sft.jsonl").write_text(
        "".join(json.dumps({"prompt": f"post : job {i} tl;dr :", "completion": " job"}) + "\n" for i in range(40))
    )
    return tmp_path


def _no_model_load(monkeypatch):
    def refuse(*a, **k):
        raise AssertionError("a model was loaded before the data was checked")

    monkeypatch.setattr(sft_mod, "load_policy", refuse)
    monkeypatch.setattr(rl_mod, "load_models", refuse)


@pytest.mark.parametrize("command", ["sft", "train"])
def test_a_bad_column_fails_before_any_model_loads(command, data, tiny_model_dir, tmp_path, monkeypatch, capsys):
    _no_model_load(monkeypatch)
    model = [f"model={tiny_model_dir}"] if command == "sft" else [f"policy={tiny_model_dir}", "reward_fn=x.py:f"]
    (tmp_path / "x.py").write_text("def f(prompts, completions):\n    return [0.0] * len(prompts)\n")
    monkeypatch.chdir(tmp_path)
    rc = main([command, *model, f"dataset.path={data / 'cols.jsonl'}", f"output_dir={tmp_path / 'out'}"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "has no column 'prompt'" in err and len(err.splitlines()) == 1, err
    assert not (tmp_path / "out").exists()


def test_preference_data_hint_names_the_reward_keys(data, tiny_model_dir, tmp_path, capsys):
    rc = main(
        [
            "pipeline",
            f"model={tiny_model_dir}",
            f"dataset.path={data / 'sft.jsonl'}",
            f"reward.dataset.path={data / 'cmp.jsonl'}",
            f"output_dir={tmp_path / 'p'}",
        ]
    )
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1, err
    assert "reward.dataset.columns.prompt=COLUMN" in err and "reward.dataset.format=tldr" in err, err


def test_a_missing_column_under_format_tldr_does_not_suggest_format_tldr(data, tiny_model_dir, tmp_path, capsys):
    (data / "posts.jsonl").write_text(json.dumps({"post": "my job", "tldr": " job"}) + "\n")
    argv = ["sft", f"model={tiny_model_dir}", f"dataset.path={data / 'posts.jsonl'}", "dataset.format=tldr"]
    assert main([*argv, f"output_dir={tmp_path / 'out'}"]) == 2
    err = capsys.readouterr().err.strip()
    assert "has no column 'summary' for 'completion'" in err and "dataset.columns.completion=COLUMN" in err, err
    assert "format=tldr" not in err.split("columns: ")[1] and len(err.splitlines()) == 1, err


def test_a_raising_reward_function_points_to_debug(tiny_model_dir, tmp_path, monkeypatch, capsys):
    (tmp_path / "bad.py").write_text("def f(prompts, completions):\n    raise ValueError('my bug')\n")
    monkeypatch.chdir(tmp_path)
    argv = ["train", f"policy={tiny_model_dir}", "reward_fn=bad.py:f", "steps=1", "batch_size=2", "k=2"]
    rc = main([*argv, "max_new_tokens=2", "output_dir=out"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "raised ValueError: my bug" in err and err.endswith("rerun with --debug for the traceback")


def test_ctrl_c_is_an_interruption_not_an_error(tiny_model_dir, tmp_path, monkeypatch, capsys):
    def stopped(cfg, args):
        raise Interrupted("SIGINT received; stopped at step 3/8 and saved x; continue with --resume", 2)

    monkeypatch.setitem(cli.COMMANDS, "train", (cli.COMMANDS["train"][0], stopped))
    rc = main(["train", f"policy={tiny_model_dir}", f"reward_model={tiny_model_dir}", f"output_dir={tmp_path / 'r'}"])
    err = capsys.readouterr().err.strip()
    assert rc == 130 and err.startswith("rloo train: interrupted: SIGINT received") and "error" not in err


def test_own_model_on_the_built_in_task_says_so(tiny_model_dir, tmp_path, capsys):
    """tiny_model_dir has the summarize task's tokenizer: on the dialogue task its words are unknown."""
    argv = ["sft", f"model={tiny_model_dir}", "task=dialogue", "num_examples=4", "epochs=1", "batch_size=4"]
    assert main([*argv, f"output_dir={tmp_path / 'sft'}", "report_to=none"]) == 0
    err = capsys.readouterr().err
    assert "note: no dataset.path, so" in err and "set dataset.path=FILE" in err
    assert main([*argv[:2], *argv[3:], f"output_dir={tmp_path / 'sft2'}", "report_to=none"]) == 0
    assert "note: no dataset.path" not in capsys.readouterr().err  # its own task: no note
