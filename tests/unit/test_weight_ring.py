"""rloo.runtime.link.weights.WeightRing: version v in slot v mod (N+1), refused once overwritten."""

import copy

import pytest
import torch

from rloo.runtime.link.weights import StaleVersion, WeightRing


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


def test_a_checkpoint_takes_the_older_versions_and_a_resumed_ring_gets_them_back():
    """Step 5 at N = 2: the next batches need versions 3 and 4 besides the policy (5); only the
    trainable entries are taken (the frozen bias is every version's), and refill puts them back."""
    ring = WeightRing(_model(0.0), staleness=2)
    for v in range(1, 6):
        ring.publish(v, _model(float(v)))
    policy = _model(5.0)
    policy.bias.requires_grad_(False)  # frozen, as a LoRA model's base weights
    older = ring.older_versions(5, policy)
    assert sorted(older) == [3, 4] and all(set(t) == {"weight"} for t in older.values())
    assert WeightRing(_model(0.0), staleness=2).older_versions(1, policy).keys() == {0}  # t < N: from 0
    resumed, out = WeightRing(policy, staleness=2, version=5), _model(-1.0)
    resumed.refill({v: {n: t.clone() for n, t in s.items()} for v, s in older.items()}, policy, 5)
    assert [resumed.holds(v) for v in (3, 4, 5)] == [True, True, True] and resumed.oldest() == 3
    resumed.load_into(3, out)
    assert torch.equal(out.weight, torch.full((1, 2), 3.0)) and torch.equal(out.bias, torch.full((1,), 5.0))


def test_refill_leaves_out_versions_another_n_saved():
    """A checkpoint of an N = 2 run resumed with N = 1: version 3 would take version 5's slot."""
    ring = WeightRing(_model(5.0), staleness=1, version=5)
    ring.refill({3: {"weight": torch.full((1, 2), 3.0)}, 4: {"weight": torch.full((1, 2), 4.0)}}, _model(5.0), 5)
    assert [ring.holds(v) for v in (3, 4, 5)] == [False, True, True]


def test_a_tied_parameter_is_saved_once_and_restored_from_its_twin():
    """A tied LM head: the checkpoint holds the shared tensor under one name; refill fills both."""
    model = torch.nn.Sequential(torch.nn.Embedding(3, 2), torch.nn.Linear(2, 3, bias=False))
    model[1].weight = model[0].weight
    ring = WeightRing(model, staleness=1)
    with torch.no_grad():
        model[0].weight.add_(1.0)
    ring.publish(1, model)
    older = ring.older_versions(1, model)
    assert set(older[0]) == {"0.weight"}
    resumed, out = WeightRing(model, staleness=1, version=1), copy.deepcopy(model)
    resumed.refill(older, model, 1)
    out[1].weight = torch.nn.Parameter(torch.zeros(3, 2))  # untied, to see both names filled
    resumed.load_into(0, out)
    assert torch.equal(out[0].weight, older[0]["0.weight"]) and torch.equal(out[1].weight, older[0]["0.weight"])


def test_a_version_is_marked_only_after_its_copies_have_landed(monkeypatch):
    """On CUDA `copy_` is queued on the stream while the version numbers are read by another process
    at once: publish (and refill) must wait for the copies (`_settle`) before they mark the slot, and
    load_into before it re-checks the version. CPU-checkable through the order of the calls."""
    import rloo.runtime.link.weights as weights

    ring, seen = WeightRing(_model(0.0), staleness=1), []
    monkeypatch.setattr(weights, "_settle", lambda tensors: seen.append(ring.versions.tolist()))
    ring.publish(1, _model(1.0))
    assert seen == [[0, -1]]  # slot 1 still unmarked while its copy settles
    ring.load_into(1, _model(-1.0))
    assert seen[-1] == [0, 1] and len(seen) == 2
    ring.refill({1: {"weight": torch.full((1, 2), 5.0), "bias": torch.ones(1)}}, _model(2.0), step=2)
    assert seen[-1] == [0, -1] and len(seen) == 3  # version 1 goes back into slot 1, not yet marked
