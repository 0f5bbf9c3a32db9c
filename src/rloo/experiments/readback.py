"""The shapes of what `rloo compare` reads back from a study folder: a run's result.json and a cell's
gradient_variance.json. A file of another shape (edited by hand, `{}`, NaN or null where rloo
writes a number, a list) is one line naming it, instead of a KeyError or TypeError deep in the
report's plots and tables (compare/plots.py, compare/tables.py).

    result.json                {"win_rate", "gold", "kl": finite numbers, "gold_per_prompt": [numbers],
                                "reward", "length", "win_rate_vs_sft", "seconds": finite numbers or null, ...}
    gradient_variance.json     {"sft" | "weak": {estimator: {"variance": finite number,
                                                             "noise_to_signal": finite number or null}}}
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from rloo.errors import RlooError, option
from rloo.runtime.runfolder.reading import read_text

RESULT_NUMBERS = ("win_rate", "gold", "kl")  # rloo.experiments.compare.eval.judge writes them always
RESULT_OPTIONAL = ("reward", "length", "win_rate_vs_sft", "seconds")  # null where there is no such number


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def result_shape_problem(data: dict, required: tuple[str, ...] = ()) -> str | None:
    """None when `data` (a result.json's object) has the shape rloo writes, else what is wrong: each
    of RESULT_NUMBERS present a finite number (`required`: present at all), each of RESULT_OPTIONAL
    a finite number or null, gold_per_prompt a list of finite numbers. (A tuning trial's choice
    reads only some keys, so only the report's reader, `required=RESULT_NUMBERS`, asks for them.)"""
    missing = [k for k in required if k not in data]
    if missing:
        return f"it has no {missing[0]!r}"
    for key in RESULT_NUMBERS + RESULT_OPTIONAL:
        if key in data and not _number(data[key]) and not (key in RESULT_OPTIONAL and data[key] is None):
            return f"its {key!r} is {data[key]!r}, not a finite number"
    scores = data.get("gold_per_prompt", [])
    if not isinstance(scores, list) or not all(_number(s) for s in scores):
        return "its 'gold_per_prompt' is not a list of finite numbers"
    return None


def variance_problem(data) -> str | None:
    """None when `data` (a gradient_variance.json) has the shape rloo writes, else what is wrong."""
    if not isinstance(data, dict) or not all(isinstance(data.get(k), dict) for k in ("sft", "weak")):
        return "it is not an object with 'sft' and 'weak' measurements"
    for at in ("sft", "weak"):
        for est, m in data[at].items():
            ns = m.get("noise_to_signal") if isinstance(m, dict) else None
            if not isinstance(m, dict) or not _number(m.get("variance")) or not (ns is None or _number(ns)):
                return f"its {at}.{est} is not a finite variance and noise_to_signal"
    return None


def read_variance(path: Path) -> dict:
    """A cell's gradient_variance.json, or one RlooError line naming it when it is not JSON or not of
    the shape rloo writes (a FIFO or link there: rloo.runtime.runfolder.reading)."""
    try:
        data = json.loads(read_text(path))
    except (ValueError, RecursionError) as e:  # UnicodeDecodeError, JSONDecodeError
        why = f"it is not valid JSON ({str(e).splitlines()[0][:80]})"
    else:
        why = variance_problem(data)
        if why is None:
            return data
    raise RlooError(
        f"the gradient variance {path} cannot be used: {why}; remove it to measure it again, or rerun with "
        f"{option('overwrite')} to start the study over (nothing was changed)"
    )
