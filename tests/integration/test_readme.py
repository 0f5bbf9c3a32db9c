"""The README's Python example runs as written (with the model path pointed at a local tiny model and
2 steps instead of 100: the API calls are the example's, the length is not what it shows)."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"


def test_readme_python_example_runs(tiny_model_dir, tmp_path, monkeypatch):
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    assert blocks, "README has no python example"
    code = blocks[0].replace("path/to/local/model", str(tiny_model_dir))
    # 100 steps of 16 prompts x 4 took 2 minutes of the default suite; 2 steps run every line of it
    assert "steps=100," in code, "the README example's steps changed: update this test's substitution"
    code = code.replace("steps=100,", "steps=2,")
    monkeypatch.chdir(tmp_path)
    scope: dict = {}
    exec(compile(code, "README.md", "exec"), scope)
    result = scope["result"]
    assert result.model_path.exists()
    assert (result.model_path / "model.safetensors").exists()
    assert result.history and result.history[-1]["step"] <= 2, result.history[-1]


def test_readme_starts_with_the_two_setup_commands():
    head = README.read_text().split("```bash", 1)[1].split("```", 1)[0]
    assert "make demo" in head and "make test" in head
    assert "make test" in (Path(__file__).resolve().parents[2] / ".ci" / "run").read_text()


def test_readme_stays_a_front_door():
    """The README gets a newcomer running in one screen; reference text and measurements live in docs/
    (issue 31: it had grown to 368 lines with a 20-line paragraph of dated timings before the API)."""
    lines = README.read_text().splitlines()
    assert len(lines) <= 150, f"README.md has {len(lines)} lines: move reference text to docs/"
    first_screen = "\n".join(lines[:25])
    assert "make demo" in first_screen and "make test" in first_screen
