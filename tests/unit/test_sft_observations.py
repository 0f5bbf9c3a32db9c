"""SFT on episode traces with sft.observation_loss=false trains on the policy's words only: the
environment's observations (the calculator's `out ...`, the game's `higher`/`lower`) are left out of
its loss, as RL leaves them out (rloo.data.collate.environment_token_mask, Task.environment_words,
rloo.training.sft)."""

from __future__ import annotations

import pytest
import torch

from helpers.chat_tokenizers import chat_tokenizer
from rloo.config import ArchConfig, PipelineConfig, SFTConfig
from rloo.data.collate import encode_completions, encode_prompts, environment_token_mask
from rloo.envs.base import make_env
from rloo.envs.calculator import CalculatorEnv
from rloo.modeling.forward import completion_logprobs
from rloo.modeling.loading import build_llama
from rloo.tasks import Example, get_task
from rloo.tasks.tokenizer import build_tokenizer
from rloo.training.sft import _loss, sft_loss_mask


def test_the_words_sft_leaves_out_are_the_ones_the_calculator_environment_writes():
    task = get_task("calculator")
    tok = build_tokenizer(task)
    prompt = "q : 4 7 * 8 + 6 ="
    ref = task.ideal_response(prompt)  # call calc 4 7 * 8 + 6 end out 3 8 2 ans 3 8 2
    env = make_env(lambda: CalculatorEnv(tok), len(tok))
    env.reset(prompt)
    call = ref.split(" out ")[0]
    obs = env.step(tok(call, add_special_tokens=False)["input_ids"]).observation  # played, not assumed
    enc = encode_completions(tok, [ref], 32)
    env_mask = environment_token_mask(tok, [ref], [task.environment_words(ref)], enc)[0]
    assert enc.ids[0][env_mask].tolist() == obs
    assert tok.decode(enc.ids[0][enc.mask[0] & ~env_mask]) == "call calc 4 7 * 8 + 6 end ans 3 8 2 <eos>"


@pytest.mark.parametrize(
    ("task", "ref", "env_words"),
    [
        ("calculator", "call calc 4 * * 8 end out error calc bad ans 3", "out error calc bad"),
        ("calculator", "ans 3 8 2", ""),  # answered from memory: every word the policy's
        ("guess", "guess 8 higher guess 12 lower guess 10", "higher lower"),
        ("arithmetic", "3 + 4 = 7 ans 7", ""),  # single-turn
    ],
)
def test_each_task_names_its_environment_words(task, ref, env_words):
    flags = get_task(task).environment_words(ref)
    assert " ".join(w for w, f in zip(ref.split(" "), flags, strict=True) if f) == env_words


def test_with_a_bpe_tokenizer_the_tokens_that_touch_an_environment_word_are_left_out():
    tok = chat_tokenizer(None)  # byte-level BPE: tokens carry their leading space
    ref = "call calc 4 end out 3 8 ans 3 8"
    flags = [w in ("out", "3", "8") and i in (4, 5, 6) for i, w in enumerate(ref.split(" "))]
    enc = encode_completions(tok, [ref], 64)
    env_mask = environment_token_mask(tok, [ref], [flags], enc)[0]
    assert tok.decode(enc.ids[0][env_mask]).strip() == "out 3 8"
    kept = enc.ids[0][enc.mask[0] & ~env_mask].tolist()
    assert kept[-1] == tok.eos_token_id and tok.decode(kept[:-1]).split() == "call calc 4 end ans 3 8".split()


def test_the_sft_loss_is_the_mean_over_the_policy_tokens_only():
    """_loss on a batch of calculator traces equals an independent mean of the policy's words' log-probs
    (and differs from the mean over every target token, so the test can tell them apart)."""
    task = get_task("calculator")
    tok = build_tokenizer(task)
    prompts = ["q : 4 7 * 8 + 6 =", "q : 1 2 * 3 + 4 ="]
    refs = [task.ideal_response(prompts[0]), "ans 4 0"]
    model = build_llama(ArchConfig(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64), tok, seed=0)
    p, _ = encode_prompts(tok, prompts, 16)
    c = encode_completions(tok, refs, 24)
    mask = sft_loss_mask(task, tok, [Example(a, b) for a, b in zip(prompts, refs, strict=True)], c, policy_only=True)
    loss, _ = _loss(model, p, c, mask, torch.arange(2), "cpu")
    lp = completion_logprobs(model, p.ids, p.mask, c.ids, c.mask)
    per_word = [task.environment_words(r) for r in refs]
    policy = torch.zeros_like(c.mask)
    for i, (r, flags) in enumerate(zip(refs, per_word, strict=True)):
        words = r.split(" ") + ["<eos>"]  # the word tokenizer: one token per word, then EOS
        policy[i, : len(words)] = torch.tensor([not f for f in flags] + [True])
    expected = -(lp * policy).sum() / policy.sum()
    torch.testing.assert_close(loss, expected, rtol=1e-6, atol=1e-6)
    everything = -(lp * c.mask).sum() / c.mask.sum()
    assert abs(float(everything - expected)) > 1e-3
    assert int(c.mask.sum() - policy.sum()) == 4  # out 3 8 2


def test_with_observation_loss_every_target_token_is_trained_on():
    task = get_task("calculator")
    tok = build_tokenizer(task)
    ref = task.ideal_response("q : 4 7 * 8 + 6 =")
    c = encode_completions(tok, [ref], 24)
    assert torch.equal(sft_loss_mask(task, tok, [Example("q", ref)], c, policy_only=False), c.mask)


def test_the_calculator_pipeline_trains_sft_on_the_policys_words_and_the_game_on_the_whole_trace():
    """The task table's choice (sft.observation_loss): predicting the calculator's output is arithmetic
    the policy need not learn; predicting higher/lower is the game's rule (guess, seed 0, without the
    answers in SFT's loss: SFT 0.564 of games won against 0.627 with them, RLOO 0.675 against 0.759;
    one seed each, docs/results/agents-calculator)."""
    assert PipelineConfig(task="calculator").sft.observation_loss is False
    assert PipelineConfig(task="guess").sft.observation_loss is True
    assert SFTConfig().observation_loss is True  # `rloo sft`, own tasks: every target token, as before
