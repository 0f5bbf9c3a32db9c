"""A model `generation=vllm` cannot run (one vLLM serves only through its Transformers backend) is
refused in one line, exit 2, before anything is written, at rl.max_staleness 0 and 1 alike, decided
from the model's config.json without importing vLLM. At max_staleness=1 the refusal came only at
step 1, from the producer's engine start, after the run folder and a step-0 checkpoint (issue 58).
The real engine's refusal: tests/integration/test_vllm.py (`make test-vllm`)."""

from __future__ import annotations

import json
import os
import sys

import pytest

from helpers.tiny_archs import save_tiny_lm
from rloo.cli import main

from .test_bad_input import TINY_RUN, _one_line
from .test_bad_input_table import RW, _tree


@pytest.fixture(scope="module")
def neox_dir(tmp_path_factory):
    return save_tiny_lm(tmp_path_factory.mktemp("neox") / "model", "gpt_neox")


@pytest.mark.parametrize("staleness", [0, 1])
def test_a_model_vllm_cannot_run_is_one_line_before_anything_is_written(neox_dir, tmp_path, capsys, staleness):
    out = tmp_path / "out"
    before = _tree(tmp_path)
    args = ["train", f"policy={neox_dir}", RW, *TINY_RUN, f"output_dir={out}", "generation=vllm"]
    rc = main([*args, f"max_staleness={staleness}"])
    _one_line(
        rc,
        capsys.readouterr().err.strip(),
        f"rloo train: error: vLLM cannot run policy '{neox_dir}' (GPT-NeoX, GPTNeoXForCausalLM)",
        "only through its Transformers backend",
        "use generation=sampler",
    )
    assert _tree(tmp_path) == before and not out.exists()
    assert "vllm" not in sys.modules  # decided without vLLM (not installed in the quick suite's venv)


def test_a_pipeline_from_such_a_model_is_refused_before_its_sft(neox_dir, tmp_path, capsys):
    """The pipeline's RL policy is its SFT model, trained from `model`: refused before `[1/4] SFT`."""
    out = tmp_path / "pipe"
    rc = main(["pipeline", f"model={neox_dir}", "rl.generation=vllm", "rl.max_staleness=1", f"output_dir={out}"])
    _one_line(rc, capsys.readouterr().err.strip(), f"rloo pipeline: error: vLLM cannot run model '{neox_dir}'")
    assert not out.exists()


def test_what_the_config_says_decides(tiny_model_dir, tmp_path):
    """A Llama is left to vLLM's engine start; a config that is not a JSON object, not UTF-8, missing,
    or a FIFO decides nothing here (the loader reports it) and is never blocked on."""
    # here, not at the top: the tests above also run on the code before the module existed
    from rloo.runtime.inputs.vllm_models import architectures, vllm_cannot_run

    assert architectures(str(tiny_model_dir)) == ["LlamaForCausalLM"]
    assert vllm_cannot_run(str(tiny_model_dir), "policy") is None
    assert vllm_cannot_run("EleutherAI/pythia-70m", "policy") is None  # a Hub name: no folder to read here
    for i, content in enumerate([b"[1, 2]", b'{"architectures": "GPTNeoXForCausalLM"}', b"\xff\xfe{", None]):
        folder = tmp_path / str(i)
        folder.mkdir()
        if content is not None:
            (folder / "config.json").write_bytes(content)
        assert vllm_cannot_run(str(folder), "policy") is None
    fifo = tmp_path / "fifo"
    fifo.mkdir()
    os.mkfifo(fifo / "config.json")
    assert architectures(str(fifo)) == []
    neox = tmp_path / "neox"
    neox.mkdir()
    (neox / "config.json").write_text(json.dumps({"architectures": ["GPTNeoXForCausalLM"]}))
    assert vllm_cannot_run(str(neox), "policy") is not None
