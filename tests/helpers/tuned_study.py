"""The suite's one tuned comparison: `rloo compare` with tuning at the tiny study sizes (tests/helpers/tiny.py),
the costliest run of the quick suite, made once per session (`tuned_study` in tests/conftest.py) and read
by the tests of how a tuned study chooses (tests/integration/test_compare_tuning.py) and of how it is
saved, restored and resumed (tests/integration/test_compare_cells.py, on a copy).

Its settings hold every part those tests read: two methods of which one (ppo) has a grid of its own and
an update view (ppo@2x2), trials at two update counts, the untuned runs, two equal-KL levels. While it
runs, the evaluation prompts are poisoned until the choice is made (any score of one is an error), and
every RL run records (seed, split, chosen yet): selection must see only the validation split and the
tuning seeds."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pytest

from helpers.tiny import TINY_STUDY, no_plots
from rloo.config import CompareConfig
from rloo.tasks.base import stable_hash
from rloo.tasks.summarize import EVAL_BUCKETS, SummarizeTask

# relative: the study is made in its own folder, and a test that changes it copies it to its own
# folder and runs the same config there (compare refuses a folder whose saved config differs, and
# the saved config holds output_dir)
OUTPUT_DIR = Path("study")


def tuned_study_config() -> CompareConfig:
    return CompareConfig(
        methods=["rloo", "ppo"],
        tasks=["summarize"],
        seeds=[0],
        output_dir=OUTPUT_DIR,
        dtype="float32",
        tuning={
            "trials": 2,
            "seeds": [5],
            "lr": [1e-4, 3e-2],
            "beta": [0.25],
            "updates": [[1, 1], [2, 2]],
            "grids": {"ppo": {"lr": [1e-4]}},  # ppo: lr 1e-4 at 1x1 and at 2x2
            "update_views": {"ppo": [[2, 2]]},
            "untuned": True,
            "metric": "win_rate_vs_sft",  # the tiny SFT models almost never beat a reference
            "valid_prompts": 8,  # the default 200 made each trial's evaluation most of this study's time
        },
        equal_kl=[0.01, 100.0],
        **(TINY_STUDY | {"variance_batches": 0}),
    )


def is_eval_prompt(prompt: str) -> bool:
    """summarize's evaluation partition (SummarizeTask.sample_prompt): the hash of the post."""
    post = prompt.removeprefix("post : ").removesuffix(" tl;dr :")
    return stable_hash(post) % EVAL_BUCKETS == 0


@dataclass
class TunedStudy:
    """The finished study (`root / "study"`, read-only: copy it before changing it), its config and
    what was seen while it ran: each RL run's (seed, eval_split, after the choice) in order, and how
    many evaluation prompts were scored (all after the choice)."""

    root: Path
    cfg: CompareConfig
    train_seeds: list[tuple[int, str, bool]] = field(default_factory=list)
    scored_eval: int = 0
    selected: bool = False

    @property
    def out(self) -> Path:
        return self.root / OUTPUT_DIR


def run_tuned_study(root: Path) -> TunedStudy:
    import rloo.experiments.compare.report as report_mod
    import rloo.experiments.compare.study as compare_mod

    study = TunedStudy(root, tuned_study_config())
    gold = SummarizeTask.gold_score
    real_train, real_choose = compare_mod.train, compare_mod.choose

    def poisoned(self, prompt, response):
        # adversarial evaluation split: before the choice, any score of an evaluation prompt is an
        # error (and would rank the trials backwards if it were read)
        if is_eval_prompt(prompt):
            if not study.selected:
                raise AssertionError(f"an evaluation prompt was scored before selection: {prompt!r}")
            study.scored_eval += 1
            return -gold(self, prompt, response)
        return gold(self, prompt, response)

    def spy_train(rl_cfg, **kw):
        study.train_seeds.append((rl_cfg.seed, rl_cfg.eval_split, study.selected))
        return real_train(rl_cfg, **kw)

    def spy_choose(*a, **kw):
        chosen = real_choose(*a, **kw)
        study.selected = True
        return chosen

    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(root)
        mp.setattr(SummarizeTask, "gold_score", poisoned)
        mp.setattr(compare_mod, "train", spy_train)
        mp.setattr(compare_mod, "choose", spy_choose)
        mp.setattr(report_mod, "plot_all", no_plots)
        compare_mod.compare(study.cfg)
    return study
