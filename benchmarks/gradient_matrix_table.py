"""docs/gradient-matrix.md's table from the JSON the slow matrix test writes:

    export RLOO_MATRIX_JSON=docs/results/gradient-matrix/gradient_matrix.json
    python -m pytest tests/equivalence/test_gradient_matrix.py -m study
    python benchmarks/gradient_matrix_table.py docs/results/gradient-matrix/gradient_matrix.*.json > table.md
The default suite's pairwise rows (RLOO_MATRIX_JSON set) go to
docs/results/gradient-matrix/gradient_matrix.pairwise.jsonl. The committed rows are packed into
docs/results/gradient-matrix/rows.tar.xz (its README says how to unpack and tabulate them).
"""

import json
import sys

from rloo.config.methods import DEFAULT_METHOD, compare_variants

FACTORS = (
    "arch", "tied", "dropout", "padded", "share", "buckets", "checkpointing", "lora", "chunked", "grouped", "few_rows",
    "micro", "minibatches",
)  # fmt: skip
BEFORE = {"minibatches": 1}  # a factor's value in runs from before it existed (others: off)


def methods_with(rows: list[dict], metric: str) -> list[str]:
    """The methods and comparison variants (names from the method table) some row measured `metric`
    of, in the order the test wrote them (the rows' first mention)."""
    known = compare_variants()
    return list(dict.fromkeys(m for r in rows for m, v in r.items() if m in known and metric in v))


def yes(v) -> str:
    return ("yes" if v else "no") if isinstance(v, bool) else str(v)  # not 1 -> "yes": 1 == True


def main(paths: list[str]) -> None:
    parts = [json.loads(open(p).read()) for p in paths if p.endswith(".json")]
    for p in (p for p in paths if p.endswith(".jsonl")):  # the default suite's pairwise rows
        rows = [json.loads(line) for line in open(p) if line.strip()]
        parts.append({"grad_rel_tol": rows[0]["grad_rel_tol"], "rows": rows, "failures": []})
    data = {
        "grad_rel_tol": parts[0]["grad_rel_tol"],
        "rows": [r for d in parts for r in d["rows"]],
        "failures": [f for d in parts for f in d["failures"]],
    }
    for r in data["rows"]:  # runs from before a factor existed ran with it off
        r["combo"] = {f: BEFORE.get(f, False) for f in FACTORS} | r["combo"]
    grads, ratios = methods_with(data["rows"], "grad_err_rel"), methods_with(data["rows"], "logratio_max")
    rows = sorted(data["rows"], key=lambda r: tuple(str(r["combo"][f]) for f in FACTORS))
    head = [f for f in FACTORS] + [f"{m} grad err / max" for m in grads] + ["distinct lengths"]
    head += [f"{m} max log-ratio" for m in ratios]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for r in rows:
        c = r["combo"]
        cells = [yes(c[f]) for f in FACTORS] + [f"{r[m]['grad_err_rel']:.1e}" if m in r else "" for m in grads]
        cells += [str(r[DEFAULT_METHOD]["distinct_lengths"])]  # the same batch for every method
        cells += [f"{r[m]['logratio_max']:.1e}" if m in r else "" for m in ratios]
        print("| " + " | ".join(cells) + " |")
    errs = [r[m]["grad_err_rel"] for r in rows for m in grads if m in r]
    lr = [r[m]["logratio_max"] for r in rows for m in ratios if m in r]
    clip = [r[m]["clipfrac"] for r in rows for m in ratios if m in r]
    print(
        f"\n{len(rows)} combinations; gradient error / max |entry|: max {max(errs):.1e} "
        f"(tolerance {data['grad_rel_tol']:.1e}); ratio methods: max |log ratio| {max(lr):.1e}, "
        f"max clip fraction {max(clip)}; failures: {len(data['failures'])}"
    )


if __name__ == "__main__":
    main(sys.argv[1:])
