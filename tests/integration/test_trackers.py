"""What a run reports: the same scalars to TensorBoard and wandb (offline, no network), sample
tables (prompt, completion, score, KL, advantage), a printed line per periodic eval, an ETA in
plain-text progress lines, plots from `rloo train`, and only rank 0 printing."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from rloo.cli import main
from rloo.runtime.tracking.log import say
from rloo.runtime.tracking.progress_text import eta_seconds, format_duration

REWARD = "def words(prompts, completions):\n    return [len(c.split()) / 4 for c in completions]\n"


def _train(tmp_path, tiny_model_dir, *extra):
    (tmp_path / "r.py").write_text(REWARD)
    out = tmp_path / "run"
    rc = main(
        [
            "train",
            f"policy={tiny_model_dir}",
            f"reward_fn={tmp_path / 'r.py'}:words",
            f"output_dir={out}",
            "steps=4",
            "batch_size=2",
            "k=2",
            "max_new_tokens=4",
            "eval_every=2",
            "eval_prompts=4",
            "save_every=null",
            "sample_every=2",
            "seed=0",
            *extra,
        ]
    )
    return rc, out


def _tensorboard(out: Path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(out / "tensorboard"), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    scalars = {(e.step, tag): e.value for tag in acc.Tags()["scalars"] for e in acc.Scalars(tag)}
    texts = {e.step: e.tensor_proto.string_val[0].decode() for e in acc.Tensors("samples/text_summary")}
    return scalars, texts


def test_tensorboard_scalars_samples_eval_lines_eta_plots(tmp_path, tiny_model_dir, capsys):
    rc, out = _train(tmp_path, tiny_model_dir)
    err = capsys.readouterr().err
    assert rc == 0, err
    scalars, texts = _tensorboard(out)
    records = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    # every finite number of metrics.jsonl is in TensorBoard, rounded to float32 (relative error <= 2^-24)
    expected = {(r["step"], k): v for r in records for k, v in r.items() if k != "step" and v is not None}
    assert set(scalars) == set(expected)
    assert all(math.isclose(scalars[key], v, rel_tol=2**-24, abs_tol=1e-30) for key, v in expected.items())
    assert sorted(texts) == [2, 4]
    header = texts[2].splitlines()[0]
    assert header == "| prompt | completion | score | kl | advantage |" and len(texts[2].splitlines()) == 2 + 4
    # one printed line per eval: steps 0 and 2 (periodic) and 4 (final), naming the judge
    evals = [x for x in err.splitlines() if x.startswith("eval at step")]
    assert [x.split()[3] for x in evals] == ["0/4", "2/4", "4/4"], err
    assert all("(judge: gold judge (summarize))" in x for x in evals)
    # stderr is not a terminal here: plain progress lines carry the elapsed time and an ETA
    progress = [x for x in err.splitlines() if x.startswith("rloo step")]
    assert progress and all("elapsed" in x and "ETA" in x for x in progress), err
    assert {p.name for p in (out / "plots").iterdir()} >= {"reward.png", "kl.png", "win_rate.png"}


def _wandb_history(run_dir: Path) -> list[dict]:
    """History rows of an offline wandb run, read from its .wandb log (W&B's LevelDB-style record log:
    32 KiB blocks of records with a 7-byte header: crc32 (4), length (2), type (1: full, 2: first,
    3: middle, 4: last); a block tail shorter than a header is padding)."""
    import struct

    from wandb.proto import wandb_internal_pb2 as pb

    data = next(run_dir.glob("run-*.wandb")).read_bytes()
    assert data[:4] == b":W&B"
    pos, block, buf, rows = 7, 32768, b"", []
    while pos + 7 <= len(data):
        if block - pos % block < 7:
            pos += block - pos % block
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if kind == 0 and length == 0:
            break
        chunk, pos = data[pos + 7 : pos + 7 + length], pos + 7 + length
        buf = chunk if kind in (1, 2) else buf + chunk
        if kind in (1, 4):
            rec = pb.Record()
            rec.ParseFromString(buf)
            if rec.WhichOneof("record_type") == "history":
                rows.append({i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in rec.history.item})
            buf = b""
    return rows


def test_wandb_offline_same_scalars_as_tensorboard_and_samples_table(tmp_path, tiny_model_dir, monkeypatch, capsys):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_API_KEY", "")
    rc, out = _train(tmp_path, tiny_model_dir, "report_to=[tensorboard, wandb]")
    assert rc == 0, capsys.readouterr().err
    run_dir = next((out / "wandb").glob("offline-run-*"))
    history = _wandb_history(run_dir)
    wb = {
        (row["_step"], k): v
        for row in history
        for k, v in row.items()
        if not k.startswith("_") and not k.startswith("samples")
    }
    tb, _ = _tensorboard(out)
    assert set(wb) == set(tb)
    assert all(math.isclose(tb[key], v, rel_tol=2**-24, abs_tol=1e-30) for key, v in wb.items())
    tables = sorted((run_dir / "files" / "media" / "table").glob("samples_*.table.json"))
    assert len(tables) == 2
    table = json.loads(tables[-1].read_text())
    assert table["columns"] == ["prompt", "completion", "score", "kl", "advantage"] and len(table["data"]) == 4
    # the table holds what step 4 computed: its mean score is the logged reward/score, and the
    # leave-one-out advantages of each prompt's k=2 samples sum to zero (eq. 4)
    scores = [row[2] for row in table["data"]]
    assert math.isclose(sum(scores) / 4, tb[(4, "reward/score")], rel_tol=1e-6)
    adv = [row[4] for row in table["data"]]
    assert abs(adv[0] + adv[1]) < 1e-6 and abs(adv[2] + adv[3]) < 1e-6


def test_report_to_none_writes_no_tracker_files(tmp_path, tiny_model_dir, capsys):
    rc, out = _train(tmp_path, tiny_model_dir, "report_to=none")
    assert rc == 0, capsys.readouterr().err
    assert not (out / "tensorboard").exists() and not (out / "wandb").exists()
    assert (out / "metrics.jsonl").stat().st_size > 0


def test_only_rank_zero_speaks(monkeypatch, capsys):
    monkeypatch.setenv("RANK", "1")
    say("from rank 1")
    monkeypatch.setenv("RANK", "0")
    say("from rank 0")
    assert capsys.readouterr().err == "from rank 0\n"


def test_eta():
    # 10 of 100 steps in 20 s: 90 left at 2 s each
    assert eta_seconds(10, 100, 20.0) == 180.0 and eta_seconds(0, 100, 5.0) is None
    assert [format_duration(s) for s in (5, 65, 3725)] == ["5s", "1m05s", "1h02m"]


def test_sft_plain_progress_lines_with_eta(tmp_path, capsys):
    rc = main(
        [
            "sft",
            f"output_dir={tmp_path / 'sft'}",
            "num_examples=16",
            "epochs=1",
            "batch_size=4",
            "arch.hidden_size=16",
            "arch.num_layers=1",
            "arch.num_heads=2",
            "arch.intermediate_size=32",
            "report_to=none",
        ]
    )
    err = capsys.readouterr().err
    assert rc == 0, err
    lines = [x for x in err.splitlines() if x.startswith("sft ")]
    assert [x.split(":")[0] for x in lines] == ["sft 1/4", "sft 2/4", "sft 3/4", "sft 4/4"], err
    assert all("loss=" in x and "elapsed" in x and "ETA" in x for x in lines)


TINY_ARCH = {"hidden_size": 16, "num_layers": 1, "num_heads": 2, "intermediate_size": 32}


@pytest.mark.parametrize("stage", ["sft", "reward"])
def test_stopped_stage_keeps_its_tensorboard_records(stage, tmp_path, monkeypatch):
    """A stage stopped mid-run (Ctrl-C, an error) closes what it opened: no TensorBoard writer thread is
    left running in the process (a notebook would collect one per stopped run), and TensorBoard
    holds every step metrics.jsonl holds."""
    import threading

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    import rloo.training.reward as reward_mod
    import rloo.training.sft as sft_mod
    from rloo.config import RewardConfig, SFTConfig

    sft_dir = tmp_path / "sft"
    if stage == "reward":  # a reward model starts from an SFT model
        sft_mod.sft(
            SFTConfig.model_validate(dict(output_dir=sft_dir, num_examples=8, report_to="none", arch=TINY_ARCH))
        )
    mod = sft_mod if stage == "sft" else reward_mod
    real, calls = mod.supervised_step, [0]

    def stopped_at_the_fourth(*args, **kwargs):
        calls[0] += 1
        if calls[0] == 4:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(mod, "supervised_step", stopped_at_the_fourth)
    out = tmp_path / stage
    threads_before = set(threading.enumerate())
    with pytest.raises(KeyboardInterrupt):
        if stage == "sft":
            sft_mod.sft(SFTConfig.model_validate(dict(output_dir=out, num_examples=32, batch_size=4, arch=TINY_ARCH)))
        else:
            cfg = dict(sft_model=str(sft_dir / "model"), output_dir=out, num_pairs=32, eval_pairs=8, batch_size=4)
            reward_mod.train_reward(RewardConfig.model_validate(cfg | {"policy_pairs": 0}))
    records = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2, 3]
    left = [t.name for t in set(threading.enumerate()) - threads_before if t.is_alive()]
    assert not left, f"threads left running by the stopped {stage} stage: {left}"
    acc = EventAccumulator(str(out / "tensorboard"), size_guidance={"scalars": 0})
    acc.Reload()
    assert {e.step for tag in acc.Tags()["scalars"] for e in acc.Scalars(tag)} == {1, 2, 3}
