"""The README's table from `rloo bench generation=vllm`'s bench.json files, one per (shape, dtype):

    python benchmarks/studies/bench_vllm_table.py RUN/S-float32/bench.json RUN/S-bfloat16/bench.json ...

Per trainer the median s/step of the timed steps (each step's time in brackets), rloo's phases (TRL
reports none), completion tokens per second, peak RSS; "TRL s / its s" is TRL's median over this
trainer's; "own / vLLM" is rloo's own sampler over rloo-vllm, for the step and for the rollout phase.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

HEAD = (
    "| shape | dtype | trainer | s/step (median) [each step] | rollout / score / update s | weight sync s "
    "| completion tok/s | peak RSS GB | TRL s / its s | own s / vLLM s (step; rollout) | 1-min load before / after |"
)


def phases(r: dict) -> tuple[str, str]:
    p = r.get("phases_s", {})
    if not p:
        return "-", "-"
    main = " / ".join(f"{p.get(f'time/{k}', 0):.2f}" for k in ("rollout", "score", "update"))
    sync = p.get("time/weight_sync")
    return main, "-" if sync is None else f"{sync:.2f}"


def rows(bench: dict) -> list[str]:
    out = []
    for shape in bench["shapes"]:
        res, load = shape["results"], shape.get("load_avg", [None, None])
        trl = res.get("trl", {}).get("median_s")
        own = res.get("rloo")
        for name, r in res.items():
            main, sync = phases(r)
            steps = ", ".join(f"{t:.2f}" for t in r["times_s"])
            vs_trl = f"{trl / r['median_s']:.2f}x" if trl and name != "trl" else "-"
            vs_own = "-"
            if name == "rloo-vllm" and own:
                roll = own["phases_s"]["time/rollout"] / r["phases_s"]["time/rollout"]
                vs_own = f"**{own['median_s'] / r['median_s']:.2f}x**; {roll:.2f}x"
            ld = " / ".join("-" if x is None else f"{x:.1f}" for x in load)
            out.append(
                f"| {shape['shape']} | {shape['dtype']} | {name} | {r['median_s']:.2f} [{steps}] | {main} | {sync} "
                f"| {r['completion_tokens_per_s']:.0f} | {r['peak_rss_gb']:.2f} | {vs_trl} | {vs_own} | {ld} |"
            )
    return out


def main(paths: list[str]) -> None:
    print(HEAD)
    print("|" + "---|" * (HEAD.count("|") - 1))
    for p in paths:
        print("\n".join(rows(json.loads(Path(p).read_text()))))


if __name__ == "__main__":
    main(sys.argv[1:])
