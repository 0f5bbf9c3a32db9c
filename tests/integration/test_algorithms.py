"""Every method trains through the shared loop (API and CLI), on tiny models, in a few steps."""

from __future__ import annotations

import json
import math

import pytest
import torch
from transformers import AutoModelForCausalLM

from rloo import RLConfig, train
from rloo.cli import main
from rloo.config import METHOD_SPECS, OFFLINE_ALGORITHMS, ONLINE_ALGORITHMS, ArchConfig, Sampling
from rloo.modeling.loading import build_llama
from rloo.runtime.checkpoint.verify import latest_checkpoint, load_state
from rloo.tasks import get_task
from rloo.tasks.tokenizer import build_tokenizer
from tolerance import ELEMENTWISE, TINY_MODEL_FORWARD, tolerance

ONLINE = list(ONLINE_ALGORITHMS)  # from the method table (rloo.config.methods)
OFFLINE = list(OFFLINE_ALGORITHMS)
PROMPTS = ["post : job rent tl;dr :", "post : exam car tl;dr :", "post : loan sister tl;dr :"]


def _reward_short(prompts, completions):
    return [-len(c.split()) / 10 for c in completions]


def _cfg(tiny_model_dir, out, **kw):
    base = dict(
        policy=str(tiny_model_dir),
        output_dir=out,
        steps=2,
        batch_size=2,
        k=2,
        max_new_tokens=5,
        lr=1e-3,
        warmup_steps=0,
        eval_every=None,
        save_every=None,
    )
    return RLConfig(**(base | kw))


def _head(algorithm: str) -> dict:
    """A value head instead of a separate value model, for the methods that have one (faster)."""
    return {"value_model": "head"} if "value_model" in METHOD_SPECS[algorithm].settings.model_fields else {}


def _changed(before_dir, after_dir) -> bool:
    a = AutoModelForCausalLM.from_pretrained(before_dir).state_dict()
    b = AutoModelForCausalLM.from_pretrained(after_dir).state_dict()
    return any(not torch.equal(a[k], b[k]) for k in a)


def test_ppo_logs_clip_fraction_and_value_loss(tiny_model_dir, tmp_path):
    cfg = _cfg(tiny_model_dir, tmp_path / "ppo", algorithm="ppo", algo={"ppo_epochs": 3, "value_model": "head"})
    hist = train(cfg, prompts=PROMPTS, reward_fn=_reward_short).history
    assert all(0.0 <= h["ppo/clipfrac"] <= 1.0 and h["loss/value"] >= 0 for h in hist)


def test_rloo_ablations_run_and_default_is_the_papers_step(tiny_model_dir, tmp_path):
    from rloo.algorithms import make_algorithm
    from rloo.algorithms.rloo import rloo_step

    assert make_algorithm(_cfg(tiny_model_dir, tmp_path / "x"), None).step is rloo_step
    for name, algo in {
        "token_kl": {"kl_level": "token"},
        "k3": {"kl_estimator": "k3"},
        "clip": {"rloo_clip": True},
    }.items():
        cfg = _cfg(tiny_model_dir, tmp_path / name, algo=algo, beta=0.5)
        result = train(cfg, prompts=PROMPTS, reward_fn=_reward_short)
        assert _changed(tiny_model_dir, result.model_path), name


def test_reinforce_baseline_and_ppo_value_model_are_checkpointed(tiny_model_dir, tmp_path):
    cfg = _cfg(tiny_model_dir, tmp_path / "r", algorithm="reinforce", save_every=1, steps=2)
    hist = train(cfg, prompts=PROMPTS, reward_fn=_reward_short).history
    state = load_state(latest_checkpoint(tmp_path / "r"))
    # baseline after 2 batches: m * R1-mean-start + ... ; it must be the one the loop would use next
    assert state["algorithm"]["baseline"].dim() == 0
    # the first batch is centred on its own mean, so its logged baseline is that batch's mean reward
    # float32 means of 4 rewards and a 2-term moving average: a few roundings of the rewards' scale
    # (|R| < 1 here: -words/10 for <= 5 words, plus a KL term of the first 2 steps)
    tol = tolerance(None, ELEMENTWISE, scale=1.0)
    assert hist[0]["reinforce/baseline"] == pytest.approx(hist[0]["reward/total"], abs=tol)
    m = cfg.algorithm_settings.baseline_momentum
    b1 = hist[0]["reward/total"]
    assert hist[1]["reinforce/baseline"] == pytest.approx(b1, abs=tol)  # m*b1 + (1-m)*b1
    expected = m * b1 + (1 - m) * hist[1]["reward/total"]
    assert float(state["algorithm"]["baseline"]) == pytest.approx(expected, abs=tol)
    cfg = _cfg(tiny_model_dir, tmp_path / "p", algorithm="ppo", save_every=1, algo={"value_model": "head"})
    train(cfg, prompts=PROMPTS, reward_fn=_reward_short)
    st = load_state(latest_checkpoint(tmp_path / "p"))["algorithm"]
    assert {"value_model", "value_optimizer"} <= set(st)
    resumed = _cfg(tiny_model_dir, tmp_path / "p", algorithm="ppo", save_every=1, steps=3, algo={"value_model": "head"})
    train(resumed, prompts=PROMPTS, reward_fn=_reward_short, resume=True)


def test_raft_trains_on_the_argmax(tiny_model_dir, tmp_path, monkeypatch):
    # the SFT loss must see exactly the best-reward completion of each prompt
    import rloo.algorithms.raft as raft

    seen = {}
    real = raft.sft_loss

    def spy(lp, mask):
        seen["rows"] = mask.shape[0]
        return real(lp, mask)

    captured = {}
    real_rows = raft.raft_rows

    def rows_spy(rewards, k):
        r = real_rows(rewards, k)
        captured["rewards"], captured["rows"] = rewards.clone(), r.clone()
        return r

    monkeypatch.setattr(raft, "sft_loss", spy)
    monkeypatch.setattr(raft, "raft_rows", rows_spy)
    cfg = _cfg(tiny_model_dir, tmp_path / "raft", algorithm="raft", k=3, steps=1)
    train(cfg, prompts=PROMPTS, reward_fn=_reward_short)
    rewards = captured["rewards"].view(-1, 3)
    assert seen["rows"] == rewards.shape[0]
    for b, row in enumerate(captured["rows"].tolist()):
        assert row // 3 == b and rewards[b, row % 3] == rewards[b].max()


def test_raft_rows_on_numbers():
    from rloo.algorithms.raft import raft_rows

    # prompt 0: rewards [0.1, 0.9, 0.3] -> row 1; prompt 1: [2, 2, -1] -> first max, row 3 + 0
    rows = raft_rows(torch.tensor([0.1, 0.9, 0.3, 2.0, 2.0, -1.0]), k=3)
    assert rows.tolist() == [1, 3]


@pytest.fixture(scope="module")
def tiny_dialogue_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny-dialogue") / "model"
    tok = build_tokenizer(get_task("dialogue"))
    build_llama(
        ArchConfig(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64, max_position_embeddings=96),
        tok,
        seed=0,
    ).save_pretrained(path)
    tok.save_pretrained(path)
    return path


@pytest.mark.parametrize("algorithm", ONLINE + OFFLINE)
def test_every_method_trains_through_the_cli_and_samples_through_the_backend(
    algorithm, tiny_dialogue_dir, tmp_path, capsys, monkeypatch
):
    """One `rloo train` per method (in process), 2 steps on the dialogue task: the policy changes, every
    step's numbers are finite and none was skipped, the final evaluation is logged. generation=vllm
    puts a sampler in Models (a stand-in here: rloo's own rollout, counting calls and weight syncs);
    every online method must sample with it (they once quietly used rloo's sampler instead, all but
    rloo itself), and the loop must sync it after each step."""
    from rloo.training import rl

    made = []
    monkeypatch.setattr(rl, "_vllm_sampler", lambda cfg, tok, path: made.append(_CountingSampler(cfg, tok)) or made[-1])
    # the tiny causal LM doubles as a (random) reward model and the separate value model's start
    rc = main(
        [
            "train",
            f"algorithm={algorithm}",
            "task=dialogue",
            f"policy={tiny_dialogue_dir}",
            f"reward_model={tiny_dialogue_dir}",
            f"output_dir={tmp_path / 'r'}",
            "steps=2",
            "batch_size=2",
            "k=2",
            "max_new_tokens=4",
            "eval_every=null",
            "eval_prompts=4",
            "eval.batch_size=4",
            "save_every=null",
        ]
        + (["algorithm_settings.dpo_pairs=8", "algorithm_settings.dpo_batch_size=4"] if algorithm in OFFLINE else [])
    )
    assert rc == 0, capsys.readouterr().err
    recs = [json.loads(x) for x in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]
    assert "eval/win_rate" in recs[-1]
    assert _changed(tiny_dialogue_dir, tmp_path / "r" / "model"), f"{algorithm} did not change the policy"
    if algorithm in OFFLINE:  # dpo trains on preference pairs: no sampler, no rollout
        assert not made
        return
    steps = [r for r in recs if "reward/score" in r]
    assert len(steps) == 2
    # metrics.jsonl writes a non-finite number as null (rloo.runtime.tracking.log)
    assert all(v is not None and math.isfinite(v) for r in steps for v in r.values())
    assert all(r["guard/skipped"] == 0.0 for r in steps)
    assert [(s.calls, s.syncs) for s in made] == [(2, 2)]


def test_dpo_uses_the_reward_models_pairs(tiny_model_dir, tmp_path):
    from rloo.training.dpo import load_pairs

    rm_dir = tmp_path / "reward"
    (rm_dir / "model").mkdir(parents=True)
    pairs = [["post : job rent tl;dr :", "job rent", "exam"], ["post : exam car tl;dr :", "exam car", "job"]] * 4
    (rm_dir / "pairs.jsonl").write_text("".join(json.dumps(p) + "\n" for p in pairs))
    cfg = _cfg(
        tiny_model_dir,
        tmp_path / "dpo",
        algorithm="dpo",
        eval_prompts=4,
        reward_model=str(rm_dir / "model"),
        algo={"dpo_pairs": 8, "dpo_batch_size": 4},
        eval={"batch_size": 4},
    )
    assert load_pairs(cfg, get_task("summarize")) == [tuple(p) for p in pairs]
    # no reward model here (the folder has none), so train without it: fresh reference pairs
    result = train(cfg.model_copy(update={"reward_model": None}))
    losses = [h["loss/dpo"] for h in result.history if "loss/dpo" in h]
    # policy == ref at start, so the loss is -log sigmoid(0) = log 2 up to float32 rounding: the
    # reference pass runs in other batches (other padding), its summed log-probs (< 256 in size:
    # two completions of < 16 tokens, |log p| < 8) differ by the forward bound; the loss moves by
    # beta/2 per unit of margin
    tol = tolerance(None, TINY_MODEL_FORWARD, scale=cfg.algorithm_settings.dpo_beta / 2 * 256)
    assert len(losses) == 2 and losses[0] == pytest.approx(math.log(2), abs=tol)
    assert _changed(tiny_model_dir, result.model_path)


def test_reward_stage_writes_the_pairs_dpo_reads(tiny_model_dir, tmp_path):
    from rloo.config import RewardConfig
    from rloo.training.reward import train_reward

    cfg = RewardConfig(
        sft_model=str(tiny_model_dir), output_dir=tmp_path / "rm", num_pairs=16, eval_pairs=4, epochs=1, batch_size=8
    )
    train_reward(cfg)
    lines = (tmp_path / "rm" / "pairs.jsonl").read_text().splitlines()
    assert len(lines) == 16 and len(json.loads(lines[0])) == 3


class _CountingSampler:
    """Stands in for generation=vllm's sampler: rloo's own rollout, counting the calls and weight syncs."""

    def __init__(self, cfg, tokenizer):
        self.cfg, self.tokenizer, self.calls, self.syncs = cfg, tokenizer, 0, 0

    def __call__(self, policy, prompts, rows=None, generator=None):
        from rloo.rollout import rollout

        self.calls += 1
        c = self.cfg
        return rollout(
            policy,
            self.tokenizer,
            prompts,
            c.k,
            Sampling(c.max_new_tokens, c.max_prompt_tokens),
            generator=generator,
        )

    def sync(self, policy):
        self.syncs += 1
