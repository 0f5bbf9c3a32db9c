"""rloo.runtime.weights.WeightRing: version v in slot v mod (N+1), refused once overwritten."""

import pytest
import torch

from rloo.runtime.weights import StaleVersion, WeightRing


def _model(value: float) -> torch.nn.Module:
    m = torch.nn.Linear(2, 1)
    with torch.no_grad():
        m.weight.fill_(value)
        m.bias.fill_(value)
    return m


def test_versions_live_in_their_slots_until_overwritten():
    ring, out = WeightRing(_model(0.0), staleness=2), _model(-1.0)
    for v in (1, 2, 3):  # version v holds weights v
        ring.publish(v, _model(float(v)))
    # slots of 3 copies: versions 1, 2, 3 are there; 0 was overwritten by 3 (3 mod 3 = 0)
    assert [ring.holds(v) for v in range(4)] == [False, True, True, True]
    ring.load_into(1, out)
    assert torch.equal(out.weight, torch.full((1, 2), 1.0)) and torch.equal(out.bias, torch.ones(1))
    with pytest.raises(StaleVersion, match="version 0 is not in the ring"):
        ring.load_into(0, out)


def test_a_resumed_ring_starts_at_its_step():
    ring = WeightRing(_model(5.0), staleness=1, version=7)
    assert ring.holds(7) and not ring.holds(6)
    with pytest.raises(ValueError, match="staleness"):
        WeightRing(_model(0.0), staleness=-1)
