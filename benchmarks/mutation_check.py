"""Does each reliability test fail without the behaviour it checks?

For every behaviour in docs/reliability.md's mutation table, it copies `src/` to a temporary folder, removes the
behaviour there with one textual edit (or two, where one line alone cannot remove it) (a
"mutant"), runs the test that is meant to catch it against the mutated copy, and reports
whether that test failed (caught) or passed (a test that could not fail). The edit must match
the source exactly once, so a mutant that no longer applies is reported as stale instead of
silently testing nothing (tests/unit/test_mutation_table.py checks that in the quick suite, without
running any mutant). The real source is never touched.

    python benchmarks/mutation_check.py                 # all mutants, ~5-10 min on 2 cores
    python benchmarks/mutation_check.py guard rng       # only these
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parents[1]
R = "tests/reliability/"


class Mutant(NamedTuple):
    """One behaviour removed: in `file` (under src/rloo) each `old` text (exactly once in the file)
    becomes `new`; `test` must then fail. `behaviour` names what is removed (docs/reliability.md's table)."""

    file: str
    old: str | tuple[str, ...]
    new: str | tuple[str, ...]
    test: str
    behaviour: str


MUTANTS = {
    "manifest": Mutant(
        "runtime/checkpoint/verify.py",
        "    return check_manifest(ckpt, files)",
        "    return None",
        R + "test_checkpoints.py::test_corrupt_checkpoint_is_reported_and_skipped",
        "manifest check",
    ),
    "weights_only": Mutant(
        "runtime/checkpoint/verify.py",
        'state.pt", weights_only=True, map_location="cpu")',
        'state.pt", weights_only=False, map_location="cpu")',
        R + "test_checkpoints.py::test_pickled_code_in_state_is_never_run",
        "weights_only loading",
    ),
    "rng": Mutant(
        "runtime/checkpoint/save.py",
        '        set_rng_state(state["rng"], self.gen)',
        "        pass",
        R + "test_resume.py::test_sigterm_then_resume_is_bitwise_exact",
        "RNG restore",
    ),
    "data_position": Mutant(
        "runtime/checkpoint/save.py",
        '        self.stream.seek(*state["stream"])',
        "        pass",
        R + "test_resume.py::test_sigterm_then_resume_is_bitwise_exact",
        "data-position restore",
    ),
    "optimizer": Mutant(
        "runtime/checkpoint/save.py",
        # restore_optimizer, which the RL loop's restore calls: the LambdaLR schedule is still restored
        '    opt.load_state_dict(state["optimizer"])',
        "    pass",
        R + "test_resume.py::test_sigterm_then_resume_is_bitwise_exact",
        "optimizer restore",
    ),
    "algo_state": Mutant(
        "runtime/checkpoint/save.py",
        '            self.algo.load_state_dict(state.get("algorithm", {}))',
        "            pass",
        R + "test_resume.py::test_stateful_algorithms_resume_exactly",
        "algorithm state restore",
    ),
    "metrics_cut": Mutant(
        "runtime/checkpoint/save.py",
        '        truncate_metrics(self.out, state["metrics_bytes"])',
        "        pass",
        R + "test_kill.py::test_killed_three_times_then_resumed_equals_uninterrupted",
        "metrics cut back on resume",
    ),
    "partial_cleanup": Mutant(
        "runtime/checkpoint/save.py",
        "        remove_tree(tmp)\n        prev =",
        "        prev =",
        R + "test_checkpoints.py::test_full_disk_while_checkpointing",
        "removal of a half-written checkpoint",
    ),
    # a checkpoint written straight into its final folder instead of a temp folder renamed into place
    "atomic_rename": Mutant(
        "runtime/checkpoint/save.py",
        ('final, tmp = root / f"step-{step:06d}", root / f".tmp-step-{step:06d}"', "    _replace_dir(tmp, final)\n"),
        ('final = tmp = root / f"step-{step:06d}"', ""),
        R + "test_kill.py::test_killed_three_times_then_resumed_equals_uninterrupted",
        "temp folder + rename (atomic write)",
    ),
    "guard": Mutant(
        "algorithms/base.py",
        "    if finite:\n        opt.step()",
        "    if True:\n        opt.step()",
        R + "test_guard.py::test_isolated_non_finite_step_is_skipped_and_counted",
        "non-finite guard (guarded_step)",
    ),
    "signals": Mutant(
        "runtime/signals.py",
        "            self._old = {s: signal.signal(s, self._handle)",
        "            self._old = {s: signal.getsignal(s)",
        R + "test_resume.py::test_sigterm_then_resume_is_bitwise_exact",
        "SIGTERM handler",
    ),
    "occupied_output": Mutant(
        "training/common.py",
        '        raise RlooError(f"{out} already holds {what}; {how}',
        '        if False: raise RlooError(f"{out} already holds {what}; {how}',
        R + "test_bad_input.py::test_output_folder_holding_a_run_is_refused",
        "refusal of an occupied output folder",
    ),
    "reward_nan": Mutant(
        "rewards/sources.py",
        "    if not math.isfinite(x):",
        "    if False:",
        R + "test_errors.py::test_broken_reward_function",
        "NaN reward check",
    ),
    "reward_count": Mutant(
        "rewards/sources.py",
        "        if len(values) != len(completions):\n            raise RewardError(",
        "        if len(values) != len(completions):\n            print(",
        R + "test_errors.py::test_broken_reward_function",
        "score-count check",
    ),
    "pad_token": Mutant(
        "modeling/loading.py",
        "        tok.pad_token = tok.eos_token",
        "        pass",
        R + "test_bad_input.py::test_tokenizer_without_pad_token_is_handled",
        "pad token fallback",
    ),
    "truncation_count": Mutant(
        "data/collate.py",
        "    truncated, longest = sum(len(r) > max_len for r in rows),",
        "    truncated, longest = 0,",
        R + "test_bad_input.py::test_long_prompts_are_truncated_and_counted",
        "truncated-prompt count",
    ),
    "dataset_quiet": Mutant(
        "data/tables.py",
        "    datasets.logging.set_verbosity(datasets.logging.CRITICAL)\n",
        "",
        R + "test_bad_input.py::test_dataset_errors_from_the_cli",
        "silencing of datasets' traceback log",
    ),
}


class StaleMutant(ValueError):
    """A mutant's original text does not occur exactly once in its file: it would test nothing."""


def apply_edits(text: str, old: str | tuple[str, ...], new: str | tuple[str, ...]) -> str:
    """`text` with each edit old[i] -> new[i] applied; StaleMutant if an old[i] does not occur exactly
    once (checked before any replacement, and on the text as the earlier edits left it)."""
    olds = old if isinstance(old, tuple) else (old,)
    news = new if isinstance(new, tuple) else (new,)
    if len(olds) != len(news):
        raise StaleMutant(f"{len(olds)} originals for {len(news)} replacements")
    for o, n in zip(olds, news, strict=True):
        if text.count(o) != 1:
            raise StaleMutant(f"an edit matches {text.count(o)} times: {o[:60]!r}")
        text = text.replace(o, n)
    return text


def run_mutant(m: Mutant, work: Path) -> tuple[str, float]:
    """(result, seconds) of `m.test` run on a copy of src/ with `m`'s edits applied in `work`."""
    src = work / "src"
    shutil.rmtree(src, ignore_errors=True)
    shutil.copytree(ROOT / "src", src)
    path = src / "rloo" / m.file
    try:
        path.write_text(apply_edits(path.read_text(), m.old, m.new))
    except StaleMutant as e:
        return f"STALE ({e})", 0.0
    # the copy first: the venv's editable install of rloo (a .pth entry) comes after PYTHONPATH
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(src), str(ROOT)])}
    where = subprocess.run(
        [sys.executable, "-c", "import rloo; print(rloo.__file__)"], env=env, capture_output=True, text=True
    ).stdout.strip()
    if not where or Path(where).resolve().parent != (src / "rloo").resolve():
        return f"error: the tests would import rloo from {where or '?'}, not from the mutated copy", 0.0
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", m.test],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    seconds = time.perf_counter() - t0
    if proc.returncode == 1:
        return "caught (the test fails)", seconds
    if proc.returncode < 0:  # e.g. SIGTERM with no handler installed kills the test process itself
        return f"caught (the test process died of signal {-proc.returncode})", seconds
    if proc.returncode == 5:
        return "error: no test collected (a test marked slow is deselected by the default options)", seconds
    if proc.returncode == 0:
        return "NOT CAUGHT (the test passes without the behaviour)", seconds
    return f"error (pytest exit {proc.returncode}): {proc.stdout[-300:]}", seconds


def test_column(m: Mutant) -> str:
    """The test as the table shows it: its id from the tier folder on, in backticks."""
    return f"`{m.test.removeprefix(R)}`"


def main(names: list[str]) -> int:
    chosen = names or list(MUTANTS)
    unknown = [n for n in chosen if n not in MUTANTS]
    if unknown:
        print(f"unknown mutant(s) {unknown}; choose from {', '.join(MUTANTS)}")
        return 2
    missed = 0
    with tempfile.TemporaryDirectory() as tmp:
        print("| behaviour removed | file | test | result | s |\n|---|---|---|---|---|")
        for name in chosen:
            m = MUTANTS[name]
            result, seconds = run_mutant(m, Path(tmp))
            missed += not result.startswith("caught")
            print(f"| {m.behaviour} | {m.file} | {test_column(m)} | {result} | {seconds:.0f} |", flush=True)
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
