"""Training what you already loaded (issue 56, item 2): rloo.train / sft / train_reward take a model
object (plain or PEFT), a tokenizer object and a `datasets.Dataset` in place of paths, and
`callbacks=` whose stop ends the run as Ctrl-C does (a checkpoint, one line) and resumes exactly."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

import rloo
from rloo.config import ArchConfig
from rloo.errors import ConfigError, RlooError, StoppedByCallback
from rloo.modeling.loading import build_llama
from rloo.tasks import get_task
from rloo.tasks.tokenizer import build_tokenizer

peft = pytest.importorskip("peft")
datasets = pytest.importorskip("datasets")
transformers = pytest.importorskip("transformers")

ARCH = ArchConfig(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64)


def _tiny():
    """A fresh tiny Llama and the summarize task's word tokenizer (the same weights every call)."""
    tok = build_tokenizer(get_task("summarize"))
    return build_llama(ARCH, tok, seed=0), tok


def _rows(n: int = 40) -> list[dict]:
    """Task prompts with columns rloo does not read (a TRL user's dataset has them)."""
    ex = get_task("summarize").examples("train", n, seed=0)
    return [{"prompt": e.prompt, "completion": e.reference, "answer": e.reference, "id": i} for i, e in enumerate(ex)]


def _rl(out, steps: int = 3, **kw) -> rloo.RLConfig:
    return rloo.RLConfig(
        output_dir=str(out),
        steps=steps,
        batch_size=2,
        k=2,
        max_new_tokens=3,
        eval_every=None,
        save_every=None,
        log_every=1,
        **kw,
    )


def _short(prompts, completions, **kwargs):
    return [-float(len(c)) for c in completions]


class StopAt:
    """Duck-typed hooks, the arguments as transformers passes them; asks to stop at step `at`."""

    def __init__(self, at: int):
        self.at, self.seen = at, []

    def on_log(self, args, state, control, logs=None, **kw):
        self.seen.append(("log", state.global_step, sorted(logs)))

    def on_step_end(self, args, state, control, **kw):
        self.seen.append(("step_end", state.global_step, kw["model"] is not None))
        if state.global_step == self.at:
            control.should_training_stop = True

    def on_save(self, args, state, control, checkpoint=None, **kw):
        self.seen.append(("save", state.global_step, checkpoint))


def _weights(folder) -> dict[str, torch.Tensor]:
    return load_file(str(folder / "model.safetensors"))


def test_stopping_callback_checkpoints_and_resume_continues(tmp_path):
    """A handed model, tokenizer and Dataset (extra columns) train; a callback's stop after step 1
    writes a checkpoint and one line; a resume handed the trained object (not the weights the run
    started from) is refused and changes nothing; handed the model as loaded again, it finishes."""
    ds = datasets.Dataset.from_list(_rows())
    out = tmp_path / "stopped"
    hooks = StopAt(1)
    model, tok = _tiny()
    with pytest.raises(StoppedByCallback) as e:
        rloo.train(_rl(out, steps=2), model=model, tokenizer=tok, dataset=ds, reward_fn=_short, callbacks=[hooks])
    msg = str(e.value)
    assert "\n" not in msg and "StopAt.on_step_end asked to stop" in msg and "step 1/2" in msg, msg
    ckpt = out / "checkpoints" / "step-000001"
    assert ckpt.is_dir() and not (out / "model").exists()
    logged = json.loads((out / "metrics.jsonl").read_text().splitlines()[-1])
    assert logged["step"] == 1
    assert hooks.seen == [("log", 1, sorted(logged.keys() - {"step"})), ("step_end", 1, True), ("save", 1, str(ckpt))]
    assert "policy: memory:LlamaForCausalLM:" in (out / "config.yaml").read_text()

    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file() and p.name != ".lock"}
    with pytest.raises(RlooError, match=r"cannot resume with different policy") as e:
        rloo.train(_rl(out, steps=2), model=model, tokenizer=tok, dataset=ds, reward_fn=_short, resume=True)
    assert "\n" not in str(e.value)
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file() and p.name != ".lock"} == before

    model, tok = _tiny()
    res = rloo.train(_rl(out, steps=2), model=model, tokenizer=tok, dataset=ds, reward_fn=_short, resume=True)
    assert [h["step"] for h in res.history if "loss" in " ".join(h)] == [2]
    # the object handed in is the one trained (as TRL's trainers train theirs)
    saved = _weights(res.model_path)
    assert torch.equal(model.state_dict()["model.norm.weight"], saved["model.norm.weight"])


@pytest.mark.slow
def test_stopped_and_resumed_equals_a_run_that_never_stopped(tmp_path):
    """Stopped by a callback after step 1 and resumed: the weights of a run that never stopped, bit
    for bit; that run handed its model and data as paths (the objects train as their paths do)."""
    ds = datasets.Dataset.from_list(_rows())
    model, tok = _tiny()
    model.save_pretrained(tmp_path / "m")
    tok.save_pretrained(tmp_path / "m")
    ds.to_json(str(tmp_path / "rows.jsonl"))
    whole = rloo.train(
        _rl(tmp_path / "whole", policy=str(tmp_path / "m"), dataset={"path": str(tmp_path / "rows.jsonl")}),
        reward_fn=_short,
    )
    out = tmp_path / "stopped"
    model, tok = _tiny()
    with pytest.raises(StoppedByCallback):
        rloo.train(_rl(out), model=model, tokenizer=tok, dataset=ds, reward_fn=_short, callbacks=[StopAt(1)])
    model, tok = _tiny()
    resumed = rloo.train(_rl(out), model=model, tokenizer=tok, dataset=ds, reward_fn=_short, resume=True)
    a, b = _weights(whole.model_path), _weights(resumed.model_path)
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a), [k for k in a if not torch.equal(a[k], b[k])]


def test_peft_model_with_chat_template_trains_its_adapters(tmp_path):
    """A PeftModel handed in trains its adapters only, the reference being the model with them off;
    the tokenizer's chat template wraps the Dataset's prompts; the adapters are saved as peft saves."""
    from tests.helpers.chat_tokenizers import chat_tokenizer
    from tests.helpers.tiny_archs import CLASSES, tiny_config

    tok = chat_tokenizer("chatml")
    torch.manual_seed(0)
    base = CLASSES["qwen2"](tiny_config("qwen2", tokenizer=tok))
    model = peft.get_peft_model(base, peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    frozen = {k: v.clone() for k, v in model.state_dict().items() if "lora_" not in k}
    adapters = {k: v.clone() for k, v in model.state_dict().items() if "lora_B" in k}
    seen: list[str] = []
    sources: list[str] = []

    def reward(prompts, completions, source, **kw):  # the Dataset's other column, one value per completion
        seen.extend(prompts)
        sources.extend(source)
        return [float(len(c)) for c in completions]

    rows = [{"prompt": f"say {i}", "source": "own"} for i in range(40)]  # short: the tokenizer is byte-level
    cfg = _rl(tmp_path / "peft", steps=2, max_prompt_tokens=32)
    res = rloo.train(cfg, model=model, tokenizer=tok, dataset=rows, reward_fn=reward)
    assert seen and all(p.startswith("<|im_start|>user\n") for p in seen), seen[:2]
    assert len(sources) == len(seen) and set(sources) == {"own"}
    now = model.state_dict()
    assert all(torch.equal(now[k], v) for k, v in frozen.items())
    assert any(not torch.equal(now[k], v) for k, v in adapters.items()), "no adapter moved"
    assert (res.model_path / "adapter_config.json").is_file()
    assert res.history[-1]["step"] == 2 and "kl" in " ".join(res.history[0])


def test_sft_takes_objects_and_a_trainer_callback_subclass(tmp_path):
    """SFT on a handed model, tokenizer and Dataset; a transformers TrainerCallback subclass gets its
    own signature (args, state, control, **kwargs) and its control stops the stage with a checkpoint."""

    class Early(transformers.TrainerCallback):
        def __init__(self):
            self.logs = []

        def on_log(self, args, state, control, logs=None, **kwargs):
            self.logs.append(logs)

        def on_step_end(self, args, state, control, **kwargs):
            control.should_training_stop = state.global_step >= 2
            return control

    model, tok = _tiny()
    ds = datasets.Dataset.from_list(_rows(64))
    cfg = rloo.SFTConfig(output_dir=str(tmp_path / "sft"), epochs=1, batch_size=8, save_every=None)
    cb = Early()
    with pytest.raises(StoppedByCallback, match=r"Early.on_step_end asked to stop; sft stopped at step 2/"):
        rloo.sft(cfg, model=model, tokenizer=tok, dataset=ds, callbacks=[cb])
    assert [sorted(x) for x in cb.logs[-2:]] == [sorted(cb.logs[-1])] * 2 and "loss/sft" in cb.logs[-1]
    assert (tmp_path / "sft" / "checkpoints" / "step-000002").is_dir()
    model, tok = _tiny()
    res = rloo.sft(cfg, model=model, tokenizer=tok, dataset=ds, resume=True)
    assert (res.model_path / "model.safetensors").is_file()


def test_train_reward_takes_a_sequence_classifier(tmp_path):
    tok = build_tokenizer(get_task("summarize"))
    lm = build_llama(ARCH, tok, seed=0)
    rm = transformers.LlamaForSequenceClassification(lm.config.__class__(**{**lm.config.to_dict(), "num_labels": 1}))
    rows = [
        {"prompt": r["prompt"], "chosen": r["completion"], "rejected": r["completion"] + " rent rent", "id": r["id"]}
        for r in _rows(48)
    ]
    cfg = rloo.RewardConfig(output_dir=str(tmp_path / "rm"), epochs=1, batch_size=16, save_every=None)
    res = rloo.train_reward(cfg, model=rm, tokenizer=tok, dataset=rows)
    assert (res.model_path / "model.safetensors").is_file() and 0.0 <= res.accuracy_vs_labeler <= 1.0
    with pytest.raises(RlooError, match="must be a reward model: a sequence classifier") as e:
        rloo.train_reward(
            cfg.model_copy(update={"output_dir": str(tmp_path / "x")}), model=lm, tokenizer=tok, dataset=rows
        )
    assert "\n" not in str(e.value) and not (tmp_path / "x").exists()


@pytest.mark.parametrize(
    "kwargs, cfg_kw, needle",
    [
        ({"dataset": ["a prompt"]}, {}, "dataset= row 0 is a str, expected a dict of columns"),
        ({"dataset": "rows.jsonl"}, {}, "dataset= must be a datasets.Dataset"),
        ({}, {"policy": "some/where"}, "pass policy=some/where or model=, not both"),
        ({"prompts": ["x"], "dataset": [{"prompt": "x"}]}, {}, "pass prompts= or dataset=, not both"),
    ],
)
def test_mistakes_are_one_line_and_write_nothing(kwargs, cfg_kw, needle, tmp_path):
    model, tok = _tiny()
    out = tmp_path / "out"
    with pytest.raises((RlooError, ConfigError), match=needle) as e:
        rloo.train(_rl(out, **cfg_kw), model=model, tokenizer=tok, reward_fn=_short, **kwargs)
    assert "\n" not in str(e.value) and not out.exists()
