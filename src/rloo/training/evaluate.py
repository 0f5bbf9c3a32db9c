"""`rloo eval`: the trained policy and its SFT starting point side by side on held-out prompts."""

from __future__ import annotations

import json
import math
from collections.abc import Callable

import torch

from rloo.config import EvalConfig
from rloo.data.lengths import cut_metrics, report_prompt_cuts, save_cuts
from rloo.data.preflight import check_config
from rloo.data.split import eval_records, text_field
from rloo.errors import RlooError
from rloo.eval.judge import PolicyEval, evaluate_policy
from rloo.eval.paired import compare_paired, describe
from rloo.eval.passk import PassAtK, evaluate_pass_at_k, format_pass_table, paired_pass_difference
from rloo.eval.samples import chosen_examples, examples_markdown, sample_rows, to_jsonl
from rloo.modeling.loading import frozen, load_policy, load_reward_model, model_options
from rloo.rewards import RewardModelScorer
from rloo.rewards.judges import make_judge
from rloo.rewards.sources import FunctionReward, load_function
from rloo.runtime.precision import MIN_BF16_WIDTH_SAMPLING, stage_precision
from rloo.runtime.runfolder.atomic import atomic_write_text
from rloo.runtime.runfolder.lock import holds_run_folder
from rloo.runtime.tracking.log import say
from rloo.tasks import Example, get_task, has_checker
from rloo.tasks.base import ParsesAnswers
from rloo.training.agents import evaluate_agents
from rloo.training.common import check_device, prepare_output_dir, seed_everything
from rloo.training.eval_notes import honest_notes


@holds_run_folder
@stage_precision(min_width=MIN_BF16_WIDTH_SAMPLING)
def evaluate(cfg: EvalConfig, *, overwrite: bool = False) -> dict[str, PolicyEval]:
    """Win rate against the task's references by its gold judge, gold and reward-model scores,
    KL to the reference model and length, for `policy` (and `baseline` when given). Writes
    summary.json, report.md (with the best, worst and most changed examples) and samples.jsonl
    (every judged sample). With `env=`: both policies play episodes instead (rloo.training.agents)."""
    check_config(cfg)
    check_device(cfg.device)
    seed_everything(cfg.seed)
    if cfg.env is not None:
        return evaluate_agents(cfg, overwrite=overwrite)
    task = get_task(cfg.task)
    names = {"policy": cfg.policy} | ({"baseline": cfg.baseline} if cfg.baseline else {})
    opts = model_options(cfg)
    loaded = {name: load_policy(path, **opts) for name, path in names.items()}
    ref_path = cfg.reference_model or cfg.baseline
    ref = frozen(load_policy(ref_path, **opts)[0]) if ref_path else None
    scorer = None
    if cfg.reward_model:
        rm, rm_tok = load_reward_model(cfg.reward_model, **opts)
        scorer = RewardModelScorer(frozen(rm), rm_tok, policy_tokenizer=loaded["policy"][1])
    # held-out prompts and references: the dataset's eval split (or held-out rows), or the task's eval split
    if cfg.dataset is not None:
        recs = eval_records(cfg.dataset, ("prompt", "completion"), cfg.num_prompts, tokenizer=loaded["policy"][1])
        examples = [Example(r.prompt, text_field(r.completion)) for r in recs]
    else:
        examples = task.examples("eval", cfg.num_prompts, seed=cfg.seed)
    judge = make_judge(
        cfg.judge,
        task=task,
        reward_scorer=scorer,
        use_task=cfg.dataset is None,
        reward_name=f"reward model ({cfg.reward_model})",
    )
    if judge is None:  # rloo.data.preflight refuses this config first; kept for API callers that skip it
        raise RlooError("nothing to judge the responses with: set judge=module:function or reward_model=PATH")
    prompts, (policy, tokenizer) = [e.prompt for e in examples], loaded["policy"]  # cut prompts: said, too many refused
    cuts = report_prompt_cuts("eval", tokenizer, cfg, prompts, [], policy)
    out = prepare_output_dir(cfg, overwrite=overwrite)
    save_cuts(out, cuts)
    results = {}
    for name, (model, tok) in loaded.items():
        model.eval()
        # the same sampling noise for every policy: a paired comparison
        results[name] = evaluate_policy(
            model,
            tok,
            [e.prompt for e in examples],
            cfg.sampling(cfg.max_new_tokens, cfg.max_prompt_tokens),
            references=[e.reference for e in examples],
            judge=judge,
            reward_scorer=scorer,
            ref_model=ref,
            batch_size=cfg.batch_size,
            generator=torch.Generator().manual_seed(cfg.seed + 7),
            keep_samples=5,
        )
    _report(cfg, out, task, judge, examples, loaded, results, cut_metrics(cuts))
    return results


def _report(
    cfg: EvalConfig, out, task, judge, examples: list[Example], loaded: dict, results: dict, cut_stats: dict
) -> None:
    """summary.json, report.md and samples.jsonl of the judged `results`; pass@k added on checker tasks;
    `cut_stats`: what the prompt limit cut (rloo.data.lengths), in the summary when not empty."""
    summary = {"judge": judge.name} | {k: v.summary(samples=True) for k, v in results.items()}
    summary |= {"data": cut_stats} if cut_stats else {}
    table = format_table(results, judge.name)
    diff = compare_paired(results["policy"], results["baseline"]) if "baseline" in results else None
    if diff is not None:
        summary["difference"] = diff
        table += "\n\n" + describe(diff, judge.name)
    check = _checker(cfg, task)
    if check is not None:
        passes = {name: _pass_at_k(model, tok, check, examples, cfg) for name, (model, tok) in loaded.items()}
        text, pass_summary = pass_report(passes)
        table += "\n\n" + text
        for name, r in passes.items():
            summary[name]["pass"] = r.summary()
        summary.setdefault("difference", {}).update(pass_summary)
        for name, r in passes.items():  # kept on the result for callers (the pipeline's summary)
            results[name].passk = r
    notes = honest_notes(cfg, judge)
    rows = sample_rows([e.prompt for e in examples], [e.reference for e in examples], results)
    atomic_write_text(out / "samples.jsonl", to_jsonl(rows))
    atomic_write_text(out / "summary.json", json.dumps(summary | {"notes": notes}, indent=2))
    data = cfg.dataset.path if cfg.dataset is not None else cfg.task
    shown = examples_markdown(chosen_examples(rows), judge.name)
    report = f"# Evaluation on {len(examples)} held-out {data} prompts\n\n{table}\n\n" + "\n\n".join(notes)
    report += "\n\nEvery judged sample: samples.jsonl (one line per prompt)." + (f"\n\n{shown}" if shown else "")
    atomic_write_text(out / "report.md", report + "\n")
    say("\n" + table + "".join(f"\n{n}" for n in notes))


def format_table(results: dict[str, PolicyEval], judge: str) -> str:
    """Markdown table: one row per policy; the header names the judge of the win rate and score."""
    fmt = lambda v, p=3: "-" if v is None else f"{v:.{p}f}"  # noqa: E731
    rows = [
        f"| policy | win rate vs refs ({judge}) | score ({judge}) | RM score | KL to ref (k3) | length | truncated |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, r in results.items():
        rows.append(
            f"| {name} | {fmt(r.win_rate)} | {fmt(r.gold)} | {fmt(r.reward)} | {fmt(r.kl_k3)} | "
            f"{fmt(r.length, 1)} | {fmt(r.truncated, 2)} |"
        )
    return "\n".join(rows)


def _checker(cfg: EvalConfig, task) -> tuple[Callable, Callable | None] | None:
    """(check(prompt, response) -> 1/0/NaN, parse or None) for pass@k: `cfg.checker`, else a built-in
    checker task's own (on its own problems); None when there is no checker."""
    if (name := cfg.checker) is not None:
        fn = FunctionReward(load_function(name), name=name)
        return lambda p, c: _solved(name, fn.score_texts([p], [c])[0].item()), None
    if has_checker(task) and cfg.dataset is None:
        return task.gold_score, task.parse_answer if isinstance(task, ParsesAnswers) else None
    return None


def _solved(name: str, v: float) -> float:
    """A checker's score as pass@k counts it: 1 solved, 0 not, NaN (it returned None) unreadable."""
    if not (math.isnan(v) or v in (0.0, 1.0)):
        raise RlooError(f"checker {name} returned {v:g}: a checker returns 1 (solved), 0 (not) or None (unreadable)")
    return v


def _pass_at_k(model, tok, check, examples, cfg: EvalConfig) -> PassAtK:
    """pass@k of one policy: cfg.pass_samples samples per problem, the same noise for every policy."""
    return evaluate_pass_at_k(
        model,
        tok,
        [e.prompt for e in examples],
        check[0],
        cfg.sampling(cfg.max_new_tokens, cfg.max_prompt_tokens),
        n=cfg.pass_samples,
        parse=check[1],
        batch_size=max(cfg.batch_size, cfg.pass_samples),
        generator=torch.Generator().manual_seed(cfg.seed + 11),
    )


def pass_report(passes: dict[str, PassAtK]) -> tuple[str, dict]:
    """The pass@k table (markdown) and, with a baseline, policy - baseline pass@1 paired over problems."""
    first = next(iter(passes.values()))
    text = (
        f"pass@k on {len(first.counts)} held-out problems, {first.n} samples each (unbiased estimator, "
        f"mean ± 95% interval over problems; zero-var@k: share of groups of k whose rewards are all equal)"
        f"\n\n{format_pass_table(passes)}"
    )
    if "baseline" not in passes:
        return text, {}
    pol, base = passes["policy"], passes["baseline"]
    out = {}
    for k in pol.pass_k:
        diff, half = paired_pass_difference(pol.counts, base.counts, pol.n, k)
        out[f"pass@{k}"] = {"diff": diff, "ci95": half}
    d = out["pass@1"]
    text += (
        f"\n\npolicy - baseline pass@1: {100 * d['diff']:+.1f} points (95% CI {100 * (d['diff'] - d['ci95']):+.1f} "
        f"to {100 * (d['diff'] + d['ci95']):+.1f}, paired over {len(pol.counts)} problems)"
    )
    return text, out
