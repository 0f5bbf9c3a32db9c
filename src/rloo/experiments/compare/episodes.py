"""`rloo compare` on the tasks played as episodes (calculator, guess; docs/agents.md): how a cell judges
its policies, and the report's tables and plot.

A cell's SFT model and every method's final policy play the same held-out prompts, eval.pass_samples
episodes each, with the same sampling noise (seed 20000 + seed): the success rate (pass@1, the
headline; rloo.tasks.plays_episodes says which tasks are judged so), turns, tool calls, reward and
truncations per episode (rloo.eval.episodes). There is no reward model (the environment gives the
reward), no win rate, no gradient-variance measurement (it is the reward model's gradient) and no
equal-KL / equal-compute view: those read the win rate and KL of periodic held-out evaluations along
training, which an episode run's periodic evaluation does not measure (it plays episodes: success
rate, turns, tool calls; rloo.training.evalset). The training batches' own episode reward and KL (per
policy tokens) are logged every step: the plot shows them, and the tables give the KL of the last steps.
The cell's evaluation prompts are counted as `rloo eval env=` counts them (`episode_prompt_cuts`): a
line says those cut to max_prompt_tokens, more than max_cut_share of them is refused before any policy
is judged, and the cell's cuts.json records the counts.
"""

from __future__ import annotations

from pathlib import Path

from rloo.config import CompareConfig, RLConfig
from rloo.config.methods import DEFAULT_METHOD
from rloo.data.lengths import save_cuts
from rloo.eval.episodes import evaluate_episodes
from rloo.eval.passk import paired_pass_difference
from rloo.experiments.compare.eval import CellJudge
from rloo.experiments.compare.plots import _grid, _legend, _methods_run, _plt, _save
from rloo.experiments.compare.tables import _fmt, _fmt_signed
from rloo.modeling.loading import frozen, load_policy
from rloo.training.agents import episode_prompt_cuts
from rloo.training.common import env_spec

# (result key, column) of the episode tables; success_rate is the headline
COLUMNS = (
    ("success_rate", "success rate"),
    ("turns", "turns"),
    ("tool_calls", "tool calls"),
    ("reward", "reward / episode"),
    ("truncated", "truncated"),
)


def episode_judge(cfg: CompareConfig, rl: RLConfig, task, examples, root: Path, seed: int) -> CellJudge:
    """Episodes of rl.env (its env_settings' limits) on the examples' prompts (see the module docstring).
    `root`: the cell's folder, where its cuts.json goes."""
    sft, tok = load_policy(str(root / "sft" / "model"), device=cfg.device, dtype=cfg.dtype)
    spec = env_spec(rl, tok)
    prompts = [e.prompt for e in examples]
    save_cuts(root, episode_prompt_cuts(rl, spec, tok, sft, prompts))  # every policy plays these prompts

    def evaluate(policy, _sft: dict | None) -> dict:
        policy.eval()
        e = evaluate_episodes(
            policy,
            tok,
            spec,
            prompts,
            cfg.eval.sampling(cfg.rl.max_new_tokens, cfg.max_prompt_tokens),
            n=cfg.eval.pass_samples,
            seed=20_000 + seed,
            batch_size=cfg.eval.batch_size,
            threshold=task.success_threshold,
        )
        summary = {k: v for k, v in e.summary().items() if k != "pass_at_1"}
        return {"success_rate": e.pass_at_1, **summary, "success_counts": e.counts, "examples": e.examples}

    def line(res: dict) -> str:
        return (
            f"success rate {res['success_rate']:.3f}, turns {res['turns']:.2f}, tool calls {res['tool_calls']:.2f}, "
            f"reward {res['reward']:.3f}"
        )

    return CellJudge(frozen(sft), tok, evaluate, line)


def train_kl(metrics: list[dict]) -> float | None:
    """Mean `kl/ref` (eq. 1's KL summed over the policy's tokens, per episode) over the last tenth of a
    run's logged training steps (at least one); None when none is logged."""
    kls = [m["kl/ref"] for m in sorted(metrics, key=lambda m: m["step"]) if "kl/ref" in m]
    last = kls[-max(1, len(kls) // 10) :]
    return sum(last) / len(last) if last else None


def results_table(cfg, data: dict, task: str) -> str:
    """Per method (and the SFT model): the COLUMNS, the training KL and seconds; mean ± 95% t-interval
    over seeds."""
    head = [c for _, c in COLUMNS] + ["KL (train, last steps)", "train s", "seeds"]
    rows = ["| method | " + " | ".join(head) + " |", "|---" * (len(head) + 1) + "|"]
    for name in ["sft", *cfg.methods]:
        rs = data[task].get(name, [])
        if not rs:
            continue
        kls = [k for r in rs if (k := train_kl(r["metrics"])) is not None]
        cells = [_fmt([r[key] for r in rs]) for key, _ in COLUMNS]
        cells += [_fmt(kls), _fmt([r["seconds"] for r in rs if "seconds" in r]), str(len(rs))]
        rows.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def paired_table(cfg, data: dict, task: str, base: str = DEFAULT_METHOD) -> str:
    """Each method (and the SFT model) minus `base`, paired by seed: same SFT model, prompts and
    evaluation noise. Mean ± 95% t-interval over seeds; with one seed, the success rate's difference
    carries the 95% normal interval over prompts (marked *: it leaves out training-seed noise)."""
    ref = {r["seed"]: r for r in data[task].get(base, [])}
    if not ref:
        return f"(needs {base})"
    head = [f"{c} − {base}" for _, c in COLUMNS[:4]] + ["seeds ahead (success)"]
    rows = ["| method | " + " | ".join(head) + " |", "|---" * (len(head) + 1) + "|"]
    for name in [n for n in ["sft", *cfg.methods] if n != base]:
        rs = [r for r in data[task].get(name, []) if r["seed"] in ref]
        if not rs:
            continue
        diffs = {key: [r[key] - ref[r["seed"]][key] for r in rs] for key, _ in COLUMNS[:4]}
        cells = [_fmt_signed(diffs[key]) for key, _ in COLUMNS[:4]]
        if len(rs) == 1:
            r = rs[0]
            m, h = paired_pass_difference(r["success_counts"], ref[r["seed"]]["success_counts"], r["n"], 1)
            cells[0] = f"{m:+.3f} ± {h:.3f}*" if h is not None else f"{m:+.3f}"
        cells.append(f"{sum(d > 0 for d in diffs['success_rate'])}/{len(rs)}")
        rows.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def episode_section(cfg, data: dict) -> list[str]:
    """The report's body for a study of episode tasks."""
    text = [
        f"The SFT model and each method's final policy play the same {cfg.eval.num_prompts} held-out prompts, "
        f"{cfg.eval.pass_samples} episodes each, with the same sampling noise per seed (rloo.eval.episodes). "
        "Success rate (pass@1) is the headline: the share of episodes whose reward reaches the task's success "
        "threshold; turns, tool calls, reward and truncations are per episode. KL (train, last steps): eq. 1's "
        "KL to the SFT model over the policy's tokens, on the training batches of the run's last tenth. "
        "Mean ± 95% t-interval over seeds (no interval with one seed). No reward model (the environment "
        "gives the reward), hence no gradient-variance measurement; no equal-KL or equal-compute view: they "
        "read held-out evaluations along training, which an episode run does not make (docs/compare.md).",
        "",
    ]
    for task in cfg.tasks:
        text += [f"## {task}", "", results_table(cfg, data, task), ""]
        sft = data[task].get("sft", [])
        plain = [r["no_tool_pass"] for r in sft if r.get("no_tool_pass") is not None and r["no_tool_share"] < 1]
        if plain:
            text += [f"No-tool baseline: the SFT model's episodes that called no tool succeed {_fmt(plain)}.", ""]
        text += [
            f"Differences from {DEFAULT_METHOD}, paired by seed ('seeds ahead': seeds where the method's success "
            f"rate is above {DEFAULT_METHOD}'s):",
            "",
            paired_table(cfg, data, task),
            "",
        ]
    return text


def training_curves(cfg, data: dict, path: Path) -> Path:
    """Per task: the training batches' mean episode reward (reward/score) and KL (kl/ref) per step,
    mean over seeds."""
    plt = _plt()
    fig, axes = _grid(plt, 2, len(cfg.tasks))
    for col, task in enumerate(cfg.tasks):
        for name, runs in _methods_run(cfg, data, task):
            for row, key in enumerate(("reward/score", "kl/ref")):
                per_seed = [{m["step"]: m[key] for m in run["metrics"] if key in m} for run in runs]
                steps = sorted(set.intersection(*(set(d) for d in per_seed)))
                axes[row][col].plot(steps, [sum(d[s] for d in per_seed) / len(per_seed) for s in steps], label=name)
        axes[0][col].set(title=f"{task}: episode reward of the training batches", xlabel="step", ylabel="reward")
        axes[1][col].set(title=f"{task}: KL to the SFT model (policy tokens)", xlabel="step", ylabel="KL")
        _legend(axes[0][col])
    return _save(plt, fig, path)
