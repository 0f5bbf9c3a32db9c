"""Bad names and missing pieces fail at once, in one line, before any model loads or file is written:
path typos name the closest entries, Hub names are tried once (the Hub unreachable here), user
callables are found from the current folder or a file, evaluation refuses to run without a judge."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap
import time

import pytest

from helpers.child_env import child_env
from rloo import RLConfig, RlooError, train
from rloo.cli import main
from rloo.runtime.inputs.names import hub_problem
from rloo.runtime.inputs.user_code import load_callable

UNREACHABLE = "http://127.0.0.1:9"  # nothing listens on the discard port: connection refused at once


@pytest.fixture()
def workdir(tmp_path, monkeypatch):
    """A user's folder: data/ with two files, nothing else; the current folder for the test."""
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "sft.jsonl").write_text('{"prompt": "a b", "completion": " c"}\n' * 4)
    (tmp_path / "data" / "prefs.parquet").write_bytes(b"")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _cli(args, cwd, **env):
    """`python -m rloo.cli ARGS` in `cwd` with the Hub unreachable; (rc, stderr lines, seconds)."""
    offline = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
    full_env = {k: v for k, v in child_env(inherit_pythonpath=False).items() if k not in offline}
    full_env |= {"HF_ENDPOINT": UNREACHABLE, **env}
    t = time.perf_counter()
    p = subprocess.run(
        [sys.executable, "-m", "rloo.cli", *args], cwd=cwd, env=full_env, capture_output=True, text=True, timeout=120
    )
    return p.returncode, p.stderr.strip().splitlines(), time.perf_counter() - t


@pytest.fixture(scope="module")
def started_s(tmp_path_factory):
    """Seconds of a refusal that needs nothing but the local disk (a missing model folder): starting
    Python, importing rloo, one line. A bad name must be refused in about that time; a Hub lookup
    that retried (huggingface_hub backs off 1, 2, 4, 8 s) or timed out would add seconds. A fixed
    bound (3 s) failed on a loaded machine, where this refusal alone took 4.3 s."""
    rc, err, seconds = _cli(
        ["sft", "model=./m", "dataset.path=data/nope", "output_dir=out"], tmp_path_factory.mktemp("t")
    )
    assert rc == 2, err
    return seconds


def _fast(seconds: float, started: float) -> bool:
    return seconds < 1.5 * started + 1.5


@pytest.mark.parametrize(
    "args, expect",
    [
        (["train", "policy=mymodel", "reward_model=mymodel"], "policy 'mymodel' is not a local path and the Hub"),
        (["sft", "model=mymodel", "dataset.path=data/sft.jsonl"], "model 'mymodel' is not a local path and the Hub"),
        (["sft", "model=./m", "dataset.path=data/nope"], "model './m' does not exist"),
        (
            ["pipeline", "model=mymodel", "dataset.path=data/nope"],
            "dataset.path 'data/nope' does not exist; nothing similar in data/, which holds: prefs.parquet, sft.jsonl",
        ),
        (
            ["pipeline", "model=mymodel", "dataset.path=data/x.jsnl"],
            "dataset.path 'data/x.jsnl' does not exist; closest in data/: sft.jsonl",
        ),
        (["train", "policy=mymodel", "reward_model=mymodel", "dataset.path=data/x.jsnl"], "dataset.path 'data/x.jsnl'"),
    ],
)
def test_bad_names_fail_fast_in_one_line(args, expect, workdir, started_s):
    rc, err, seconds = _cli([*args, "output_dir=out"], workdir)
    assert rc == 2 and len(err) == 1 and expect in err[0], err
    assert "Retrying" not in err[0] and "Traceback" not in err[0]
    assert sorted(p.name for p in workdir.iterdir()) == ["data"], "nothing is written"
    print(f"{' '.join(args)}: {seconds:.2f}s")
    assert _fast(seconds, started_s), f"took {seconds:.1f}s (a local refusal {started_s:.1f}s): {err}"


def test_hub_offline_is_honoured(workdir, started_s):
    rc, err, seconds = _cli(
        ["train", "policy=org/not-cached", "reward_model=org/not-cached", "output_dir=out"],
        workdir,
        HF_HUB_OFFLINE="1",
        HF_HUB_CACHE=str(workdir / "empty-cache"),
    )
    assert rc == 2 and len(err) == 1 and "HF_HUB_OFFLINE is set" in err[0], err
    assert _fast(seconds, started_s) and not (workdir / "out").exists()


def test_hub_lookup_is_one_request(monkeypatch):
    """One call, no retry: a failing lookup is asked once and remembered."""
    from huggingface_hub import HfApi

    calls = []

    def refuse(self, repo_id, **kw):
        calls.append(repo_id)
        raise ConnectionError("refused")

    monkeypatch.setattr(HfApi, "repo_info", refuse)
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", False)
    hub_problem.cache_clear()
    assert "could not be reached: ConnectionError: refused" in hub_problem("someone/x")
    assert "could not be reached" in hub_problem("someone/x")
    assert calls == ["someone/x"]
    hub_problem.cache_clear()


MYPKG = textwrap.dedent("""
    def keywords(prompts, completions):
        return [float("rent" in c) for c in completions]
""")


@pytest.fixture()
def isolated_imports(monkeypatch):
    """sys.path and sys.modules restored after the test (the loader adds the current folder)."""
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", os.getcwd())])
    before = set(sys.modules)
    yield
    for name in set(sys.modules) - before:
        sys.modules.pop(name, None)


def test_module_function_found_from_current_folder(workdir, isolated_imports):
    (workdir / "mypkg").mkdir()
    (workdir / "mypkg" / "__init__.py").write_text("")
    (workdir / "mypkg" / "rewards.py").write_text(MYPKG)
    sys.path[:] = [p for p in sys.path if p not in ("", str(workdir))]
    assert importlib.util.find_spec("mypkg") is None, "not importable without the current folder"
    fn = load_callable("mypkg.rewards:keywords")
    assert fn(["p", "p"], ["the rent", "a dog"]) == [1.0, 0.0]


def test_file_function(workdir, isolated_imports):
    (workdir / "rewards.py").write_text(MYPKG)
    (workdir / "sub").mkdir()
    (workdir / "sub" / "judge.py").write_text(MYPKG)
    assert load_callable("rewards.py:keywords")(["p"], ["rent"]) == [1.0]
    assert load_callable("sub/judge.py:keywords")(["p"], ["dog"]) == [0.0]


@pytest.mark.parametrize(
    "spec, expect",
    [
        ("nosuchmod:f", "cannot import 'nosuchmod'"),
        (
            "rewardz.py:keywords",
            "reward function file 'rewardz.py' does not exist; closest in the current folder: rewards.py",
        ),
        ("rewards.py:nope", "has no callable 'nope' (it has: keywords)"),
        ("rewards.py", "must be given as module:function or path/to/file.py:function"),
    ],
)
def test_bad_callable_specs(spec, expect, workdir, isolated_imports):
    (workdir / "rewards.py").write_text(MYPKG)
    with pytest.raises(RlooError, match=None) as e:
        load_callable(spec)
    assert expect in str(e.value)


def test_cli_reward_fn_from_current_folder_without_pythonpath(workdir, tiny_model_dir):
    """`rloo train reward_fn=mypkg.rewards:keywords` run as the `rloo` script runs (its own folder
    first on sys.path, not the current one), with no PYTHONPATH entry for the user's package."""
    (workdir / "mypkg").mkdir()
    (workdir / "mypkg" / "__init__.py").write_text("")
    (workdir / "mypkg" / "rewards.py").write_text(MYPKG)
    script = workdir.parent / f"{workdir.name}-bin" / "rloo"
    script.parent.mkdir()
    script.write_text("import sys\nfrom rloo.cli import main\nsys.exit(main())\n")
    env = child_env(inherit_pythonpath=False)
    p = subprocess.run(
        [
            sys.executable,
            str(script),
            "train",
            f"policy={tiny_model_dir}",
            "reward_fn=mypkg.rewards:keywords",
            "output_dir=out",
            "steps=1",
            "batch_size=2",
            "k=2",
            "max_new_tokens=3",
            "eval_every=null",
            "save_every=null",
        ],
        cwd=workdir,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 0, p.stderr
    assert (workdir / "out" / "model").is_dir()


def test_no_reward_source_before_any_model_loads(tmp_path, monkeypatch, tiny_model_dir):
    def boom(*a, **k):
        raise AssertionError("a model was loaded before the config was checked")

    monkeypatch.setattr("rloo.training.rl.load_policy", boom)
    with pytest.raises(RlooError, match="no reward source"):
        train(RLConfig(policy=str(tiny_model_dir), output_dir=tmp_path / "run"))
    assert not (tmp_path / "run").exists()


def test_api_raises_rloo_error_not_pydantic():
    from pydantic import ValidationError

    for kw in ({"k": 1}, {"beta": -1}, {"bogus": 1}, {"eval": {"num_prompts": 0}}):
        with pytest.raises(RlooError) as e:
            RLConfig(policy="p", **kw)
        assert not isinstance(e.value, ValidationError) and "{" not in str(e.value)
    cfg = RLConfig(policy="p")
    with pytest.raises(RlooError, match="k >= 2"):
        cfg.k = 1


def test_k1_is_one_line_without_config_dump(tiny_model_dir, tmp_path, capsys):
    rc = main(
        ["train", f"policy={tiny_model_dir}", f"reward_model={tiny_model_dir}", "k=1", f"output_dir={tmp_path / 'run'}"]
    )
    err = capsys.readouterr().err.strip()
    assert rc == 2 and err == (
        "rloo train: error: invalid config: leave-one-out needs k >= 2 samples per prompt "
        "(the baseline of one sample is the mean of the other k-1), got k=1"
    )


def test_eval_without_judge_is_an_error(workdir, tiny_model_dir, capsys):
    rc = main(["eval", f"policy={tiny_model_dir}", "dataset.path=data/sft.jsonl", "output_dir=ev"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "nothing to judge the responses with" in err and len(err.splitlines()) == 1
    assert not (workdir / "ev").exists()


@pytest.mark.parametrize(
    "args, expect",
    [
        (["dataset.path=data/sft.jsonl"], "needs model=PATH"),
        (["model=MODEL", "dataset.path=data/sft.jsonl"], "has no column 'chosen'"),
        (
            ["model=MODEL", "dataset.path=data/sft.jsonl", "eval.judge=gold"],
            "judge 'gold' is the built-in task's judge",
        ),
        (
            ["model=MODEL", "dataset.path=data/sft.jsonl", "eval.judge=nojudge.py:f"],
            "judge file 'nojudge.py' does not exist",
        ),
        (["reward.dataset.path=data/sft.jsonl"], "reward.dataset is set but dataset is not"),
        (["report_to=mlflow"], "report_to must be among tensorboard, wandb, none"),
    ],
)
def test_pipeline_config_checked_before_anything_is_written(args, expect, workdir, tiny_model_dir, capsys):
    args = [a.replace("MODEL", str(tiny_model_dir)) for a in args]
    rc = main(["pipeline", *args, "output_dir=p"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and expect in err and len(err.splitlines()) == 1, err
    assert not (workdir / "p").exists()
