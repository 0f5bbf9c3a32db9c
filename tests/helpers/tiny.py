"""The tiny settings every tier shares: one study (`rloo compare` on 1-layer width-32 models, 2 RL
steps) as a dict for `CompareConfig(**TINY_STUDY)` and as `KEY=VALUE` arguments for the CLI, so a
test that runs a study, in process or as `rloo compare`, does not hand-build its own."""

from __future__ import annotations

TINY_STUDY: dict = dict(
    sft={
        "num_examples": 64,
        "epochs": 1,
        "batch_size": 32,
        "arch": {"hidden_size": 32, "num_layers": 1, "num_heads": 2, "intermediate_size": 64},
    },
    reward={"num_pairs": 64, "eval_pairs": 16, "epochs": 1, "batch_size": 32},
    rl={
        "steps": 2,
        "batch_size": 2,
        "k": 4,
        "max_new_tokens": 5,
        "eval_every": 1,
        "eval_prompts": 8,
        "save_every": None,
        "algorithm_settings": {"dpo_batch_size": 32},
    },
    eval={"num_prompts": 8, "batch_size": 8},
    variance_batches=2,
    variance_samples=8,
)


def as_overrides(settings: dict, prefix: str = "") -> list[str]:
    """{"rl": {"steps": 2}, "seeds": [0]} -> ["rl.steps=2", "seeds=[0]"]: the CLI's override syntax
    (None is `null`, a list is `[a,b]`)."""
    out: list[str] = []
    for key, val in settings.items():
        if isinstance(val, dict):
            out += as_overrides(val, f"{prefix}{key}.")
        elif val is None:
            out.append(f"{prefix}{key}=null")
        elif isinstance(val, list):
            out.append(f"{prefix}{key}=[{','.join(str(v) for v in val)}]")
        else:
            out.append(f"{prefix}{key}={val}")
    return out


def no_plots(cfg, data, report):
    """rloo.experiments.compare.report.plot_all's stand-in for a test that reads no plot of its study
    (they were 7% of a tiny tuned study's time; tests/integration/test_compare.py checks them)."""
    return []
