"""docs/install.md's one-GPU quick start: its `rloo` commands are accepted by rloo's parser and
config (on the GPU, with the checker reading a column), and the vLLM default it states is the config's."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from rloo.cli import COMMANDS, build_parser
from rloo.config import RLConfig, load_config

ROOT = Path(__file__).resolve().parents[2]
INSTALL = (ROOT / "docs" / "install.md").read_text()


def _rloo_commands() -> list[list[str]]:
    section = INSTALL.split("## One GPU", 1)[1].split("\n## ", 1)[0]
    cmds = []
    for block in re.findall(r"```bash\n(.*?)```", section, flags=re.S):
        for line in block.replace("\\\n", " ").splitlines():
            if line.startswith("rloo "):
                cmds.append(shlex.split(line)[1:])
    return cmds


def test_the_quick_start_pipeline_is_a_valid_gpu_config():
    cmds = _rloo_commands()
    assert [c[0] for c in cmds] == ["pipeline"]
    ns = build_parser().parse_args(cmds[0])
    cfg = load_config(COMMANDS[ns.command][0], ns.config, ns.overrides)
    assert cfg.device == "cuda" and cfg.dataset is not None
    assert cfg.dataset.columns == {"prompt": "question", "completion": "answer"}
    assert cfg.rl.reward_fn == cfg.eval.judge == "gsm_check.py:accuracy"


def test_the_stated_vllm_default_is_the_configs():
    default = RLConfig.model_fields["vllm_gpu_memory_utilization"].default
    text = " ".join(INSTALL.split())  # line breaks are the doc's layout, not its content
    assert f"`rl.vllm_gpu_memory_utilization` of the GPU's memory, **{default} by default**" in text
