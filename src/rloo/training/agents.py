"""`rloo eval env=...` and the evaluation stage of `rloo pipeline` on episodes (a task played as
episodes: calculator, guess; or the user's `env=file.py:Class`): the policy and the baseline (the SFT
model) each play the same held-out prompts, `pass_samples` episodes each (seeded), and the evaluation
reports pass@1 (success rate), turns and tool calls per episode, and the paired pass@1 difference
with its 95% interval (one seed: the interval is over prompts, not over seeds). It writes
results.json (the summary), report.md and samples.jsonl (every episode, the environment's text marked
`[env: ...]`), and, as every stage, cuts.json: the held-out prompts longer than max_prompt_tokens in
the chat template's frame, which keep their last tokens (rloo.data.lengths; said in one line, in
results.json's `data` when any, refused above max_cut_share before anything is written).

Success is an episode reward >= a threshold: a built-in task's `success_threshold`, else the
environment class's own `success_threshold` attribute when it has one, else 1."""

from __future__ import annotations

import json

from rloo.config import EvalConfig
from rloo.config.tasks import episode_tasks
from rloo.data.lengths import Cut, cut_metrics, report_prompt_cuts, save_cuts
from rloo.data.split import eval_records
from rloo.envs import EnvSpec
from rloo.eval.episodes import ENV_MARK, EpisodeEval, evaluate_episodes
from rloo.eval.passk import paired_pass_difference
from rloo.modeling.loading import load_policy, model_options
from rloo.runtime.inputs.user_code import load_callable
from rloo.runtime.runfolder.atomic import atomic_write_text
from rloo.runtime.tracking.log import say
from rloo.tasks import get_task
from rloo.tasks.base import EpisodeSuccess
from rloo.training.common import env_spec, prepare_output_dir


def evaluate_agents(ev: EvalConfig, *, overwrite: bool = False, name: str = "policy", base: str = "baseline") -> dict:
    """ev.policy (and ev.baseline) play episodes of ev.env on ev.num_prompts held-out prompts: the
    dataset's held-out rows, or the task's eval split. `name`: the policy's name in printed lines
    (the pipeline's method), `base` the baseline's (the pipeline's SFT). Returns the summary it writes
    to results.json."""
    assert ev.env is not None
    prompts = _prompts(ev)
    policy = load_policy(ev.policy, **model_options(ev))
    # counted before anything is written: too many cut is refused with nothing in the folder
    cuts = episode_prompt_cuts(ev, env_spec(ev, policy[1]), policy[1], policy[0], prompts)
    out = prepare_output_dir(ev, overwrite=overwrite)
    save_cuts(out, cuts)
    results = _play(ev, prompts, policy)
    summary: dict = {"env": ev.env} | {who: r.summary() | {"examples": r.examples} for who, r in results.items()}
    summary |= {"data": stats} if (stats := cut_metrics(cuts)) else {}  # as `rloo eval`'s summary.json
    lines = [f"episodes of {ev.env} on {len(prompts)} held-out prompts ({ev.pass_samples} each, seed {ev.seed}):"]
    if "baseline" in results:
        pol = results["policy"]
        diff, half = paired_pass_difference(pol.counts, results["baseline"].counts, ev.pass_samples, 1)
        summary["difference"] = {"pass@1": {"diff": diff, "ci95": half}}
        lines += _paired_lines(results["baseline"], pol, diff, half, (base, name))
    else:
        lines += _single_lines(results["policy"])
    lines += [f"  {name}: {x}" for x in results["policy"].examples[:2]]
    rows = episode_rows(prompts, results)
    atomic_write_text(out / "samples.jsonl", "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    atomic_write_text(out / "results.json", json.dumps(summary, indent=2))
    marks = f"Text the environment wrote is shown as {ENV_MARK.format('...')}; every episode: samples.jsonl."
    atomic_write_text(out / "report.md", "# Episodes\n\n" + "\n".join(lines) + f"\n\n{marks}\n")
    say("\n" + "\n".join(lines))
    return summary


def episode_prompt_cuts(cfg, spec: EnvSpec, tokenizer, model, prompts: list[str]) -> list[Cut]:
    """The evaluation's prompts as its episodes start them (in the chat template's frame,
    spec.prompt_frame), counted as every stage counts its prompts (rloo.data.lengths): said in one
    `eval: cut to the length limits` line, refused above cfg.max_cut_share. `cfg`: any config with
    max_prompt_tokens and max_cut_share (`rloo eval env=`'s, a `rloo compare` cell's RL stage's)."""
    return report_prompt_cuts("eval", tokenizer, cfg, prompts, [], model, spec.prompt_frame)


def _play(ev: EvalConfig, prompts: list[str], policy: tuple) -> dict[str, EpisodeEval]:
    """The baseline (loaded here), then `policy` (model, tokenizer), each playing ev.pass_samples
    episodes of every prompt with the same seed."""
    assert ev.env is not None
    results: dict[str, EpisodeEval] = {}
    paths = ({"baseline": ev.baseline} if ev.baseline else {}) | {"policy": None}  # None: `policy`, loaded
    for who, path in paths.items():
        model, tokenizer = policy if path is None else load_policy(path, **model_options(ev))
        model.eval()
        results[who] = evaluate_episodes(
            model,
            tokenizer,
            env_spec(ev, tokenizer),
            prompts,
            ev.sampling(ev.max_new_tokens, ev.max_prompt_tokens),
            n=ev.pass_samples,
            seed=ev.seed,
            batch_size=ev.batch_size,
            threshold=success_threshold(ev.env),
        )
    return results


def _prompts(ev: EvalConfig) -> list[str]:
    if ev.dataset is not None:  # the held-out rows no stage trained on (rloo.data.split)
        return [r.prompt for r in eval_records(ev.dataset, ("prompt",), ev.num_prompts)]
    return [e.prompt for e in get_task(ev.task).examples("eval", ev.num_prompts, seed=ev.seed)]


def success_threshold(env: str) -> float:
    """The episode reward that counts as solved in episodes of `env` (the module docstring); also the
    periodic evaluation's of `rloo train env=` (rloo.training.evalset)."""
    if env in episode_tasks():
        task = get_task(env)
        return task.success_threshold if isinstance(task, EpisodeSuccess) else 1.0
    # getattr: a user's environment class: success_threshold is optional (docs/agents.md)
    return float(getattr(load_callable(env, "environment"), "success_threshold", 1.0))


def _paired_lines(base: EpisodeEval, pol: EpisodeEval, diff: float, half: float, names: tuple[str, str]) -> list[str]:
    lines = [
        f"  success rate (pass@1): {names[0]} {base.pass_at_1:.3f} -> {names[1]} {pol.pass_at_1:.3f} "
        f"({100 * diff:+.1f} points, paired 95% CI {100 * (diff - half):+.1f} to {100 * (diff + half):+.1f})",
        f"  per episode: turns {base.turns:.2f} -> {pol.turns:.2f}, tool calls {base.tool_calls:.2f} -> "
        f"{pol.tool_calls:.2f}, truncated {base.truncated:.3f} -> {pol.truncated:.3f}, reward {base.reward:.3f} -> "
        f"{pol.reward:.3f}",
    ]
    if base.no_tool_pass is not None and base.no_tool_share < 1:
        share = f"{base.no_tool_share:.2f} of them"
        lines.append(
            f"  no-tool baseline: {names[0]} episodes without a tool call ({share}) pass {base.no_tool_pass:.3f}"
        )
    return lines


def _single_lines(pol: EpisodeEval) -> list[str]:
    return [
        f"  success rate (pass@1): {pol.pass_at_1:.3f}; per episode: turns {pol.turns:.2f}, tool calls "
        f"{pol.tool_calls:.2f}, truncated {pol.truncated:.3f}, reward {pol.reward:.3f}"
    ]


def episode_rows(prompts: list[str], results: dict[str, EpisodeEval]) -> list[dict]:
    """samples.jsonl of an episode evaluation: one line per prompt with each policy's episodes
    (`rloo.eval.episodes.episode_record`) and successes, and with a baseline the paired difference of
    their success rates on that prompt."""
    rows = []
    for i, prompt in enumerate(prompts):
        row: dict = {"prompt": prompt}
        for who, r in results.items():
            eps = r.episodes[i * r.n : (i + 1) * r.n]
            row[who] = {
                "successes": r.counts[i],
                "episodes": [{k: v for k, v in e.items() if k != "prompt"} for e in eps],
            }
        if "baseline" in results:
            n = results["policy"].n
            row["success_difference"] = (row["policy"]["successes"] - row["baseline"]["successes"]) / n
        rows.append(row)
    return rows
