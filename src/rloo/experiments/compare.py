"""`rloo compare`: the paper's comparison (Ahmadian et al. 2024, sec. 5) on the built-in tasks.

For every task and seed:
  1. one SFT model, one reward model (shared by every method: differences come from the method)
  2. every method trains from the SFT model with the same rl settings, hence the same number of
     generated samples (steps x batch_size x k); DPO, offline, trains on the reward model's pairs
  3. each final policy is judged on the same held-out prompts with the same sampling noise:
     win rate against the references and head to head against the SFT model (gold judge)
  4. gradient variance of the estimators at the SFT model and at a deliberately weak model
The report (table, plots) is written by rloo.experiments.compare_report from the per-run result files,
so an interrupted comparison continues where it stopped (finished runs are skipped), and several
processes started with the same command share the work (each takes the (task, seed) cells no live
process has claimed); the last one to finish writes the complete report.
"""

from __future__ import annotations

import json
import shutil
import time
from contextlib import ExitStack, contextmanager
from pathlib import Path

import torch
import yaml

from rloo.config import CompareConfig, PipelineConfig, RLConfig, save_config
from rloo.core.kl import sequence_kl
from rloo.errors import RlooError, option
from rloo.eval.judge import win_rate
from rloo.eval.passk import evaluate_pass_at_k
from rloo.experiments.compare_report import write_report
from rloo.experiments.gradvar import variance_cell
from rloo.modeling.forward import completion_logprobs
from rloo.modeling.loading import frozen, load_policy, load_reward_model
from rloo.rewards import RewardModelScorer
from rloo.rollout import rollout
from rloo.runtime.precision import stage_precision
from rloo.runtime.runlock import RunFolderBusy, run_folder
from rloo.runtime.tracking import say
from rloo.tasks import get_task, has_checker
from rloo.training.reward import train_reward
from rloo.training.rl import train
from rloo.training.sft import sft

# name -> (algorithm, overrides of the shared rl settings). rloo_k2 doubles the prompts per batch so
# that its sample budget equals the others'.
METHODS: dict[str, tuple[str, dict]] = {
    "rloo": ("rloo", {}),
    "rloo_k2": ("rloo", {"k": 2}),
    "reinforce": ("reinforce", {}),
    "vanilla_pg": ("vanilla_pg", {}),
    "ppo": ("ppo", {}),
    "ppo_lambda1": ("ppo", {"algorithm_settings": {"gae_lambda": 1.0}}),
    "grpo": ("grpo", {}),
    "raft": ("raft", {}),
    "dpo": ("dpo", {}),
    "rloo_token_kl": ("rloo", {"algorithm_settings": {"kl_level": "token"}}),
    "rloo_k3_kl": ("rloo", {"algorithm_settings": {"kl_estimator": "k3"}}),
    "rloo_clip": ("rloo", {"algorithm_settings": {"rloo_clip": True}}),
    "dr_grpo": ("dr_grpo", {}),
    "reinforce_pp": ("reinforce_pp", {}),
}

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
    """cfg with the tiny QUICK settings laid over it (methods, tasks and output_dir are kept)."""
    data = cfg.model_dump()
    for key, val in QUICK.items():
        data[key] = (data[key] | val) if isinstance(val, dict) else val
    data["sft"]["arch"] = cfg.sft.arch.model_dump() | QUICK["sft"]["arch"]
    return CompareConfig(**data)


def method_config(cfg: CompareConfig, pipe: PipelineConfig, method: str, out: Path) -> RLConfig:
    """The RLConfig of one method: the shared rl settings, the method's overrides, the same budget."""
    _, _, base, _ = pipe.stage_configs()
    algorithm, over = METHODS[method]
    data = base.model_dump() | {"algorithm": algorithm, "output_dir": out}
    key = "algorithm_settings"
    data[key] = data[key] | over.get(key, {}) | {"dpo_pairs": cfg.reward.num_pairs}
    if "k" in over:
        data["k"], data["batch_size"] = over["k"], base.batch_size * base.k // over["k"]
    return RLConfig(**data)


@torch.no_grad()
def judge(policy, tokenizer, task, examples, cfg: CompareConfig, scorer=None, ref=None, seed: int = 0) -> dict:
    """One sample per held-out prompt (fixed sampling noise per seed): per-prompt gold scores and the
    means of gold, reward-model score, KL to the SFT model and length."""
    policy.eval()
    gen = torch.Generator().manual_seed(10_000 + seed)
    gold, rm, kl, length = [], [], [], []
    for i in range(0, len(examples), cfg.eval.batch_size):
        chunk = examples[i : i + cfg.eval.batch_size]
        roll = rollout(
            policy,
            tokenizer,
            [e.prompt for e in chunk],
            1,
            max_prompt_len=cfg.max_prompt_tokens,
            max_new_tokens=cfg.rl.max_new_tokens,
            temperature=cfg.eval.temperature,
            generator=gen,
        )
        gold += [task.gold_score(e.prompt, c) for e, c in zip(chunk, roll.completions, strict=False)]
        length += roll.completion_mask.sum(-1).tolist()
        if scorer is not None:
            rm += scorer(roll).tolist()
        if ref is not None:
            ref_lp = completion_logprobs(
                ref,
                roll.prompt_ids,
                roll.prompt_mask,
                roll.completion_ids,
                roll.completion_mask,
                temperature=cfg.eval.temperature,
            )
            kl += sequence_kl(roll.logprobs, ref_lp, roll.completion_mask).tolist()
    refs = [task.gold_score(e.prompt, e.reference) for e in examples]
    mean = lambda xs: sum(xs) / len(xs) if xs else None  # noqa: E731
    return {
        "gold_per_prompt": gold,
        "win_rate": win_rate(gold, refs),
        "gold": mean(gold),
        "reward": mean(rm),
        "kl": mean(kl),
        "length": mean(length),
    }


def _stage_models(cfg: CompareConfig, pipe: PipelineConfig) -> None:
    """SFT and reward model of one (task, seed), skipped when already there (no reward model for a
    task scored by a checker)."""
    sft_cfg, rm_cfg, _, _ = pipe.stage_configs()
    if not (sft_cfg.output_dir / "model").exists():
        sft(sft_cfg, overwrite=True)
    if not has_checker(get_task(pipe.task)) and not (rm_cfg.output_dir / "model").exists():
        train_reward(rm_cfg, overwrite=True)


def _pass(policy, tok, task, examples, cfg: CompareConfig, seed: int) -> dict:
    """pass@k of a policy on a checker task (the same sampling noise for every method of a seed)."""
    r = evaluate_pass_at_k(
        policy,
        tok,
        [e.prompt for e in examples],
        task.gold_score,
        n=cfg.eval.pass_samples,
        parse=getattr(task, "parse_answer", None),
        temperature=cfg.eval.temperature,
        max_prompt_len=cfg.max_prompt_tokens,
        max_new_tokens=cfg.rl.max_new_tokens,
        batch_size=max(cfg.eval.batch_size, cfg.eval.pass_samples),
        generator=torch.Generator().manual_seed(20_000 + seed),
    )
    return {"pass": r.summary(), "pass_counts": r.counts}


def run_cell(cfg: CompareConfig, task_name: str, seed: int, runs: Path) -> None:
    """Steps 1-3 for one (task, seed): writes runs/<task>/seed-<s>/<method>/result.json."""
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
    )
    _stage_models(cfg, pipe)
    task = get_task(task_name)
    examples = task.examples("eval", cfg.eval.num_prompts, seed=seed)
    sft_path, rm_path = str(root / "sft" / "model"), str(root / "reward" / "model")
    ref, tok = load_policy(sft_path, device=cfg.device, dtype=cfg.dtype)
    ref = frozen(ref)
    checker, scorer = has_checker(task), None
    if not checker:
        rm, rm_tok = load_reward_model(rm_path, device=cfg.device, dtype=cfg.dtype)
        scorer = RewardModelScorer(frozen(rm), rm_tok, policy_tokenizer=tok)
    extra = (lambda model: _pass(model, tok, task, examples, cfg, seed)) if checker else (lambda model: {})
    sft_file = root / "sft" / "result.json"
    if not sft_file.exists():
        sft_file.write_text(json.dumps(judge(ref, tok, task, examples, cfg, scorer, ref, seed) | extra(ref)))
    sft_gold = json.loads(sft_file.read_text())["gold_per_prompt"]
    for method in cfg.methods:
        out = root / method
        if (out / "result.json").exists():
            continue
        say(f"== {task_name} seed {seed}: {method}")
        t0 = time.perf_counter()
        result = train(method_config(cfg, pipe, method, out), overwrite=True)
        seconds = time.perf_counter() - t0
        policy, _ = load_policy(str(result.model_path), device=cfg.device, dtype=cfg.dtype)
        res = judge(policy, tok, task, examples, cfg, scorer, ref, seed) | extra(policy)
        res |= {
            "win_rate_vs_sft": win_rate(res["gold_per_prompt"], sft_gold),
            "seconds": seconds,
            "samples": _samples(cfg, method),
        }
        (out / "result.json").write_text(json.dumps(res))
        say(
            f"   {method}: win rate vs refs {res['win_rate']:.3f}, vs SFT {res['win_rate_vs_sft']:.3f}, "
            f"KL {res['kl']:.2f}, {seconds:.0f}s"
        )


def _samples(cfg: CompareConfig, method: str) -> int:
    """Generated completions a method trained on (0 for offline DPO)."""
    return 0 if method == "dpo" else cfg.rl.steps * cfg.rl.batch_size * cfg.rl.k


@stage_precision
def compare(cfg: CompareConfig, *, overwrite: bool = False) -> Path:
    """Run (or continue) the comparison and write the report; returns the report folder."""
    if cfg.quick:
        cfg = quick_config(cfg)
    out = Path(cfg.output_dir)
    if overwrite and out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)
    saved = out / "config.yaml"
    if saved.exists() and saved.read_text() != _dump(cfg):
        raise RlooError(
            f"{out} holds a comparison with other settings; pass {option('overwrite')} or choose another output_dir"
        )
    save_config(cfg, saved)
    t0 = time.perf_counter()
    for task_name in cfg.tasks:
        for seed in cfg.seeds:
            with _claim(out / "runs" / task_name / f"seed-{seed}") as mine:
                if mine:
                    run_cell(cfg, task_name, seed, out / "runs")
        if cfg.variance_batches >= 2 and not has_checker(get_task(task_name)):  # it measures the RM's gradient
            with _claim(out / "runs" / task_name / "variance") as mine:
                if mine:
                    variance_cell(cfg, task_name, cfg.seeds[0], out / "runs")
    report = write_report(cfg, out)
    say(f"compare: report in {report} ({time.perf_counter() - t0:.0f}s this invocation)")
    return report


@contextmanager
def _claim(cell: Path):
    """Lets several `rloo compare` processes on one output_dir share the cells: a cell whose lock
    (rloo.runtime.runlock) a live process holds is left to it; the lock of a killed run is taken over."""
    cell.mkdir(parents=True, exist_ok=True)
    with ExitStack() as stack:
        try:
            stack.enter_context(run_folder(cell))
        except RunFolderBusy as e:
            say(f"compare: {e}; skipping it here")
            yield False
            return
        yield True


def _dump(cfg: CompareConfig) -> str:
    return yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False)
