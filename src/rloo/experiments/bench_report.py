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


def summary(name: str, results: list[dict], peak: float, staleness: int | None) -> dict:
    times = [r["time"] for r in results]
    med = statistics.median(times)
    flops = statistics.median(r["flops"] for r in results)
    tokens = statistics.median(r["tokens"] for r in results)
    phases = {k: statistics.median(r["phases"][k] for r in results) for k in results[0]["phases"]}
    return {
        "trainer": name,
        "median_s": med,
        "times_s": times,
        "completion_tokens_per_s": tokens / med,
        "median_completion_tokens": tokens,
        "peak_rss_gb": max(r["rss_gb"] for r in results),
        "flops_per_step": flops,
        "achieved_flops": statistics.median(r["flops"] / r["time"] for r in results),
        "achieved_frac_peak": statistics.median(r["flops"] / r["time"] for r in results) / peak,
        "phases_s": phases,
        "median_prompt_width": statistics.median(r.get("prompt_width", 0) for r in results),
        "median_completion_width": statistics.median(r["width"] for r in results),
        "sampling_ms_per_decode_step": sampling_ms_per_decode_step(results),
    } | ({} if staleness is None else _async_summary(results, staleness))


SAMPLING_PHASES = ("time/rollout", "time/generate")
"""A step's sampling time: rloo's rollout phase (prompts tokenized, sampled, texts decoded), TRL's generation
(rloo.experiments.bench_trl: its `_generate_single_turn`, the device synchronised)."""


def sampling_ms_per_decode_step(results: list[dict]) -> float | None:
    """Median over the steps of sampling time / completion width (the positions each row was decoded at,
    the prefill's first token included): ms per decode step. None where a trainer reports no sampling
    phase (rloo at max_staleness > 0: its producer samples)."""
    per = [1e3 * r["phases"][k] / r["width"] for r in results for k in SAMPLING_PHASES if k in r["phases"]]
    return statistics.median(per) if per and len(per) == len(results) else None


def _async_summary(results: list[dict], staleness: int) -> dict:
    """rloo's max_staleness, and at N > 0 the lag of each timed batch and the producer's peak RSS."""
    if not staleness:
        return {"max_staleness": 0}
    rss = [r["producer_rss_gb"] for r in results if r.get("producer_rss_gb") is not None]
    lags = [r["lag"] for r in results]
    return {"max_staleness": staleness, "lags": lags, "producer_peak_rss_gb": max(rss) if rss else None}
