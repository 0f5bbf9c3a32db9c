"""The losses that exponentiate a log-prob difference (PPO's ratio, GRPO's and Dr. GRPO's k3 KL)
take it only at real tokens: a log-prob of -1e4 at a masked position (padding, a multi-turn
observation) made exp(+1e4) = inf there, and the masked mean's gradient 0 * inf = NaN, though the
loss itself was finite. With the difference masked first, loss and gradient equal the unplanted
ones exactly (the real tokens' arithmetic is unchanged)."""

import pytest
import torch

from rloo.core.losses import dr_grpo_loss, grpo_loss, ppo_clip_loss

PLANTED = -1e4  # exp(1e4) overflows float64 (max ~e^709), let alone float32 (~e^88)


def _inputs():
    g = torch.Generator().manual_seed(0)
    lp = torch.randn(3, 4, generator=g, dtype=torch.float64) * 0.3 - 1.0
    old = lp + 0.1 * torch.randn(3, 4, generator=g, dtype=torch.float64)
    ref = lp + 0.1 * torch.randn(3, 4, generator=g, dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0], [1, 0, 1, 0]], dtype=torch.bool)  # [2] 1: an observation
    adv = torch.randn(3, generator=g, dtype=torch.float64)
    return {"lp": lp, "old": old, "ref": ref, "mask": mask, "adv": adv}


LOSSES = {
    "ppo": lambda x: ppo_clip_loss(x["lp"], x["old"], x["adv"], x["mask"], 0.2)[0],
    "grpo": lambda x: grpo_loss(x["lp"], x["old"], x["ref"], x["adv"], x["mask"], 0.2, 0.1)[0],
    "dr_grpo": lambda x: dr_grpo_loss(x["lp"], x["old"], x["ref"], x["adv"], x["mask"], 0.2, 0.1, 4.0)[0],
}


def _loss_and_grad(name: str, x: dict) -> tuple[torch.Tensor, torch.Tensor]:
    lp = x["lp"].clone().requires_grad_(True)
    loss = LOSSES[name](x | {"lp": lp})
    loss.backward()
    assert lp.grad is not None
    return loss.detach(), lp.grad


# planted in the policy's log-probs: k3's ref - lp = +1e4; in the old log-probs: the ratio's lp - old = +1e4
@pytest.mark.parametrize(
    "name,where", [("ppo", "old"), ("grpo", "lp"), ("grpo", "old"), ("dr_grpo", "lp"), ("dr_grpo", "old")]
)
def test_planted_log_prob_at_a_masked_position_changes_nothing(name, where):
    clean = _inputs()
    planted = clean | {where: clean[where].clone()}
    planted[where][1, 3] = PLANTED  # padding
    planted[where][2, 1] = PLANTED  # an observation between real tokens
    loss, grad = _loss_and_grad(name, planted)
    assert torch.isfinite(loss) and torch.isfinite(grad).all(), (loss, grad)
    ref_loss, ref_grad = _loss_and_grad(name, clean)
    assert torch.equal(loss, ref_loss) and torch.equal(grad, ref_grad)
