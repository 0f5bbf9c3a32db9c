"""Mixed precision's rules (rloo.runtime.precision): the probe's decision from its timings, what each
dtype resolves to per device, and the RLOO_AUTO_DTYPE pin. bf16 against fp32 numerically:
tests/equivalence/test_precision.py."""

from __future__ import annotations

import pytest
import torch

from rloo.errors import RlooError
from rloo.runtime import precision
from rloo.runtime.precision import Precision, choose_bf16, resolve_precision


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
    monkeypatch.setattr(precision, "cpu_bf16_probe", lambda: pytest.fail("probed for a forced dtype"))
    assert resolve_precision("float32", "cpu") == Precision("cpu", torch.float32, None, "dtype=float32")
    cpu_bf16 = resolve_precision("bfloat16", "cpu")
    assert (cpu_bf16.weights, cpu_bf16.compute) == (torch.float32, torch.bfloat16)  # fp32 master weights
    cuda = resolve_precision("auto", "cuda:1")
    assert (cuda.weights, cuda.compute) == (torch.bfloat16, None)  # as before on GPU
    assert resolve_precision(torch.bfloat16, "cpu").weights == torch.bfloat16  # an explicit torch dtype


def test_environment_pin(monkeypatch):
    monkeypatch.setattr(precision, "cpu_bf16_probe", lambda: pytest.fail("probed despite the pin"))
    monkeypatch.setenv("RLOO_AUTO_DTYPE", "bfloat16")
    assert resolve_precision("auto", "cpu").compute == torch.bfloat16
    monkeypatch.setenv("RLOO_AUTO_DTYPE", "float32")
    assert resolve_precision("auto", "cpu").compute is None
    monkeypatch.setenv("RLOO_AUTO_DTYPE", "fp8")
    with pytest.raises(RlooError, match="RLOO_AUTO_DTYPE"):
        resolve_precision("auto", "cpu")
