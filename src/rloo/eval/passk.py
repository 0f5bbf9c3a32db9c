"""pass@k evaluation for tasks scored by a checker (reward 1 = solved, 0 = not).

n samples per held-out problem; with c of them correct, the unbiased estimator of the probability
that at least one of k samples (k <= n) solves the problem is (Chen et al. 2021, eq. 1)

    pass@k = 1 - C(n - c, k) / C(n, k)

averaged over problems, with a 95% normal interval over problems (problems are the independent
units; the n samples of one problem are not). Two more per-problem quantities, both unbiased in the
same way (averages over every k-subset of the n samples):

    zero_variance@k = (C(c, k) + C(n - c, k)) / C(n, k)

the probability that a group of k samples has all-equal rewards, so that any group baseline
(RLOO's leave-one-out, GRPO's mean, Dr. GRPO's mean) leaves it no gradient; and the share of
unparseable responses (no final answer the checker can read), counted apart from wrong ones.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from rloo.config import Sampling
from rloo.eval.sampling import sampled_chunks

PASS_KS: tuple[int, ...] = (1, 2, 4, 8)
Z95 = 1.959963984540054


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of one problem with c correct among n samples (Chen et al. 2021):
    1 - C(n-c, k)/C(n, k), computed as 1 - prod_{i=n-c+1}^{n} (1 - k/i) to stay exact in floats."""
    _check_counts(n, c, k)
    if n - c < k:  # every k-subset holds a correct sample
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def zero_variance_at_k(n: int, c: int, k: int) -> float:
    """Probability that k of the n samples drawn without replacement are all correct or all
    wrong: (C(c, k) + C(n-c, k)) / C(n, k)."""
    _check_counts(n, c, k)
    return (math.comb(c, k) + math.comb(n - c, k)) / math.comb(n, k)


def _check_counts(n: int, c: int, k: int) -> None:
    if not 0 <= c <= n:
        raise ValueError(f"need 0 <= c <= n, got c={c}, n={n}")
    if not 1 <= k <= n:
        raise ValueError(f"need 1 <= k <= n, got k={k}, n={n}")


def mean_ci(xs: Sequence[float]) -> tuple[float, float]:
    """Mean over problems and the half-width of its 95% normal interval (0 for one problem)."""
    m = sum(xs) / len(xs)
    if len(xs) < 2:
        return m, 0.0
    var = sum((x - m) ** 2 for x in xs) / (len(xs) - 1)
    return m, Z95 * math.sqrt(var / len(xs))


@dataclass
class PassAtK:
    """pass@k results of one policy. counts[i]: correct samples of problem i among n."""

    n: int
    counts: list[int]
    pass_k: dict[int, tuple[float, float]]  # k -> (mean over problems, 95% half-width)
    zero_variance: dict[int, float]  # k -> mean zero_variance@k (k >= 2)
    unparseable: float  # share of all samples with no readable answer
    length: float  # mean response tokens (EOS included)
    samples: list[tuple[str, str]] = field(default_factory=list)

    def summary(self) -> dict:
        return {
            "n": self.n,
            "problems": len(self.counts),
            "pass_at_k": {str(k): {"mean": m, "ci95": h} for k, (m, h) in self.pass_k.items()},
            "zero_variance": {str(k): v for k, v in self.zero_variance.items()},
            "unparseable": self.unparseable,
            "length": self.length,
        }


def summarize_counts(counts: Sequence[int], n: int, ks: Sequence[int] = PASS_KS) -> tuple[dict, dict]:
    """(pass_k, zero_variance) of per-problem correct counts, for each k <= n in ks."""
    ks = [k for k in ks if k <= n]
    pass_k = {k: mean_ci([pass_at_k(n, c, k) for c in counts]) for k in ks}
    zero = {k: sum(zero_variance_at_k(n, c, k) for c in counts) / len(counts) for k in ks if k >= 2}
    return pass_k, zero


def paired_pass_difference(counts_a: Sequence[int], counts_b: Sequence[int], n: int, k: int = 1) -> tuple[float, float]:
    """pass@k of a minus pass@k of b on the same problems: mean of the per-problem differences and
    its 95% normal half-width (pairing removes the spread of problem difficulty)."""
    if len(counts_a) != len(counts_b):
        raise ValueError(f"paired difference needs the same problems: {len(counts_a)} vs {len(counts_b)}")
    return mean_ci([pass_at_k(n, a, k) - pass_at_k(n, b, k) for a, b in zip(counts_a, counts_b, strict=False)])


@torch.no_grad()
def evaluate_pass_at_k(
    policy,
    tokenizer,
    prompts: list[str],
    check: Callable[[str, str], float],
    s: Sampling,
    *,
    n: int,
    parse: Callable[[str], object] | None = None,
    ks: Sequence[int] = PASS_KS,
    batch_size: int = 128,
    generator: torch.Generator | None = None,
    keep_samples: int = 4,
) -> PassAtK:
    """n sampled responses per prompt, each checked (``check(prompt, response)`` is 1 for solved);
    ``parse(response)`` returning None marks a response unparseable (without ``parse``: a NaN check).
    ``s``: how to sample (an eval section's `sampling`)."""
    if n < max(ks, default=1):
        raise ValueError(f"pass@{max(ks)} needs at least {max(ks)} samples per problem, got n={n}")
    counts, lengths, bad, samples = [], [], 0, []
    chunks = sampled_chunks(policy, tokenizer, prompts, n, s, batch_size=batch_size, generator=generator)
    for chunk, roll in chunks:
        ok = [float(check(p, c)) for p, c in zip(roll.prompts, roll.completions, strict=False)]
        counts += [sum(v == 1.0 for v in ok[j * n : (j + 1) * n]) for j in range(len(chunk))]
        lengths += roll.completion_mask.sum(-1).tolist()
        # unreadable: what `parse` cannot read, or (without one) what the checker scored NaN (None)
        bad += sum(parse(c) is None for c in roll.completions) if parse is not None else sum(map(math.isnan, ok))
        samples += list(zip(roll.prompts[::n], roll.completions[::n], strict=False))[
            : max(0, keep_samples - len(samples))
        ]
    pass_k, zero = summarize_counts(counts, n, ks)
    return PassAtK(
        n=n,
        counts=counts,
        pass_k=pass_k,
        zero_variance=zero,
        unparseable=bad / len(lengths),
        length=sum(lengths) / len(lengths),
        samples=samples,
    )


def format_pass_table(results: dict[str, PassAtK]) -> str:
    """Markdown table: one row per policy, pass@k mean ± 95% half-width over problems."""
    first = next(iter(results.values()))
    ks = list(first.pass_k)
    zks = list(first.zero_variance)
    rows = [
        "| policy | "
        + " | ".join(f"pass@{k}" for k in ks)
        + " | "
        + " | ".join(f"zero-var@{k}" for k in zks)
        + " | unparseable | length |",
        "|---" * (len(ks) + len(zks) + 3) + "|",
    ]
    for name, r in results.items():
        cells = [f"{m:.3f} ± {h:.3f}" for m, h in r.pass_k.values()] + [f"{v:.3f}" for v in r.zero_variance.values()]
        rows.append(f"| {name} | " + " | ".join(cells) + f" | {r.unparseable:.3f} | {r.length:.1f} |")
    return "\n".join(rows)
