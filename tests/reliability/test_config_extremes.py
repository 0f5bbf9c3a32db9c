"""Round five (issue 58), breaks 1-4 and 6: values that pass a parser or a bound in Python but not
the layer under it (PyYAML's integers and recursion, torch's 64-bit seeds, float32 bounds, a step
count that drew every prompt up front). Each: one line, exit 2, nothing written, before a model loads."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest

from rloo.cli import main
from rloo.config import RLConfig
from rloo.tasks import get_task
from rloo.training import evalset

from .test_bad_input import TINY_RUN, _one_line
from .test_bad_input_table import RW

HUGE_INT = "9" * 5000  # Python reads at most 4300 digits of an integer from text
DEEP = "[" * 3000 + "]" * 3000  # past Python's recursion limit in PyYAML's composer


def _refused(args, tiny_model_dir, tmp_path, capsys, *needles, command="train"):
    out = tmp_path / "run"
    required = [f"policy={tiny_model_dir}", RW, *TINY_RUN] if command == "train" else []
    t = time.perf_counter()
    rc = main([command, *required, *args, f"output_dir={out}"])
    seconds = time.perf_counter() - t
    _one_line(rc, capsys.readouterr().err.strip(), f"rloo {command}: error: ", *needles)
    assert not out.exists(), "nothing is written"
    assert seconds < 5, f"took {seconds:.1f}s: refused only after loading"


@pytest.mark.parametrize(
    "value, needle",
    [(HUGE_INT, "an integer of more than 4300 digits"), (DEEP, "lists or sections nested more than 32 deep")],
    ids=["digits", "deep"],
)
def test_override_pyyaml_cannot_read(value, needle, tiny_model_dir, tmp_path, capsys):
    _refused([f"seed={value}"], tiny_model_dir, tmp_path, capsys, "override seed=", needle, "characters)")


@pytest.mark.parametrize(
    "text, needle",
    [(f"seed: {HUGE_INT}\n", "an integer of more than 4300 digits"), (f"stop: {DEEP}\n", "nested more than 32")],
    ids=["digits", "deep"],
)
def test_config_file_pyyaml_cannot_read(text, needle, tiny_model_dir, tmp_path, capsys):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(text)
    _refused(["--config", str(cfg)], tiny_model_dir, tmp_path, capsys, f"config file {cfg}", needle)


def test_nesting_up_to_the_bound_reaches_the_config_check(tiny_model_dir, tmp_path, capsys):
    """32 deep is read and refused by the field's own check, not by the depth bound."""
    _refused(["stop=" + "[" * 32 + "]" * 32], tiny_model_dir, tmp_path, capsys, "stop.0: Input should be")


@pytest.mark.parametrize("seed", [2**64, -(2**64), 2**62 + 1])
@pytest.mark.parametrize("command", ["train", "sft"])
def test_seed_beyond_torch_is_refused_up_front(seed, command, tiny_model_dir, tmp_path, capsys):
    _refused([f"seed={seed}"], tiny_model_dir, tmp_path, capsys, "seed: Input should be", command=command)


def test_compare_seeds_beyond_torch_are_refused(tmp_path, capsys):
    out = tmp_path / "cmp"
    rc = main(["compare", f"seeds=[0,{2**64}]", f"output_dir={out}"])
    _one_line(rc, capsys.readouterr().err.strip(), "rloo compare: error: ", "seeds.1: Input should be less")
    assert not out.exists()


def test_seeds_at_the_bound_are_taken():
    for seed in (2**62, -(2**62), 0):
        assert RLConfig(policy="x", seed=seed).seed == seed


@pytest.mark.parametrize("steps", [1_000_000_001, 2**64])
def test_absurd_step_counts_are_refused(steps, tiny_model_dir, tmp_path, capsys):
    _refused([f"steps={steps}"], tiny_model_dir, tmp_path, capsys, "steps: Input should be less than or equal to")


@pytest.mark.parametrize("command", ["train", "pipeline"])
def test_is_clip_beyond_float32_is_refused(command, tiny_model_dir, tmp_path, capsys):
    key = "rl.is_clip" if command == "pipeline" else "is_clip"
    args = [f"{key}=1.0e308", f"{key.replace('clip', 'correction')}=cispo"]
    args += ["rl.max_staleness=1"] if command == "pipeline" else ["max_staleness=1"]
    _refused(args, tiny_model_dir, tmp_path, capsys, f"{key}: 1e+308 is beyond float32's range", command=command)


def test_is_clip_at_float32_max_is_taken():
    assert RLConfig(policy="x", is_clip=3.4e38, max_staleness=1).is_clip == 3.4e38


def _drawn(cfg: RLConfig, monkeypatch) -> tuple[int, list[str]]:
    """How many training prompts the built-in task's list is drawn with, and the list."""
    asked = []
    task = get_task(cfg.task)
    real = type(task).examples

    def examples(self, split, n, seed=0):
        if split == "train":
            asked.append(n)
        return real(self, split, min(n, 4) if n > 10**4 else n, seed)  # the test needs the count, not the list

    monkeypatch.setattr(type(task), "examples", examples)
    models = SimpleNamespace(scorer=None, tokenizer=None)
    prompts, _ = evalset.train_and_eval_prompts(cfg, task, None, models)  # type: ignore[arg-type]
    return asked[0], prompts


def test_the_prompt_list_is_bounded(monkeypatch):
    """steps=1000000000 drew steps x batch_size prompts before any output; now at most
    MAX_DRAWN_PROMPTS, and a run below the bound draws exactly as before (the same prompts)."""
    cfg = RLConfig(policy="x", steps=1_000_000, batch_size=64, eval_prompts=2)
    assert _drawn(cfg, monkeypatch)[0] == evalset.MAX_DRAWN_PROMPTS
    small = cfg.model_copy(update={"steps": 3, "batch_size": 5})
    n, prompts = _drawn(small, monkeypatch)
    assert n == 15 and prompts == [e.prompt for e in get_task(cfg.task).examples("train", 15, seed=cfg.seed)]
