"""The tables of the `rloo compare` report, in markdown: results, differences paired by seed, pass@k,
PPO's GAE lambda and gradient variance, with the statistic they print (mean ± 95% t-interval over
seeds). They read the collected runs, data[task][method] = [result dict with its 'metrics' records,
one per seed]; the variance table reads each task's gradient_variance.json."""

from __future__ import annotations

import math
from pathlib import Path

from rloo.config.methods import DEFAULT_METHOD, spec_of_variant
from rloo.eval.passk import paired_pass_difference
from rloo.experiments.readback import read_variance
from rloo.experiments.tuning import base_of

# two-sided 95% Student-t quantiles t_{0.975, df}; the normal 1.96 beyond df = 30
_T975 = {
    1: 12.706,
    2: 4.303,
    3: 3.182,
    4: 2.776,
    5: 2.571,
    6: 2.447,
    7: 2.365,
    8: 2.306,
    9: 2.262,
    10: 2.228,
    15: 2.131,
    20: 2.086,
    30: 2.042,
}


def mean_ci(xs: list[float]) -> tuple[float, float | None]:
    """Mean and the half-width of its 95% t-interval over seeds (None for a single seed)."""
    n = len(xs)
    m = sum(xs) / n
    if n < 2:
        return m, None
    sd = math.sqrt(sum((x - m) ** 2 for x in xs) / (n - 1))
    t = _T975.get(n - 1) or next((v for d, v in sorted(_T975.items()) if d >= n - 1), 1.96)
    return m, t * sd / math.sqrt(n)


def _fmt(xs: list[float]) -> str:
    if not xs:
        return "-"
    m, h = mean_ci(xs)
    return f"{m:.3f}" if h is None else f"{m:.3f} ± {h:.3f}"


def results_table(cfg, data: dict) -> str:
    cols = []
    for task in cfg.tasks:
        cols += [f"{task}: win vs refs", f"{task}: win vs SFT", f"{task}: KL"]
    rows = ["| method | " + " | ".join(cols) + " | seeds |", "|---" * (len(cols) + 2) + "|"]
    for name in ["sft", *cfg.methods]:
        cells, seeds = [], 0
        for task in cfg.tasks:
            rs = data[task].get(name, [])
            seeds = max(seeds, len(rs))
            cells += [
                _fmt([r["win_rate"] for r in rs]),
                "(0.5)" if name == "sft" else _fmt([r["win_rate_vs_sft"] for r in rs if "win_rate_vs_sft" in r]),
                _fmt([r["kl"] for r in rs]),
            ]
        rows.append(f"| {name} | " + " | ".join(cells) + f" | {seeds} |")
    return "\n".join(rows)


def paired_differences(cfg, data: dict, base: str = DEFAULT_METHOD) -> str:
    """Each method's win rate minus `base`'s, paired by seed: the two share the SFT model, the reward
    model, the eval prompts and the eval sampling noise of that seed, so the seed-to-seed spread of
    those (large with tiny models) cancels and only the methods' own randomness is left."""
    names = [n for n in cfg.methods if n != base]
    if base not in cfg.methods or not names:
        return "(needs rloo and another method)"
    rows = [
        "| method | " + " | ".join(f"{t}: win vs refs − {base} | {t}: seeds ahead" for t in cfg.tasks) + " |",
        "|---" * (2 * len(cfg.tasks) + 1) + "|",
    ]
    for name in names:
        cells = []
        for task in cfg.tasks:
            ref = {r["seed"]: r["win_rate"] for r in data[task].get(base, [])}
            diffs = [r["win_rate"] - ref[r["seed"]] for r in data[task].get(name, []) if r["seed"] in ref]
            cells += [_fmt_signed(diffs), f"{sum(d > 0 for d in diffs)}/{len(diffs)}" if diffs else "-"]
        rows.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def _fmt_signed(xs: list[float]) -> str:
    if not xs:
        return "-"
    m, h = mean_ci(xs)
    return f"{m:+.3f}" if h is None else f"{m:+.3f} ± {h:.3f}"


def variance_table(out: Path, cfg) -> str:
    rows = []
    for task in cfg.tasks:
        f = out / "runs" / task / f"seed-{cfg.seeds[0]}" / "gradient_variance.json"
        if not f.exists():
            continue
        v = read_variance(f)  # not JSON, or `[]`: one line naming it
        if not rows:
            rows = [
                "| task | estimator | tr Cov(g) at SFT | noise/signal at SFT | tr Cov(g) at weak | "
                "noise/signal at weak |",
                "|---|---|---|---|---|---|",
            ]
        for est in v["sft"]:
            s, w = v["sft"][est], v["weak"][est]
            ns = lambda d: "-" if d["noise_to_signal"] is None else f"{d['noise_to_signal']:.2f}"  # noqa: E731
            rows.append(f"| {task} | {est} | {s['variance']:.3g} | {ns(s)} | {w['variance']:.3g} | {ns(w)} |")
    return "\n".join(rows) if rows else "(not measured)"


def ppo_lambda_table(cfg, data: dict) -> str:
    names = [n for n in cfg.methods if spec_of_variant(base_of(n)).value_model]
    rows = ["| task | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
    for task in cfg.tasks:
        rows.append(
            f"| {task} | " + " | ".join(_fmt([r["win_rate"] for r in data[task].get(n, [])]) for n in names) + " |"
        )
    return "\n".join(rows)


def pass_table(cfg, data: dict, task: str) -> str:
    """pass@k per method on a checker task: mean ± 95% t-interval over seeds, plus the zero-variance
    share of groups of k = rl.k at evaluation and during training (mean of groups/zero_variance)."""
    first = next(r for rs in data[task].values() for r in rs if "pass" in r)
    ks = list(first["pass"]["pass_at_k"])
    zk = str(cfg.rl.k) if str(cfg.rl.k) in first["pass"]["zero_variance"] else None
    head = (
        [f"pass@{k}" for k in ks]
        + ([f"zero-var@{zk} (eval)"] if zk else [])
        + ["zero-var (training)", "unparseable", "length", "seeds"]
    )
    rows = ["| method | " + " | ".join(head) + " |", "|---" * (len(head) + 1) + "|"]
    for name in ["sft", *cfg.methods]:
        rs = [r for r in data[task].get(name, []) if "pass" in r]
        if not rs:
            continue
        if len(rs) == 1:  # one seed: the interval over problems (it leaves out training-seed noise)
            cells = [
                f"{r['pass']['pass_at_k'][k]['mean']:.3f} ± {r['pass']['pass_at_k'][k]['ci95']:.3f}*"
                for r in rs
                for k in ks
            ]
        else:
            cells = [_fmt([r["pass"]["pass_at_k"][k]["mean"] for r in rs]) for k in ks]
        if zk:
            cells.append(_fmt([r["pass"]["zero_variance"][zk] for r in rs]))
        train_zero = [
            sum(v) / len(v)
            for r in rs
            if (v := [m["groups/zero_variance"] for m in r["metrics"] if "groups/zero_variance" in m])
        ]
        cells += [
            _fmt(train_zero),
            _fmt([r["pass"]["unparseable"] for r in rs]),
            _fmt([r["pass"]["length"] for r in rs]),
            str(len(rs)),
        ]
        rows.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def pass_differences(cfg, data: dict, task: str, base: str = DEFAULT_METHOD) -> str:
    """Each method's pass@1 and pass@8 minus `base`'s, paired by seed (same SFT model, problems and
    evaluation noise), mean ± 95% t-interval over seeds, and the seeds where it is ahead."""
    names = [n for n in ["sft", *cfg.methods] if n != base]
    ref = {r["seed"]: r["pass"]["pass_at_k"] for r in data[task].get(base, []) if "pass" in r}
    ks = [k for k in ("1", "8") if ref and k in next(iter(ref.values()))]
    rows = [
        "| method | " + " | ".join(f"pass@{k} − {base} | seeds ahead" for k in ks) + " |",
        "|---" * (2 * len(ks) + 1) + "|",
    ]
    counts = {r["seed"]: r.get("pass_counts") for r in data[task].get(base, []) if "pass" in r}
    for name in names:
        cells = []
        for k in ks:
            rs = [r for r in data[task].get(name, []) if "pass" in r and r["seed"] in ref]
            d = [r["pass"]["pass_at_k"][k]["mean"] - ref[r["seed"]][k]["mean"] for r in rs]
            if len(rs) == 1 and rs[0].get("pass_counts") and counts.get(rs[0]["seed"]):
                # one seed: paired over problems (same problems and evaluation noise)
                m, h = paired_pass_difference(rs[0]["pass_counts"], counts[rs[0]["seed"]], rs[0]["pass"]["n"], int(k))
                cells += [f"{m:+.3f} ± {h:.3f}*", f"{sum(x > 0 for x in d)}/{len(d)}"]
                continue
            cells += [_fmt_signed(d), f"{sum(x > 0 for x in d)}/{len(d)}" if d else "-"]
        rows.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(rows)
