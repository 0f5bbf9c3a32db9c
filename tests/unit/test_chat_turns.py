"""Episodes in the policy tokenizer's chat template (rloo.data.chat_turns, docs/agents.md): the turn
wrappers reproduce the template's text, templates that cannot frame episodes are one line, an
episode's context before each policy turn is `apply_chat_template` of the conversation so far, and
`rloo train env=`'s episodes start from the template when the tokenizer has one."""

from __future__ import annotations

import pytest
import torch

from helpers.chat_tokenizers import chat_tokenizer
from helpers.tiny_archs import tiny_lm
from rloo.algorithms.agents import episode_reward, limits, sample_episodes
from rloo.algorithms.base import Models
from rloo.config import RLConfig, Sampling
from rloo.data.chat_turns import chat_frame, end_ids
from rloo.data.lengths import count
from rloo.envs import EnvSpec, Step, make_env
from rloo.errors import RlooError
from rloo.rollout.multiturn import episodes
from rloo.tasks import get_task
from rloo.tasks.tokenizer import build_tokenizer
from rloo.training.common import env_spec


def _ids(tok, text: str) -> list[int]:
    return tok(text, add_special_tokens=False)["input_ids"]


def _chat(tok, *contents: str, generation: bool = True) -> str:
    roles = ["user" if i % 2 == 0 else "assistant" for i in range(len(contents))]
    msgs = [{"role": r, "content": c} for r, c in zip(roles, contents, strict=True)]
    return tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=generation)


@pytest.mark.parametrize("template", ["chatml", "llama3", "eos_turns"])
def test_frame_reproduces_the_template_text(template):
    """head + prompt + tail, then turn + [eot] + obs_head + obs + obs_tail: decoded with their special
    tokens, the template's text of the conversation, whichever way the turn ended."""
    tok = chat_tokenizer(template)
    frame = chat_frame(tok)
    prompt, reply, obs = _ids(tok, "guess 3 + 4"), _ids(tok, "call calc 3 + 4 end"), _ids(tok, "out 7")
    first = frame.first(prompt)
    assert tok.decode(first) == _chat(tok, "guess 3 + 4")
    for turn in (reply, [*reply, frame.eot]):  # ended at a tool's stop / at the end-of-turn token
        context = [*first, *turn, *frame.observation(turn, obs)]
        assert tok.decode(context) == _chat(tok, "guess 3 + 4", "call calc 3 + 4 end", "out 7"), turn
    assert end_ids(tok, frame) == {tok.eos_token_id, frame.eot}


@pytest.mark.parametrize("template", ["chatml", "llama3", "eos_turns"])
def test_tool_observations_take_the_tool_role(template):
    """env_settings.observation_role=tool: each observation is framed as a `tool` message, the text
    apply_chat_template gives that conversation (and not the one with a user message there)."""
    tok = chat_tokenizer(template)
    frame = chat_frame(tok, "tool")
    prompt, reply, obs = _ids(tok, "guess 3 + 4"), _ids(tok, "call calc 3 + 4 end"), _ids(tok, "out 7")
    msgs = [{"role": "user", "content": "guess 3 + 4"}, {"role": "assistant", "content": "call calc 3 + 4 end"}]
    want = tok.apply_chat_template(
        [*msgs, {"role": "tool", "content": "out 7"}], tokenize=False, add_generation_prompt=True
    )
    context = [*frame.first(prompt), *reply, *frame.observation(reply, obs)]
    assert tok.decode(context) == want
    assert tok.decode(context) != _chat(tok, "guess 3 + 4", "call calc 3 + 4 end", "out 7")  # the user role's


@pytest.mark.parametrize(
    ("template", "message"),
    [("llama2", "renders a turn differently after the conversation goes on"), ("drops_history", "differently")],
)
def test_templates_that_cannot_frame_episodes_are_one_line(template, message):
    with pytest.raises(RlooError, match=message) as err:
        chat_frame(chat_tokenizer(template))
    assert "\n" not in str(err.value) and "env_settings.chat_template=false" in str(err.value)


def test_no_template_no_frame():
    assert chat_frame(chat_tokenizer(None)) is None
    assert end_ids(chat_tokenizer(None), None) == {1}


class CountEnv:
    """Answers turn j with `out <j> <length of the turn>`; done after three turns."""

    stop_ids = ()

    def __init__(self, tok):
        self.tok = tok

    def reset(self, prompt):
        self.said = []
        return _ids(self.tok, prompt)

    def step(self, turn):
        self.said.append(f"out {len(self.said)} {len(turn)}")
        return Step(_ids(self.tok, self.said[-1]), 0.0, len(self.said) == 3)


def test_episode_context_is_the_template_of_the_conversation():
    """Before every policy turn, the episode's ids so far, decoded with their special tokens, are
    apply_chat_template(conversation so far, add_generation_prompt=True): the prompt, each turn (less
    a final end-of-turn token) as an assistant message and each observation as a user message."""
    tok = chat_tokenizer("chatml")
    frame = chat_frame(tok)
    model = tiny_lm("qwen2", tokenizer=tok).eval()
    envs = [make_env(lambda: CountEnv(tok), len(tok)) for _ in range(4)]
    lim = limits(EnvSpec(CountEnv, max_turns=3, max_turn_tokens=5, max_total_tokens=40))
    gen = torch.Generator().manual_seed(0)
    roll = episodes(model, tok, envs, ["guess 3 + 4", "ans 5"], 2, lim, Sampling(1, 32), generator=gen, chat=frame)
    checked = 0
    for i in range(4):
        prompt = roll.prompt_ids[i][roll.prompt_mask[i]].tolist()
        real = roll.completion_mask[i]
        traj, pol = roll.completion_ids[i][real].tolist(), roll.policy_mask[i][real].tolist()
        said, contents = envs[i].env.said, [["guess 3 + 4", "ans 5"][i // 2]]
        for t in range(len(traj) + 1):
            if t < len(traj) and pol[t] and (t == 0 or not pol[t - 1]):  # a policy turn starts at t
                assert tok.decode(prompt + traj[:t]) == _chat(tok, *contents), (i, t)
                checked += 1
            if t == len(traj) or (t > 0 and pol[t - 1] and not pol[t]):  # a turn ended before t
                turn = traj[max(j for j in range(t) if j == 0 or not pol[j - 1]) : t]
                contents += [tok.decode(turn[:-1] if turn[-1] == frame.eot else turn)]
                contents += said[len(contents) // 2 - 1 : len(contents) // 2]
    assert checked >= 8, "too few turns checked"


def test_train_env_episodes_start_from_the_template():
    """`rloo train env=calculator` with a tokenizer that has a chat template (the word tokenizer and
    role tokens): each episode's first context is the template's; with env_settings.chat_template=false
    (or no template) the prompt's ids alone, as before."""
    tok = build_tokenizer(get_task("calculator"))
    tok.add_tokens(["user", "assistant"])
    tok.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    tok.chat_template = (
        "{% for m in messages %}<|im_start|> {{ m['role'] }} {{ m['content'] }} <|im_end|> {% endfor %}"
        "{% if add_generation_prompt %}<|im_start|> assistant {% endif %}"
    )
    policy = tiny_lm("llama", tokenizer=tok)
    prompt = get_task("calculator").examples("eval", 1)[0].prompt
    for on in (True, False):
        off = {} if on else {"env_settings": {"chat_template": False}}  # on: the default
        cfg = RLConfig(policy="unused", env="calculator", k=2, **off)
        models = Models(policy, policy, tok, episode_reward, env=env_spec(cfg, tok))
        roll = sample_episodes(models, [prompt], cfg, torch.Generator().manual_seed(0))
        text = tok.decode(roll.prompt_ids[0][roll.prompt_mask[0]])
        expected = _chat(tok, prompt) if on else prompt
        assert " ".join(text.split()) == " ".join(expected.split()), on
    token_by_token = RLConfig(policy="unused", env="calculator", env_settings={"prefill_observations": False})
    assert env_spec(cfg, tok).prefill_observations and not env_spec(token_by_token, tok).prefill_observations


def test_the_length_survey_counts_an_episodes_start_as_the_sampler_cuts_it():
    """An episode starts with its prompt in the template's frame (ChatFrame.first), so the survey of
    the prompts (rloo.data.lengths.count, as `rloo eval env=` and `rloo train env=` count them) adds
    the frame's tokens: a prompt that fits alone but not in its frame is cut, and counted."""
    tok = chat_tokenizer("chatml")
    frame = chat_frame(tok)
    spec = EnvSpec(CountEnv, max_turns=1, max_turn_tokens=2, max_total_tokens=4, chat=frame)
    assert spec.prompt_frame == len(frame.first([])) > 0 and EnvSpec(CountEnv).prompt_frame == 0
    prompts = ["guess 3 + 4", "ans 5", "call calc 3 * 4 + 5 * 6 end"]
    starts = [len(frame.first(_ids(tok, p))) for p in prompts]
    limit = max(starts) - 1  # the longest start (the third) is cut, the others fit; every prompt alone fits
    assert max(len(_ids(tok, p)) for p in prompts) <= limit and count(tok, prompts, "prompts", limit).n == 0
    survey = count(tok, prompts, "prompts", limit, spec.prompt_frame)
    assert (survey.n, survey.total, survey.longest) == (1, 3, max(starts))
    model = tiny_lm("qwen2", tokenizer=tok).eval()
    envs = [make_env(lambda: CountEnv(tok), len(tok)) for _ in range(2 * len(prompts))]
    gen = torch.Generator().manual_seed(0)
    roll = episodes(model, tok, envs, prompts, 2, limits(spec), Sampling(1, limit), generator=gen, chat=frame)
    assert roll.prompts_truncated == 2 * survey.n  # k = 2 episodes of each prompt
