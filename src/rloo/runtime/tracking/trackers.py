"""Experiment trackers a run reports to (`report_to`): TensorBoard, Weights & Biases, or none.

Every tracker gets the same scalars (what `metrics.jsonl` holds) and, every `sample_every` RL steps,
a table of sample completions: prompt, completion, score, KL and advantage (TensorBoard: a text
panel holding a markdown table; wandb: a `wandb.Table`). wandb is optional (`pip install
'rloo[wandb]'`) and honours its own settings: WANDB_MODE=offline writes the run under
`<output_dir>/wandb/` with no network, to `wandb sync` later; WANDB_PROJECT names the project.
"""

from __future__ import annotations

import os
from pathlib import Path

from rloo.errors import ConfigError, RlooError
from rloo.runtime.runfolder.confine import confine

SAMPLE_COLUMNS = ("prompt", "completion", "score", "kl", "advantage")


def check_wandb_installed(names) -> None:
    if "wandb" in names:
        try:
            import wandb  # noqa: F401  (optional dependency: rloo[wandb])
        except ImportError:
            raise ConfigError(
                "report_to=wandb needs the wandb package: pip install 'rloo[wandb]' (or report_to=tensorboard)"
            ) from None


class TensorBoardTracker:
    def __init__(self, out_dir: Path, purge_step: int | None = None):
        from torch.utils.tensorboard import SummaryWriter  # import is slow; only when used

        # purge_step hides events a resumed run is about to log again
        log_dir = confine(out_dir / "tensorboard", folder=True)  # never a link out of the run folder
        self.writer = SummaryWriter(log_dir=str(log_dir), purge_step=purge_step)

    def scalars(self, step: int, metrics: dict[str, float]) -> None:
        for k, v in metrics.items():
            if v is not None:
                self.writer.add_scalar(k, v, step)

    def samples(self, step: int, rows: list[dict]) -> None:
        self.writer.add_text("samples", markdown_table(rows), step)

    def close(self) -> None:
        self.writer.close()


class WandbTracker:
    def __init__(self, out_dir: Path, config: dict | None = None):
        import wandb  # optional dependency (rloo[wandb]): only when report_to names it

        self.wandb = wandb
        name = f"{out_dir.parent.name}/{out_dir.name}" if out_dir.parent.name else out_dir.name
        try:
            self.run = wandb.init(
                project=os.environ.get("WANDB_PROJECT", "rloo"),
                dir=str(confine(out_dir / "wandb", folder=True).parent),
                name=name,
                config=config or {},
                reinit="finish_previous",
            )
        except Exception as e:  # noqa: BLE001 - login, network, settings: one line that says what to do
            first = str(e).strip().splitlines()[0] if str(e).strip() else ""
            raise RlooError(
                f"wandb could not start a run: {type(e).__name__}: {first}; "
                f"log in (wandb login), or set WANDB_MODE=offline to write the run locally"
            ) from e

    def scalars(self, step: int, metrics: dict[str, float]) -> None:
        self.run.log({k: v for k, v in metrics.items() if v is not None}, step=step)

    def samples(self, step: int, rows: list[dict]) -> None:
        table = self.wandb.Table(columns=list(SAMPLE_COLUMNS), data=[[r.get(c) for c in SAMPLE_COLUMNS] for r in rows])
        self.run.log({"samples": table}, step=step)

    def close(self) -> None:
        self.run.finish()


def start_trackers(names: list[str], out_dir: Path, purge_step: int | None = None, config: dict | None = None):
    out = []
    for n in names:
        out.append(TensorBoardTracker(out_dir, purge_step) if n == "tensorboard" else WandbTracker(out_dir, config))
    return out


def sample_rows(roll, limit: int = 16) -> list[dict]:
    """Up to `limit` completions of a rollout with the values the step recorded for each
    (`roll.per_sample`: score, kl, advantage; None where the method has no such number)."""
    rows = []
    for i in range(min(limit, len(roll.prompts))):
        row = {"prompt": roll.prompts[i], "completion": roll.completions[i]}
        for c in SAMPLE_COLUMNS[2:]:
            v = roll.per_sample.get(c)
            row[c] = None if v is None else float(v[i])
        rows.append(row)
    return rows


def markdown_table(rows: list[dict]) -> str:
    def cell(v):
        if v is None:
            return "-"
        if isinstance(v, float):
            return f"{v:.3f}"
        return str(v).replace("|", "\\|").replace("\n", " ")

    head = "| " + " | ".join(SAMPLE_COLUMNS) + " |\n|" + "---|" * len(SAMPLE_COLUMNS)
    return head + "".join("\n| " + " | ".join(cell(r.get(c)) for c in SAMPLE_COLUMNS) + " |" for r in rows)
