"""Every recipe YAML loads and validates, and the commands in docs/recipes.md are accepted by rloo."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from rloo.cli import COMMANDS, build_parser
from rloo.config import load_config

ROOT = Path(__file__).resolve().parents[2]
RECIPES = sorted((ROOT / "recipes").glob("*.yaml"))
STAGE = {"sft": "sft", "reward": "reward", "rloo": "train"}


def test_the_paper_settings_are_all_there():
    names = {p.stem for p in RECIPES}
    assert {"tldr-pythia-6.9b-rloo-k2", "tldr-pythia-6.9b-rloo-k4", "hh-pythia-6.9b-rloo", "hh-llama-7b-rloo"} <= names


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.stem)
def test_recipe_validates(path):
    stage = next(v for k, v in STAGE.items() if f"-{k}" in path.stem)
    cfg = load_config(COMMANDS[stage][0], path)
    if stage == "train":
        assert cfg.k in (2, 4) and cfg.dataset is not None and cfg.batch_size % 8 == 0
    text = path.read_text()
    # every hyperparameter line says where its value comes from
    keys = [ln for ln in text.splitlines() if re.match(r"^\s*\w+:\s*\S", ln) and not ln.strip().startswith("#")]
    unsourced = [
        ln
        for ln in keys
        if "[paper]" not in ln
        and "[ours]" not in ln
        and ln.split(":")[0].strip()
        not in {
            "output_dir",
            "device",
            "dtype",
            "format",
            "split",
            "name",
            "eval_split",
            "columns",
            "temperature",
            "batch_size",
            "judge",
            "reward_model",
            "sft_model",
            "policy",
            "gradient_checkpointing",
            "path",
        }
    ]
    assert not unsourced, unsourced


def _doc_commands() -> list[list[str]]:
    text = (ROOT / "docs" / "recipes.md").read_text()
    cmds = []
    for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S):
        for line in block.strip().splitlines():
            args = shlex.split(line)
            if args[0] == "torchrun":
                args = args[args.index("rloo.cli") + 1 :]
            else:
                assert args[0] == "rloo", line
                args = args[1:]
            cmds.append(args)
    return cmds


@pytest.mark.parametrize("args", _doc_commands(), ids=lambda a: " ".join(a)[:60])
def test_doc_command_is_accepted(args, monkeypatch):
    monkeypatch.chdir(ROOT)  # the docs run from the repository root
    ns = build_parser().parse_args(args)
    cfg = load_config(COMMANDS[ns.command][0], ns.config, ns.overrides)
    assert cfg.device == "cuda"
