"""Where r(x, y) of eq. (1) comes from: a reward model or a user's Python function."""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Sequence
from typing import Protocol, runtime_checkable

import torch
from torch import Tensor

from rloo.data.collate import encode_completions, encode_prompts
from rloo.data.columns import columns_of, keywords_for, missing_columns
from rloo.errors import RewardError, RlooError, StopNow
from rloo.modeling.forward import reward_scores
from rloo.modeling.forward_shared import reward_scores_shared
from rloo.runtime.inputs.user_code import callable_name, load_callable

RewardFn = Callable[[list[str], list[str]], Sequence[float]]


# What a batch handed to RewardModel may offer beyond its prompts' and completions' ids and texts: a
# rloo.rollout.sampler.Rollout has both (this layer does not import rollout/), an API caller's
# stand-in may have neither.
@runtime_checkable
class Grouped(Protocol):
    """A batch whose rows come in runs of `group_size` sharing one prompt."""

    group_size: int


@runtime_checkable
class KeepsRawCompletions(Protocol):
    """A batch that keeps its completions as sampled (the leading space unstripped), or None."""

    raw_completions: list[str] | None


def _group_size(batch: object) -> int:
    return batch.group_size if isinstance(batch, Grouped) else 1


def _raw_completions(batch: object) -> list[str] | None:
    return batch.raw_completions if isinstance(batch, KeepsRawCompletions) else None


class FunctionReward:
    """A batched Python reward: fn(prompts, completions, **columns) -> one float per completion.

    `columns`: the dataset row's other columns (rloo.data.columns), one value per completion, as
    TRL passes them; only those the function's signature names (all with **kwargs), so a
    `(prompts, completions)` function is called with the two lists alone.

    Its output is checked every call: a reward that raises, returns the wrong number of scores,
    non-numbers or NaN/inf stops training with a RewardError naming the problem. ``None`` means
    "could not score" (a checker that found nothing to check): it comes out as NaN, and the group
    algorithms leave such a sample out of its group's baseline and give it advantage 0 (the rule
    of ``rloo.core.advantages.leave_one_out``); the others stop with a RewardError.
    """

    def __init__(self, fn: RewardFn, name: str | None = None):
        if not callable(fn):
            raise RlooError(f"reward function {fn!r} is not callable")
        self.fn, self.name = fn, name or callable_name(fn, "reward_fn")

    def __call__(self, batch) -> Tensor:
        return self.score_texts(batch.prompts, batch.completions)

    def score_texts(self, prompts: list[str], completions: list[str]) -> Tensor:
        columns = self._columns(prompts)
        try:
            out = self.fn(list(prompts), list(completions), **columns)
        except StopNow:  # the user's second Ctrl-C arrived while the reward ran: not the function's fault
            raise
        except (Exception, SystemExit, KeyboardInterrupt) as e:  # noqa: BLE001 - any failure of user code
            # becomes one clear error; sys.exit() or a raised KeyboardInterrupt inside it too, so the
            # loop still writes its checkpoint from before the step
            raise RewardError(f"reward function {self.name} raised {type(e).__name__}: {e}") from e
        values = _score_list(out, self.name)
        if len(values) != len(completions):
            raise RewardError(
                f"reward function {self.name} returned {len(values)} scores for {len(completions)} completions"
            )
        return torch.tensor([_score(v, self.name, i) for i, v in enumerate(values)], dtype=torch.float32)

    def _columns(self, prompts: list[str]) -> dict[str, list]:
        """The row columns of `prompts` that the function takes; a RewardError when it requires one
        that the data lacks (a checker's `answer` on prompts without columns)."""
        columns = columns_of(prompts)
        missing = missing_columns(self.fn, columns)
        if missing:
            have = ", ".join(sorted(columns)) or "none: the prompts came without a dataset row"
            raise RewardError(
                f"reward function {self.name} takes {', '.join(missing)}, which is not a column of the data "
                f"(the other columns: {have})"
            )
        return keywords_for(self.fn, columns)

    def part_metrics(self) -> dict[str, float]:
        return {}


_F32_MAX = torch.finfo(torch.float32).max


def _score(v, name: str, i: int) -> float:
    """Score `i` of reward function `name` as a float (None: NaN, "could not score", see
    rloo.core.advantages.unscored); a RewardError naming the index for a non-number, NaN/inf, or a
    number no float32 score holds (an int like 10**400 that no float fits, or 1e39: inf in float32)."""
    if isinstance(v, torch.Tensor) and v.numel() == 1:
        v = v.item()
    if v is None:
        return math.nan
    if isinstance(v, bool) or not isinstance(v, numbers.Real):
        raise RewardError(f"reward function {name} returned a non-number at index {i}: {_shown(v)}")
    try:
        x = float(v)
    except OverflowError:  # a Python int past float's range
        raise RewardError(
            f"reward function {name} returned a score too large for a float at index {i}: {_shown(v)}"
        ) from None
    if not math.isfinite(x):
        raise RewardError(f"reward function {name} returned a non-finite score at index {i}: {_shown(v)}")
    if abs(x) > _F32_MAX:  # a finite float64 that the float32 scores would hold as inf
        raise RewardError(
            f"reward function {name} returned a score too large for a float32 score (beyond ±{_F32_MAX:.3g}) "
            f"at index {i}: {_shown(v)}"
        )
    return x


def _shown(v) -> str:
    """v for a one-line message: a huge int by its size, anything else by a repr cut to 80 characters."""
    if isinstance(v, int) and abs(v) > 10**30:  # str() of a 5000-digit int raises (Python's digit limit)
        return f"an integer of about {int(v.bit_length() * math.log10(2)) + 1} digits"
    text = repr(v)
    return text if len(text) <= 80 else text[:77] + "..."


def _score_list(out, name: str) -> list:
    """The scores of a reward's return value: a list, tuple, NumPy array or 1-D tensor. Anything
    else is refused: `list()` of a dict would read its keys as scores, of a string its letters."""
    if isinstance(out, torch.Tensor):
        return list(out.reshape(-1)) if out.dim() <= 1 else _refuse(out, name)
    # getattr: third-party: a NumPy array or scalar (numpy is not imported here), told apart by ndim
    if isinstance(out, (list, tuple)) or (type(out).__module__ == "numpy" and getattr(out, "ndim", 0) == 1):
        return list(out)
    return _refuse(out, name)


def _refuse(out, name: str):
    shape = f" of shape {tuple(out.shape)}" if hasattr(out, "shape") else ""
    raise RewardError(
        f"reward function {name} returned a {type(out).__name__}{shape}; expected a list (or tuple, "
        f"1-D array or tensor) of one float or None per completion"
    )


class RewardModelScorer:
    """A sequence-classification reward model. With the policy's own tokenizer it scores the
    rollout's token ids directly; with a different tokenizer it re-tokenizes the decoded text
    (unstripped: `Rollout.raw_completions`).
    share_prompt: score a rollout's groups of k with each prompt computed once (same scores)."""

    def __init__(
        self,
        model,
        tokenizer,
        policy_tokenizer=None,
        max_len: int = 1024,
        batch_size: int = 256,
        share_prompt: bool = True,
    ):
        self.model, self.tokenizer, self.max_len, self.batch_size = model, tokenizer, max_len, batch_size
        self.share_prompt = share_prompt
        self.same_tokenizer = policy_tokenizer is not None and tokenizer.get_vocab() == policy_tokenizer.get_vocab()

    @torch.no_grad()
    def __call__(self, batch) -> Tensor:
        if self.same_tokenizer:
            k = _group_size(batch) if self.share_prompt else 1
            return self._chunked(batch.prompt_ids, batch.prompt_mask, batch.completion_ids, batch.completion_mask, k)
        # the decoded text as sampled (leading space kept): a reward model reads responses in the
        # layout of its training pairs (" text"), in training and in evaluation alike
        return self.score_texts(batch.prompts, _raw_completions(batch) or batch.completions)

    @torch.no_grad()
    def score_texts(self, prompts: list[str], completions: list[str]) -> Tensor:
        p, _ = encode_prompts(self.tokenizer, prompts, self.max_len)
        c = encode_completions(self.tokenizer, completions, self.max_len)
        dev = next(self.model.parameters()).device
        return self._chunked(p.ids.to(dev), p.mask.to(dev), c.ids.to(dev), c.mask.to(dev))

    def _chunked(self, p_ids, p_mask, c_ids, c_mask, k: int = 1) -> Tensor:
        size = max(k, self.batch_size // k * k)  # chunks hold whole groups of k
        score = (
            (lambda *a: reward_scores_shared(self.model, *a, k=k))
            if k > 1
            else (lambda *a: reward_scores(self.model, *a))
        )
        out = [
            score(p_ids[i : i + size], p_mask[i : i + size], c_ids[i : i + size], c_mask[i : i + size])
            for i in range(0, p_ids.shape[0], size)
        ]
        return torch.cat(out).cpu()

    def part_metrics(self) -> dict[str, float]:
        return {}


def load_function(spec: str) -> RewardFn:
    """`package.module:function` or `path/to/file.py:function` -> the function (rloo.runtime.inputs.user_code)."""
    return load_callable(spec, "reward function")
