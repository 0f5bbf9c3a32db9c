"""Issue 32 point 4 for the supervised stages: gradient accumulation (micro_batch_size) in SFT, the
reward model and DPO gives the whole batch's gradient, and LoRA in SFT and the reward model trains
only the adapters (and the reward model's score head), saves as RL saves, and the saved models load
in the next stage (SFT -> reward model -> RL)."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from rloo.config import LoraSettings, RewardConfig, RLConfig, SFTConfig
from rloo.errors import RlooError
from rloo.modeling.loading import load_policy, load_reward_model
from rloo.training.reward import train_reward
from rloo.training.rl import load_models
from rloo.training.sft import sft
from tolerance import TINY_MODEL_BACKWARD, assert_close

SMALL = dict(report_to="none", seed=0, dtype="float32")


def first_gradient(monkeypatch, run) -> list[torch.Tensor]:
    """The gradient the first clipping sees (after accumulation, before the step), of `run()`."""
    seen: list[list[torch.Tensor]] = []
    original = torch.nn.utils.clip_grad_norm_

    def recording(params, max_norm, *a, **kw):
        params = list(params)
        if not seen:
            seen.append([p.grad.detach().clone() for p in params if p.grad is not None])
        return original(params, max_norm, *a, **kw)

    with monkeypatch.context() as m:
        m.setattr(torch.nn.utils, "clip_grad_norm_", recording)
        run()
    return seen[0]


def same_gradient(a: list[torch.Tensor], b: list[torch.Tensor], what: str) -> None:
    assert len(a) == len(b) > 0
    scale = max(g.abs().max().item() for g in b)
    for x, y in zip(a, b, strict=True):
        assert_close(x, y, TINY_MODEL_BACKWARD, scale=scale, msg=what)


@pytest.fixture(scope="module")
def sft_dir(tmp_path_factory, tiny_model_dir):
    out = tmp_path_factory.mktemp("stage") / "sft"
    return sft(SFTConfig(model=str(tiny_model_dir), output_dir=out, num_examples=8, epochs=1, batch_size=8, **SMALL))


def test_sft_micro_batches_give_the_whole_batch_gradient(tiny_model_dir, tmp_path, monkeypatch):
    def run(micro):
        cfg = SFTConfig(
            model=str(tiny_model_dir), output_dir=tmp_path / str(micro), num_examples=12, epochs=1, batch_size=6
        )
        return lambda: sft(cfg.model_copy(update={"micro_batch_size": micro, **SMALL}))

    same_gradient(first_gradient(monkeypatch, run(4)), first_gradient(monkeypatch, run(None)), "sft")


def test_reward_micro_batches_give_the_whole_batch_gradient(sft_dir, tmp_path, monkeypatch):
    def run(micro):
        kw = dict(num_pairs=12, eval_pairs=4, policy_pairs=0.0, epochs=1, batch_size=6, micro_batch_size=micro)
        cfg = RewardConfig(sft_model=str(sft_dir.model_path), output_dir=tmp_path / str(micro), **kw, **SMALL)
        return lambda: train_reward(cfg)

    same_gradient(first_gradient(monkeypatch, run(4)), first_gradient(monkeypatch, run(None)), "reward")


def test_dpo_micro_batches_give_the_whole_batch_gradient(sft_dir, tmp_path, monkeypatch):
    from rloo import train

    def run(micro):
        algo = {"dpo_pairs": 6, "dpo_batch_size": 6}
        cfg = RLConfig(
            policy=str(sft_dir.model_path), output_dir=tmp_path / str(micro), algorithm="dpo", algo=algo,
            eval_every=None, eval_prompts=2, eval={"batch_size": 2}, batch_size=6, micro_batch_size=micro,
            max_new_tokens=4, **SMALL,
        )  # fmt: skip
        return lambda: train(cfg)

    same_gradient(first_gradient(monkeypatch, run(4)), first_gradient(monkeypatch, run(None)), "dpo")


def lora_trainable(monkeypatch, module) -> list:
    """The trainable parameters' names of each LoRA model `module` (a stage) builds (the optimizer
    takes exactly these: rloo.training.common.adamw), read when it is built (the save merges it)."""
    from rloo.modeling import lora

    built: list = []

    def keep(*a, **kw):
        model = lora.add_lora(*a, **kw)
        built.append([n for n, p in model.named_parameters() if p.requires_grad])
        return model

    monkeypatch.setattr(module, "add_lora", keep)
    return built


def test_sft_with_lora_trains_adapters_and_rl_starts_from_it(tiny_model_dir, tmp_path, monkeypatch):
    import rloo.training.sft as stage

    built = lora_trainable(monkeypatch, stage)
    cfg = SFTConfig(model=str(tiny_model_dir), output_dir=tmp_path / "sft", num_examples=8, epochs=1, batch_size=4)
    result = sft(cfg.model_copy(update={"lora": LoraSettings(r=2, alpha=4), **SMALL}))
    names = built[0]
    assert names and all("lora_A" in n or "lora_B" in n for n in names), names
    assert not (result.model_path / "adapter_config.json").exists()  # lora.save=merged: a plain model
    merged, _ = load_policy(str(result.model_path))
    base = dict(load_policy(str(tiny_model_dir))[0].named_parameters())
    changed = [n for n, p in merged.named_parameters() if not torch.equal(p, base[n])]
    assert changed and all("proj" in n or "mlp" in n for n in changed), changed  # adapted linears only
    # RL starts from it: the policy and the reference are the SFT result
    rl = RLConfig(policy=str(result.model_path), output_dir=tmp_path / "rl", **SMALL)
    models = load_models(rl, reward_fn=lambda p, c: [0.0] * len(c))
    for (n, p), (_, q) in zip(models.policy.named_parameters(), merged.named_parameters(), strict=True):
        assert torch.equal(p, q), n


def test_reward_model_with_lora_trains_its_head_and_saved_adapters_load(sft_dir, tmp_path, monkeypatch):
    import rloo.training.reward as stage

    built = lora_trainable(monkeypatch, stage)
    kw = dict(num_pairs=8, eval_pairs=4, policy_pairs=0.0, epochs=1, batch_size=4, **SMALL)
    lora = LoraSettings(r=2, alpha=4, save="adapter")
    res = train_reward(RewardConfig(sft_model=str(sft_dir.model_path), output_dir=tmp_path / "rm", lora=lora, **kw))
    names = built[0]
    assert any("score" in n for n in names), names  # the fresh head is trained in full
    assert all("lora_A" in n or "lora_B" in n or "score" in n for n in names), names
    saved = load_file(res.model_path / "adapter_model.safetensors")
    assert any("score" in k for k in saved) and any("lora_A" in k for k in saved)  # the head is saved with them
    cfg = json.loads((res.model_path / "adapter_config.json").read_text())
    assert "score" in cfg["modules_to_save"] and cfg["base_model_name_or_path"].startswith("/")
    rm, tok = load_reward_model(str(res.model_path))  # a plain model: adapters and trained head merged in
    head = next(v for k, v in saved.items() if "score" in k)
    assert torch.equal(rm.score.weight, head)
    # and the RL stage scores with it
    rl = RLConfig(policy=str(sft_dir.model_path), reward_model=str(res.model_path), output_dir=tmp_path / "rl", **SMALL)
    models = load_models(rl)
    assert models.scorer is not None
    assert torch.isfinite(models.scorer.score_texts(["post : job tl;dr :"], ["job rent"])).all()


def test_sft_lora_adapter_save_needs_a_model_on_disk(tmp_path):
    cfg = SFTConfig(output_dir=tmp_path / "s", lora=LoraSettings(save="adapter"), num_examples=4, **SMALL)
    with pytest.raises(RlooError, match="lora.save=adapter needs model=PATH"):
        sft(cfg)


def test_pipeline_runs_with_lora_and_micro_batches_in_every_stage(tmp_path):
    """`rloo pipeline` end to end: SFT with LoRA (merged) feeds the reward model (LoRA, saved as
    adapters) and RL; RL loads both; every stage accumulates micro-batches with a remainder."""
    from rloo.cli import main

    tiny = [f"sft.arch.{k}={v}" for k, v in (("hidden_size", 32), ("num_layers", 2), ("num_heads", 2))]
    rc = main(
        ["pipeline", f"output_dir={tmp_path / 'p'}", "report_to=none", "sft.num_examples=32", "sft.epochs=1",
         "sft.batch_size=16", "sft.micro_batch_size=5", "sft.lora.r=4", "sft.arch.intermediate_size=64", *tiny,
         "reward.num_pairs=16", "reward.eval_pairs=4", "reward.batch_size=16", "reward.micro_batch_size=6",
         "reward.lora.r=4", "reward.lora.save=adapter", "rl.steps=2", "rl.batch_size=4", "rl.micro_batch_size=3",
         "rl.k=2", "rl.eval_every=null", "rl.save_every=null", "rl.eval_prompts=4", "eval.num_prompts=4",
         "eval.batch_size=4"]
    )  # fmt: skip
    assert rc == 0
    out = tmp_path / "p"
    assert not (out / "sft" / "model" / "adapter_config.json").exists()  # merged: a plain model
    assert (out / "reward" / "model" / "adapter_config.json").exists()
    assert (out / "rl" / "model" / "model.safetensors").exists() and (out / "eval").is_dir()
