"""The evaluation stage of `rloo pipeline` on a task played as episodes (calculator, guess): the SFT and the
RL policy each play the same held-out prompts, `eval.pass_samples` episodes each (seeded), and the
summary reports pass@1 (success rate), turns and tool calls per episode, and the paired pass@1
difference with its 95% interval (one seed: the interval is over problems, not over seeds)."""

from __future__ import annotations

import json

from rloo.config import EvalConfig, RLConfig
from rloo.config.generation import multi_turn_refusal
from rloo.errors import RlooError
from rloo.eval.episodes import evaluate_episodes
from rloo.eval.passk import paired_pass_difference
from rloo.modeling.loading import load_policy, model_options
from rloo.runtime.atomic import atomic_write_text
from rloo.runtime.tracking import say
from rloo.tasks import get_task
from rloo.training.common import prepare_output_dir
from rloo.training.rl import env_spec


def evaluate_agents(ev: EvalConfig, rl: RLConfig) -> dict:
    """SFT (ev.baseline) vs RL (ev.policy) on ev.num_prompts held-out prompts; writes eval/results.json."""
    if why := multi_turn_refusal(ev, "eval."):
        raise RlooError(why)
    out = prepare_output_dir(ev, overwrite=True)
    task = get_task(ev.task)
    prompts = [e.prompt for e in task.examples("eval", ev.num_prompts, seed=ev.seed)]
    results = {}
    for name, path in (("baseline", ev.baseline), ("policy", ev.policy)):
        assert path is not None
        model, tokenizer = load_policy(path, **model_options(ev))
        model.eval()
        results[name] = evaluate_episodes(
            model,
            tokenizer,
            env_spec(rl, tokenizer),
            prompts,
            n=ev.pass_samples,
            seed=ev.seed,
            temperature=ev.temperature,
            top_p=ev.top_p,
            top_k=ev.top_k,
            max_prompt_len=ev.max_prompt_tokens,
            batch_size=ev.batch_size,
            threshold=getattr(task, "success_threshold", 1.0),
        )
    diff, half = paired_pass_difference(results["policy"].counts, results["baseline"].counts, ev.pass_samples, 1)
    summary = {name: r.summary() | {"examples": r.examples} for name, r in results.items()}
    summary["difference"] = {"pass@1": {"diff": diff, "ci95": half}}
    atomic_write_text(out / "results.json", json.dumps(summary, indent=2))
    base, pol = results["baseline"], results["policy"]
    say(f"\nepisodes on {len(prompts)} held-out prompts ({ev.pass_samples} each, seed {ev.seed}):")
    say(
        f"  success rate (pass@1): SFT {base.pass_at_1:.3f} -> {rl.algorithm} {pol.pass_at_1:.3f} "
        f"({100 * diff:+.1f} points, paired 95% CI {100 * (diff - half):+.1f} to {100 * (diff + half):+.1f})"
    )
    say(
        f"  per episode: turns {base.turns:.2f} -> {pol.turns:.2f}, tool calls {base.tool_calls:.2f} -> "
        f"{pol.tool_calls:.2f}, truncated {base.truncated:.3f} -> {pol.truncated:.3f}, reward {base.reward:.3f} -> "
        f"{pol.reward:.3f}"
    )
    if base.no_tool_pass is not None and base.no_tool_share < 1:
        share = f"{base.no_tool_share:.2f} of them"
        say(f"  no-tool baseline: SFT episodes without a tool call ({share}) pass {base.no_tool_pass:.3f}")
    for line in pol.examples[:2]:
        say(f"  {rl.algorithm}: {line}")
    return summary
