"""`rloo compare`: the paper's comparison (Ahmadian et al. 2024, sec. 5) on the built-in tasks.

For every task and seed:
  1. one SFT model, one reward model (shared by every method: differences come from the method)
  2. every method trains from the SFT model with the same rl settings, hence the same number of
     generated samples (steps x batch_size x k); DPO, offline, trains on the reward model's pairs
  3. each final policy is judged on the same held-out prompts with the same sampling noise:
     win rate against the references and head to head against the SFT model (gold judge)
  4. gradient variance of the estimators at the SFT model and at a deliberately weak model
A task played as episodes (calculator, guess) has no reward model (the environment gives the reward)
and is judged by its episodes' success rate instead (rloo.experiments.compare.episodes; no step 4).
With tuning on (tuning.trials > 0), steps 1-3 first run on the tuning seeds, once per trial of each
method, judged on validation prompts (rloo.experiments.tuning); the reported seeds then run each
method at the settings its trials chose.
The report (table, plots) is written by rloo.experiments.compare.report from the per-run result files,
so an interrupted comparison continues where it stopped (finished runs are skipped), and several
processes started with the same command share the work (each takes the (task, seed) cells no live
process has claimed); the last one to finish writes the complete report.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from rloo.config import METHOD_SPECS, CompareConfig, PipelineConfig, RLConfig
from rloo.config.method_choice import shared_settings
from rloo.config.methods import compare_variants, spec_of_variant
from rloo.errors import rerun_continues, study_rerun
from rloo.experiments.compare.episodes import episode_judge
from rloo.experiments.compare.eval import text_judge
from rloo.experiments.compare.folder import claim, open_study, wait_for_models
from rloo.experiments.compare.report import write_report
from rloo.experiments.gradvar import variance_cell
from rloo.experiments.tuning import base_of, choose, read_result, trial_variants, tuning_done, tuning_root, untuned_name
from rloo.modeling.loading import load_policy
from rloo.runtime.precision import stage_precision
from rloo.runtime.runfolder.atomic import atomic_write_text
from rloo.runtime.tracking.log import say
from rloo.tasks import get_task, has_checker, plays_episodes
from rloo.training.reward import train_reward
from rloo.training.rl import train
from rloo.training.sft import sft

# name -> (algorithm, overrides of the shared rl settings), from the method table (each method's
# `variants`). rloo_k2 doubles the prompts per batch so that its sample budget equals the others'.
METHODS: dict[str, tuple[str, dict]] = compare_variants()

QUICK = {
    "sft": {
        "num_examples": 2000,
        "epochs": 3,
        "arch": {"hidden_size": 64, "num_layers": 2, "num_heads": 2, "intermediate_size": 128},
    },
    "reward": {"num_pairs": 800, "eval_pairs": 100, "epochs": 1},
    "rl": {"steps": 12, "batch_size": 8, "k": 4, "eval_every": 6, "eval_prompts": 32, "save_every": None},
    "eval": {"num_prompts": 64},
    "variance_batches": 6,
    "variance_samples": 16,
    "seeds": [0],
    "weak_sft_fraction": 0.1,
}


def quick_config(cfg: CompareConfig) -> CompareConfig:
    """cfg with the tiny QUICK settings laid over the keys the user did not set: an explicit
    `seeds=[0,1,2]` or `rl.steps=40` wins over --quick (said in one line); methods, tasks and
    output_dir are kept."""
    kept: list[str] = []
    data = _lay_quick(cfg, QUICK, "", kept)
    if kept:
        say(f"--quick: keeping your {', '.join(kept)} (explicit settings win over the quick ones)")
    return CompareConfig(**data)


def _lay_quick(section, quick: dict, prefix: str, kept: list[str]) -> dict:
    data = section.model_dump()
    for key, val in quick.items():
        if isinstance(val, dict):
            # getattr: `key` names a field of `section` (the quick settings' keys), not a probe
            data[key] = _lay_quick(getattr(section, key), val, f"{prefix}{key}.", kept)
        elif key in section.model_fields_set:
            kept.append(f"{prefix}{key}={data[key]}")
        else:
            data[key] = val
    return data


def method_config(
    cfg: CompareConfig, pipe: PipelineConfig, method: str, out: Path, settings: dict | None = None
) -> RLConfig:
    """The RLConfig of one method: the shared rl settings, the method's overrides, then `settings`
    (a trial's or the tuned choice: lr, beta, eval_split, algorithm_settings), the same budget."""
    _, _, base, _ = pipe.stage_configs()
    algorithm, over = compare_variants()[method]  # the table, read now: an added method is known too
    own = METHOD_SPECS[algorithm].settings_model.model_fields
    settings = settings or {}
    data = base.model_dump() | {k: v for k, v in settings.items() if k != "algorithm_settings"}
    data |= {"algorithm": algorithm, "output_dir": out}
    key = "algorithm_settings"
    pairs = {"dpo_pairs": cfg.reward.num_pairs} if "dpo_pairs" in own else {}
    # the shared section may hold any method's settings: this method's run takes those it has
    data[key] = (
        shared_settings(algorithm, cfg.rl.algorithm_settings) | over.get(key, {}) | settings.get(key, {}) | pairs
    )
    if "k" in over:
        data["k"], data["batch_size"] = over["k"], base.batch_size * base.k // over["k"]
    return RLConfig(**data)


def _stage_models(cfg: CompareConfig, pipe: PipelineConfig) -> None:
    """SFT and reward model of one (task, seed), skipped when already there (no reward model for a
    task scored by a checker, nor for one played as episodes: the environment gives the reward)."""
    sft_cfg, rm_cfg, _, _ = pipe.stage_configs()
    if not (sft_cfg.output_dir / "model").exists():
        sft(sft_cfg, overwrite=True)
    if pipe.trains_reward_model() and not (rm_cfg.output_dir / "model").exists():
        train_reward(rm_cfg, overwrite=True)


def run_cell(
    cfg: CompareConfig,
    task_name: str,
    seed: int,
    runs: Path,
    variants: dict[str, tuple[str, dict]] | None = None,
    split: str = "eval",
) -> None:
    """Steps 1-3 for one (task, seed): writes runs/<task>/seed-<s>/<name>/result.json for each run
    of `variants`, {name: (method, settings)} (default: each method at the shared settings), every
    run evaluated on `split`'s prompts (eval; valid for tuning trials, periodic evals included)."""
    variants = variants or {m: (m, {}) for m in cfg.methods}
    n_prompts = cfg.eval.num_prompts if split == "eval" else cfg.tuning.valid_prompts
    root = runs / task_name / f"seed-{seed}"
    pipe = PipelineConfig(
        task=task_name,
        seed=seed,
        device=cfg.device,
        dtype=cfg.dtype,
        output_dir=root,
        sft=cfg.sft,
        reward=cfg.reward,
        rl=cfg.rl,
        eval=cfg.eval,
        max_prompt_tokens=cfg.max_prompt_tokens,
        max_response_tokens=cfg.max_response_tokens,
        max_cut_share=cfg.max_cut_share,
    )
    _stage_models(cfg, pipe)
    task = get_task(task_name)
    examples = task.examples(split, n_prompts, seed=seed)
    if plays_episodes(task):
        cell = episode_judge(cfg, pipe.stage_configs()[2], task, examples, root, seed)
    else:
        cell = text_judge(cfg, task, examples, root, seed)
    sft_file = root / "sft" / "result.json"
    if not sft_file.exists():
        sft_res = cell.evaluate(cell.sft, None) | {"split": split}
        atomic_write_text(sft_file, json.dumps(sft_res))  # another process may read it meanwhile
    sft_res = read_result(sft_file)
    for name, (method, settings) in variants.items():
        out = root / name
        if (out / "result.json").exists():
            continue
        say(f"== {task_name} seed {seed}: {name}")
        t0 = time.perf_counter()
        result = train(method_config(cfg, pipe, method, out, settings | {"eval_split": split}), overwrite=True)
        seconds = time.perf_counter() - t0
        policy, _ = load_policy(str(result.model_path), device=cfg.device, dtype=cfg.dtype)
        res = cell.evaluate(policy, sft_res) | {
            "seconds": seconds,
            "samples": _samples(cfg, method),
            "split": split,
            "settings": settings,
        }
        atomic_write_text(out / "result.json", json.dumps(res))
        say(f"   {name}: {cell.line(res)}, {seconds:.0f}s")


def _samples(cfg: CompareConfig, method: str) -> int:
    """Generated completions a method trained on (0 for offline DPO)."""
    return 0 if not spec_of_variant(method).online else cfg.rl.steps * cfg.rl.batch_size * cfg.rl.k


def compare(cfg: CompareConfig, *, overwrite: bool = False) -> Path:
    """Run (or continue) the comparison and write the report; returns the report folder."""
    if cfg.quick:
        cfg = quick_config(cfg)
    study = open_study(cfg, overwrite)  # its refusals come at once: before the precision probe and any model
    try:
        t0 = time.perf_counter()
        report = _run_study(cfg)
    finally:
        study.close()
    say(f"compare: report in {report} ({time.perf_counter() - t0:.0f}s this invocation)")
    return report


@stage_precision
def _run_study(cfg: CompareConfig) -> Path:
    out = Path(cfg.output_dir)
    # an interrupted stage or run says to rerun this command: the rerun skips the finished runs
    # and starts the unfinished ones over (run_cell trains them with overwrite=True)
    with rerun_continues(study_rerun()):
        for task_name in cfg.tasks if cfg.tuning.trials else []:  # 1. every method's trials (tuning seeds)
            _tuning_cells(cfg, out, task_name)
        for task_name in cfg.tasks:  # 2. the reported seeds, at the chosen settings when tuned
            _reported_cells(cfg, out, task_name)
    return write_report(cfg, out)


def _reported_cells(cfg: CompareConfig, out: Path, task_name: str) -> None:
    """The unfinished cells of a task's reported seeds that no live process holds, then its
    gradient variance (at seed 0's models: waited for while another process makes them)."""
    variants = None
    if cfg.tuning.trials:
        variants = tuned_variants(_tuned(cfg, out, task_name))
        variants |= {untuned_name(m): (m, {}) for m in cfg.methods} if cfg.tuning.untuned else {}
    runs = out / "runs"
    for seed in cfg.seeds:
        with claim(runs / task_name / f"seed-{seed}") as mine:
            if mine:
                run_cell(cfg, task_name, seed, runs, variants)
    task = get_task(task_name)
    if cfg.variance_batches < 2 or has_checker(task) or plays_episodes(task):  # it is the reward model's gradient
        return
    if (runs / task_name / f"seed-{cfg.seeds[0]}" / "gradient_variance.json").exists():
        return
    with claim(runs / task_name / "variance") as mine:
        if mine:
            wait_for_models(
                runs / task_name / f"seed-{cfg.seeds[0]}",
                needs_reward=True,
                make_cell=lambda: run_cell(cfg, task_name, cfg.seeds[0], runs, variants),
            )
            variance_cell(cfg, task_name, cfg.seeds[0], runs)


def tuned_variants(chosen: dict[str, dict]) -> dict[str, tuple[str, dict]]:
    """The reported runs of a tuned task, {name: (method, settings)}, from choose()'s {method or view:
    settings}: a view (ppo@2x2) whose choice is its method's own is not run twice (the report reads
    the method's run for it, rloo.experiments.compare.report.collect)."""
    return {n: (base_of(n), s) for n, s in chosen.items() if n == base_of(n) or s != chosen.get(base_of(n))}


def _tuning_cells(cfg: CompareConfig, out: Path, task_name: str) -> None:
    """Runs the unfinished tuning cells of a task (one per tuning seed) that no live process holds:
    every trial of every method, judged on the seed's validation prompts."""
    trials = trial_variants(cfg.tuning, cfg.methods)
    for seed in cfg.tuning.seeds:
        if tuning_done(out, cfg.tuning, cfg.methods, task_name, seeds=[seed]):
            continue  # finished: no need to load its models again
        with claim(tuning_root(out, task_name, seed)) as mine:
            if mine:
                run_cell(cfg, task_name, seed, out / "tuning", trials, split="valid")


def _tuned(cfg: CompareConfig, out: Path, task_name: str, poll_s: float = 30.0) -> dict[str, dict]:
    """Each method's chosen settings on a task, once every trial has its validation result: waits for
    the tuning cells other live processes hold, and takes over those whose holder died."""
    while not tuning_done(out, cfg.tuning, cfg.methods, task_name):
        _tuning_cells(cfg, out, task_name)
        if not tuning_done(out, cfg.tuning, cfg.methods, task_name):
            say(f"compare: waiting for the tuning of {task_name} in other processes")
            time.sleep(poll_s)
    return choose(out, cfg.tuning, cfg.methods, task_name)
