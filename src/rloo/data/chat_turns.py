"""A chat template around multi-turn episodes: the tokens the template writes between the turns.

With a chat template an episode reads as a conversation: the task prompt is the first user
message, each policy turn an assistant message, each environment observation the next user (or
tool) message. The template is rendered once, with placeholder messages, and its text split at the
placeholders; each piece between them is tokenized once, on its own (`ChatFrame`):

    first context   head + reset ids + tail             (template([user: P], generation prompt))
    after a turn    [eot] + obs_head + obs ids + obs_tail   (the next user turn, then the assistant
                                                          header of the policy's next turn)

`eot` is the template's end-of-turn token: a stop of every policy turn, written as context when
a turn ended otherwise (a tool's stop id, EOS, the token limit). The policy's and the
environment's ids go in as they are, never decoded and re-tokenized; so the episode's text
(decoded with its special tokens) is the template's rendering of the conversation.
"""

from __future__ import annotations

from dataclasses import dataclass

from rloo.errors import RlooError
from rloo.runtime.inputs.hf import chat_template

# placeholder contents: plain words that no template trims, escapes or finds in its own text
_P, _A, _O, _A2, _O2 = (f"rlooholder{c}" for c in "paobq")


@dataclass(frozen=True)
class ChatFrame:
    """The template's tokens around an episode's turns (module docstring)."""

    head: tuple[int, ...]
    tail: tuple[int, ...]
    eot: int
    obs_head: tuple[int, ...]
    obs_tail: tuple[int, ...]

    @property
    def around_prompt(self) -> int:
        """The tokens `first` adds to a prompt's: what counts against max_prompt_tokens besides it."""
        return len(self.head) + len(self.tail)

    def first(self, prompt_ids: list[int]) -> list[int]:
        """The first context: the prompt's ids as the user message, then the assistant header."""
        return [*self.head, *prompt_ids, *self.tail]

    def observation(self, turn: list[int], obs: list[int]) -> list[int]:
        """What follows the policy's `turn`: its end-of-turn token if the turn did not end with one,
        `obs` as the next user (or tool) message, the assistant header of the next turn."""
        close = [] if turn and turn[-1] == self.eot else [self.eot]
        return [*close, *self.obs_head, *obs, *self.obs_tail]


def _render(tokenizer, messages: list[tuple[str, str]], generation: bool) -> str:
    msgs = [{"role": r, "content": c} for r, c in messages]
    try:
        return tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=generation)
    except Exception as e:  # noqa: BLE001 - a template's own error (jinja raise_exception, unknown role)
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise RlooError(f"the tokenizer's chat template cannot render an episode: {first}; {_OFF}") from e


_OFF = "set env_settings.chat_template=false to play episodes without it"


def _split(text: str, holder: str) -> tuple[str, str]:
    if text.count(holder) != 1:
        raise RlooError(f"the tokenizer's chat template does not write a message's content verbatim once; {_OFF}")
    before, after = text.split(holder)
    return before, after


def _ids(tokenizer, text: str) -> tuple[int, ...]:
    return tuple(tokenizer(text, add_special_tokens=False)["input_ids"])


def _end_of_turn(tokenizer, after_reply: str) -> tuple[int, str]:
    """The special token the template writes right after an assistant message's content (after
    whitespace that is no token, as a word tokenizer's), and its text with that whitespace."""
    rest = after_reply.lstrip()
    space = after_reply[: len(after_reply) - len(rest)]
    if _ids(tokenizer, space):
        rest, space = after_reply, ""
    # getattr: third-party: slow and fast tokenizers differ in added_tokens_decoder and its entries' `special`
    for tid in sorted(set(tokenizer.all_special_ids) | set(getattr(tokenizer, "added_tokens_decoder", {}))):
        text = tokenizer.convert_ids_to_tokens(tid)
        special = tid in tokenizer.all_special_ids or getattr(tokenizer.added_tokens_decoder[tid], "special", False)
        if special and text and rest.startswith(text) and _ids(tokenizer, text) == (tid,):
            return tid, space + text
    raise RlooError(f"the tokenizer's chat template ends an assistant message with no special token; {_OFF}")


def has_chat_template(tokenizer) -> bool:
    """Whether `tokenizer` renders chats: a Hugging Face tokenizer with a template. (The one probe of
    it: rloo's built-in word tokenizer and None have no `chat_template`, a HF one may hold None.)"""
    return bool(chat_template(tokenizer))


def chat_frame(tokenizer, role: str = "user") -> ChatFrame | None:
    """The ChatFrame of `tokenizer`'s chat template (None without one); observations as `role`
    messages. One RlooError line when the template cannot frame episodes: it raises, rewrites a
    message's content, closes an assistant turn without a special token, or renders an earlier turn
    differently once the conversation goes on (then an episode's text would not be its template's)."""
    if not has_chat_template(tokenizer):
        return None
    first = _render(tokenizer, [("user", _P)], True)
    head, tail = _split(first, _P)
    two = _render(tokenizer, [("user", _P), ("assistant", _A), (role, _O)], True)
    if not two.startswith(first + _A):
        raise RlooError(
            f"the tokenizer's chat template renders a turn differently after the conversation goes on; {_OFF}"
        )
    eot, eot_text = _end_of_turn(tokenizer, two[len(first + _A) :])
    obs_head, obs_tail = _split(two[len(first + _A + eot_text) :], _O)
    three = _render(tokenizer, [("user", _P), ("assistant", _A), (role, _O), ("assistant", _A2), (role, _O2)], True)
    if three != two + _A2 + eot_text + obs_head + _O2 + obs_tail:
        raise RlooError(f"the tokenizer's chat template writes later turns differently from the second; {_OFF}")
    return ChatFrame(
        _ids(tokenizer, head), _ids(tokenizer, tail), eot, _ids(tokenizer, obs_head), _ids(tokenizer, obs_tail)
    )


def end_ids(tokenizer, frame: ChatFrame | None) -> frozenset[int]:
    """The tokens that close a policy turn without being part of its content: EOS and the template's
    end-of-turn (an environment drops one at a turn's end before it parses the turn's text)."""
    ids = {tokenizer.eos_token_id} | ({frame.eot} if frame is not None else set())
    return frozenset(i for i in ids if i is not None)
