"""TRL's names for rloo's keys: a TRL user types `num_generations=8`, and the unknown-key message
names rloo's key for the same thing (`unknown key 'num_generations' for RLConfig (TRL's name;
rloo's is k)`). Keys that TRL's RLOOConfig (and its older PPO-style RLOOConfig) spells as rloo
does (beta, temperature, top_p, top_k, warmup_steps, max_grad_norm, seed, output_dir,
gradient_checkpointing, report_to, vllm_gpu_memory_utilization, reward_weights) need no entry.
docs/own-data.md has the table."""

from __future__ import annotations

from collections.abc import Iterable

# TRL's name -> (rloo's key, what differs: "" when nothing does)
TRL_NAMES: dict[str, tuple[str, str]] = {
    "num_generations": ("k", ""),
    "rloo_k": ("k", ""),
    "max_prompt_length": ("max_prompt_tokens", ""),
    "max_completion_length": ("max_new_tokens", ""),
    "response_length": ("max_new_tokens", ""),
    "learning_rate": ("lr", ""),
    "kl_coef": ("beta", ""),
    "per_device_train_batch_size": ("batch_size", "prompts per step, each sampled k times"),
    "max_steps": ("steps", ""),
    "num_train_epochs": ("steps", "rloo counts updates, not epochs"),
    "total_episodes": ("steps", "steps x batch_size x k completions in all"),
    "gradient_accumulation_steps": ("micro_batch_size", "prompts per forward pass; one update per step"),
    "logging_steps": ("log_every", ""),
    "save_steps": ("save_every", ""),
    "eval_steps": ("eval_every", ""),
    "save_total_limit": ("keep_checkpoints", ""),
    "missing_eos_penalty": ("truncation_penalty", "the score a response without EOS gets"),
    "stop_token": ("stop", ""),
    "bf16": ("dtype", "set dtype=bfloat16 (bf16 autocast)"),
    "use_vllm": ("generation", "set generation=vllm"),
    "reward_funcs": ("reward_fn", "module:function or path/to/file.py:function"),
    "reward_model_path": ("reward_model", ""),
    "model_name_or_path": ("policy", "model in rloo pipeline and rloo sft"),
    "sft_model_path": ("policy", ""),
    "dataset_name": ("dataset.path", ""),
    "dataset_train_split": ("dataset.split", ""),
    "dataset_test_split": ("dataset.eval_split", ""),
}


def trl_hint(key: str, paths: Iterable[str]) -> str:
    """` (TRL's name; rloo's is k)` for an unknown `key` that is one of TRL's names, when rloo's key
    is among `paths` (the config's dotted keys): in the key's own section first (`rl.num_generations`
    -> rl.k), else in every section that has it (`learning_rate` on the pipeline -> sft.lr or
    reward.lr or rl.lr); "" otherwise."""
    prefix, _, last = key.rpartition(".")
    if last not in TRL_NAMES:
        return ""
    target, note = TRL_NAMES[last]
    paths = list(paths)
    own = f"{prefix}.{target}" if prefix else target
    found = next(([p] for p in (own, target) if p in paths), [p for p in paths if p.endswith("." + target)])
    if not found:
        return ""
    return f" (TRL's name; rloo's is {' or '.join(found)}{': ' + note if note else ''})"
