"""rl.max_staleness / rl.is_correction / rl.is_clip: defaults, derived correction, refusals (docs/async.md)."""

import pytest

from rloo.config import CompareConfig, RLConfig
from rloo.errors import ConfigError, RlooError


def test_defaults_keep_the_paper_update():
    cfg = RLConfig(policy="x")
    assert (cfg.max_staleness, cfg.is_correction, cfg.is_clip) == (0, None, 2.0)
    assert cfg.off_policy_correction is None  # today's path
    assert RLConfig(policy="x", is_correction="none").off_policy_correction is None


def test_correction_is_derived_from_staleness():
    assert RLConfig(policy="x", max_staleness=1).off_policy_correction == "tis"
    assert RLConfig(policy="x", max_staleness=2, is_correction="mis_token").off_policy_correction == "mis_token"
    assert RLConfig(policy="x", max_staleness=1, is_correction="none").off_policy_correction == "none"
    assert RLConfig(policy="x", is_correction="mis").off_policy_correction == "mis"  # lag 0, mismatched sampler
    # raft trains on lagged samples as they are: no importance weight by default
    assert RLConfig(policy="x", algorithm="raft", max_staleness=1).off_policy_correction == "none"
    assert RLConfig(policy="x", algorithm="raft", is_correction="none").off_policy_correction is None
    # vLLM samples in the lagged samplers too: mu is the lagged engine's log-probs (rloo.rollout.versioned)
    assert RLConfig(policy="x", max_staleness=1, generation="vllm").off_policy_correction == "tis"


@pytest.mark.parametrize(
    "kw,words",
    [
        (dict(is_clip=1.0), "is_clip"),
        (dict(max_staleness=-1), "max_staleness"),
        (dict(is_correction="ppo"), "is_correction"),
        (dict(max_staleness=1, algorithm="dpo"), "dpo is offline"),
        (dict(is_correction="tis", algorithm="raft"), "raft trains on lagged samples as they are"),
        (dict(max_staleness=1, is_correction="mis_token", algorithm="raft"), "no tractable importance ratio"),
        (dict(producer_address="10.0.0.2:29511"), "set max_staleness >= 1"),
        (dict(is_kl="unweighted"), "is_kl=unweighted: for the importance-weighted update"),
        (dict(max_staleness=1, is_kl="unweighted", algorithm="reinforce"), "implemented for rloo only"),
        (dict(max_staleness=1, producer_address="10.0.0.2"), "expected HOST:PORT"),
        (dict(max_staleness=1, producer_address="host:99999"), "expected HOST:PORT"),
        # the bounded estimators (rloo.core.bounded): rloo only, is_kl=weighted, their own settings only
        (dict(max_staleness=1, is_correction="topr", algorithm="reinforce"), "topr are implemented for rloo only"),
        (dict(max_staleness=1, is_correction="cispo", algorithm="grpo"), "cispo are implemented for rloo only"),
        (dict(max_staleness=1, is_correction="asymre", is_kl="unweighted"), "asymre rewrites the whole advantage"),
        (dict(max_staleness=1, is_baseline_shift=0.2), "is_baseline_shift: for is_correction=asymre, got tis"),
        (dict(is_baseline_shift=0.2), "got none"),
        (dict(max_staleness=1, is_correction="tis_token", is_clip_low=0.5), "is_clip_low: for is_correction=cispo"),
        (dict(max_staleness=1, is_correction="topr", is_clip=3.0), "topr takes no C"),
        (dict(max_staleness=1, is_correction="clipped_surrogate", is_clip=3.0), "algorithm_settings.clip_eps"),
        (dict(max_staleness=1, is_correction="cispo", is_clip_low=1.0), "is_clip_low"),
        (dict(max_staleness=1, is_correction="asymre", is_baseline_shift=-0.1), "is_baseline_shift"),
    ],
)
def test_refusals_are_one_line(kw, words):
    with pytest.raises(ConfigError, match=words) as e:
        RLConfig(policy="x", **kw)
    assert "\n" not in str(e.value)


def test_bounded_estimators_take_their_settings():
    cfg = RLConfig(policy="x", max_staleness=4, is_correction="cispo", is_clip=1.5, is_clip_low=0.5)
    assert (cfg.off_policy_correction, cfg.is_clip, cfg.is_clip_low) == ("cispo", 1.5, 0.5)
    cfg = RLConfig(policy="x", is_correction="asymre", is_baseline_shift=0.3)  # lag 0: a mismatched sampler
    assert (cfg.off_policy_correction, cfg.is_baseline_shift) == ("asymre", 0.3)
    cfg = RLConfig(policy="x", max_staleness=1, is_correction="clipped_surrogate")
    assert cfg.off_policy_correction == "clipped_surrogate"
    for name in ("asymre", "topr", "cispo", "clipped_surrogate"):  # a run's saved config.yaml gives every key
        cfg = RLConfig(policy="x", max_staleness=1, is_correction=name)
        assert RLConfig(**cfg.model_dump()) == cfg


@pytest.mark.parametrize(
    "kw,words",
    [
        (dict(staleness=[1, 1]), "distinct"),
        (dict(staleness=[]), "distinct"),
        (dict(staleness=[0, 1], threads=1), "threads >= 2"),
    ],
)
def test_bench_staleness_is_refused_in_one_line(kw, words):
    from rloo.config.tools import BenchConfig

    assert BenchConfig().staleness == [0] and BenchConfig(staleness=[0, 1, 2]).staleness == [0, 1, 2]
    with pytest.raises(ConfigError, match=words):
        BenchConfig(**kw)


def test_a_producer_address_is_kept():
    assert RLConfig(policy="x", max_staleness=1, producer_address="10.0.0.2:29511").producer_address == "10.0.0.2:29511"
    assert RLConfig(policy="x").producer_address is None


def test_a_study_refuses_a_remote_producer():
    with pytest.raises(ConfigError, match="a study runs many RL stages"):
        CompareConfig(rl={"max_staleness": 1, "producer_address": "10.0.0.2:29511"})


@pytest.mark.parametrize(
    "kw,words",
    [
        (dict(max_staleness=1, parallel="fsdp"), "takes parallel=ddp"),
        (dict(max_staleness=1, producer_address="127.0.0.1:29512"), "leave producer_address unset"),
    ],
)
def test_torchrun_refusals_at_lag_are_one_line(kw, words):
    """Under torchrun (rloo.runtime.distributed.check_supported, before any model loads): FSDP's
    sharded weights cannot be copied whole into a sampler, and a remote producer serves one process."""
    from rloo.runtime.distributed import check_supported

    with pytest.raises(RlooError, match=words) as e:
        check_supported(RLConfig(policy="p", **kw), resume=False)
    assert "\n" not in str(e.value)
    check_supported(RLConfig(policy="p", max_staleness=1), resume=False)  # ddp, producer beside each process
