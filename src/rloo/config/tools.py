"""Configs of the tools around training: `rloo bench` and `rloo compare`."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator, model_validator

from rloo.config.agents import episode_default_methods, episode_study_refusal
from rloo.config.base import MAX_BETA, MAX_LR, Seed, Strict, check_device_name, refuse_float16
from rloo.config.methods import compare_variants, one_of, several_updates_variants, spec_of_variant
from rloo.config.sections import EvalSettings, RewardSettings, SFTSettings, SharedRLSettings
from rloo.config.tasks import TASK_SPECS, check_task, episode_tasks


class BenchConfig(Strict):
    """`rloo bench`: rloo's RL step against TRL's RLOOTrainer (needs the `bench` extra), and with
    generation=vllm rloo generating with vLLM, side by side."""

    shapes: list[Literal["S", "M", "L", "1B"]] = Field(
        default=["S", "M", "L"],
        description="Benchmark shapes (see rloo.experiments.bench_assets; 1B: Pythia-1B-sized).",
    )
    device: str = Field(default="cpu", description="cpu or cuda: both trainers run there.")
    _device = field_validator("device")(classmethod(lambda cls, v: check_device_name(v)))
    dtype: Literal["auto", "float32", "bfloat16"] = Field(
        default="float32",
        description="Both trainers: float32, or bf16 mixed precision (TRL's bf16=True); auto as in "
        "the stages (rloo.runtime.precision).",
    )
    warmup: int = Field(default=2, ge=0, description="Untimed steps per trainer before measuring.")
    steps: int | None = Field(default=None, ge=1, description="Timed steps per trainer (null: 10, or 5 for L).")
    k: int = Field(default=4, ge=2, description="Completions per prompt.")
    batch_size: int = Field(default=8, ge=1, description="Prompts per step.")
    beta: float = Field(default=0.05, ge=0, le=MAX_BETA, description="KL coefficient (both trainers).")
    lr: float = Field(default=1e-6, gt=0, le=MAX_LR, description="AdamW learning rate (both trainers).")
    seed: Seed = Field(default=0)
    threads: int = Field(default=2, ge=1, description="torch threads per trainer process.")
    trl: bool = Field(default=True, description="Run TRL's RLOOTrainer alongside (false: rloo only).")
    share_prompt: bool = Field(default=True, description="rloo's prompt-once-per-group fast path.")
    output_dir: Path = Field(default=Path("runs/bench"), description="Built models (assets/) and bench.json.")
    staleness: list[int] = Field(
        default=[0],
        description="rl.max_staleness values to time rloo at, one rloo trainer each (docs/async.md); N > 0: "
        "a producer process samples and scores, the threads split between the two (1 + 1 on 2).",
    )

    generation: Literal["sampler", "vllm"] = Field(
        default="sampler",
        description="vllm: also time rloo generating with vLLM (trainer rloo-vllm: rl.generation=vllm at "
        "max_staleness 0, the engine in its process) beside rloo's own sampler; needs vLLM installed.",
    )

    @model_validator(mode="after")
    def _check_staleness(self):
        if not self.staleness or len(set(self.staleness)) < len(self.staleness) or min(self.staleness) < 0:
            raise ValueError(f"staleness: needs distinct values >= 0, got {self.staleness}")
        if max(self.staleness) > 0 and self.threads < 2:
            raise ValueError("staleness > 0 needs threads >= 2 (the producer takes half of them)")
        return self


COMPARE_METHODS = tuple(compare_variants())
"""Methods `rloo compare` knows: an algorithm plus overrides (rloo.config.methods.compare_variants)."""


MULTI_UPDATE_METHODS = several_updates_variants()
"""Methods that take ppo_epochs x num_minibatches optimizer steps per batch (the others take one)."""


class MethodGrid(Strict):
    """One method's own tuning grid (`tuning.grids.<method>`): each key given replaces the shared
    one for that method; the keys left out stay the shared ones."""

    lr: list[float] | None = Field(default=None, description="rl.lr choices of this method (dpo: dpo_lr).")
    beta: list[float] | None = Field(default=None, description="rl.beta choices of this method (dpo: dpo_beta).")
    updates: list[tuple[int, int]] | None = Field(
        default=None, description="(ppo_epochs, num_minibatches) choices (only a method that takes several)."
    )


def _check_space(where: str, lr: list[float], beta: list[float], updates: list[tuple[int, int]]) -> None:
    for name, vals, top in (("lr", lr, MAX_LR), ("beta", beta, MAX_BETA)):
        if not vals or any(not 0 < v <= top for v in vals) or len(set(vals)) < len(vals):
            raise ValueError(f"{where}{name}: needs distinct values in (0, {top:g}], got {vals}")
    if not updates or any(e < 1 or m < 1 for e, m in updates) or len(set(updates)) < len(updates):
        raise ValueError(f"{where}updates: needs distinct (epochs, minibatches) pairs >= 1, got {updates}")


class TuningSettings(Strict):
    """`rloo compare`'s per-method search over the settings that set how far a method moves, chosen on
    validation prompts (disjoint from the evaluation prompts) with tuning seeds (disjoint from the
    reported seeds); every method gets `trials` trials, then runs on the reported seeds with its choice."""

    trials: int = Field(
        default=0, ge=0, description="Trials per method and task (0: no tuning; every method at the rl settings)."
    )
    seeds: list[Seed] = Field(
        default=[100, 101], description="Tuning seeds (their own SFT and reward models); none may be a reported seed."
    )
    lr: list[float] = Field(default=[3e-5, 1e-4, 3e-4], description="rl.lr choices (dpo: dpo_lr).")
    beta: list[float] = Field(default=[0.05, 0.1, 0.25, 0.5], description="rl.beta choices (dpo: dpo_beta).")
    updates: list[tuple[int, int]] = Field(
        default=[(1, 1), (2, 2), (4, 2)],
        description="(ppo_epochs, num_minibatches) choices for the methods that take several steps per batch: "
        + ", ".join(MULTI_UPDATE_METHODS)
        + ".",
    )
    valid_prompts: int = Field(default=200, ge=1, description="Validation prompts each trial is judged on, per seed.")
    metric: Literal["win_rate", "win_rate_vs_sft"] = Field(
        default="win_rate",
        description="Selection: the trial with the highest mean of this over the tuning seeds, on the validation "
        "prompts (ties: the earlier trial).",
    )
    max_kl: float | None = Field(
        default=None, gt=0, description="Selection: only trials whose mean validation KL is at most this (null: all)."
    )
    search_seed: Seed = Field(default=0, description="Seed of the draw of trials from each method's grid.")
    grids: dict[str, MethodGrid] = Field(
        default={},
        description="Per-method grids: {method: {lr, beta, updates}}, each key given replacing the shared one "
        "for that method (e.g. dpo's own beta, rloo's lr reaching further); the same number of trials each.",
    )
    update_views: dict[str, list[tuple[int, int]]] = Field(
        default={},
        description="{method: [(epochs, minibatches), ...]}: also report the method, as <method>@<e>x<m>, at its best "
        "trial among those with these updates (no extra trials), beside its overall choice.",
    )

    untuned: bool = Field(
        default=False,
        description="Also run every method at the shared rl settings on the reported seeds, as <method>@untuned, in "
        "the same cells as its tuned run (same SFT and reward model): what tuning changed, paired by seed.",
    )

    def grid_of(self, method: str) -> tuple[list[float], list[float], list[tuple[int, int] | None]]:
        """(lr, beta, updates) a method's trials are drawn from: its `grids` entry over the shared grid;
        updates [None] for a method that takes one step per batch."""
        own = self.grids.get(method, MethodGrid())
        several = method in several_updates_variants()
        updates: list[tuple[int, int] | None] = list(own.updates or self.updates) if several else [None]
        return own.lr or self.lr, own.beta or self.beta, updates

    @model_validator(mode="after")
    def _space(self):
        _check_space("", self.lr, self.beta, self.updates)
        if self.trials > len(self.lr) * len(self.beta):
            raise ValueError(
                f"trials: {self.trials} is more than the {len(self.lr) * len(self.beta)} lr x beta settings of a "
                "one-step method; every method must get the same number of distinct trials"
            )
        if self.trials and not self.seeds:
            raise ValueError("seeds: tuning needs at least one tuning seed")
        for m, g in self.grids.items():
            if m not in (known := compare_variants()):  # read now: a method added by add_method is known too
                raise ValueError(f"grids: unknown method '{m}'; choose from {', '.join(known)}")
            if g.updates is not None and m not in several_updates_variants():
                raise ValueError(f"grids.{m}.updates: {m} takes one optimizer step per batch")
            lr, beta, updates = self.grid_of(m)
            _check_space(f"grids.{m}.", lr, beta, [u for u in updates if u] or [(1, 1)])
            if self.trials > len(lr) * len(beta) * len(updates):
                raise ValueError(
                    f"grids.{m}: {self.trials} trials is more than its {len(lr) * len(beta) * len(updates)} settings"
                )
        for m, pairs in self.update_views.items():
            if m not in several_updates_variants():
                raise ValueError(f"update_views: '{m}' is not a method that takes several steps per batch")
            have = self.grid_of(m)[2]
            if bad := [list(p) for p in pairs if tuple(p) not in have]:
                raise ValueError(f"update_views.{m}: {bad} not among its updates {[list(u or ()) for u in have]}")
        return self


class CompareConfig(Strict):
    """`rloo compare`: methods x tasks x seeds under the same sample budget, one report folder."""

    methods: list[str] = Field(
        default_factory=lambda: list(compare_variants()),
        description="Methods to compare: " + ", ".join(COMPARE_METHODS) + " (default: all; for episode tasks the "
        "methods that train on episodes, docs/agents.md).",
    )
    tasks: list[str] = Field(
        # the tasks judged by a reward model (no checker, no environment): summarize and dialogue
        default_factory=lambda: [n for n, s in TASK_SPECS.items() if s.checker is None and s.env is None],
        description="Built-in tasks ("
        + ", ".join(TASK_SPECS)
        + "): text tasks, or tasks played as episodes ("
        + ", ".join(episode_tasks())
        + "; not both in one study; docs/compare.md).",
    )
    seeds: list[Seed] = Field(
        default=[0, 1, 2], description="One SFT model, reward model and run of each method per seed."
    )
    quick: bool = Field(default=False, description="Tiny settings (smoke run, minutes): overrides the sections below.")
    output_dir: Path = Field(default=Path("runs/compare"), description="Runs in runs/, the report in report/.")
    device: str = Field(default="cpu", description="torch device.")
    _device = field_validator("device")(classmethod(lambda cls, v: check_device_name(v)))
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        default="auto",
        description="As in every stage: auto is bf16 autocast on GPU, on CPU where bf16 matmul is fast; no float16.",
    )
    max_prompt_tokens: int = Field(default=64, ge=1)
    max_response_tokens: int = Field(default=32, ge=1)
    max_cut_share: float = Field(default=0.25, ge=0, le=1, description="As every stage's; the cells' evaluation too.")
    sft: SFTSettings = Field(default_factory=SFTSettings)
    reward: RewardSettings = Field(default_factory=RewardSettings)
    rl: SharedRLSettings = Field(
        default_factory=SharedRLSettings,
        description="Shared by every method; steps x batch_size x k is the sample budget of each.",
    )
    eval: EvalSettings = Field(default_factory=EvalSettings)
    variance_batches: int = Field(
        default=24, ge=0, description="Independent batches per gradient-variance estimate (< 2: skip)."
    )
    variance_samples: int = Field(
        default=32, ge=4, description="Completions per batch in the gradient-variance measurement."
    )
    weak_sft_fraction: float = Field(
        default=0.05, gt=0, le=1, description="Weak starting model: SFT on this share of the SFT data, one epoch."
    )
    tuning: TuningSettings = Field(
        default_factory=TuningSettings, description="Per-method tuning before the reported runs (off by default)."
    )
    equal_kl: list[float] = Field(
        default=[0.25, 0.5, 1.0],
        description="KL values at which the report reads each method's win rate off its training trajectory.",
    )
    equal_compute: list[float] = Field(
        default=[0.5, 1.0],
        description="Training times, as multiples of the shortest rloo run's, at which the report reads each "
        "method's win rate off its training trajectory (wall-clock of the logged time/* phases).",
    )

    @field_validator("dtype")
    @classmethod
    def _dtype(cls, v):
        return refuse_float16(v)

    @field_validator("methods")
    @classmethod
    def _known(cls, v: list[str]) -> list[str]:
        known = compare_variants()  # read now: a method added by add_method is known too
        bad = [m for m in v if m not in known]
        if bad or not v:
            raise ValueError(f"unknown method(s) {bad}; choose from {', '.join(known)}")
        return v

    @field_validator("tasks")
    @classmethod
    def _known_tasks(cls, v: list[str]) -> list[str]:
        return [check_task(t) for t in v]

    @field_validator("equal_kl", "equal_compute")
    @classmethod
    def _positive(cls, v: list[float]) -> list[float]:
        if not v or any(x <= 0 for x in v):
            raise ValueError(f"needs values > 0, got {v}")
        return v

    @model_validator(mode="after")
    def _tuning_seeds_are_not_reported(self):
        both = sorted(set(self.seeds) & set(self.tuning.seeds)) if self.tuning.trials else []
        if both:
            raise ValueError(
                f"tuning.seeds {both} are also reported seeds; tuning must not see the runs it reports "
                "(choose disjoint seeds)"
            )
        return self

    @model_validator(mode="after")
    def _one_producer_per_run(self):
        if self.rl.producer_address is not None:  # `rloo produce` serves one run and ends with it
            raise ValueError("rl.producer_address: a study runs many RL stages; use a producer here (unset it)")
        return self

    @model_validator(mode="before")
    @classmethod
    def _episode_methods(cls, data):
        return episode_default_methods(data)

    @model_validator(mode="after")
    def _episode_tasks(self):
        if why := episode_study_refusal(self.tasks, self.methods, self.tuning.trials):
            raise ValueError(why)
        return self

    @model_validator(mode="after")
    def _offline_needs_pairs(self):
        checked = [t for t in self.tasks if TASK_SPECS[t].checker is not None]
        offline = [m for m in self.methods if not spec_of_variant(m).online]
        if offline and checked:
            raise ValueError(
                f"{one_of(offline, 'and')} trains on a reward model's preference pairs, which {', '.join(checked)} "
                f"(scored by a checker) does not have; drop {one_of(offline, 'and')} from methods"
            )
        return self
