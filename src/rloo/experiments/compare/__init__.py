"""`rloo compare`, the paper's comparison of the methods on the built-in tasks (docs/compare.md).

study: the driver (every (task, seed) cell: SFT, reward model, each method, judging, variance);
folder: the output folder several processes share; cells: carrying a study across sessions
(`python -m rloo.experiments.compare.cells`); eval and episodes: how a cell judges a policy on a
text task and on an episode task; report, tables, kl, order, plots: the report written from the
per-run result files.

The driver's public names are reached from here lazily, so `compare.cells` (a command run
between sessions) and the report's modules do not load torch and the trainers.
"""

import importlib

_STUDY = ("METHODS", "QUICK", "compare", "method_config", "quick_config", "run_cell", "tuned_variants")


def __getattr__(name):
    if name in _STUDY:
        # getattr: a module __getattr__: lazy exports
        return getattr(importlib.import_module("rloo.experiments.compare.study"), name)
    raise AttributeError(f"module 'rloo.experiments.compare' has no attribute {name!r}")
