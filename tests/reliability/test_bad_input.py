"""Bad input: each a one-line error from the CLI naming the problem and the fix (a traceback only
with --debug), exit code 2, and nothing overwritten or left half-written."""

from __future__ import annotations

import json
import shutil
import sys
import textwrap
from pathlib import Path

import pytest

from rloo import train
from rloo.cli import main
from rloo.errors import ConfigError, RlooError
from rloo.runtime.checkpoint.verify import list_checkpoints, step_of, verify_checkpoint

from ._helpers import PROMPTS, leftovers, reward_short
from .conftest import rl_config

TINY_RUN = [
    "steps=2",
    "batch_size=2",
    "k=2",
    "max_new_tokens=4",
    "eval_every=null",
    "eval_prompts=2",
    "eval.batch_size=2",
    "save_every=1",
]


def _cli(args, capsys):
    rc = main(args)
    err = capsys.readouterr().err.strip()
    return rc, err


def _one_line(rc, err, *needles, progress_before=False):
    """Exit code 2 and exactly one error line (after progress lines, for a run that had started)."""
    assert rc == 2, err
    lines = err.splitlines()
    assert "Traceback" not in err and sum("error:" in x for x in lines) == 1, err
    assert len(lines) == 1 or (progress_before and "error:" in lines[-1]), err
    err = lines[-1]
    for n in needles:
        assert n in err, err


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.parametrize(
    "command, args, needle",
    [
        ("sft", ["epochs=zero"], "epochs: Input should be a valid integer"),
        ("sft", ["arch.layers=2"], "unknown key 'arch.layers'"),
        ("reward", ["sft_model=x", "lr=-1"], "lr: Input should be greater than 0"),
        ("eval", ["policy=x", "num_prompts=0"], "num_prompts: Input should be greater than or equal to 1"),
        ("pipeline", ["rl.top_p=2"], "rl.top_p: Input should be less than or equal to 1"),
        ("train", ["policy=x", "max_skipped_steps=0"], "max_skipped_steps"),
        ("train", [], "missing required key 'policy'"),
        ("train", ["policy=x", "k"], "override 'k' is not key=value"),
    ],
)
def test_config_errors_every_command(command, args, needle, tmp_path, capsys):
    out = tmp_path / "out"
    rc, err = _cli([command, *args, f"output_dir={out}"], capsys)
    _one_line(rc, err, f"rloo {command}: error: ", needle)
    assert not out.exists()


def test_debug_shows_the_traceback(tmp_path):
    with pytest.raises(ConfigError, match="unknown key 'bogus'"):
        main(["train", "policy=x", "bogus=1", f"output_dir={tmp_path / 'o'}", "--debug"])


@pytest.mark.parametrize(
    "prompts, needle",
    [
        ([], "no training prompts: the prompt list is empty"),
        (["post : job tl;dr :", ""], "prompt 1 is empty"),
        (["post : job tl;dr :", 7], "prompt 1 is a int, expected a string"),
    ],
)
def test_bad_prompt_lists(prompts, needle, tiny_model_dir, tmp_path):
    out = tmp_path / "run"
    with pytest.raises(RlooError, match=needle):
        train(rl_config(tiny_model_dir, out), prompts=prompts, reward_fn=reward_short)
    assert not out.exists()


def test_long_prompts_are_truncated_and_counted(tiny_model_dir, tmp_path, capsys):
    out = tmp_path / "run"
    long = "post : " + " ".join(["job rent exam car"] * 5) + " tl;dr :"  # 24 tokens
    cfg = rl_config(tiny_model_dir, out, steps=2, max_prompt_tokens=8, save_every=None)
    # half the prompts cut is more than max_cut_share's default, a quarter: refused, nothing written
    with pytest.raises(RlooError, match=r"rl: 1 of 2 prompts \(50%\) are longer than max_prompt_tokens=8"):
        train(cfg, prompts=[long, PROMPTS[0]], reward_fn=reward_short)
    assert not out.exists()
    train(cfg.model_copy(update={"max_cut_share": 0.5}), prompts=[long, PROMPTS[0]], reward_fn=reward_short)
    recs = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["data/prompts_truncated"] for r in recs] == [1.0, 1.0]  # the long one in each batch of 2
    err = capsys.readouterr().err
    assert "keep their last tokens" in err and "rl: cut to the length limits: 1 of 2 prompts (50%, longest 24" in err


def test_tokenizer_without_pad_token_is_handled(tiny_model_dir, tmp_path, capsys):
    model = tmp_path / "nopad"
    shutil.copytree(tiny_model_dir, model)
    for name in ("tokenizer_config.json", "special_tokens_map.json"):
        f = model / name
        if f.exists():
            d = json.loads(f.read_text())
            d.pop("pad_token", None)
            f.write_text(json.dumps(d))
    cfg = json.loads((model / "config.json").read_text())
    cfg.pop("pad_token_id", None)
    (model / "config.json").write_text(json.dumps(cfg))
    from transformers import AutoTokenizer

    assert AutoTokenizer.from_pretrained(model).pad_token is None
    out = tmp_path / "run"
    rc, err = _cli(["train", f"policy={model}", f"reward_model={model}", f"output_dir={out}", *TINY_RUN], capsys)
    assert rc == 0, err
    assert (out / "model" / "model.safetensors").exists()


@pytest.fixture()
def flaky_reward(tmp_path, monkeypatch):
    """A reward that works for the preflight and step 1, then raises (a judge service going down)."""
    (tmp_path / "flaky.py").write_text(
        textwrap.dedent("""
        calls = 0
        def judge(prompts, completions):
            global calls
            calls += 1
            if calls > 2:
                raise RuntimeError("judge offline")
            return [0.0] * len(completions)
    """)
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "flaky:judge"
    sys.modules.pop("flaky", None)


def test_reward_failing_mid_run_checkpoints_before_the_step(flaky_reward, tiny_model_dir, tmp_path, capsys):
    out = tmp_path / "run"
    rc, err = _cli(
        [
            "train",
            f"policy={tiny_model_dir}",
            f"reward_fn={flaky_reward}",
            f"output_dir={out}",
            *TINY_RUN,
            "save_every=null",
        ],
        capsys,
    )
    _one_line(
        rc,
        err,
        "reward function judge raised RuntimeError: judge offline (at step 2; checkpoint from "
        f"before it: {out}/checkpoints/step-000001; fix the cause and rerun with --resume)",
        progress_before=True,
    )
    assert [step_of(c) for c in list_checkpoints(out)] == [1]
    assert verify_checkpoint(out / "checkpoints" / "step-000001") is None
    assert not (out / "model").exists() and not leftovers(out)


@pytest.fixture(scope="module")
def finished(tiny_model_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("done") / "run"
    assert (
        main(
            [
                "train",
                f"policy={tiny_model_dir}",
                "reward_fn=reliability._helpers:reward_short",
                f"output_dir={out}",
                *TINY_RUN,
            ]
        )
        == 0
    )
    return out


@pytest.mark.parametrize(
    "extra, needle",
    [
        (["beta=0.5"], "already holds a different run; pass --resume to continue it or --overwrite to replace it"),
        ([], "already holds this run; pass --resume to continue it or --overwrite to replace it"),
        (["k=3", "--resume"], "cannot resume with different k (k: 2 -> 3)"),
    ],
)
def test_output_folder_holding_a_run_is_refused(extra, needle, finished, tiny_model_dir, tmp_path, capsys):
    out = tmp_path / "run"
    shutil.copytree(finished, out)
    before = _files(out)
    rc, err = _cli(
        [
            "train",
            f"policy={tiny_model_dir}",
            "reward_fn=reliability._helpers:reward_short",
            f"output_dir={out}",
            *TINY_RUN,
            *extra,
        ],
        capsys,
    )
    _one_line(rc, err, needle)
    assert _files(out) == before


def test_overwrite_replaces_a_run(finished, tiny_model_dir, tmp_path, capsys):
    out = tmp_path / "run"
    shutil.copytree(finished, out)
    # a file of the old run that the new one does not write (a user's own file is refused instead:
    # test_overwrite_safety.py)
    (out / "checkpoints" / "step-000099").mkdir()
    (out / "checkpoints" / "step-000099" / "state.pt").write_text("from the old run")
    rc, err = _cli(
        [
            "train",
            f"policy={tiny_model_dir}",
            "reward_fn=reliability._helpers:reward_short",
            f"output_dir={out}",
            *TINY_RUN,
            "beta=0.5",
            "--overwrite",
        ],
        capsys,
    )
    assert rc == 0, err
    assert not (out / "checkpoints" / "step-000099").exists() and "beta: 0.5" in (out / "config.yaml").read_text()


@pytest.mark.parametrize("command", ["train", "eval"])
def test_folder_that_is_not_a_run_is_never_deleted(command, tiny_model_dir, tmp_path, capsys):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "config.yaml").write_text("my: own\nnotes: true\n")
    (out / "thesis.tex").write_text("precious")
    before = _files(out)
    extra = ["reward_fn=reliability._helpers:reward_short", *TINY_RUN] if command == "train" else ["num_prompts=2"]
    rc, err = _cli([command, f"policy={tiny_model_dir}", f"output_dir={out}", *extra, "--overwrite"], capsys)
    _one_line(rc, err, "is not empty and does not hold an rloo", "choose another output_dir (nothing was deleted)")
    assert _files(out) == before


@pytest.fixture
def bad_data(tmp_path):
    d = tmp_path / "data"
    d.mkdir()
    (d / "empty.jsonl").write_text("")
    (d / "cols.jsonl").write_text(json.dumps({"question": "post : job tl;dr :", "answer": "job"}) + "\n")
    (d / "broken.jsonl").write_text('{"prompt": "post : job tl;dr :", "completion": "job"}\n{"prompt": \n')
    return d


@pytest.mark.parametrize("command", ["sft", "train"])
@pytest.mark.parametrize(
    "data, needle",
    [
        ("missing.jsonl", "does not exist"),
        ("empty.jsonl", "is empty"),
        ("cols.jsonl", "has no column 'prompt'"),
        ("broken.jsonl", "cannot be read"),
    ],
)
def test_dataset_errors_from_the_cli(command, data, needle, bad_data, tiny_model_dir, tmp_path, capsys):
    """A missing, empty, unreadable or column-less dataset: one line naming the file, before any output."""
    out = tmp_path / "out"
    model_key = "model" if command == "sft" else "policy"
    extra = [] if command == "sft" else ["reward_fn=tests.reliability._helpers:reward_short", *TINY_RUN]
    rc, err = _cli(
        [command, f"{model_key}={tiny_model_dir}", f"output_dir={out}", f"dataset.path={bad_data / data}", *extra],
        capsys,
    )
    _one_line(rc, err, f"rloo {command}: error: ", needle, data)
    assert not out.exists()


def test_overrides_after_flags_are_read(tmp_path, capsys):
    """`make demo ARGS="task=dialogue"` puts overrides after --overwrite; they must still count."""
    out = tmp_path / "out"
    rc, err = _cli(["sft", f"output_dir={out}", "--overwrite", "epochs=zero"], capsys)
    _one_line(rc, err, "rloo sft: error: ", "epochs: Input should be a valid integer")
    with pytest.raises(SystemExit) as e:  # argparse's own usage error, as for any unknown flag
        main(["sft", f"output_dir={out}", "--overwrite", "--bogus"])
    assert e.value.code == 2 and "unrecognized arguments: --bogus" in capsys.readouterr().err
