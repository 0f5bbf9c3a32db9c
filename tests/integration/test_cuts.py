"""Nothing cut without a word: chat-templated prompts longer than max_prompt_tokens (their system
message is lost with their start) and SFT targets longer than max_response_tokens (their EOS is lost)
are counted and said by every stage, and refused, before anything is written, when more than
max_cut_share of them are cut. Tiny locally built GPT-NeoX models and BPE tokenizers."""

from __future__ import annotations

import json
import re

import pytest
from tests.integration.test_own_formats import _chat_tokenizer, _chats, _msgs, _neox

from rloo.cli import main

SYSTEM = ("system", "be brief and kind and answer with the two topics of the question and nothing else")
TINY = ["sft.epochs=1", "sft.batch_size=8", "reward.epochs=1", "reward.batch_size=8", "reward.eval_pairs=4"]
TINY += ["rl.steps=2", "rl.batch_size=2", "rl.k=2", "rl.max_new_tokens=4", "rl.eval_every=null"]
TINY += ["rl.save_every=null", "rl.eval_prompts=4", "eval.num_prompts=4", "max_response_tokens=24", "report_to=none"]
DATA = ["dataset.path=data/chat.jsonl", "dataset.eval_fraction=0.25"]
DATA += ["reward.dataset.path=data/prefs.jsonl", "reward.dataset.eval_fraction=0.25"]


def _jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


@pytest.fixture(scope="module")
def long_chat(tmp_path_factory):
    """models/policy (chat template, EOS ends a turn); data/chat.jsonl and data/prefs.jsonl whose
    rows open with a long system message; data/short.jsonl, the same chats without it. Returns the
    folder, the tokenizer, and a max_prompt_tokens that holds every question but no system message."""
    root = tmp_path_factory.mktemp("cuts")
    rows, pref_rows = _chats(32, seed=0), _chats(24, seed=1)
    tok = _chat_tokenizer([f"{SYSTEM[1]} {q} {g} {b}" for q, g, b in rows + pref_rows])
    _neox(tok, root / "models" / "policy")
    (root / "data").mkdir()
    chats = [{"messages": _msgs(SYSTEM, ("user", q), ("assistant", g))} for q, g, _ in rows]
    _jsonl(root / "data" / "chat.jsonl", chats)
    _jsonl(root / "data" / "short.jsonl", [{"messages": _msgs(("user", q), ("assistant", g))} for q, g, _ in rows])
    _jsonl(
        root / "data" / "prefs.jsonl",
        [
            {
                "chosen": _msgs(SYSTEM, ("user", q), ("assistant", g)),
                "rejected": _msgs(SYSTEM, ("user", q), ("assistant", b)),
            }
            for q, g, b in pref_rows
        ],
    )

    def length(*turns):
        text = tok.apply_chat_template(_msgs(*turns), tokenize=False, add_generation_prompt=True)
        return len(tok(text, add_special_tokens=False)["input_ids"])

    questions = max(length(("user", q)) for q, _, _ in rows + pref_rows)
    assert min(length(SYSTEM, ("user", q)) for q, _, _ in rows + pref_rows) > questions  # every prompt is cut
    return root, tok, questions


def test_a_pipeline_refuses_cut_chat_prompts_before_any_stage_runs(long_chat, monkeypatch, capsys):
    # fails on main: every stage cut the system message silently and the pipeline trained on
    root, _, limit = long_chat
    monkeypatch.chdir(root)
    rc = main(["pipeline", "model=models/policy", *DATA, f"max_prompt_tokens={limit}", "output_dir=runs/r", *TINY])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1, err
    assert re.search(rf"sft: (\d+) of \1 prompts \(100%\) are longer than max_prompt_tokens={limit} ", err), err
    assert "set max_prompt_tokens=" in err and "or set max_cut_share=1" in err, err
    assert not (root / "runs" / "r").exists()


def test_a_later_stages_cut_data_is_refused_before_sft_trains(long_chat, monkeypatch, capsys):
    # SFT's prompts fit; the reward stage's would lose their system message: refused before SFT runs
    root, _, limit = long_chat
    monkeypatch.chdir(root)
    data = ["dataset.path=data/short.jsonl", *DATA[1:]]
    rc = main(["pipeline", "model=models/policy", *data, f"max_prompt_tokens={limit}", "output_dir=runs/r2", *TINY])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and err.startswith("rloo pipeline: error: reward: ") and "prompts (100%)" in err, err
    assert not (root / "runs" / "r2").exists()


def _metrics(path) -> dict:
    out: dict = {}
    for line in path.read_text().splitlines():
        out |= {k: v for k, v in json.loads(line).items() if k.startswith("data/")}
    return out


def test_each_stage_of_a_pipeline_says_what_it_cut(long_chat, monkeypatch, capsys):
    # fails on main: only RL counted its cut prompts (data/prompts_truncated); SFT, the reward model
    # and the evaluation said nothing
    root, _, limit = long_chat
    monkeypatch.chdir(root)
    argv = ["pipeline", "model=models/policy", *DATA, f"max_prompt_tokens={limit}", "max_cut_share=1"]
    assert main([*argv, "output_dir=runs/ok", *TINY]) == 0
    err = capsys.readouterr().err
    keep = f"keep their last max_prompt_tokens={limit} tokens (a chat template's system message goes with their start)"
    cut = {}
    for stage in ("sft", "reward", "rl", "eval"):
        line = re.search(rf"^{stage}: cut to the length limits: (\d+) of \1 prompts \(100%, longest .*$", err, re.M)
        assert line is not None and keep in line.group(0), (stage, err)
        cut[stage] = float(line.group(1))
    assert re.search(r"; 4 of 4 eval prompts \(100%", err)  # RL's periodic evaluation, on its own held-out rows
    run = root / "runs" / "ok"
    assert _metrics(run / "sft" / "metrics.jsonl") == {"data/prompts_cut": cut["sft"], "data/targets_cut": 0.0}
    assert _metrics(run / "reward" / "metrics.jsonl") == {"data/prompts_cut": cut["reward"], "data/responses_cut": 0.0}
    assert _metrics(run / "rl" / "metrics.jsonl")["data/prompts_truncated"] > 0
    assert json.loads((run / "eval" / "summary.json").read_text())["data"] == {"data/prompts_cut": cut["eval"]}


@pytest.fixture(scope="module")
def long_answers(long_chat):
    """data/long.jsonl: plain prompts whose completions are longer than max_response_tokens=8."""
    root, tok, _ = long_chat
    rows = [{"prompt": f"help with my {q}", "completion": f" {g} {b} {g}"} for q, g, b in _chats(24, seed=4)]
    _jsonl(root / "data" / "long.jsonl", rows)
    lengths = [len(tok(r["completion"], add_special_tokens=False)["input_ids"]) + 1 for r in rows]
    assert min(lengths) > 8
    return root, max(lengths)


def test_sft_refuses_targets_that_would_lose_their_eos(long_answers, monkeypatch, capsys):
    # fails on main: the targets were cut at max_response_tokens and lost their EOS without a word
    root, longest = long_answers
    monkeypatch.chdir(root)
    argv = ["sft", "model=models/policy", "dataset.path=data/long.jsonl", "epochs=1", "batch_size=8", "report_to=none"]
    assert main([*argv, "max_response_tokens=8", "output_dir=runs/s1"]) == 2
    err = capsys.readouterr().err.strip()
    assert re.search(r"sft: (\d+) of \1 targets \(100%\) are longer than max_response_tokens=8 ", err), err
    assert f"(longest {longest} tokens with its EOS)" in err and f"set max_response_tokens={longest}" in err, err
    assert len(err.splitlines()) == 1 and not (root / "runs" / "s1").exists()
    # the suggested limit keeps every EOS: nothing cut, nothing said
    assert main([*argv, f"max_response_tokens={longest}", "output_dir=runs/s2"]) == 0
    assert "cut to the length limits" not in capsys.readouterr().err
    assert _metrics(root / "runs" / "s2" / "metrics.jsonl") == {}
    # asked for: trained on the cut targets, and said so
    assert main([*argv, "max_response_tokens=8", "max_cut_share=1", "output_dir=runs/s3"]) == 0
    err = capsys.readouterr().err
    line = re.search(r"sft: cut to the length limits: (\d+) of \1 targets \(100%.*", err)
    assert line is not None and "lose their end and their EOS at max_response_tokens=8 tokens" in line.group(0), err
    n = float(line.group(1))
    assert _metrics(root / "runs" / "s3" / "metrics.jsonl") == {"data/prompts_cut": 0.0, "data/targets_cut": n}


def _said(err: str, stage: str) -> dict[str, tuple[int, int]]:
    """`{kind: (cut, of)}` from a stage's printed line (none printed: nothing cut)."""
    line = re.search(rf"^{stage}: cut to the length limits: (.*)$", err, re.M)
    found = re.findall(r"(\d+) of (\d+) ([a-z ]+?) \(", line.group(1)) if line else []
    return {what: (int(n), int(total)) for n, total, what in found}


def test_the_pipeline_summary_gathers_what_every_stage_cut(long_chat, monkeypatch, capsys):
    # fails on main: each stage said its own cuts as it ran, the summary (printed and summary.json)
    # said nothing of them. Here SFT keeps every prompt (no system message) but cuts every target
    # before its EOS, the reward model cuts every chat prompt's start, RL and the evaluation cut nothing.
    root, _, limit = long_chat
    monkeypatch.chdir(root)
    rows = [{"messages": _msgs(("user", q), ("assistant", f"{g} {b} {g}"))} for q, g, b in _chats(32, seed=0)]
    _jsonl(root / "data" / "answers.jsonl", rows)
    data = ["dataset.path=data/answers.jsonl", *DATA[1:]]
    argv = ["pipeline", "model=models/policy", *data, f"max_prompt_tokens={limit}", "max_cut_share=1"]
    assert main([*argv, "output_dir=runs/sum", *TINY, "max_response_tokens=8"]) == 0
    err = capsys.readouterr().err
    run = root / "runs" / "sum"
    cut = json.loads((run / "summary.json").read_text())["cut"]
    said = {stage: _said(err, stage) for stage in ("sft", "reward", "rl", "eval")}
    assert set(said["sft"]) == {"targets"} and set(said["reward"]) >= {"prompts"}, said
    assert said["rl"] == said["eval"] == {}, err
    n_sft = said["sft"]["targets"][1]
    for stage, kinds in {"sft": ("prompts", "targets"), "reward": ("prompts", "responses")}.items():
        logged = _metrics(run / stage / "metrics.jsonl")  # the counts each stage logged at its step 0
        assert {k: float(c["cut"]) for k, c in cut[stage].items()} == {k: logged[f"data/{k}_cut"] for k in kinds}
        assert all((c["cut"], c["of"]) == said[stage][k] for k, c in cut[stage].items() if c["cut"]), (cut, said)
    assert cut["sft"]["prompts"]["of"] == n_sft and cut["sft"]["targets"]["cut"] == n_sft > 0
    assert cut["sft"]["targets"]["max_response_tokens"] == 8 and cut["reward"]["prompts"]["max_prompt_tokens"] == limit
    # RL surveys the same training rows as SFT and its 4 held-out ones; the evaluation its 4 prompts
    rl = {k: (c["cut"], c["of"], c["max_prompt_tokens"]) for k, c in cut["rl"].items()}
    assert rl == {"prompts": (0, n_sft, limit), "eval prompts": (0, 4, limit)}
    assert cut["eval"]["prompts"]["cut"] == 0 and cut["eval"]["prompts"]["of"] == 4
    assert "data" not in json.loads((run / "eval" / "summary.json").read_text())  # nothing cut, nothing logged
    assert not [k for k, v in _metrics(run / "rl" / "metrics.jsonl").items() if v]  # no prompts_truncated either
    # the printed block, from the numbers the stages said
    p, pairs = said["reward"]["prompts"]
    r = said["reward"].get("responses", (0,))[0]  # a pair's two responses
    block = (
        f"cut to the length limits: sft 0/{n_sft} prompts, {n_sft}/{n_sft} targets (EOS lost); "
        f"reward {p}/{pairs} prompts (start lost), {r}/{2 * pairs} responses{' (end lost)' if r else ''}; "
        f"rl 0/{n_sft} prompts, 0/4 eval prompts; eval 0/4 prompts"
    )
    assert block in err.splitlines(), err
