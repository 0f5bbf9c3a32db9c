"""Mixed precision's rules (rloo.runtime.precision): the probe's decision from its timings, what each
dtype resolves to per device, and the RLOO_AUTO_DTYPE pin. bf16 against fp32 numerically:
tests/equivalence/test_precision.py."""

from __future__ import annotations

import pytest
import torch

from rloo.errors import RlooError
from rloo.runtime import matmul_timing, precision
from rloo.runtime.precision import Precision, choose_bf16, resolve_precision, update_fraction


@pytest.fixture(autouse=True)
def _isa_unknown(monkeypatch):
    """These tests inject the probe's timings; the instruction-set rule that comes first would answer
    on x86 before any timing (tested on its own below), so the flags say "cannot tell"."""
    monkeypatch.setattr(precision, "cpu_flags", lambda: None)


def test_probe_rule_from_injected_timings():
    assert choose_bf16(10e-3, 4e-3)  # AVX512_BF16: 2.5x
    assert choose_bf16(3e-3, 2e-3)  # exactly 1.5x counts
    assert not choose_bf16(10e-3, 7e-3)  # 1.43x: not worth bf16's precision
    assert not choose_bf16(1e-3, 0.1)  # AVX2 only: emulated bf16, 100x slower
    assert not choose_bf16(0.0, 1e-3) and not choose_bf16(1e-3, float("nan"))


@pytest.mark.parametrize("timings,bf16", [((10e-3, 4e-3), True), ((1e-3, 0.1), False)])
def test_auto_on_cpu_follows_the_probe_once_and_logs_it(monkeypatch, capsys, timings, bf16):
    calls = []
    monkeypatch.delenv("RLOO_AUTO_DTYPE", raising=False)
    monkeypatch.setattr(precision, "time_matmuls", lambda *a, **k: calls.append(1) or timings)
    precision.cpu_bf16_probe.cache_clear()
    try:
        first, second = resolve_precision("auto", "cpu"), resolve_precision("auto", "cpu")
    finally:
        precision.cpu_bf16_probe.cache_clear()
    assert first == second and first.weights == torch.float32
    assert first.compute == (torch.bfloat16 if bf16 else None)
    assert len(calls) == 1, "the probe runs once per process"
    log = capsys.readouterr().err
    assert log.count("precision: CPU matmul") == 1 and ("bf16 autocast" in log) == bf16


def test_forced_dtypes_never_probe(monkeypatch):
    monkeypatch.delenv("RLOO_AUTO_DTYPE", raising=False)
    monkeypatch.setattr(precision, "cpu_bf16_probe", lambda *a: pytest.fail("probed for a forced dtype"))
    assert resolve_precision("float32", "cpu") == Precision("cpu", torch.float32, None, "dtype=float32")
    cpu_bf16 = resolve_precision("bfloat16", "cpu")
    assert (cpu_bf16.weights, cpu_bf16.compute) == (torch.float32, torch.bfloat16)  # fp32 master weights
    cuda = resolve_precision("auto", "cuda:1")
    assert (cuda.weights, cuda.compute) == (torch.float32, torch.bfloat16)  # fp32 masters on GPU too (issue 34)
    assert resolve_precision(torch.bfloat16, "cpu").weights == torch.bfloat16  # an explicit torch dtype


def test_environment_pin(monkeypatch):
    monkeypatch.setattr(precision, "cpu_bf16_probe", lambda *a: pytest.fail("probed despite the pin"))
    monkeypatch.setenv("RLOO_AUTO_DTYPE", "bfloat16")
    assert resolve_precision("auto", "cpu").compute == torch.bfloat16
    monkeypatch.setenv("RLOO_AUTO_DTYPE", "float32")
    assert resolve_precision("auto", "cpu").compute is None
    monkeypatch.setenv("RLOO_AUTO_DTYPE", "fp8")
    with pytest.raises(RlooError, match="RLOO_AUTO_DTYPE"):
        resolve_precision("auto", "cpu")


def test_auto_on_a_wide_model_follows_the_probe(monkeypatch):
    monkeypatch.delenv("RLOO_AUTO_DTYPE", raising=False)
    monkeypatch.setattr(precision, "time_matmuls", lambda *a, **k: (10e-3, 4e-3))
    precision.cpu_bf16_probe.cache_clear()
    try:
        assert resolve_precision("auto", "cpu", width=128).compute == torch.bfloat16
        assert resolve_precision("auto", "cpu", width=4096).compute == torch.bfloat16
    finally:
        precision.cpu_bf16_probe.cache_clear()


def test_a_narrow_model_keeps_float32_without_probing(monkeypatch, capsys):
    """Below MIN_BF16_WIDTH the answer is fixed (measured: the 64-wide `compare --quick` ran slower under
    bf16), so its numbers cannot depend on what a probe read under load."""
    monkeypatch.delenv("RLOO_AUTO_DTYPE", raising=False)
    monkeypatch.setattr(precision, "time_matmuls", lambda *a, **k: pytest.fail("probed a narrow model"))
    precision.cpu_bf16_probe.cache_clear()
    try:
        assert resolve_precision("auto", "cpu", width=64).compute is None
        assert resolve_precision("auto", "cpu", width=128 - 1).compute is None
    finally:
        precision.cpu_bf16_probe.cache_clear()
    assert "model width 64 < 128" in capsys.readouterr().err


def test_a_cpu_without_fast_bf16_logs_one_decision(monkeypatch, capsys):
    """An AVX2-only CPU (bf16 matmul ~0.03x fp32, measured): every stage runs fp32 and the log says why
    once: the probe's line, not also a width note for a narrower stage whose answer the probe already gave."""
    monkeypatch.delenv("RLOO_AUTO_DTYPE", raising=False)
    monkeypatch.setattr(precision, "time_matmuls", lambda *a, **k: (2e-3, 55e-3))
    precision.cpu_bf16_probe.cache_clear()
    precision._narrow_model_note.cache_clear()  # printed once per process: an earlier test may have printed it
    try:
        assert resolve_precision("auto", "cpu", width=128).compute is None  # a training stage: probes
        assert resolve_precision("auto", "cpu", width=128, min_width=256).compute is None  # a decoding stage
        assert resolve_precision("auto", "cpu", width=4096).compute is None
    finally:
        precision.cpu_bf16_probe.cache_clear()
    err = capsys.readouterr().err
    assert err.count("precision:") == 1 and "dtype=auto uses float32" in err and "width 128 <" not in err, err


def test_model_width_from_a_folder_or_the_built_in_arch(tmp_path):
    from types import SimpleNamespace

    from rloo.config import ArchConfig
    from rloo.runtime.precision import model_width

    (tmp_path / "gpt2").mkdir()
    (tmp_path / "gpt2" / "config.json").write_text('{"n_embd": 768}')
    (tmp_path / "llama").mkdir()
    (tmp_path / "llama" / "config.json").write_text('{"hidden_size": 2048}')
    assert model_width(SimpleNamespace(policy=str(tmp_path / "gpt2"))) == 768
    assert model_width(SimpleNamespace(model=None, sft_model=tmp_path / "llama")) == 2048
    assert model_width(SimpleNamespace(model=None, arch=ArchConfig(hidden_size=96))) == 96
    assert model_width(SimpleNamespace(sft=SimpleNamespace(arch=ArchConfig()))) == 128
    assert model_width(SimpleNamespace(policy="org/some-hub-model")) is None


def test_a_float32_stage_inside_a_bf16_one_runs_in_float32():
    """Stages nest (a compare cell's train inside compare): the inner stage's choice holds."""
    a = torch.ones(4, 4)
    with Precision("cpu", torch.float32, torch.bfloat16).autocast():
        assert (a @ a).dtype == torch.bfloat16
        with Precision("cpu", torch.float32, None).autocast():
            assert (a @ a).dtype == torch.float32


def test_loading_weights_never_probes(monkeypatch):
    """The weights' dtype under auto on CPU is fp32 whatever autocast decides: loading a model must not
    run (and log) the probe, whose decision belongs to the stage at its model's width."""
    from rloo.modeling.loading import resolve_dtype

    monkeypatch.delenv("RLOO_AUTO_DTYPE", raising=False)
    monkeypatch.setattr(precision, "cpu_bf16_probe", lambda *a: pytest.fail("probed to load weights"))
    assert resolve_dtype("auto", "cpu") == torch.float32


def test_decoding_stages_need_a_wider_model_for_bf16(monkeypatch):
    """At width 128 bf16 autocast pays for training stages but not for the decoding-bound ones (online
    RL, evaluation: docs/precision.md), which use MIN_BF16_WIDTH_SAMPLING; a stage nested in a bf16 one
    switches autocast off."""
    from types import SimpleNamespace

    from rloo.config import ArchConfig
    from rloo.runtime.precision import MIN_BF16_WIDTH, MIN_BF16_WIDTH_SAMPLING, stage_precision
    from rloo.training.evaluate import evaluate
    from rloo.training.rl import train

    monkeypatch.delenv("RLOO_AUTO_DTYPE", raising=False)
    monkeypatch.setattr(precision, "time_matmuls", lambda *a, **k: (10e-3, 4e-3))  # a CPU with fast bf16
    precision.cpu_bf16_probe.cache_clear()
    cfg = SimpleNamespace(dtype="auto", device="cpu", arch=ArchConfig(hidden_size=128))

    @stage_precision
    def training(cfg):
        return torch.is_autocast_enabled("cpu"), sampling(cfg)

    @stage_precision(min_width=MIN_BF16_WIDTH_SAMPLING)
    def sampling(cfg):
        return torch.is_autocast_enabled("cpu")

    try:
        assert training(cfg) == (True, False)
        wide = SimpleNamespace(dtype="auto", device="cpu", arch=ArchConfig(hidden_size=MIN_BF16_WIDTH_SAMPLING))
        assert sampling(wide) is True
    finally:
        precision.cpu_bf16_probe.cache_clear()
    assert MIN_BF16_WIDTH < MIN_BF16_WIDTH_SAMPLING
    for stage in (train, evaluate):
        assert getattr(stage, "min_bf16_width", None) == MIN_BF16_WIDTH_SAMPLING, stage


@pytest.mark.parametrize(
    "flags,bf16,reason",
    [
        ({"avx2", "fma"}, False, "neither avx512_bf16 nor amx_bf16"),
        ({"avx2", "avx512f"}, False, "neither avx512_bf16 nor amx_bf16"),
        ({"avx512f", "avx512_bf16"}, True, "avx512_bf16 without amx_bf16"),
        ({"avx512f", "avx512_bf16", "amx_tile", "amx_bf16"}, True, "amx_bf16"),
    ],
)
def test_an_x86_cpu_is_decided_by_its_flags_without_timing(monkeypatch, capsys, flags, bf16, reason):
    """On x86 the instruction set decides, never a timing, so a loaded machine cannot flip a run's
    numbers (7 identical runs once chose bf16 five times and fp32 twice); the reason is logged once
    and is the precision's `why` (what a run folder records)."""
    monkeypatch.delenv("RLOO_AUTO_DTYPE", raising=False)
    monkeypatch.setattr(precision, "cpu_flags", lambda: frozenset(flags))
    monkeypatch.setattr(precision, "time_matmuls", lambda *a, **k: pytest.fail("timed an x86 CPU"))
    precision.cpu_bf16_probe.cache_clear()
    precision._narrow_model_note.cache_clear()
    try:
        wide = resolve_precision("auto", "cpu", width=4096)
        assert resolve_precision("auto", "cpu", width=128, min_width=256).compute is None  # narrow for decoding
    finally:
        precision.cpu_bf16_probe.cache_clear()
    assert (wide.weights, wide.compute) == (torch.float32, torch.bfloat16 if bf16 else None)
    assert reason in wide.why, wide.why
    err = capsys.readouterr().err
    assert err.count(reason) == 1 and "CPU matmul" not in err, err


def test_where_the_flags_cannot_tell_the_median_of_alternated_timings_decides(monkeypatch):
    """Another architecture (or oneDNN capped by ONEDNN_MAX_CPU_ISA): timed, alternating fp32 and bf16,
    and decided by the medians, so one preempted try (here bf16's 0.5 s) does not flip the choice."""
    monkeypatch.delenv("RLOO_AUTO_DTYPE", raising=False)
    monkeypatch.setattr(precision, "cpu_flags", lambda: None)
    bf16_ticks = iter([4e-4, 4e-4, 4e-4, 0.5] + [4e-4] * 20)  # warm-up, 2 tries, one preempted, the rest
    order = []
    monkeypatch.setattr(
        matmul_timing,
        "_time_once",
        lambda a, b: order.append(a.dtype) or (1e-3 if a.dtype == torch.float32 else next(bf16_ticks)),
    )
    precision.cpu_bf16_probe.cache_clear()
    try:
        chosen = resolve_precision("auto", "cpu", width=4096)
    finally:
        precision.cpu_bf16_probe.cache_clear()
    assert chosen.compute == torch.bfloat16 and "probe: bf16 matmul 2.50x fp32" in chosen.why, chosen.why
    assert order[2:6] == [torch.float32, torch.bfloat16, torch.bfloat16, torch.float32]  # alternated


# ---- the CUDA branch, run on a CPU (issue 34) ------------------------------------------------


@pytest.mark.parametrize("name", ["auto", "bfloat16"])
def test_cuda_policy_keeps_every_update_at_a_fine_tuning_lr(name):
    """On CUDA `dtype=auto|bfloat16` stored bf16 weights stepped by AdamW directly: at the RLOO recipes'
    lr 1e-6 an update (~lr) is below half a bf16 ulp of a N(0, 0.02) weight (|w| 2^-9 ~ 4e-5) and
    rounds away, silently. The policy's CUDA branch (a function of the device type, no GPU needed)
    must store weights in which one step changes as many elements as in fp32 (all of them)."""
    policy = resolve_precision(name, "cuda")
    gen = torch.Generator().manual_seed(0)
    w, g = 0.02 * torch.randn(8192, generator=gen), torch.randn(8192, generator=gen)
    fp32 = update_fraction(w, g, lr=1e-6)
    assert fp32 == 1.0  # fp32's ulp at |w| <= 0.1 is <= 2^-27 ~ 7e-9, far below the ~1e-6 step
    assert update_fraction(w.to(policy.weights), g, lr=1e-6) == fp32
    assert policy.compute == torch.bfloat16  # the matmuls still run in bf16 (autocast)
    assert update_fraction(w.bfloat16(), g, lr=1e-6) < 0.05  # what pure bf16 weights keep


def test_loaders_store_fp32_weights_on_cuda():
    from rloo.modeling.loading import resolve_dtype

    assert resolve_dtype("auto", "cuda") == resolve_dtype("bfloat16", "cuda:1") == torch.float32


def test_float16_is_refused_in_one_line():
    """float16 without loss scaling underflows gradients; it was accepted (on CPU a long traceback)."""
    from rloo.config import RLConfig
    from rloo.config.base import FLOAT16_REFUSED

    with pytest.raises(RlooError, match="loss scaling"):
        resolve_precision("float16", "cuda")
    with pytest.raises(RlooError, match="loss scaling"):  # ConfigError, one line
        RLConfig(policy="p", dtype="float16")
    assert "\n" not in FLOAT16_REFUSED


def test_a_run_folder_records_what_dtype_ran_in_and_why(tmp_path, monkeypatch):
    """config.yaml's first line says what `dtype=auto` computed in and why (a comment: the file still
    loads as the run's settings); a stage nested in another records its own choice."""
    from pathlib import Path

    from rloo.config import ArchConfig, SFTConfig, load_config
    from rloo.runtime.precision import stage_precision
    from rloo.training.common import prepare_output_dir

    monkeypatch.delenv("RLOO_AUTO_DTYPE", raising=False)
    monkeypatch.setattr(precision, "cpu_flags", lambda: frozenset({"avx512f", "avx512_bf16", "amx_bf16"}))
    precision.cpu_bf16_probe.cache_clear()
    stage = stage_precision(prepare_output_dir)
    wide = SFTConfig(output_dir=tmp_path / "wide", arch=ArchConfig(hidden_size=128))
    narrow = SFTConfig(output_dir=tmp_path / "narrow", arch=ArchConfig(hidden_size=64))
    outer = wide.model_copy(update={"output_dir": tmp_path / "outer"})
    try:
        outs = [stage(wide), stage_precision(lambda cfg: (stage(narrow), prepare_output_dir(cfg))[1])(outer)]
    finally:
        precision.cpu_bf16_probe.cache_clear()
    outs = [Path(out) for out in outs]
    first = [(out / "config.yaml").read_text().splitlines()[0] for out in (*outs, tmp_path / "narrow")]
    assert first[0].startswith("# precision: bfloat16 (amx_bf16 in the CPU flags"), first
    assert first[1] == first[0]  # the outer stage's record, after the nested one ended
    assert first[2].startswith("# precision: float32 (model width 64 < 128)"), first
    assert load_config(SFTConfig, outs[0] / "config.yaml") == wide
