"""What a run fingerprints for its resume check (rloo.runtime.inputs.fingerprint): the inputs it
names, never the working folder. The reward stage handed `model=` keeps sft_model's default "",
which as a path is the working folder: every file under it (a checkout's .venv: 185k files, 10-60 s)
was hashed at each start. This test failed before the fix ({'sft_model': ''})."""

from __future__ import annotations

import os

from rloo.config import RewardConfig
from rloo.runtime.inputs.fingerprint import fingerprints, input_paths


def test_an_empty_path_is_no_input(tmp_path):
    cfg = RewardConfig(output_dir=str(tmp_path / "rm"), model=str(tmp_path / "m"))
    assert cfg.sft_model == "" and input_paths(cfg) == {"model": str(tmp_path / "m")}


def test_the_working_folder_is_not_hashed(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "big").write_bytes(os.urandom(16))
    hashed = []
    import rloo.runtime.inputs.fingerprint as fp

    real = fp._file_sha
    monkeypatch.setattr(fp, "_file_sha", lambda p: hashed.append(p) or real(p))
    assert fingerprints(RewardConfig(output_dir=str(tmp_path / "rm"))) == {}
    assert hashed == []
