"""Every judged sample of an evaluation, one JSON line per held-out prompt (eval/samples.jsonl),
and the report's example sections chosen from them.

A line holds the prompt, the reference (when the data has one, with the judge's score of it) and,
per policy (`policy`, `baseline`), its completion, the judge's score, the reward model's score, the
KL to the reference model (k1 and k3, rloo.eval.judge) summed over the response, its length in
tokens and whether it hit the length limit; with a baseline, `score_difference` = policy - baseline
on that prompt (the paired difference the report's mean and interval are taken over).
"""

from __future__ import annotations

import json
import re

from rloo.eval.judge import PER_PROMPT, PolicyEval

# How many examples each report section shows
EXAMPLES = 3


def sample_rows(prompts: list[str], references: list[str | None], results: dict[str, PolicyEval]) -> list[dict]:
    """One dict per prompt (the module docstring); a value the evaluation did not measure is absent."""
    rows = []
    for i, prompt in enumerate(prompts):
        row: dict = {"prompt": prompt, "reference": references[i]}
        first = next(iter(results.values())).per_prompt
        if first.get("reference_score"):
            row["reference_score"] = first["reference_score"][i]
        for name, r in results.items():
            row[name] = {
                k: _plain(k, r.per_prompt[k][i]) for k in PER_PROMPT if k != "reference_score" and r.per_prompt[k]
            }
        if _has_scores(results):
            row["score_difference"] = row["policy"]["score"] - row["baseline"]["score"]
        rows.append(row)
    return rows


def _plain(key: str, v):
    """The length as an int, truncated as a bool, the completion as text, every number a float."""
    return {"length": int, "truncated": bool, "completion": str}.get(key, float)(v)


def _has_scores(results: dict[str, PolicyEval]) -> bool:
    return "baseline" in results and all(r.per_prompt.get("score") for r in results.values())


def to_jsonl(rows: list[dict]) -> str:
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)


def chosen_examples(rows: list[dict], n: int = EXAMPLES) -> dict[str, list[dict]]:
    """The report's sections: with a baseline and judge scores, `best` (largest policy - baseline score
    difference), `worst` (smallest) and `most changed` (largest KL of the policy's response from the
    reference model, k3; absent without a reference model). Without a baseline, best and worst by the
    policy's own score. Ties keep the prompts' order; empty when there are no scores."""
    if not rows or "score" not in rows[0]["policy"]:
        return {}
    key = (lambda r: r["score_difference"]) if "score_difference" in rows[0] else (lambda r: r["policy"]["score"])
    ranked = sorted(rows, key=key, reverse=True)
    out = {"best": ranked[:n], "worst": sorted(rows, key=key)[:n]}
    if "kl_k3" in rows[0]["policy"]:
        out["most changed"] = sorted(rows, key=lambda r: r["policy"]["kl_k3"], reverse=True)[:n]
    return out


def examples_markdown(sections: dict[str, list[dict]], judge: str) -> str:
    """The report's example sections (markdown): each prompt, its reference and each policy's response
    with its score, KL (k3) and length."""
    what = {
        "best": "largest policy - baseline score difference",
        "worst": "smallest policy - baseline score difference",
        "most changed": "largest KL (k3) of the policy's response from the reference model",
    }
    parts = []
    for title, rows in sections.items():
        by = what[title] if "score_difference" in rows[0] or title == "most changed" else "the policy's score"
        parts.append(f"## {title.capitalize()} examples ({by}; judge: {judge})")
        for r in rows:
            parts.append(_example(r))
    return "\n\n".join(parts)


def _example(r: dict) -> str:
    lines = ["**prompt**", _block(r["prompt"])]
    if r.get("reference") is not None:
        ref_score = f" (score {r['reference_score']:.3f})" if "reference_score" in r else ""
        lines += [f"**reference**{ref_score}", _block(r["reference"])]
    for name in ("baseline", "policy"):
        if name in r:
            s = r[name]
            nums = [f"score {s['score']:.3f}"] if "score" in s else []
            nums += [f"KL {s['kl_k3']:.3f}"] if "kl_k3" in s else []
            nums += [f"{s['length']} tokens" + (", cut at the limit" if s["truncated"] else "")]
            lines += [f"**{name}** ({', '.join(nums)})", _block(s["completion"])]
    if "score_difference" in r:
        lines.append(f"policy - baseline: {r['score_difference']:+.3f}")
    return "\n\n".join(lines)


def _block(text: str) -> str:
    """`text` verbatim in a fenced block whose fence is longer than any backtick run in it."""
    longest = max((len(m) for m in re.findall(r"`+", text)), default=0)
    fence = "`" * max(3, longest + 1)
    return f"{fence}text\n{text}\n{fence}"
