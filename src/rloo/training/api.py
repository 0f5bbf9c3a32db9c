"""The Python API's stage entry points (`rloo.train`, `rloo.sft`, `rloo.train_reward`): the stages of
rloo.training.rl / sft / reward, plus what a TRL user hands a trainer: a loaded model
(a transformers PreTrainedModel or a peft PeftModel), a tokenizer object, a `datasets.Dataset`
(or DatasetDict, or an iterable of row dicts) in place of the config's paths, and `callbacks`.

    model = AutoModelForCausalLM.from_pretrained("my-sft-model")
    rloo.train(RLConfig(output_dir="runs/mine"), model=model, tokenizer=tok, dataset=ds, reward_fn=f)

The objects go through the paths' checks and code (rloo.training.handed); the config records them
by content (`policy: memory:Qwen2ForCausalLM:3f2a...`), and `resume=True` must be handed the same
initial weights, tokenizer and rows again (a model as loaded, not the one the interrupted call
trained). The handed model is the one trained (in place), as in TRL; the run folder's model/ holds
the result either way.
"""

from __future__ import annotations

from collections.abc import Callable

from rloo.config import OFFLINE_ALGORITHMS, RewardConfig, RLConfig, SFTConfig
from rloo.config.method_settings import ValueSettings
from rloo.errors import ConfigError
from rloo.runtime.inputs.objects import holding
from rloo.training import reward as reward_stage
from rloo.training import rl as rl_stage
from rloo.training import sft as sft_stage
from rloo.training.handed import hand_in
from rloo.training.loop import RLResult
from rloo.training.reward import RewardResult
from rloo.training.sft import SFTResult


def train(
    cfg: RLConfig,
    *,
    prompts: list[str] | None = None,
    reward_fn: Callable | None = None,
    resume: bool = False,
    overwrite: bool = False,
    model=None,
    tokenizer=None,
    dataset=None,
    callbacks: list | None = None,
) -> RLResult:
    """RL fine-tuning (rloo.training.rl.train) of `cfg.policy`, or of `model` (then `tokenizer`, or
    the one its config names), on the built-in task, `cfg.dataset`, `dataset` or `prompts`.
    `callbacks`: objects with any of on_log, on_evaluate, on_step_end, on_save (a transformers
    TrainerCallback works; rloo.training.callbacks); one that asks to stop ends the run with a
    checkpoint, as Ctrl-C does (rloo.errors.StoppedByCallback)."""
    if dataset is not None and prompts is not None:
        raise ConfigError("pass prompts= or dataset=, not both")
    if cfg.algorithm in OFFLINE_ALGORITHMS and (model, tokenizer, dataset) != (None, None, None):
        raise ConfigError(
            f"algorithm={cfg.algorithm} reads policy=PATH and its pairs from files: drop model=, dataset="
        )
    if model is not None and cfg.generation == "vllm":
        raise ConfigError("generation=vllm starts its engine from policy=PATH: save the model and pass its folder")
    if (
        model is not None
        and isinstance(cfg.algorithm_settings, ValueSettings)
        and cfg.algorithm_settings.value_model == "separate"
        and not cfg.reward_model
    ):
        raise ConfigError(
            f"algorithm={cfg.algorithm}'s separate value model starts from policy=PATH: set "
            f"algorithm_settings.value_model=head, or reward_model=PATH to start it from"
        )
    cfg, held = hand_in(cfg, "policy", model, tokenizer, dataset)
    with holding(held):
        return rl_stage.train(
            cfg, prompts=prompts, reward_fn=reward_fn, resume=resume, overwrite=overwrite, callbacks=callbacks
        )


def sft(
    cfg: SFTConfig,
    *,
    resume: bool = False,
    overwrite: bool = False,
    model=None,
    tokenizer=None,
    dataset=None,
    callbacks: list | None = None,
) -> SFTResult:
    """Supervised fine-tuning (rloo.training.sft.sft) of `cfg.model` or `model`, with `cfg.tokenizer`
    or `tokenizer`, on the task, `cfg.dataset` or `dataset` (prompt and completion columns)."""
    cfg, held = hand_in(cfg, "model", model, tokenizer, dataset, tokenizer_key="tokenizer")
    with holding(held):
        return sft_stage.sft(cfg, resume=resume, overwrite=overwrite, callbacks=callbacks)


def train_reward(
    cfg: RewardConfig,
    *,
    resume: bool = False,
    overwrite: bool = False,
    model=None,
    tokenizer=None,
    dataset=None,
    callbacks: list | None = None,
) -> RewardResult:
    """Reward-model training (rloo.training.reward.train_reward) from `cfg.model` / `cfg.sft_model` or
    `model` (a sequence classifier with num_labels=1), on the task, `cfg.dataset` or `dataset`
    (prompt, chosen, rejected columns)."""
    cfg, held = hand_in(cfg, "model", model, tokenizer, dataset)
    with holding(held):
        return reward_stage.train_reward(cfg, resume=resume, overwrite=overwrite, callbacks=callbacks)
