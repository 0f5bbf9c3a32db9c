"""What the API promises a Python caller: arguments it cannot use are refused, not ignored; error
messages name the API's keywords (the CLI's flags only on the command line); logged learning rates
are the ones the updates used; a run with top_p < 1 says once that it trains on a biased quantity."""

from __future__ import annotations

import json
import math

import pytest

from rloo import ConfigError, RLConfig, RlooError, SFTConfig, sft, train
from rloo.training.common import prepare_output_dir

PROMPTS = ["post : job rent tl;dr :", "post : exam car tl;dr :"]


def _cfg(tiny_model_dir, out, **kw):
    base = dict(
        policy=str(tiny_model_dir),
        output_dir=out,
        steps=1,
        batch_size=2,
        k=2,
        max_new_tokens=4,
        lr=1e-3,
        warmup_steps=0,
        eval_every=None,
        save_every=None,
    )
    return RLConfig(**(base | kw))


@pytest.mark.parametrize("given", [("prompts",), ("reward_fn",), ("prompts", "reward_fn")])
def test_dpo_refuses_prompts_and_reward_fn_instead_of_ignoring_them(given, tiny_model_dir, tmp_path):
    calls = []

    def reward_fn(prompts, completions):
        calls.append(1)
        return [0.0] * len(completions)

    kw = {"prompts": PROMPTS, "reward_fn": reward_fn}
    with pytest.raises(ConfigError) as exc:
        # tiny DPO settings, so that without the refusal the run ends quickly and the test fails
        cfg = _cfg(
            tiny_model_dir,
            tmp_path / "dpo",
            algorithm="dpo",
            eval_prompts=2,
            eval={"batch_size": 2},
            algo={"dpo_pairs": 4, "dpo_batch_size": 2, "dpo_epochs": 1},
        )
        train(cfg, **{g: kw[g] for g in given})
    msg = str(exc.value)
    assert "algorithm='dpo'" in msg and all(f"{g}=" in msg for g in given), msg
    assert calls == [] and not (tmp_path / "dpo").exists()


def test_grpo_k1_error_names_grpo():
    with pytest.raises(ConfigError, match=r"grpo needs k >= 2 .*got k=1") as exc:
        RLConfig(policy="p", algorithm="grpo", k=1)
    assert "leave-one-out" not in str(exc.value)
    with pytest.raises(ConfigError, match=r"leave-one-out needs k >= 2 .*got k=1"):
        RLConfig(policy="p", algorithm="rloo", k=1)


def test_folder_in_use_error_names_api_keywords_from_python_and_flags_on_the_cli(tiny_model_dir, tmp_path):
    cfg = _cfg(tiny_model_dir, tmp_path / "run")
    prepare_output_dir(cfg)  # the folder now holds this run
    with pytest.raises(RlooError) as exc:
        train(cfg, prompts=PROMPTS, reward_fn=lambda p, c: [0.0] * len(c))
    msg = str(exc.value)
    assert "pass resume=True to continue it or overwrite=True to replace it" in msg and "--resume" not in msg, msg
    from rloo.errors import cli_options

    with cli_options(), pytest.raises(RlooError, match="pass --resume to continue it or --overwrite to replace it"):
        prepare_output_dir(cfg, can_resume=True)
    with pytest.raises(RlooError, match="pass overwrite=True to replace it"):  # the flag is back off
        prepare_output_dir(cfg)


def test_logged_lr_is_the_rate_the_step_used(tiny_model_dir, tmp_path):
    """Warm-up over 3 steps: steps 1, 2, 3 update with lr/3, 2lr/3, lr (the scheduler's factor
    before it is stepped); the next step's rate (2lr/3, lr, lr) is what used to be logged."""
    cfg = _cfg(tiny_model_dir, tmp_path / "run", steps=3, warmup_steps=3)
    hist = train(cfg, prompts=PROMPTS, reward_fn=lambda p, c: [float(len(x)) for x in c]).history
    assert [h["lr"] for h in hist if "lr" in h] == pytest.approx([1e-3 / 3, 2e-3 / 3, 1e-3], rel=1e-12)


def test_sft_logs_the_rate_the_step_used(tiny_model_dir, tmp_path):
    """3 steps, warm-up 1, cosine to 10% over the remaining 2: factors 1, 1, 0.55 for steps 1-3
    (the values after each scheduler step, 1, 0.55, 0.1, are the next steps')."""
    cfg = SFTConfig(
        model=str(tiny_model_dir), output_dir=tmp_path / "sft", num_examples=12, batch_size=4, epochs=1, lr=1e-3
    )
    sft(cfg)
    recs = [json.loads(x) for x in (tmp_path / "sft" / "metrics.jsonl").read_text().splitlines()]
    factor = [1.0, 1.0, 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi / 2))]
    assert [r["lr"] for r in recs if "lr" in r] == pytest.approx([1e-3 * f for f in factor], rel=1e-12)


@pytest.mark.parametrize("top_p,under", [(0.9, "full"), (0.9, None), (1.0, None)])
def test_top_p_below_one_warns_once(top_p, under, tiny_model_dir, tmp_path, capsys):
    train(
        _cfg(tiny_model_dir, tmp_path / "run", steps=2, top_p=top_p, logprobs_under=under),
        prompts=PROMPTS,
        reward_fn=lambda p, c: [0.0] * len(c),
    )
    err = capsys.readouterr().err
    # one note for every setting that shapes the sample away from the trained policy
    # (rloo.rollout.decoding.off_policy_note); by default (logprobs_under=truncated) top_p does not
    shaped = top_p < 1 and under == "full"
    assert err.count(f"note: top_p={top_p} samples from a shaped distribution") == (1 if shaped else 0), err
