"""Round three of bad input (issue 28): every command, a table of bad inputs. Each must exit 2 with
exactly one line on stderr naming the key or path, no traceback, in well under 3 s (all are found
before a model loads), and create nothing. The cases that need a run (non-finite updates in every
stage, a reward returning a dict or only None, a checkpoint whose model was swapped, a second
SIGTERM) follow the table."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from rloo.cli import main
from rloo.config import CompareConfig, RewardConfig, SFTConfig
from rloo.config.loading import load_config
from rloo.errors import NonFiniteError, RewardError
from rloo.rewards.sources import FunctionReward

from ._runner import run_cli
from .test_bad_input import TINY_RUN, _files, _one_line

RW = "reward_fn=reliability._helpers:reward_short"

# the keys each command needs, so that the key under test is the only problem
REQUIRED = {
    "sft": [],
    "reward": ["sft_model={model}"],
    "train": ["policy={model}", RW],
    "eval": ["policy={model}"],
    "pipeline": [],
    "compare": [],
    "bench": [],
}

# (command, arguments, what the one line must contain); {model}, {zero}, {trunc}, {loop}, {dir},
# {fifo} are made by the `inputs` fixture, {out} is a fresh output folder
TABLE = [
    # item 5: absurd settings of the stages that train
    ("sft", ["weight_decay=1e30"], "weight_decay: Input should be less than or equal to 10"),
    ("sft", ["weight_decay=5", "lr=0.5"], "weight_decay: lr x weight_decay must be below 1"),
    ("pipeline", ["sft.weight_decay=1e30"], "sft.weight_decay"),
    # item 8
    ("train", ["policy={model}", RW, "truncation_penalty=1e300"], "truncation_penalty: Input should be less"),
    ("pipeline", ["rl.truncation_penalty=-1e300"], "rl.truncation_penalty: Input should be greater"),
    # item 9: the context, and memory
    ("train", ["policy={model}", RW, "max_new_tokens=100000000"], "max_new_tokens=100000000 is longer than the"),
    ("eval", ["policy={model}", "max_new_tokens=100000000"], "max_new_tokens=100000000 is longer than the"),
    ("pipeline", ["rl.max_new_tokens=100000000"], "rl.max_new_tokens=100000000 is longer than the context"),
    ("train", ["policy={model}", RW, "batch_size=4000", "k=4000"], "batch_size x k = 4000 x 4000: 16000000"),
    # item 10: device=tpu, every command
    *[(c, [*REQUIRED[c], "device=tpu"], "device: device must be") for c in REQUIRED],
    # item 11: output_dir a symbolic link loop, or under one
    ("train", ["policy={model}", RW, "output_dir={loop}"], "is or lies under a symbolic link loop"),
    ("sft", ["output_dir={loop}/x"], "is or lies under a symbolic link loop"),
    ("eval", ["policy={model}", "output_dir={loop}"], "is or lies under a symbolic link loop"),
    ("pipeline", ["output_dir={loop}"], "is or lies under a symbolic link loop"),
    # items 12, 13: a zero-byte or truncated model.safetensors
    ("train", ["policy={zero}", RW], "policy '{zero}': weights file model.safetensors is empty"),
    ("train", ["policy={trunc}", RW], "policy '{trunc}': weights file model.safetensors is cut off"),
    ("sft", ["model={trunc}"], "model '{trunc}': weights file model.safetensors is cut off"),
    ("reward", ["sft_model={zero}"], "sft_model '{zero}': weights file model.safetensors is empty"),
    ("eval", ["policy={model}", "baseline={trunc}"], "baseline '{trunc}': weights file model.safetensors is cut"),
    # minor: a folder or FIFO as --config, a folder as reward_fn, k and pass_samples, temperature
    ("train", ["policy={model}", RW, "--config", "{dir}"], "config file {dir} is a folder, not a regular file"),
    ("sft", ["--config", "{fifo}"], "config file {fifo} is a FIFO (named pipe), not a regular file"),
    ("train", ["policy={model}", "reward_fn={dir}:fn"], "reward_fn '{dir}:fn': '{dir}' is a folder, not a Python"),
    ("train", ["policy={model}", RW, "k=100000"], "k: Input should be less than or equal to 4096"),
    ("eval", ["policy={model}", "task=arithmetic", "pass_samples=100000"], "pass_samples: Input should be less"),
    ("pipeline", ["task=arithmetic", "eval.pass_samples=100000"], "eval.pass_samples: Input should be less"),
    ("train", ["policy={model}", RW, "temperature=1e-30"], "temperature: Input should be greater than or equal"),
    ("eval", ["policy={model}", "temperature=1e-30"], "temperature: Input should be greater than or equal"),
    # a producer address that cannot be the trainer's, and the bound on max_staleness
    *[
        ("train", ["policy={model}", RW, "max_staleness=1", f"producer_address={address}"], needle)
        for address, needle in [
            ("256.1.1.1:29511", "producer_address: 256.1.1.1 is not an IPv4 address"),
            ("nonexistent.invalid:29511", "the host 'nonexistent.invalid' does not resolve"),
            ("a b:29511", "producer_address: a space or control character is not part of a host name"),
            ("http://localhost:29511", "producer_address: no scheme such as http:// before the host"),
            ("h" * 300 + ":29511", "producer_address: the host name is 300 characters long"),
            ("localhost:29511:1", "producer_address: one colon, before the port"),
        ]
    ],
    ("pipeline", ["rl.max_staleness=1", "rl.producer_address=nonexistent.invalid:1"], "rl.producer_address=nonexist"),
    (
        "train",
        ["policy={model}", RW, "max_staleness=1025"],
        "max_staleness: Input should be less than or equal to 1024",
    ),
    ("train", ["policy={model}", RW, "producer_connect_timeout_s=0"], "producer_connect_timeout_s: Input should be"),
]


@pytest.fixture
def inputs(tiny_model_dir, tmp_path, monkeypatch):
    """The bad inputs of the table, under tmp_path/in; the current folder is tmp_path."""
    d = tmp_path / "in"
    (d / "adir").mkdir(parents=True)
    for name, cut in (("zero", 0), ("trunc", 3000)):
        shutil.copytree(tiny_model_dir, d / name)
        weights = d / name / "model.safetensors"
        weights.write_bytes(weights.read_bytes()[:cut])
    (d / "loop-a").symlink_to(d / "loop-b")
    (d / "loop-b").symlink_to(d / "loop-a")
    os.mkfifo(d / "fifo")
    monkeypatch.chdir(tmp_path)
    return {"model": str(tiny_model_dir), "zero": str(d / "zero"), "trunc": str(d / "trunc")} | {
        "loop": str(d / "loop-a"),
        "dir": str(d / "adir"),
        "fifo": str(d / "fifo"),
        "out": str(tmp_path / "out"),
    }


def _tree(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


@pytest.mark.parametrize("command, args, needle", TABLE, ids=[f"{c}-{'-'.join(a)[-40:]}" for c, a, _ in TABLE])
def test_bad_input_table(command, args, needle, inputs, tmp_path, capsys):
    args = [a.format(**inputs) for a in args]
    if not any(a.startswith("output_dir=") for a in args):
        args.append(f"output_dir={inputs['out']}")
    before = _tree(tmp_path)
    t = time.perf_counter()
    rc = main([command, *args])
    seconds = time.perf_counter() - t
    _one_line(rc, capsys.readouterr().err.strip(), f"rloo {command}: error: ", needle.format(**inputs))
    assert _tree(tmp_path) == before, "nothing is created"
    assert seconds < 3, f"took {seconds:.1f}s"


# -- item 6: what a reward function may return -------------------------------------------------


@pytest.mark.parametrize(
    "value",
    [[1.0, None], (1.0, 2.0), np.array([1.0, 2.0]), torch.tensor([1.0, 2.0]), [np.float32(1), torch.tensor(2.0)]],
    ids=["list", "tuple", "ndarray", "tensor", "mixed"],
)
def test_reward_sequences_are_accepted(value):
    scores = FunctionReward(lambda p, c: value, "r").score_texts(["a", "b"], ["x", "y"])
    assert scores.shape == (2,) and scores[0] == 1.0


@pytest.mark.parametrize(
    "value, needle",
    [
        ({0: 1.0, 1: 1.0}, "returned a dict"),
        ("ab", "returned a str"),
        ({1.0, 2.0}, "returned a set"),
        ((x for x in (1.0, 2.0)), "returned a generator"),
        (torch.ones(2, 1), "returned a Tensor of shape (2, 1)"),
        (np.ones((2, 1)), "returned a ndarray of shape (2, 1)"),
        (3.0, "returned a float"),
    ],
    ids=["dict", "str", "set", "generator", "tensor-2d", "ndarray-2d", "float"],
)
def test_reward_non_sequences_are_refused(value, needle):
    with pytest.raises(RewardError, match="expected a list") as e:
        FunctionReward(lambda p, c: value, "r").score_texts(["a", "b"], ["x", "y"])
    assert needle in str(e.value)


def test_reward_returning_a_dict_stops_the_run(tiny_model_dir, tmp_path, capsys):
    out = tmp_path / "run"
    rc = main(["train", f"policy={tiny_model_dir}", f"output_dir={out}", *TINY_RUN, "reward_fn=rewards3:as_dict"])
    _one_line(rc, capsys.readouterr().err.strip(), "reward function as_dict returned a dict", progress_before=True)
    assert not out.exists()


# -- item 7: a run in which the reward scored nothing ------------------------------------------


def test_a_run_with_no_scored_step_is_not_a_success(tiny_model_dir, tmp_path, capsys):
    out = tmp_path / "run"
    rc = main(["train", f"policy={tiny_model_dir}", f"output_dir={out}", *TINY_RUN, "reward_fn=rewards3:nothing"])
    err = capsys.readouterr().err.strip()
    _one_line(rc, err, "none of the 2 steps had a scored completion", "no model was saved", progress_before=True)
    said = [x for x in err.splitlines() if "the reward scored none of the 4 completions" in x]
    assert [x.split(":")[0] for x in said] == ["step 1", "step 2"], err
    assert not (out / "model").exists()


def test_a_step_with_no_scored_sample_is_said(tiny_model_dir, tmp_path, capsys):
    out = tmp_path / "run"
    rc = main(["train", f"policy={tiny_model_dir}", f"output_dir={out}", *TINY_RUN, "reward_fn=rewards3:first_none"])
    err = capsys.readouterr().err
    assert rc == 0, err
    assert [x.split(":")[0] for x in err.splitlines() if "scored none" in x] == ["step 1"], err
    assert (out / "model" / "model.safetensors").exists()


@pytest.fixture(autouse=True)
def _rewards3(tmp_path, monkeypatch):
    """rewards3.py: rewards that return a dict, only None, or only None at the first training step."""
    (tmp_path / "rewards3.py").write_text(
        "calls = 0\n"
        "def as_dict(prompts, completions):\n"
        "    return {i: 1.0 for i in range(len(completions))}\n"
        "def nothing(prompts, completions):\n"
        "    return [None] * len(completions)\n"
        "def first_none(prompts, completions):\n"
        "    global calls\n"
        "    calls += 1  # call 1 is the check before the run, call 2 the first step\n"
        "    return [None] * len(completions) if calls == 2 else [-len(c) / 10 for c in completions]\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    yield
    import sys

    sys.modules.pop("rewards3", None)


# -- item 5: every stage that trains refuses non-finite updates --------------------------------


def _nan_loss(real):
    def loss(*args, **kwargs):
        value, stats = real(*args, **kwargs)
        return value * float("nan"), stats

    return loss


@pytest.mark.parametrize("stage", ["sft", "reward", "dpo"])
def test_every_stage_refuses_non_finite_updates(stage, tiny_model_dir, tmp_path, monkeypatch, capsys):
    """A loss that is NaN at every step: each update skipped and said, no model saved (before: an
    all-NaN SFT or reward model, or an unchanged DPO policy, saved with exit 0)."""
    from rloo import train
    from rloo.config import RLConfig
    from rloo.training import dpo, reward, sft

    out = tmp_path / stage
    if stage == "sft":
        monkeypatch.setattr(sft, "sft_loss", _nan_loss(sft.sft_loss))
        cfg = SFTConfig(model=str(tiny_model_dir), output_dir=out, num_examples=8, batch_size=4, epochs=1)
        run = lambda: sft.sft(cfg)  # noqa: E731
    elif stage == "reward":
        monkeypatch.setattr(reward, "bradley_terry_loss", _nan_loss(reward.bradley_terry_loss))
        cfg = RewardConfig(
            sft_model=str(tiny_model_dir), output_dir=out, num_pairs=8, eval_pairs=4, batch_size=4, policy_pairs=0
        )
        run = lambda: reward.train_reward(cfg)  # noqa: E731
    else:
        monkeypatch.setattr(dpo, "dpo_loss", _nan_loss(dpo.dpo_loss))
        cfg = RLConfig(
            policy=str(tiny_model_dir),
            output_dir=out,
            algorithm="dpo",
            eval_every=None,
            eval_prompts=2,
            algorithm_settings={"dpo_pairs": 8, "dpo_batch_size": 4},
        )
        run = lambda: train(cfg)  # noqa: E731
    with pytest.raises(NonFiniteError, match=f"{stage}: every step was skipped"):
        run()
    assert not (out / "model").exists()
    assert f"{stage} step 1: non-finite loss or gradient, update skipped" in capsys.readouterr().err


def test_sft_undoes_an_update_that_left_bad_weights(tiny_model_dir, tmp_path, monkeypatch, capsys):
    """A finite gradient whose update leaves non-finite weights (what weight_decay=1e30 did): undone."""
    from rloo.training import common, sft

    real = common.adamw

    def exploding(params, lr, weight_decay=0.0):
        return real(params, lr, weight_decay=1e30)  # past the config's bound, as a bug elsewhere could be

    monkeypatch.setattr(sft, "adamw", exploding)
    out = tmp_path / "sft"
    with pytest.raises(NonFiniteError, match="sft: every step was skipped"):
        sft.sft(SFTConfig(model=str(tiny_model_dir), output_dir=out, num_examples=8, batch_size=4, epochs=1))
    assert "update skipped" in capsys.readouterr().err and not (out / "model").exists()


@pytest.mark.parametrize("value_model", ["separate", "head"])
def test_the_value_model_is_guarded_too(value_model, tiny_model_dir, tmp_path, monkeypatch, capsys):
    """ppo's value model: an update that blows up its weights (its optimizer's lr patched to 1e30,
    beyond the config's bound) is taken back with the policy's, and the checkpoint written when the
    run stops holds the value model from before (before: it held weights near 1e30)."""
    from rloo.algorithms import ppo

    real = ppo.refresh_casts_after_step

    def huge_lr(opt):
        for group in opt.param_groups:
            group["lr"] = 1e30
        return real(opt)

    monkeypatch.setattr(ppo, "refresh_casts_after_step", huge_lr)
    out = tmp_path / "run"
    rc = main(
        [
            "train",
            f"policy={tiny_model_dir}",
            f"output_dir={out}",
            RW,
            *TINY_RUN,
            "algorithm=ppo",
            f"algo.value_model={value_model}",
            "max_skipped_steps=2",
        ]
    )
    _one_line(rc, capsys.readouterr().err.strip(), "2 steps in a row", progress_before=True)
    assert not (out / "model").exists()
    state = torch.load(out / "checkpoints" / "step-000000" / "state.pt", weights_only=True)
    values = state["algorithm"]["value_model"]
    worst = max(v.abs().max().item() for v in values.values() if v.is_floating_point())
    assert worst < 1e3, f"the checkpoint holds a value model with weights up to {worst:.3g}"


# -- item 15: a checkpoint whose model was swapped for another architecture --------------------


def test_resume_with_a_swapped_model_architecture_is_refused(tiny_model_dir, tmp_path, capsys):
    from transformers import AutoTokenizer

    from rloo.config.sections import ArchConfig
    from rloo.modeling.loading import build_llama

    out = tmp_path / "run"
    argv = ["train", f"policy={tiny_model_dir}", f"output_dir={out}", RW, *TINY_RUN]
    assert main(argv) == 0
    ckpt = out / "checkpoints" / "step-000002"
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    other = build_llama(ArchConfig(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=96), tok, seed=1)
    shutil.rmtree(ckpt / "model")
    other.save_pretrained(ckpt / "model")
    tok.save_pretrained(ckpt / "model")
    manifest = json.loads((ckpt / "COMPLETE").read_text())  # re-hashed: the manifest vouches for the swap
    manifest["files"] = {
        str(p.relative_to(ckpt)): [p.stat().st_size, hashlib.sha256(p.read_bytes()).hexdigest()]
        for p in sorted(ckpt.rglob("*"))
        if p.is_file() and p.name != "COMPLETE"
    }
    (ckpt / "COMPLETE").write_text(json.dumps(manifest))
    capsys.readouterr()
    before = _files(out)
    rc = main([*argv, "steps=3", "--resume"])
    _one_line(
        rc,
        capsys.readouterr().err.strip(),
        f"cannot resume from {ckpt}: trainable tensor",
        "optimizer state has",
        progress_before=True,
    )
    assert _files(out) == before


# -- a second SIGTERM, and --quick with explicit settings --------------------------------------


def test_a_second_sigterm_exits_143(tiny_model_dir, tmp_path):
    out = tmp_path / "run"
    argv = ["train", f"policy={tiny_model_dir}", f"output_dir={out}", RW, *TINY_RUN, "steps=4"]
    rc, text = run_cli(argv, tmp_path / "log.txt", "term2@2")
    assert rc == 128 + signal.SIGTERM, text
    assert text.strip().splitlines()[-1] == (
        "rloo train: interrupted by SIGTERM; rerun with --resume to continue from the newest checkpoint "
        "(step 0 if none)"
    ), text


def test_quick_keeps_the_settings_the_user_gave(capsys):
    from rloo.experiments.compare import QUICK, quick_config

    cfg = load_config(CompareConfig, None, ["seeds=[1,2]", "variance_batches=3", "rl.steps=5"])
    quick = quick_config(cfg.model_copy(update={"quick": True}))
    assert (quick.seeds, quick.variance_batches, quick.rl.steps) == ([1, 2], 3, 5)
    assert (quick.rl.k, quick.variance_samples) == (QUICK["rl"]["k"], QUICK["variance_samples"])  # the rest is quick
    assert "--quick: keeping your rl.steps=5, variance_batches=3, seeds=[1, 2]" in capsys.readouterr().err


# -- malformed values, lock records, plugins, results and rewards ------------------

# (command, arguments, what the one line must contain); besides the table's inputs: {held-<name>} a
# run folder whose lock a live holder keeps with the malformed record <name>, {study-<case>}
# a finished comparison whose rloo/result.json is cut off, a list, or a link, and the user files of
# the `table4_inputs` fixture ({exit0}, {exit3}, {kbi}, {huge}, {conv-<case>})
LOCK_RECORDS = {"list": "[1,2]", "int": "5", "str": '"str"', "text": '{"started":"x"}'} | {
    "big": '{"started":1e300}',
    "neg": '{"started":-1e20}',
}
TABLE4 = [
    # item 2: a value that is not YAML, every command that parses overrides
    ("train", ["policy={model}", RW, "seed=["], "override seed='[' is not a valid YAML value"),
    ("sft", ["task={{"], "override task='{{' is not a valid YAML value"),
    ("compare", ["tasks=[summarize"], "override tasks='[summarize' is not a valid YAML value"),
    ("eval", ["policy={model}", "num_prompts=*a"], "override num_prompts='*a' is not a valid YAML value"),
    ("train", ["policy={model}", RW, "seed=\t1"], "override seed='\\t1' is not a valid YAML value"),
    ("train", ["policy={model}", RW, "producer_address=[::1]:29511"], "override producer_address='[::1]:29511'"),
    ("train", ["policy={model}", RW, "stop={{a:"], "override stop='{{a:' is not a valid YAML value"),
    # item 3: a live holder whose lock record is malformed: refused, named safely
    *[
        ("train", ["policy={model}", RW, f"output_dir={{held-{n}}}", "--resume"], "a process whose lock record is unre")
        for n in LOCK_RECORDS
    ],
    ("compare", ["output_dir={held-study}", "--overwrite"], "in use by a process whose lock record is unreadable"),
    # item 7: LoRA targets
    ("train", ["policy={model}", RW, "lora.target_modules=[]"], "lora.target_modules: name at least one module"),
    ("sft", ["lora.target_modules=[]"], "lora.target_modules: name at least one module"),
    ("train", ["policy={model}", RW, "lora.target_modules=nonexistent"], "the names it can target: down_proj, "),
    # item 9: a plugin that exits, raises KeyboardInterrupt, or is a folder
    ("train", ["policy={model}", RW, "--plugin", "{exit0}"], "plugin '{exit0}' called sys.exit(0) while loading"),
    ("train", ["policy={model}", RW, "--plugin", "{exit3}"], "plugin '{exit3}' called sys.exit(3) while loading"),
    ("compare", ["--plugin", "{kbi}"], "plugin '{kbi}' raised KeyboardInterrupt while loading"),
    ("train", ["policy={model}", RW, "--plugin", "nsplugin"], "plugin 'nsplugin' is a folder (a namespace package)"),
    # item 10: a finished comparison whose result is cut off, not an object, or a link
    *[
        ("compare", ["--config", f"{{study-{case}}}/config.yaml", f"output_dir={{study-{case}}}"], needle)
        for case, needle in (("cut", "is not valid JSON"), ("list", "holds a list"), ("link", "is a symbolic link"))
    ],
    # conversational data: a string as `messages`, a message without text, a role no template knows
    ("sft", ["model={model}", "dataset.path={conv-str}"], "field 'messages' must be a list of {{role, content}}"),
    ("sft", ["model={model}", "dataset.path={conv-null}"], "field 'messages': message 0 has content None, expected"),
    ("sft", ["model={model}", "dataset.path={conv-role}"], "field 'messages': message 0 has role 'human'; expected"),
    # item 11: a reward past float's range (found by the check before the run, which samples k
    # completions: the fewest and shortest, for speed)
    ("train", ["policy={model}", "reward_fn={huge}:fn", "k=2", "max_new_tokens=2"], "fn returned a score too large"),
]


def _hold(folder: Path, record: str, stack) -> str:
    """`folder` with a lock file holding `record`, flock-held as a live run holds it (another open
    file description in this process conflicts with the CLI's as another process's would)."""
    import fcntl

    folder.mkdir(parents=True, exist_ok=True)
    fh = stack.enter_context(open(folder / ".rloo.lock", "w"))
    fh.write(record)
    fh.flush()
    fcntl.flock(fh, fcntl.LOCK_EX)
    return str(folder)


def _study(folder: Path, result: str | None) -> str:
    """A comparison's folder as a finished one leaves it, as far as a rerun reads before any model
    loads: its marker, config.yaml, and a cell's sft and rloo result.json (`result`; None: a link)."""
    from rloo.experiments.compare.folder import _dump
    from rloo.runtime.runfolder.layout import write_marker

    from .conftest import tiny_study_config

    cell = folder / "runs" / "summarize" / "seed-0"
    for run in ("sft", "rloo"):
        (cell / run).mkdir(parents=True)
        (cell / run / "result.json").write_text('{"win_rate": 0.5, "split": "eval", "settings": {}}')
    (folder / "config.yaml").write_text(_dump(tiny_study_config(folder)))
    write_marker(folder, "compare")
    if result is None:
        (cell / "rloo" / "result.json").unlink()
        (cell / "rloo" / "result.json").symlink_to(cell / "sft" / "result.json")
    else:
        (cell / "rloo" / "result.json").write_text(result)
    return str(folder)


@pytest.fixture
def table4_inputs(inputs, tmp_path):
    """The inputs of TABLE4 under tmp_path/in4 (with the table's), current folder tmp_path."""
    import sys
    from contextlib import ExitStack

    from rloo.runtime.runfolder.layout import write_marker

    d = tmp_path / "in4"
    d.mkdir()
    files = {"exit0": "import sys\nsys.exit(0)\n", "exit3": "import sys\nsys.exit(3)\n"} | {
        "kbi": "raise KeyboardInterrupt\n",
        "huge": "def fn(prompts, completions):\n    return [1.0] + [10**400] * (len(completions) - 1)\n",
    }
    for name, text in files.items():
        (d / f"{name}.py").write_text(text)
    reply = {"role": "assistant", "content": "hi"}
    conv = {"str": "hello there", "null": [{"role": "user", "content": None}, reply]}
    conv["role"] = [{"role": "human", "content": "a"}, reply]
    for name, messages in conv.items():
        (d / f"conv-{name}.jsonl").write_text(json.dumps({"messages": messages}) + "\n")
    (tmp_path / "nsplugin").mkdir()  # a folder without __init__.py, named as a module
    with ExitStack() as stack:
        held = {f"held-{n}": _hold(d / f"held-{n}", r, stack) for n, r in LOCK_RECORDS.items()}
        _hold(d / "held-study" / "runs" / "summarize" / "seed-0", "[1,2]", stack)
        write_marker(d / "held-study", "compare")
        studies = {f"study-{c}": _study(d / c, r) for c, r in (("cut", '{"win'), ("list", "[1, 2]"), ("link", None))}
        convs = {f"conv-{n}": str(d / f"conv-{n}.jsonl") for n in conv}
        yield (
            inputs
            | {n: str(d / f"{n}.py") for n in files}
            | held
            | studies
            | convs
            | {"held-study": str(d / "held-study")}
        )
    sys.modules.pop("nsplugin", None)


# rows found only once a model is loaded (its module names; the reward of its samples), or whose
# first run in a session imports Hugging Face `datasets` (a data file is read through it): 30 s
SLOW = ("lora.target_modules=nonexistent", "reward_fn={huge}:fn", "dataset.path=")


@pytest.mark.parametrize("command, args, needle", TABLE4, ids=[f"{c}-{'-'.join(a)[-40:]}" for c, a, _ in TABLE4])
def test_malformed_values_locks_plugins_results_and_rewards(command, args, needle, table4_inputs, tmp_path, capsys):
    """As the table above, and no file's bytes change (a lock record, a result, a plugin)."""
    limit = 30 if any(a.startswith(slow) for a in args for slow in SLOW) else 3
    args = [a.format(**table4_inputs) for a in args]
    if not any(a.startswith("output_dir=") for a in args):
        args.append(f"output_dir={table4_inputs['out']}")
    before, files = _tree(tmp_path), _files(tmp_path)
    t = time.perf_counter()
    rc = main([command, *args])
    seconds = time.perf_counter() - t
    _one_line(rc, capsys.readouterr().err.strip(), f"rloo {command}: error: ", needle.format(**table4_inputs))
    assert _tree(tmp_path) == before and _files(tmp_path) == files, "nothing is created or changed"
    assert seconds < limit, f"took {seconds:.1f}s"


def test_a_read_only_file_system_is_not_called_full(tmp_path, monkeypatch):
    """A read-only file system reports no free space (statvfs), so a failed write there was told as
    "no space left on device"; EROFS is said as what it is."""
    import errno
    import shutil as sh

    from rloo.runtime.runfolder import atomic

    monkeypatch.setattr(sh, "disk_usage", lambda p: sh._ntuple_diskusage(1 << 30, 1 << 30, 0))
    e = OSError(errno.EROFS, "Read-only file system", str(tmp_path / "x"))
    what = atomic.describe_write_failure(e, tmp_path)
    assert what.startswith("read-only file system") and "no space" not in what, what


@pytest.mark.parametrize("record", LOCK_RECORDS.values(), ids=list(LOCK_RECORDS))
def test_a_dead_holders_malformed_lock_record_is_taken_over(record, tmp_path, capsys):
    """A lock record no live process holds (as `--resume` finds one) is taken over whatever it holds
    and named safely (before: AttributeError/TypeError/OverflowError in describing it)."""
    from rloo.runtime.runfolder.lock import LOCK_NAME, run_folder

    (tmp_path / LOCK_NAME).write_text(record)
    with run_folder(tmp_path):
        assert json.loads((tmp_path / LOCK_NAME).read_text())["pid"] == os.getpid()
    err = capsys.readouterr().err.strip()
    assert err == "note: took over the lock of a process whose lock record is unreadable, which is no longer running"


def test_a_real_ctrl_c_while_a_plugin_loads_is_still_sigint(tmp_path, capsys):
    """A plugin's own KeyboardInterrupt is one error line (TABLE4); a SIGINT that arrives while it
    loads still stops the command as SIGINT does: exit 130 and its line."""
    plugin = tmp_path / "slow_plugin.py"
    plugin.write_text("import os, signal, time\nos.kill(os.getpid(), signal.SIGINT)\ntime.sleep(5)\n")
    rc = main(["train", "policy=x", RW, f"output_dir={tmp_path / 'out'}", "--plugin", str(plugin)])
    assert rc == 130
    assert capsys.readouterr().err.strip().startswith("rloo train: interrupted by SIGINT")
    assert not (tmp_path / "out").exists()


def test_a_precision_note_does_not_precede_a_one_line_error(inputs, tmp_path, monkeypatch, capsys):
    """dtype=auto's note on a narrow model was printed before the stage's refusal (two lines)."""
    from rloo.runtime import precision

    monkeypatch.delenv("RLOO_AUTO_DTYPE", raising=False)
    precision._narrow_model_note.cache_clear()  # said once per process: an earlier test may have said it
    (tmp_path / "theirs").mkdir()
    (tmp_path / "theirs" / "notes.txt").write_text("the user's")  # refused inside the stage, after the note
    rc = main(["train", f"policy={inputs['model']}", RW, "dtype=auto", f"output_dir={tmp_path / 'theirs'}"])
    _one_line(rc, capsys.readouterr().err.strip(), "rloo train: error: ", "does not hold an rloo train run")


def test_held_notes_come_before_the_next_line_or_not_at_all(capsys):
    from rloo.runtime.tracking.log import hold_notes, note, say

    with hold_notes():
        note("precision: a")
        assert capsys.readouterr().err == ""
        say("step 1")
    with pytest.raises(RuntimeError), hold_notes():
        note("precision: b")
        raise RuntimeError("refused")
    note("precision: c")  # outside the CLI's block: at once
    assert capsys.readouterr().err == "precision: a\nstep 1\nprecision: c\n"
