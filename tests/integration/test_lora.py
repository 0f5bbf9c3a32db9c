"""LoRA through peft: only adapter weights train, and the reference is the adapter-disabled model."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("peft")

from rloo import RLConfig, train  # noqa: E402
from rloo.config import LoraSettings, Sampling  # noqa: E402
from rloo.modeling.forward import completion_logprobs  # noqa: E402
from rloo.modeling.loading import load_policy  # noqa: E402
from rloo.rollout import rollout  # noqa: E402
from rloo.training.rl import load_models  # noqa: E402
from tolerance import TINY_MODEL_FORWARD, assert_close  # noqa: E402

PROMPTS = ["post : job rent tl;dr :", "post : exam car tl;dr :", "post : loan sister dog tl;dr :"]


def _short(prompts, completions):
    return [-len(c.split()) / 10 for c in completions]


def _cfg(model_dir, out, save="merged", steps=2):
    return RLConfig(
        policy=str(model_dir),
        output_dir=out,
        steps=steps,
        batch_size=3,
        k=2,
        max_new_tokens=5,
        lr=5e-2,
        warmup_steps=0,
        eval_every=None,
        save_every=None,
        lora=LoraSettings(r=4, save=save),
    )


def test_only_adapters_change_and_reference_is_adapters_off(tiny_model_dir, tmp_path):
    cfg = _cfg(tiny_model_dir, tmp_path / "unused")
    models = load_models(cfg, reward_fn=_short)
    base = {k: v.clone() for k, v in models.policy.state_dict().items() if "lora_" not in k}
    trainable = {n for n, p in models.policy.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n for n in trainable)
    from rloo.algorithms.rloo import rloo_step
    from rloo.training.common import adamw

    opt = adamw(models.policy.parameters(), cfg.lr)
    for _ in range(2):
        rloo_step(models, opt, PROMPTS, cfg, torch.Generator().manual_seed(0))
    after = models.policy.state_dict()
    assert all(torch.equal(after[k], v) for k, v in base.items()), "a non-adapter weight changed"
    assert any(after[k].abs().max() > 0 for k in after if "lora_B" in k), "adapters did not train"
    # reference log-probs == a fresh copy of the starting model's; the policy's now differ
    fresh, tok = load_policy(str(tiny_model_dir))
    roll = rollout(models.policy, tok, PROMPTS, 2, Sampling(5, 16), generator=torch.Generator().manual_seed(1))
    args = (roll.prompt_ids, roll.prompt_mask, roll.completion_ids, roll.completion_mask)
    m = roll.completion_mask
    ref_lp = completion_logprobs(models.ref, *args)[m]
    with torch.no_grad():
        fresh_lp = completion_logprobs(fresh, *args)[m]
        pol_lp = completion_logprobs(models.policy, *args)[m]
    assert_close(ref_lp, fresh_lp, TINY_MODEL_FORWARD)  # adapters off vs no adapters: other arithmetic
    assert (pol_lp - fresh_lp).abs().max() > 1e-3


@pytest.mark.parametrize("save", ["merged", "adapter"])
def test_lora_save_and_load_again(save, tiny_model_dir, tmp_path):
    res = train(_cfg(tiny_model_dir, tmp_path / save, save=save), prompts=PROMPTS, reward_fn=_short)
    files = {p.name for p in res.model_path.iterdir()}
    if save == "adapter":
        assert "adapter_config.json" in files and "model.safetensors" not in files
    else:
        assert "model.safetensors" in files and "adapter_config.json" not in files
    model, tok = load_policy(str(res.model_path))  # loads either way (peft installed)
    base, _ = load_policy(str(tiny_model_dir))
    ids = torch.tensor([tok("post : job rent tl;dr :")["input_ids"]])
    with torch.no_grad():
        diff = (model(input_ids=ids).logits - base(input_ids=ids).logits).abs().max()
    assert diff > 1e-4, "the saved policy equals the starting model: the adapters were lost"


def test_saved_adapters_name_their_base_absolutely(tiny_model_dir, tmp_path, monkeypatch):
    """Trained from a relative policy path, the adapters still load from another folder."""
    import json

    monkeypatch.chdir(tiny_model_dir.parent)
    res = train(_cfg(tiny_model_dir.name, tmp_path / "run", save="adapter"), prompts=PROMPTS, reward_fn=_short)
    base = json.loads((res.model_path / "adapter_config.json").read_text())["base_model_name_or_path"]
    assert base == str(tiny_model_dir.resolve())
    monkeypatch.chdir(tmp_path)
    load_policy(str(res.model_path))
