"""`rloo pipeline`: SFT -> reward model -> RLOO -> evaluation, one output folder. A task with a
checker (arithmetic) has no reward-model stage: the checker is the reward, and the evaluation adds
pass@k. The summary gathers what each stage cut to the length limits (each stage folder's cuts.json)."""

from __future__ import annotations

import json
import time

from rloo.config import PipelineConfig
from rloo.data.lengths import cuts_summary, read_cuts
from rloo.data.preflight import check_config
from rloo.data.split import eval_records
from rloo.errors import pipeline_rerun, rerun_continues
from rloo.eval.paired import compare_paired, describe
from rloo.eval.passk import paired_pass_difference
from rloo.runtime.runfolder.atomic import atomic_write_text
from rloo.runtime.runfolder.lock import holds_run_folder
from rloo.runtime.tracking.log import say
from rloo.training.agents import evaluate_agents
from rloo.training.common import prepare_output_dir
from rloo.training.evaluate import evaluate
from rloo.training.pipeline_resume import check_pipeline_resume, kept_reward, kept_rl, run_stage
from rloo.training.reward import train_reward
from rloo.training.rl import train
from rloo.training.sft import sft


@holds_run_folder
def pipeline(cfg: PipelineConfig, *, resume: bool = False, overwrite: bool = False) -> dict:
    """Run the four stages in order; returns the summary also written to summary.json. The whole
    config (names, data columns, reward and judge) is checked before any stage starts or any file
    is written (rloo.data.preflight). An interrupted stage writes its checkpoint; `resume` keeps
    the finished stages and continues the interrupted one from it (rloo.training.pipeline_resume)."""
    with rerun_continues(pipeline_rerun(), resumes=True):
        return _pipeline(cfg, resume, overwrite)


def _pipeline(cfg: PipelineConfig, resume: bool, overwrite: bool) -> dict:
    check_config(cfg)
    sft_cfg, rm_cfg, rl_cfg, ev_cfg = cfg.stage_configs()
    resume = resume and check_pipeline_resume(cfg)  # before anything is written
    out = prepare_output_dir(cfg, resume=resume, overwrite=overwrite, can_resume=True)
    times = {}
    t = time.perf_counter()
    data = cfg.dataset.path if cfg.dataset is not None else cfg.task
    say(f"[1/4] SFT of {cfg.model or 'a small Llama'} on {data} -> {sft_cfg.output_dir}")
    run_stage(sft, sft_cfg, resume)
    times["sft"], t = time.perf_counter() - t, time.perf_counter()
    if rl_cfg.env is not None:  # a task played as episodes, or env=
        return _episodes_pipeline(cfg, rl_cfg, ev_cfg, out, times, t, resume)
    if not cfg.trains_reward_model():
        whose = f"{cfg.task}'s checker" if cfg.rl.reward_fn is None else "rl.reward_fn"
        assert rl_cfg.reward_fn is not None, "without a reward model the RL stage scores with a function"
        say(f"[2/4] no reward model: {whose} is the reward ({_names(rl_cfg.reward_fn)})")
        rm = None
    else:
        pref = rm_cfg.dataset.path if rm_cfg.dataset is not None else f"{cfg.task} labeler pairs"
        say(f"[2/4] reward model from {rm_cfg.model or 'the SFT model'} on {pref} -> {rm_cfg.output_dir}")
        rm = run_stage(train_reward, rm_cfg, resume, kept_reward)
        times["reward"], t = time.perf_counter() - t, time.perf_counter()
    say(f"[3/4] {cfg.rl.algorithm} for {cfg.rl.steps} steps, k={cfg.rl.k}, beta={cfg.rl.beta} -> {rl_cfg.output_dir}")
    rl = run_stage(train, rl_cfg, resume, kept_rl)
    assert rl is not None  # a finished stage's result is read back (kept_rl)
    times["rl"], t = time.perf_counter() - t, time.perf_counter()
    say(f"[4/4] evaluation on {_eval_count(cfg)} held-out prompts -> {ev_cfg.output_dir}")
    results = evaluate(ev_cfg, overwrite=True)
    times["eval"] = time.perf_counter() - t
    plots = rl.plots
    judge = results["policy"].judge
    summary = {
        "task": cfg.task if cfg.dataset is None else None,  # a dataset replaces the task's data and judge
        "dataset": cfg.dataset.path if cfg.dataset else None,
        "seed": cfg.seed,
        "algorithm": cfg.rl.algorithm,
        "judge": judge,
        "reward_model": None
        if rm is None
        else {"accuracy_vs_labeler": rm.accuracy_vs_labeler, "accuracy_vs_gold": rm.accuracy_vs_gold},
        "eval": {k: _eval_summary(v) for k, v in results.items()},
        "difference": _difference(results),
        "cut": _cuts(sft_cfg, rm_cfg if rm is not None else None, rl_cfg, ev_cfg),
        "seconds": times,
        "plots": [str(p) for p in plots],
    }
    atomic_write_text(out / "summary.json", json.dumps(summary, indent=2))
    _print_summary(summary)
    return summary


def _eval_count(cfg: PipelineConfig) -> int:
    """How many prompts the evaluation reads: num_prompts, or fewer held-out rows of a dataset."""
    if cfg.dataset is None:
        return cfg.eval.num_prompts
    return len(eval_records(cfg.dataset, ("prompt",), cfg.eval.num_prompts))


def _names(specs: str | list[str]) -> str:
    return specs if isinstance(specs, str) else ", ".join(specs)


def _episodes_pipeline(cfg: PipelineConfig, rl_cfg, ev_cfg, out, times: dict, t: float, resume: bool) -> dict:
    """Stages 2-4 of a task played as episodes (calculator, guess): no reward model (the environment's
    checker is the reward), RLOO on whole episodes, then both policies play held-out episodes."""
    say(f"[2/4] no reward model: the {rl_cfg.env} environment gives the reward (docs/agents.md)")
    run = f"{cfg.rl.steps} steps, k={cfg.rl.k}, beta={cfg.rl.beta}"
    say(f"[3/4] {rl_cfg.algorithm} on episodes for {run} -> {rl_cfg.output_dir}")
    rl = run_stage(train, rl_cfg, resume, kept_rl)
    assert rl is not None  # a finished stage's result is read back (kept_rl)
    times["rl"], t = time.perf_counter() - t, time.perf_counter()
    say(f"[4/4] episodes on {_eval_count(cfg)} held-out prompts -> {ev_cfg.output_dir}")
    results = evaluate_agents(ev_cfg, overwrite=True, name=rl_cfg.algorithm, base="SFT")
    times["eval"] = time.perf_counter() - t
    task = cfg.task if cfg.dataset is None else None  # a dataset replaces the task's prompts
    summary = {"task": task, "seed": cfg.seed, "algorithm": rl_cfg.algorithm, "env": rl_cfg.env, "eval": results}
    summary |= {"cut": _cuts(cfg.stage_configs()[0], None, rl_cfg, ev_cfg)}
    summary |= {"seconds": times, "plots": [str(p) for p in rl.plots]}
    atomic_write_text(out / "summary.json", json.dumps(summary, indent=2))
    say(cuts_summary(summary["cut"]))
    say("time: " + ", ".join(f"{k} {v:.0f}s" for k, v in times.items()))
    return summary


def _cuts(sft_cfg, rm_cfg, rl_cfg, ev_cfg) -> dict:
    """`{"sft": {"prompts": {"cut": n, "of": total, ...}, ...}, "reward": ..., "rl": ..., "eval": ...}`:
    each stage's own record (rloo.data.lengths.save_cuts); a stage that did not run is left out."""
    stages = {"sft": sft_cfg, "reward": rm_cfg, "rl": rl_cfg, "eval": ev_cfg}
    held = {name: read_cuts(c.output_dir) if c is not None else None for name, c in stages.items()}
    return {name: rec for name, rec in held.items() if rec is not None}


def _eval_summary(v) -> dict:
    return v.summary() | ({"pass": v.passk.summary()} if v.passk is not None else {})


def _difference(results) -> dict | None:
    """Policy minus baseline, paired by prompt: win rate and judge score (`compare_paired`), and
    pass@k on checker tasks."""
    if "baseline" not in results:
        return None
    out = compare_paired(results["policy"], results["baseline"]) or {}
    pol, base = results["policy"].passk, results["baseline"].passk
    if pol is not None and base is not None:
        for k in pol.pass_k:
            d, h = paired_pass_difference(pol.counts, base.counts, pol.n, k)
            out[f"pass@{k}"] = {"diff": d, "ci95": h}
    return out or None


def _print_summary(s: dict) -> None:
    pol, base = s["eval"]["policy"], s["eval"].get("baseline")
    if s["reward_model"] is not None:
        gold = s["reward_model"]["accuracy_vs_gold"]
        say(
            f"\nreward model accuracy (held-out pairs): {s['reward_model']['accuracy_vs_labeler']:.3f} vs labels"
            + (f", {gold:.3f} vs gold judge" if gold is not None else "")
        )
    if base is not None and "pass" in pol and "pass" in base:
        _print_pass(s)
    if base is not None and base["win_rate"] is not None and pol["win_rate"] is not None:
        say(
            f"win rate vs references (judge: {s['judge']}): SFT {base['win_rate']:.3f} -> {s['algorithm'].upper()} "
            f"{pol['win_rate']:.3f} (seed {s['seed']})\n" + describe(s["difference"], s["judge"])
        )
    say(cuts_summary(s["cut"]))
    say("time: " + ", ".join(f"{k} {v:.0f}s" for k, v in s["seconds"].items()) + f"; plots in {', '.join(s['plots'])}")


def _print_pass(s: dict) -> None:
    pol, base, diff = s["eval"]["policy"]["pass"], s["eval"]["baseline"]["pass"], s["difference"]
    name = s["algorithm"].upper()
    say(f"\npass@k on {pol['problems']} held-out problems ({pol['n']} samples each):")
    for k, p in pol["pass_at_k"].items():
        b, d = base["pass_at_k"][k], diff[f"pass@{k}"]
        say(
            f"  pass@{k}: SFT {b['mean']:.3f} -> {name} {p['mean']:.3f} ({100 * d['diff']:+.1f} points, paired 95% CI "
            f"{100 * (d['diff'] - d['ci95']):+.1f} to {100 * (d['diff'] + d['ci95']):+.1f})"
        )
    say(
        f"  unparseable: SFT {base['unparseable']:.3f} -> {name} {pol['unparseable']:.3f}; "
        f"length {base['length']:.1f} -> {pol['length']:.1f}"
    )
