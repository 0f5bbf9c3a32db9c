"""A reward given as module:function on the command line trains a policy whose mean reward rises."""

from __future__ import annotations

import json
import sys
import textwrap

from rloo.cli import main


def test_cli_reward_function_raises_mean_reward(tiny_model_dir, tmp_path, monkeypatch, capsys):
    (tmp_path / "brevity.py").write_text(
        textwrap.dedent("""
        def score(prompts, completions):
            return [-len(c.split()) / 8 for c in completions]   # in [-1, 0]: shorter is better
    """)
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    out = tmp_path / "run"
    rc = main(
        [
            "train",
            f"policy={tiny_model_dir}",
            "reward_fn=brevity:score",
            f"output_dir={out}",
            "steps=24",
            "batch_size=8",
            "k=4",
            "max_new_tokens=8",
            "lr=3e-3",
            "warmup_steps=0",
            "beta=0.0",
            "eval_every=null",
            "eval_prompts=8",
            "save_every=null",
            "seed=0",
        ]
    )
    sys.modules.pop("brevity", None)
    assert rc == 0, capsys.readouterr().err
    recs = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    scores = [r["reward/score"] for r in recs if "reward/score" in r]
    assert len(scores) == 24
    first, last = sum(scores[:4]) / 4, sum(scores[-4:]) / 4
    # One step's mean is over 32 completions with score sd <= 0.5 (scores lie in [-1, 0]), so a 4-step
    # mean has sd <= 0.045 (0.5 / sqrt(128)) and the difference of two sd <= 0.064: without learning,
    # a rise of 0.25 (about 4 sd) would happen by chance with probability < 1e-4. Seed 0 gives ~0.43.
    print(f"mean score over the first 4 steps {first:.3f}, last 4 steps {last:.3f}")
    assert last - first > 0.25, (first, last, scores)
