"""Which checkpoints are whole: the manifest check, the newest good one on resume, and pruning.

A checkpoint counts once its COMPLETE marker is written (rloo.runtime.checkpoint.save writes it last);
it is whole when the files match the marker's manifest and its state loads. Pruning keeps only
checkpoints known to be whole, so a broken one never takes the place of a good one.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file

from rloo.errors import RlooError, option
from rloo.runtime.runfolder.atomic import check_manifest, remove_tree_reporting
from rloo.runtime.runfolder.reading import read_text
from rloo.runtime.tracking.log import say

MARKER = "COMPLETE"


def step_of(ckpt: Path) -> int:
    return int(Path(ckpt).name.split("-")[-1])


def list_checkpoints(run_dir: Path) -> list[Path]:
    """Checkpoint folders that were finished (COMPLETE written), oldest first; not yet verified."""
    root = Path(run_dir) / "checkpoints"
    if not root.exists():
        return []
    return sorted(p for p in root.glob("step-*") if (p / MARKER).exists())


def verify_checkpoint(ckpt: Path) -> str | None:
    """None when `ckpt` is whole, else why it is not."""
    try:
        marker = json.loads(read_text(Path(ckpt) / MARKER))  # a FIFO there: refused, not waited on
        files = marker["files"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        return f"its {MARKER} marker is unreadable ({type(e).__name__})"
    if "state.pt" not in files or not any(f.endswith(".safetensors") for f in files):
        return "its manifest lists no state.pt or no safetensors weights"
    return check_manifest(ckpt, files)


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The newest checkpoint that is whole and whose state loads; broken ones are reported and skipped."""
    root = Path(run_dir) / "checkpoints"
    if root.exists():
        for partial in sorted(p for p in root.iterdir() if p.name.startswith(".tmp-step-")):
            say(f"skipping unfinished checkpoint {partial} (the run stopped while writing it)")
        for unmarked in sorted(p for p in root.glob("step-*") if not (p / MARKER).exists()):
            say(
                f"skipping broken checkpoint {unmarked}: it has no {MARKER} marker (not finished, or the marker "
                f"was deleted)"
            )
    for ckpt in reversed(list_checkpoints(run_dir)):
        problem = verify_checkpoint(ckpt)
        if problem is None:
            try:
                load_state(ckpt)
                mark_verified(ckpt)
                return ckpt
            except Exception as e:  # noqa: BLE001 - a state file that does not load means: skip it
                problem = f"state.pt does not load ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})"
        say(f"skipping broken checkpoint {ckpt}: {problem}")
    return None


# Checkpoints this process wrote or verified, by the identity of their marker file: pruning keeps
# the newest `keep` of these, so it never keeps a broken checkpoint in place of a good one.
_VERIFIED: set[tuple] = set()


def _marker_id(ckpt: Path) -> tuple | None:
    try:
        st = (Path(ckpt) / MARKER).stat()
    except OSError:
        return None
    return str(ckpt), st.st_ino, st.st_mtime_ns, st.st_size


def mark_verified(ckpt: Path) -> None:
    _VERIFIED.add(_marker_id(ckpt))


def is_verified(ckpt: Path) -> bool:
    """Whole, by the cache or by checking its manifest now (and loading its state)."""
    if _marker_id(ckpt) in _VERIFIED:
        return True
    if verify_checkpoint(ckpt) is not None:
        return False
    try:
        load_state(ckpt)
    except Exception:  # noqa: BLE001 - a state that does not load makes the checkpoint useless
        return False
    mark_verified(ckpt)
    return True


def prune_checkpoints(run_dir: Path, keep: int, newest: Path) -> None:
    """Keep the newest `keep` verified checkpoints (`newest`, just written, among them); delete the
    rest, broken ones included. A folder that cannot be deleted is reported, not ignored."""
    kept = [newest]
    root = Path(run_dir) / "checkpoints"
    for ckpt in sorted(root.glob("step-*"), reverse=True):
        if ckpt == newest:
            continue
        if len(kept) < keep and step_of(ckpt) < step_of(newest) and is_verified(ckpt):
            kept.append(ckpt)
            continue
        if step_of(ckpt) > step_of(newest):
            continue  # newer than this run's position (its own logic drops those: drop_newer_than)
        problem = remove_tree_reporting(ckpt)
        if problem:
            say(f"warning: could not delete old checkpoint {ckpt} ({problem}); delete it by hand to free space")


RING = "ring"  # an asynchronous run's older weight versions (rloo.runtime.checkpoint.save)


def ring_file(folder: Path, version: int) -> Path:
    return Path(folder) / f"version-{version:06d}.safetensors"


def load_ring(ckpt: Path) -> dict[int, dict[str, torch.Tensor]]:
    """{version: tensors} of the older weight versions in `ckpt` (none: a synchronous run, or a
    checkpoint from before exact resume at max_staleness > 0)."""
    files = sorted((Path(ckpt) / RING).glob("version-*.safetensors"))
    return {int(f.stem.split("-")[1]): load_file(str(f)) for f in files}


# The entries of a state.pt that a resume reads unconditionally: a supervised stage's (SFT, reward
# model, DPO: rloo.training.supervised.StageRun) and an RL run's (rloo.runtime.checkpoint.save)
COMMON_KEYS = ("config", "step", "rng", "optimizer", "scheduler", "metrics_bytes")
STAGE_KEYS = (*COMMON_KEYS, "extra", "epoch", "done", "order", "guard")
RL_KEYS = (*COMMON_KEYS, "stream", "counters")


def checked_state(
    ckpt: Path, state: dict, keys: tuple[str, ...] = ("config", "extra"), needs: tuple[str, ...] = COMMON_KEYS
) -> dict:
    """`state` (of checkpoint `ckpt`) once it holds every entry of `needs` and its entries held as JSON
    text (`keys`: the config; a supervised stage's `extra`) decode to objects. A state changed by hand
    and its manifest re-hashed was a 27-31-line JSONDecodeError or KeyError mid-resume (after SFT had
    rewritten config.yaml); it is one line now, before the run folder is touched."""
    for key in needs:
        if key not in state:
            raise tampered(ckpt, f"its state has no {key!r}")
    for key in keys:
        if key not in state:
            continue
        try:
            value = json.loads(state[key])
        except (TypeError, ValueError, RecursionError) as e:
            raise tampered(ckpt, f"its state's {key!r} is not JSON ({str(e).splitlines()[0][:60]})") from None
        if not isinstance(value, dict):
            raise tampered(ckpt, f"its state's {key!r} holds a JSON {type(value).__name__}, not an object")
    return state


def tampered(ckpt: Path, what: str) -> RlooError:
    """The one-line refusal of a checkpoint whose state is not what rloo wrote (`what`)."""
    return RlooError(
        f"cannot resume from {ckpt}: {what}; the checkpoint was changed after it was written: delete it to "
        f"resume from an earlier one, or rerun with {option('overwrite')} (nothing was changed)"
    )


def load_state(ckpt: Path) -> dict:
    # weights_only: tensors, numbers, strings and containers only; a pickled object is refused.
    # map_location: onto the CPU on every rank (saved from cuda:0, every rank would otherwise load the
    # optimizer state onto cuda:0); the optimizer moves its state to each parameter's own device.
    return torch.load(Path(ckpt) / "state.pt", weights_only=True, map_location="cpu")
