"""The `rloo` command: one thin function per subcommand; the work lives in rloo.training."""

from __future__ import annotations

import argparse
import io
import os
import signal
import sys
from pathlib import Path

from rloo.config import (
    BenchConfig,
    CompareConfig,
    EvalConfig,
    PipelineConfig,
    ProduceConfig,
    RewardConfig,
    RLConfig,
    SFTConfig,
    describe_fields,
    load_config,
)
from rloo.errors import (
    Interrupted,
    RewardError,
    RlooError,
    StopNow,
    cli_options,
    how_to_continue,
    option,
    pipeline_rerun,
    study_rerun,
)
from rloo.runtime.runfolder.atomic import describe_write_failure
from rloo.runtime.runfolder.layout import holds_a_run, refuse_linked_folders
from rloo.runtime.runfolder.lock import refuse_if_busy
from rloo.runtime.signals import signals_stop_now
from rloo.runtime.threadpolicy import apply_thread_policy
from rloo.runtime.tracking.log import hold_notes, note

EXAMPLES = {
    "pipeline": "rloo pipeline                      # the whole pipeline on the default task\n"
    "  rloo pipeline task=dialogue rl.k=2 output_dir=runs/hh",
    "sft": "rloo sft output_dir=runs/sft epochs=3",
    "reward": "rloo reward sft_model=runs/sft/model output_dir=runs/rm",
    "train": "rloo train policy=runs/sft/model reward_model=runs/rm/model k=4 beta=0.05",
    "eval": "rloo eval policy=runs/rl/model baseline=runs/sft/model",
    "bench": "rloo bench shapes=[S,M] steps=5 output_dir=runs/bench",
    "produce": "rloo produce address=10.0.0.2:29511   # for a trainer on 10.0.0.2 started as\n"
    "  rloo train max_staleness=1 producer_address=10.0.0.2:29511 ...",
    "compare": "rloo compare --quick                # every method, minutes\n"
    "  rloo compare tasks=[summarize] seeds=[0,1] output_dir=runs/cmp\n"
    "  rloo compare tasks=[calculator] methods=[rloo,grpo,reinforce,raft]   # episodes: success rates\n"
    "  rloo compare tuning.trials=12 tuning.seeds=[100,101,102]   # tune each method first",
}

# One override each subcommand accepts, for its KEY=VALUE help (tests/reliability/test_cli_hints.py
# loads each with its own command's config).
OVERRIDE_EXAMPLES = {
    "pipeline": "rl.k=8",
    "sft": "epochs=3",
    "reward": "epochs=2",
    "train": "k=8",
    "eval": "num_prompts=100",
    "bench": "steps=5",
    "compare": "seeds=[0,1]",
    "produce": "threads=8",
}


# Each subcommand imports its stage on first use (the one allowed kind of function-level import
# besides optional dependencies): `rloo --help` and config errors stay fast, without torch.


def _run_sft(cfg, args):
    from rloo.training.sft import sft

    sft(cfg, resume=args.resume, overwrite=args.overwrite)


def _run_reward(cfg, args):
    from rloo.training.reward import train_reward

    train_reward(cfg, resume=args.resume, overwrite=args.overwrite)


def _run_train(cfg, args):
    from rloo.training.rl import train

    train(cfg, resume=args.resume, overwrite=args.overwrite)


def _run_eval(cfg, args):
    from rloo.training.evaluate import evaluate

    evaluate(cfg, overwrite=args.overwrite)


def _run_pipeline(cfg, args):
    from rloo.training.pipeline import pipeline

    pipeline(cfg, resume=args.resume, overwrite=args.overwrite)


def _run_bench(cfg, args):
    from rloo.experiments.bench import run_bench

    run_bench(cfg, overwrite=args.overwrite)


def _run_produce(cfg, args):
    from rloo.rollout.producer import serve

    serve(cfg.address, cfg.threads, cfg.connect_timeout_s)


def _run_compare(cfg, args):
    from rloo.experiments.compare import compare

    if args.quick:
        cfg = cfg.model_copy(update={"quick": True})
    compare(cfg, overwrite=args.overwrite)


COMMANDS = {
    "pipeline": (PipelineConfig, _run_pipeline),
    "sft": (SFTConfig, _run_sft),
    "reward": (RewardConfig, _run_reward),
    "train": (RLConfig, _run_train),
    "eval": (EvalConfig, _run_eval),
    "bench": (BenchConfig, _run_bench),
    "compare": (CompareConfig, _run_compare),
    "produce": (ProduceConfig, _run_produce),
}


def _started(cfg) -> bool:
    """Whether `cfg`'s run (None: not read yet) holds anything --resume continues (rloo.training.resumable)."""
    return cfg is not None and holds_a_run(Path(cfg.output_dir))


NOTHING_WRITTEN = "nothing was written; rerun the same command"


def _resume_rerun(cfg) -> str:
    resume = f"rerun with {option('resume')} to continue from the newest checkpoint (step 0 if none)"
    return resume if _started(cfg) else NOTHING_WRITTEN


# How a command stopped at once by a signal (outside a training step, or by a second signal)
# continues, given its config (None before it was read); other commands: how_to_continue(False)
RERUN = {
    "compare": lambda cfg: study_rerun(),
    "pipeline": lambda cfg: pipeline_rerun() if _started(cfg) else NOTHING_WRITTEN,
    "train": _resume_rerun,
    "sft": _resume_rerun,
    "reward": _resume_rerun,
}
# The commands that continue from their newest checkpoint (a pipeline: its finished stages kept)
RESUMABLE = ("pipeline", "sft", "reward", "train")
PREFLIGHT = ("pipeline", "sft", "reward", "train", "eval")
# The commands that train with a method, so may take one added by the user's module (--plugin)
PLUGINS = ("pipeline", "train", "compare")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="rloo", description="RLHF with REINFORCE Leave-One-Out (Ahmadian et al. 2024).")
    p.set_defaults(plugin=[])  # every command's args.plugin; a PLUGINS command's --plugin values replace it
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    for name, (cls, _) in COMMANDS.items():
        sp = sub.add_parser(
            name,
            help=(cls.__doc__ or "").splitlines()[0],
            description=cls.__doc__,
            epilog="example:\n  " + EXAMPLES[name] + "\n\nrun with --help-config to list every key.",
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        sp.add_argument(
            "overrides", nargs="*", metavar="KEY=VALUE", help=f"config overrides, e.g. {OVERRIDE_EXAMPLES[name]}"
        )
        sp.add_argument("--config", "-c", help="YAML config file (overrides win over it)")
        sp.add_argument("--overwrite", action="store_true", help="replace a previous run in output_dir")
        sp.add_argument("--debug", action="store_true", help="show full tracebacks")
        sp.add_argument("--help-config", action="store_true", help="list every config key with its default")
        if name in RESUMABLE:
            what = (
                "continue: finished stages are kept, the interrupted one continues from its newest checkpoint"
                if name == "pipeline"
                else "continue from the newest checkpoint in output_dir"
            )
            sp.add_argument("--resume", action="store_true", help=what)
        if name == "compare":
            sp.add_argument("--quick", action="store_true", help="tiny settings: every method in minutes")
        if name in PLUGINS:
            sp.add_argument(
                "--plugin",
                action="append",
                default=[],
                metavar="FILE.py|MODULE",
                help="import your module first, e.g. one that adds a method (rloo.algorithms.add_method, "
                "docs/methods.md); repeatable",
            )
    return p


def main(argv: list[str] | None = None) -> int:
    # Lines on stdout (the user's reward functions' prints, libraries') reach a log file as they are
    # written, not in 8 KiB blocks (a killed run lost them); rloo's own lines go to stderr, flushed.
    if isinstance(sys.stdout, io.TextIOWrapper):
        sys.stdout.reconfigure(line_buffering=True)
    # SIGTERM and SIGHUP stop the command as SIGINT does from here on (rloo.runtime.signals), not
    # only once a stage runs: one arriving while a plugin or the config loads ended it silently
    with signals_stop_now():
        try:
            return _command(argv)
        except KeyboardInterrupt as e:  # before the command was read; after, _command says its own line
            code = e.exit_code if isinstance(e, StopNow) else 130
            print(f"rloo: interrupted by {signal.Signals(code - 128).name}", file=sys.stderr)
            return code


def _command(argv: list[str] | None) -> int:
    parser = build_parser()
    # KEY=VALUE overrides may also follow the flags (`rloo pipeline --overwrite task=dialogue`, as
    # `make demo ARGS=...` writes it); argparse stops collecting positionals at the first flag.
    args, extra = parser.parse_known_args(argv)
    if unknown := [x for x in extra if x.startswith("-") or "=" not in x]:
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    if extra:
        args.overrides = [*args.overrides, *extra]
    if args.command is None:
        parser.print_help()
        return 2
    cls, run = COMMANDS[args.command]
    cfg = None
    if args.help_config:
        print("\n".join(describe_fields(cls)))
        return 0
    try:
        if args.plugin:  # before the config: it may name a method
            from rloo.runtime.inputs.user_code import load_module  # lazy (it loads huggingface_hub): fast --help

            for target in args.plugin:
                load_module(target, "plugin")
        cfg = load_config(cls, args.config, args.overrides)
        if not isinstance(cfg, ProduceConfig):  # its run folder, before the slow imports (produce writes none)
            refuse_if_busy(cfg.output_dir)
            if not args.overwrite:  # (--overwrite unlinks them) refused before any model loads
                refuse_linked_folders(cfg.output_dir, args.command)
        if args.command in PREFLIGHT:
            from rloo.data.preflight import check_config  # lazy like the subcommands: fast --help

            check_config(cfg)  # before the heavy imports below: a typo costs a second, not a model load
        # messages say --resume/--overwrite; notes (dtype=auto's) wait for the first line: a refusal stays one
        with cli_options(), hold_notes():
            if line := apply_thread_policy(os.environ):  # OMP_NUM_THREADS unset: the idle cores
                note(line)
            run(cfg, args)
    except Interrupted as e:  # Ctrl-C / SIGTERM with a checkpoint written: asked for, not an error
        print(f"rloo {args.command}: interrupted: {_one_line(e)}", file=sys.stderr)
        return e.exit_code
    except RlooError as e:
        if args.debug:
            raise
        # the user's own code raised: its traceback is theirs to see
        hint = "; rerun with --debug for the traceback" if isinstance(e, RewardError) and e.__cause__ else ""
        print(f"rloo {args.command}: error: {_one_line(e)}{hint}", file=sys.stderr)
        return e.exit_code
    except OSError as e:  # a folder that cannot be created, a disk that fills up mid-run, ...
        if args.debug:
            raise
        where = f" ({e.filename})" if e.filename else ""
        what = describe_write_failure(e, Path(e.filename).parent if e.filename else Path("."))
        print(
            f"rloo {args.command}: error: {what}{where}; rerun with --debug for the traceback",
            file=sys.stderr,
        )
        return 2
    except KeyboardInterrupt as e:  # SIGINT, or SIGTERM/SIGHUP (StopNow): 130, 143 or 129, as an Interrupted's
        code = e.exit_code if isinstance(e, StopNow) else 130
        print(f"rloo {args.command}: {_stopped_at_once(args.command, cfg, code)}", file=sys.stderr)
        return code
    return 0


def _stopped_at_once(command: str, cfg, code: int) -> str:
    """The line for a stop by a signal outside a training step (or a second signal): which, and how
    to continue (`cfg`: the command's config, None before it was read)."""
    with cli_options():
        hint = RERUN.get(command, lambda cfg: how_to_continue(False))(cfg)
    return f"interrupted by {signal.Signals(code - 128).name}; {hint}"


def _one_line(e: Exception) -> str:
    return " ".join(str(e).split("\n"))


if __name__ == "__main__":
    sys.exit(main())
