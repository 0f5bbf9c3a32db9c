"""`rloo eval` keeps every judged sample (eval/samples.jsonl) and shows the best, worst and most
changed examples with honest labels; `rloo eval env=file.py:Class` and `rloo pipeline env=...` play
the user's environment (success rate, turns, tool calls, the paired difference), the environment's
text marked in printed and saved episodes (docs/own-data.md, docs/agents.md)."""

from __future__ import annotations

import json
import textwrap

import pytest

from conftest import TINY
from rloo.cli import main
from rloo.modeling.loading import build_llama
from rloo.tasks import get_task
from rloo.tasks.tokenizer import build_tokenizer


def _model(path, task: str, seed: int):
    tok = build_tokenizer(get_task(task))
    build_llama(TINY, tok, seed=seed).save_pretrained(path)
    tok.save_pretrained(path)
    return path


def test_eval_keeps_every_sample_and_says_the_judge_is_the_optimised_reward(tiny_model_dir, tmp_path, capsys):
    """A policy whose RL run optimised the reward model that judges it (its config.yaml says so),
    greedy decoding (where k1 went negative): samples.jsonl has one line per prompt with both policies'
    answers, scores, KL and lengths; the report shows the examples, says the judge is the optimised
    reward model, and its KL (k3) is never negative."""
    policy = _model(tmp_path / "rl" / "model", "summarize", seed=1)
    (tmp_path / "rl" / "config.yaml").write_text(f"reward_model: {tiny_model_dir}\nreward_fn: null\n")
    out = tmp_path / "ev"
    args = [f"policy={policy}", f"baseline={tiny_model_dir}", f"reward_model={tiny_model_dir}", "judge=reward_model"]
    args += ["num_prompts=6", "max_new_tokens=4", "temperature=0", "report_to=none", f"output_dir={out}"]
    assert main(["eval", *args]) == 0, capsys.readouterr().err
    rows = [json.loads(x) for x in (out / "samples.jsonl").read_text().splitlines()]
    assert len(rows) == 6
    for r in rows:
        assert r["prompt"] and r["reference"] and isinstance(r["reference_score"], float)
        for name in ("policy", "baseline"):
            s = r[name]
            assert set(s) == {"completion", "score", "reward", "kl", "kl_k3", "length", "truncated"}
            assert s["kl_k3"] >= 0 and 1 <= s["length"] <= 4 and isinstance(s["truncated"], bool)
        assert r["score_difference"] == pytest.approx(r["policy"]["score"] - r["baseline"]["score"])
    report = (out / "report.md").read_text()
    for section in ("## Best examples", "## Worst examples", "## Most changed examples"):
        assert section in report, report
    assert "reward model RL optimised" in report and "not an independent judge" in report
    assert "KL to ref (k3)" in report and "Greedy decoding" in report
    summary = json.loads((out / "summary.json").read_text())
    assert summary["policy"]["kl_k3"] >= 0 and summary["policy"]["judge_kind"] == "reward_model"
    assert "judge_score" in summary["policy"] and "gold" not in summary["policy"]


OBS_ENV = """
from rloo.envs import Step

class ObsEnv:
    '''Two turns: the first is answered with "out 3", the second ends the episode, reward 1 when it says "ans".'''
    stop_ids = ()

    def __init__(self, tokenizer):
        self.tokenizer, self.turn = tokenizer, 0

    def reset(self, prompt):
        self.turn = 0
        return self.tokenizer(prompt, add_special_tokens=False)["input_ids"]

    def step(self, turn):
        self.turn += 1
        if self.turn == 1:
            return Step(self.tokenizer("out 3", add_special_tokens=False)["input_ids"], 0.0, False)
        return Step([], float("ans" in self.tokenizer.decode(turn, skip_special_tokens=True).split()), True)
"""
LIMITS = ["env_settings.max_turns=2", "env_settings.max_turn_tokens=4", "env_settings.max_total_tokens=12"]


@pytest.fixture
def obs_env(tmp_path):
    (tmp_path / "myenv.py").write_text(textwrap.dedent(OBS_ENV))
    return f"env={tmp_path / 'myenv.py'}:ObsEnv"


def _episodes_check(folder, err: str) -> None:
    """Both policies' success rates and the paired difference; every episode kept, the environment's
    text marked in the saved and the printed episodes."""
    summary = json.loads((folder / "results.json").read_text())
    for name in ("baseline", "policy"):
        assert 0 <= summary[name]["pass_at_1"] <= 1 and summary[name]["turns"] == 2.0
        assert summary[name]["tool_calls"] == 0
    assert set(summary["difference"]["pass@1"]) == {"diff", "ci95"}
    rows = [json.loads(x) for x in (folder / "samples.jsonl").read_text().splitlines()]
    assert len(rows) == 3 and all(len(r["policy"]["episodes"]) == 8 for r in rows)
    assert all("[env: out 3]" in e["episode"] for r in rows for e in r["baseline"]["episodes"])
    assert "success rate (pass@1)" in err and "[env: out 3]" in err


def test_eval_plays_the_users_environment(tmp_path, capsys, obs_env):
    models = [_model(tmp_path / f"m{s}", "calculator", seed=s) for s in (0, 1)]
    args = ["eval", f"policy={models[1]}", f"baseline={models[0]}", obs_env, "task=calculator", *LIMITS]
    out = tmp_path / "ev"
    rc = main([*args, "num_prompts=3", "pass_samples=8", "report_to=none", f"output_dir={out}"])
    err = capsys.readouterr().err
    assert rc == 0, err
    _episodes_check(out, err)
    assert "[env: ...]" in (out / "report.md").read_text()


def test_pipeline_trains_and_evaluates_on_the_users_environment(tmp_path, capsys, obs_env):
    out = tmp_path / "p"
    arch = ["sft.arch.hidden_size=32", "sft.arch.num_layers=1", "sft.arch.num_heads=2", "sft.arch.intermediate_size=64"]
    rl = ["rl.steps=2", "rl.batch_size=2", "rl.k=2", "rl.warmup_steps=0", "rl.save_every=null"]
    rl += ["rl.eval_every=2", "rl.eval_prompts=4"]  # task=calculator's pipeline sets none
    args = ["pipeline", "task=calculator", obs_env, f"output_dir={out}", "sft.num_examples=32", "sft.epochs=1"]
    rc = main([*args, *arch, *rl, *LIMITS, "eval.num_prompts=3", "eval.pass_samples=8", "report_to=none"])
    err = capsys.readouterr().err
    assert rc == 0, err
    assert not (out / "reward").exists()
    summary = json.loads((out / "summary.json").read_text())
    assert summary["env"].endswith("myenv.py:ObsEnv") and summary["eval"]["env"] == summary["env"]
    _episodes_check(out / "eval", err)
    # the RL stage's own evaluation of episodes: at its start and end
    recs = [json.loads(x) for x in (out / "rl" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in recs if "eval/success" in r] == [0, 2]
    # the evaluation's prompt count is in the summary and its printed line, as the other stages' are
    # (fails on the code before it: the episode evaluation wrote no cuts.json, the pipeline left it out)
    cut = summary["cut"]
    assert set(cut) == {"sft", "rl", "eval"} and cut["eval"] == json.loads((out / "eval" / "cuts.json").read_text())
    assert (cut["eval"]["prompts"]["cut"], cut["eval"]["prompts"]["of"]) == (0, 3)
    assert cut["eval"]["prompts"]["max_prompt_tokens"] == 64
    assert "; eval 0/3 prompts" in next(x for x in err.splitlines() if x.startswith("cut to the length limits:"))


def _eval_prompt_lengths(model, n: int) -> list[int]:
    """The token lengths of `rloo eval task=calculator`'s first n held-out prompts (the word tokenizer
    has no chat template: an episode starts with its prompt's ids alone)."""
    from rloo.modeling.loading import load_tokenizer

    tok = load_tokenizer(str(model))
    assert not getattr(tok, "chat_template", None)
    prompts = [e.prompt for e in get_task("calculator").examples("eval", n, seed=0)]
    return [len(tok(p, add_special_tokens=False)["input_ids"]) for p in prompts]


def test_an_episode_evaluation_counts_says_and_records_the_prompts_it_cuts(tmp_path, capsys, obs_env):
    """max_prompt_tokens below every held-out prompt: refused in one line with nothing written, as
    `rloo eval` on text; with max_cut_share=1 played, said, and recorded in cuts.json and results.json
    (fails on the code before it: the prompts were cut without a word)."""
    model = _model(tmp_path / "m", "calculator", seed=0)
    lengths = _eval_prompt_lengths(model, 3)
    limit = min(lengths) - 1
    args = ["eval", f"policy={model}", obs_env, "task=calculator", *LIMITS, "num_prompts=3", "pass_samples=8"]
    args += [f"max_prompt_tokens={limit}", "report_to=none"]
    assert main([*args, f"output_dir={tmp_path / 'refused'}"]) == 2
    err = capsys.readouterr().err.strip()
    assert (
        len(err.splitlines()) == 1 and f"eval: 3 of 3 prompts (100%) are longer than max_prompt_tokens={limit} " in err
    )
    assert f"set max_prompt_tokens={max(lengths)} to keep them whole" in err, err
    assert not (tmp_path / "refused").exists()
    out = tmp_path / "ev"
    assert main([*args, "max_cut_share=1", f"output_dir={out}"]) == 0
    err = capsys.readouterr().err
    said = f"eval: cut to the length limits: 3 of 3 prompts (100%, longest {max(lengths)} tokens) keep their last "
    assert said + f"max_prompt_tokens={limit} tokens" in err, err
    record = {"cut": 3, "of": 3, "longest": max(lengths), "max_prompt_tokens": limit}
    assert json.loads((out / "cuts.json").read_text()) == {"prompts": record}
    assert json.loads((out / "results.json").read_text())["data"] == {"data/prompts_cut": 3.0}


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["eval", "policy={m}", "judge=gold"], "env= gives the reward and judges the episodes"),
        (["eval", "policy={m}", "min_new_tokens=2"], "unset min_new_tokens"),
        (["pipeline", "rl.reward_fn=x.py:f"], "env= gives the reward: leave rl.reward_fn"),
        (["pipeline", "rl.algorithm=ppo"], "env= trains with rl.algorithm="),
    ],
)
def test_env_mistakes_are_one_line_and_write_nothing(tmp_path, capsys, obs_env, argv, message):
    argv = [a.format(m=tmp_path) for a in argv]
    rc = main([*argv, obs_env, f"output_dir={tmp_path / 'out'}"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and message in err, err
    assert not (tmp_path / "out").exists()
