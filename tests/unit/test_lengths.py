"""What encoding cuts, counted by hand: prompts lose their first tokens, completions their last and
the EOS appended after them; the share rule refuses more than max_cut_share, never at it."""

from __future__ import annotations

import pytest

from rloo.data.collate import encode_completions, encode_prompts
from rloo.data.lengths import (
    Cut,
    check_cuts,
    count,
    cut_line,
    cut_metrics,
    cuts_summary,
    prompt_cut,
    read_cuts,
    response_cut,
    save_cuts,
    target_cut,
)
from rloo.errors import RlooError


class Words:
    """One token per word (ids from 2), pad 0, EOS 1; a text or a list of texts, as a HF tokenizer."""

    pad_token_id, eos_token_id = 0, 1

    def __call__(self, text, add_special_tokens=False):
        ids = lambda t: [2 + len(w) for w in t.split()]  # noqa: E731 - any id per word will do
        return {"input_ids": [ids(t) for t in text] if isinstance(text, list) else ids(text)}


TEXTS = ["a b", "a b c", "a b c d"]  # 2, 3 and 4 tokens


def test_completions_count_the_rows_that_lose_text_and_those_that_lose_their_eos():
    enc = encode_completions(Words(), TEXTS, 3)
    # with EOS: 3, 4, 5 tokens; at max_len 3 the second and third lose their EOS, the third a word too
    assert (enc.cut, enc.eos_cut, enc.longest) == (1, 2, 5)
    assert enc.ids[0].tolist() == [3, 3, 1] and enc.ids[1].tolist() == [3, 3, 3]  # the EOS kept where it fits
    assert target_cut(enc, 3) == Cut("targets", 2, 3, 5, "max_response_tokens", 3)
    assert response_cut(enc, 3).n == 1  # a preference response is cut when it loses text
    assert encode_completions(Words(), TEXTS, 5).eos_cut == 0


def test_prompts_keep_their_last_tokens_and_count_the_cut():
    enc, truncated = encode_prompts(Words(), ["x " + t for t in TEXTS], 3)  # 3, 4, 5 tokens
    assert truncated == enc.cut == 2 and enc.longest == 5
    assert enc.ids[2].tolist() == [3, 3, 3]  # "b c d": its first two words gone
    assert prompt_cut(enc, 3) == Cut("prompts", 2, 3, 5, "max_prompt_tokens", 3)


def test_count_agrees_with_encoding():
    assert count(Words(), TEXTS, "targets", 3) == target_cut(encode_completions(Words(), TEXTS, 3), 3)
    assert count(Words(), TEXTS, "prompts", 3) == Cut("prompts", 1, 3, 4, "max_prompt_tokens", 3)


def test_a_share_above_the_limit_is_refused_with_the_value_that_fits():
    cuts = [Cut("prompts", 0, 4, 3, "max_prompt_tokens", 3), Cut("targets", 2, 4, 7, "max_response_tokens", 5)]
    check_cuts("sft", cuts, 0.5)  # 2 of 4 is not more than a half
    with pytest.raises(RlooError) as e:
        check_cuts("sft", cuts, 0.25)
    assert str(e.value) == (
        "sft: 2 of 4 targets (50%) are longer than max_response_tokens=5 (longest 7 tokens with its EOS), "
        "more than max_cut_share=0.25: set max_response_tokens=7 to keep them whole, or set max_cut_share=1 "
        "to use them cut"
    )
    with pytest.raises(RlooError, match="the model's context holds 6 tokens: shorten those examples"):
        check_cuts("sft", cuts, 0.25, context=6)


def test_the_line_and_the_metrics_say_only_what_was_cut():
    none = [Cut("prompts", 0, 4, 3, "max_prompt_tokens", 3)]
    assert cut_line("rl", none) is None and cut_metrics(none) == {}
    cuts = [*none, Cut("eval prompts", 1, 2, 9, "max_prompt_tokens", 3)]
    assert cut_line("rl", cuts) == (
        "rl: cut to the length limits: 1 of 2 eval prompts (50%, longest 9 tokens) keep their last "
        "max_prompt_tokens=3 tokens (a chat template's system message goes with their start)"
    )
    assert cut_metrics(cuts) == {"data/prompts_cut": 0.0, "data/eval_prompts_cut": 1.0}


def test_a_checkpoint_saved_without_max_cut_share_resumes_as_an_exact_continuation():
    from rloo.runtime.checkpoint.resumecheck import check_resume_config, describe_changes

    changed = check_resume_config({"steps": 4}, {"steps": 4, "max_cut_share": 0.25})
    assert describe_changes(changed, 2, 4) == [
        "resuming with changed settings (still an exact continuation): max_cut_share: None -> 0.25"
    ]


def test_a_stages_record_keeps_zeros_and_the_summary_line_says_what_each_kind_lost(tmp_path):
    assert read_cuts(tmp_path) is None  # a stage that never surveyed its data: left out of the summary
    save_cuts(
        tmp_path, [Cut("prompts", 0, 4, 3, "max_prompt_tokens", 3), Cut("targets", 2, 4, 9, "max_response_tokens", 8)]
    )
    sft = read_cuts(tmp_path)
    assert sft == {
        "prompts": {"cut": 0, "of": 4, "longest": 3, "max_prompt_tokens": 3},
        "targets": {"cut": 2, "of": 4, "longest": 9, "max_response_tokens": 8},
    }
    rl = {"prompts": {"cut": 1, "of": 5}, "eval prompts": {"cut": 2, "of": 2}}
    assert cuts_summary({"sft": sft, "rl": rl, "eval": {}}) == (
        "cut to the length limits: sft 0/4 prompts, 2/4 targets (EOS lost); "
        "rl 1/5 prompts (start lost), 2/2 eval prompts (start lost)"
    )
    assert cuts_summary({}) == "cut to the length limits: nothing counted"
