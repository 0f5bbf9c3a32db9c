"""docs/gradient-matrix.md's table from the JSON the slow matrix test writes:

    export RLOO_MATRIX_JSON=docs/results/gradient-matrix/gradient_matrix.json
    python -m pytest tests/equivalence/test_gradient_matrix.py -m slow
    python benchmarks/gradient_matrix_table.py docs/results/gradient-matrix/gradient_matrix.*.json > table.md
The default suite's pairwise rows (RLOO_MATRIX_JSON set) go to
docs/results/gradient-matrix/gradient_matrix.pairwise.jsonl.
"""

import json
import sys

FACTORS = (
    "arch", "tied", "dropout", "padded", "share", "buckets", "checkpointing", "lora", "chunked", "grouped", "few_rows",
    "micro",
)  # fmt: skip
METHODS = ("ppo", "grpo", "rloo_clip")


def yes(v) -> str:
    return {True: "yes", False: "no"}.get(v, str(v))


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
        r["combo"] = {f: False for f in FACTORS} | r["combo"]
    rows = sorted(data["rows"], key=lambda r: tuple(str(r["combo"][f]) for f in FACTORS))
    head = [f for f in FACTORS] + ["rloo grad err / max", "reinforce grad err / max", "distinct lengths"]
    head += [f"{m} max log-ratio" for m in METHODS]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for r in rows:
        c = r["combo"]
        reinforce = f"{r['reinforce']['grad_err_rel']:.1e}" if "reinforce" in r else ""  # runs before it was checked
        cells = [yes(c[f]) for f in FACTORS] + [f"{r['rloo']['grad_err_rel']:.1e}", reinforce]
        cells += [str(r["rloo"]["distinct_lengths"])]
        cells += [f"{r[m]['logratio_max']:.1e}" if m in r else "" for m in METHODS]
        print("| " + " | ".join(cells) + " |")
    errs = [r[m]["grad_err_rel"] for r in rows for m in ("rloo", "reinforce") if m in r]
    lr = [r[m]["logratio_max"] for r in rows for m in METHODS if m in r]
    clip = [r[m]["clipfrac"] for r in rows for m in METHODS if m in r]
    print(
        f"\n{len(rows)} combinations; gradient error / max |entry|: max {max(errs):.1e} "
        f"(tolerance {data['grad_rel_tol']:.1e}); ratio methods: max |log ratio| {max(lr):.1e}, "
        f"max clip fraction {max(clip)}; failures: {len(data['failures'])}"
    )


if __name__ == "__main__":
    main(sys.argv[1:])
