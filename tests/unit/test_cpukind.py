"""The CPU kind from its instruction-set flags (rloo.runtime.cpukind): pure rules of a flag set,
tested for each kind rloo runs on, and the reader of /proc/cpuinfo."""

from __future__ import annotations

import platform
from pathlib import Path

import pytest

from rloo.runtime.cpukind import auto_bf16, cpu_flags, cpu_kind, exactness_note, parse_flags

AVX2_AMD = frozenset({"sse4_2", "avx", "avx2", "fma"})
AVX512_AMD_BF16 = AVX2_AMD | {"avx512f", "avx512bw", "avx512_bf16"}
AVX512_INTEL = AVX2_AMD | {"avx512f", "avx512bw", "avx512_vnni"}
AMX_INTEL = AVX512_INTEL | {"avx512_bf16", "amx_tile", "amx_bf16", "amx_int8"}


@pytest.mark.parametrize(
    "flags,kind,bf16",
    [(AVX2_AMD, "avx2", False), (AVX512_INTEL, "avx512", False), (AVX512_AMD_BF16, "avx512_bf16", True)]
    + [(AMX_INTEL, "amx_bf16", True), (frozenset({"sse2"}), "older", False)],
)
def test_each_kind_and_its_auto_dtype(flags, kind, bf16):
    assert cpu_kind(flags) == kind
    assert auto_bf16(flags, env={})[0] is bf16


def test_unknown_flags_or_a_capped_onednn_leave_it_to_a_timing():
    assert cpu_kind(None) == "unknown"
    assert auto_bf16(None, env={}) == (None, "no x86 flags to read")
    bf16, why = auto_bf16(AMX_INTEL, env={"ONEDNN_MAX_CPU_ISA": "AVX2"})
    assert bf16 is None and "ONEDNN_MAX_CPU_ISA=AVX2" in why


def test_parse_flags_reads_the_first_processor():
    text = "processor\t: 0\nvendor_id\t: GenuineIntel\nflags\t\t: fpu avx2 amx_bf16\n\nprocessor\t: 1\nflags\t: fpu\n"
    assert parse_flags(text) == frozenset({"fpu", "avx2", "amx_bf16"})
    assert parse_flags("processor\t: 0\n") is None


def test_this_machine_is_read_from_proc_cpuinfo():
    """On x86 Linux the flags are /proc/cpuinfo's, not ATEN_CPU_CAPABILITY's (a kernel choice, not the CPU)."""
    flags = cpu_flags()
    if platform.machine().lower() not in ("x86_64", "amd64"):
        assert flags is None
    elif Path("/proc/cpuinfo").is_file():
        assert flags == parse_flags(Path("/proc/cpuinfo").read_text())


def test_what_a_resume_says_about_exactness():
    """Bit for bit (no line) with one thread anywhere, or the run's thread count on a kind where more
    threads were measured bitwise; one line otherwise, naming the way to bitwise repeats."""
    assert exactness_note(1, 1, "amx_bf16") is None
    assert exactness_note(2, 2, "avx512_bf16") is None
    assert exactness_note(2, None, "avx512_bf16") is None  # a checkpoint from before threads were recorded
    for kind in ("amx_bf16", "avx512", "avx2", "unknown"):
        note = exactness_note(2, 2, kind)
        assert note and kind in note and "OMP_NUM_THREADS=1" in note and "\n" not in note
    changed = exactness_note(2, 1, "avx512_bf16")
    assert changed and "the run used 1" in changed and "OMP_NUM_THREADS=1" in changed
