"""`rloo bench`'s ratios and its table: what the JSON report and the printed summary say of each shape."""

from __future__ import annotations

import statistics


def ratios(res: dict, variants: dict[str, int]) -> dict:
    """TRL's s/step over each rloo trainer's ("speedups"; "speedup": at N = 0), N = 0's over N > 0's
    ("async_speedups") and rloo's own sampler's over rloo with vLLM's ("vllm_speedup"). `variants`:
    rloo's trainer names -> max_staleness (rloo-vllm at 0)."""
    out = {}
    if "trl" in res:
        out["speedups"] = {n: res["trl"]["median_s"] / res[n]["median_s"] for n in variants}
    if "rloo" in res and "trl" in res:
        out["speedup"] = out["speedups"]["rloo"]
        out["memory_ratio"] = res["rloo"]["peak_rss_gb"] / res["trl"]["peak_rss_gb"]
    if "rloo" in res and len(variants) > 1:
        out["async_speedups"] = {n: res["rloo"]["median_s"] / res[n]["median_s"] for n, v in variants.items() if v}
    if "rloo" in res and "rloo-vllm" in res:
        out["vllm_speedup"] = res["rloo"]["median_s"] / res["rloo-vllm"]["median_s"]
        out["vllm_rollout_speedup"] = _phase(res["rloo"], "rollout") / _phase(res["rloo-vllm"], "rollout")
    return out


def _phase(r: dict, name: str) -> float:
    return r["phases_s"].get(f"time/{name}", float("nan"))


def format_table(report: dict) -> str:
    """One row per shape and trainer: s/step, its rollout / score / update phases (rloo only; "-": TRL
    reports none), completion tokens/s, peak memory, FLOPs, and the ratios to the others."""
    lines = [
        f"machine: {report['machine']}; {report.get('device', 'cpu')} {report.get('dtype', 'float32')} "
        f"matmul peak {report['matmul_peak_gflops']:.1f} GFLOP/s",
        "shape trainer    s/step  rollout  score  update   tok/s  peak GB  GFLOP/step  GFLOP/s  %peak  "
        "speedup  mem ratio",
    ]
    for s in report["shapes"]:
        for name, r in s["results"].items():
            gf = r["flops_per_step"] / 1e9 if r["flops_per_step"] else float("nan")
            phases = "".join(
                f" {_phase(r, p):{w}.2f}" if f"time/{p}" in r["phases_s"] else f" {'-':>{w}s}"
                for p, w in (("rollout", 8), ("score", 6), ("update", 7))
            )
            extra = f"  {s['speedups'][name]:6.2f}x" if name in s.get("speedups", {}) else ""
            extra += f"  {s['memory_ratio']:8.2f}" if name == "rloo" and "memory_ratio" in s else ""
            if name in s.get("async_speedups", {}):  # N = 0's s/step over this N's
                extra += f"  ({s['async_speedups'][name]:.2f}x N=0's step, lag {statistics.median(r['lags']):g})"
            if name == "rloo-vllm" and "vllm_speedup" in s:  # rloo's own sampler's s/step over this one's
                extra += (
                    f"  ({s['vllm_speedup']:.2f}x own sampler's step, {s['vllm_rollout_speedup']:.2f}x its rollout)"
                )
            lines.append(
                f"{s['shape']:5s} {name:9s} {r['median_s']:7.2f}{phases} {r['completion_tokens_per_s']:7.0f} "
                f"{r['peak_rss_gb']:8.2f} {gf:11.1f} {(r['achieved_flops'] or 0) / 1e9:8.1f} "
                f"{100 * (r['achieved_frac_peak'] or 0):5.1f}%{extra}"
            )
    return "\n".join(lines)
