"""Issue 32, item 4: top_k, min_new_tokens, repetition_penalty, stop strings and greedy decoding in
rloo's sampler, each against a plain reference: a per-sequence loop of full forward passes applying
transformers' own logits processors, HF `generate(do_sample=False)` for greedy decoding, and the
decoded text of the unstopped sample for stop strings. Defaults keep today's draws bitwise."""

from __future__ import annotations

import pytest
import torch
from tests.helpers.tiny_archs import EOS, PAD, V, tiny_lm
from transformers.generation.logits_process import (
    LogitsProcessorList,
    MinNewTokensLengthLogitsProcessor,
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
)

from rloo.config import Sampling
from rloo.rollout import decoding, sampler
from rloo.rollout.draw import _draw
from tolerance import TINY_MODEL_FORWARD, assert_close

T_NEW = 8


def _prompts(n: int = 6, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(2, V, (int(torch.randint(2, 6, (1,), generator=g)),), generator=g).tolist() for _ in range(n)]


def _left_pad(rows: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(map(len, rows))
    ids = torch.full((len(rows), width), PAD)
    for i, r in enumerate(rows):
        ids[i, width - len(r) :] = torch.tensor(r)
    return ids, ids != PAD


@torch.no_grad()
def _reference(model, prompts, k, *, temperature, top_k, min_new, penalty, seed):
    """Per sequence, no cache, no padding: HF's processors on the full-forward logits, the token
    drawn by inverse CDF from the same (T_NEW, N) uniforms as `sample(rows=(0, N))`."""
    u = sampler.uniforms((T_NEW, len(prompts) * k), torch.Generator().manual_seed(seed), "cpu")
    out_ids, out_lps = [], []
    for n in range(len(prompts) * k):
        prompt = prompts[n // k]
        procs = [RepetitionPenaltyLogitsProcessor(penalty)] if penalty != 1.0 else []
        procs += [MinNewTokensLengthLogitsProcessor(len(prompt), min_new, EOS)] if min_new else []
        procs += [TemperatureLogitsWarper(temperature)] + ([TopKLogitsWarper(top_k)] if top_k else [])
        seq, lps = list(prompt), []
        for t in range(T_NEW):
            logits = model(input_ids=torch.tensor([seq]), use_cache=False).logits[:, -1].float()
            probs = LogitsProcessorList(procs)(torch.tensor([seq]), logits.clone())[0].softmax(-1)
            cdf = probs.cumsum(-1)
            tok = min(int((cdf <= u[t, n] * cdf[-1]).sum()), V - 1)
            seq.append(tok)
            lps.append(float((logits[0] / temperature).log_softmax(-1)[tok]))
            if tok == EOS:
                break
        out_ids.append(seq[len(prompt) :])
        out_lps.append(lps)
    return out_ids, out_lps


@pytest.mark.parametrize(
    "temperature,top_k,min_new,penalty",
    [(1.0, 5, 0, 1.0), (0.8, 0, 4, 1.0), (1.0, 0, 0, 1.5), (1.3, 7, 3, 1.2), (1.0, 1, 0, 0.7)],
)
def test_sampler_draws_what_hf_processors_draw(temperature, top_k, min_new, penalty):
    model = tiny_lm("llama").eval()
    prompts, k = _prompts(), 3
    ids, mask = _left_pad(prompts)
    s = Sampling(T_NEW, ids.shape[1], temperature, top_k=top_k, min_new_tokens=min_new, repetition_penalty=penalty)
    got_ids, got_mask, got_lps = sampler.sample_tokens(
        model,
        ids,
        mask,
        s,
        eos_id=EOS,
        pad_id=PAD,
        k=k,
        generator=torch.Generator().manual_seed(4),
        rows=(0, len(prompts) * k),
    )
    ref_ids, ref_lps = _reference(
        model, prompts, k, temperature=temperature, top_k=top_k, min_new=min_new, penalty=penalty, seed=4
    )
    for n, (r_ids, r_lps) in enumerate(zip(ref_ids, ref_lps, strict=True)):
        assert got_ids[n][got_mask[n]].tolist() == r_ids, f"row {n}"
        assert_close(got_lps[n][got_mask[n]], torch.tensor(r_lps), TINY_MODEL_FORWARD)


def test_min_new_tokens_forbids_eos_before_the_minimum():
    model = tiny_lm("llama").eval()
    ids, mask = _left_pad(_prompts(16, seed=1))
    kw = dict(eos_id=EOS, pad_id=PAD, k=4, rows=(0, 64))
    s = Sampling(T_NEW, ids.shape[1])
    free, _, _ = sampler.sample_tokens(model, ids, mask, s, generator=torch.Generator().manual_seed(0), **kw)
    held, held_mask, _ = sampler.sample_tokens(
        model, ids, mask, s.replace(min_new_tokens=5), generator=torch.Generator().manual_seed(0), **kw
    )
    assert bool((free[:, :5] == EOS).any()), "no early EOS without the minimum: the test checks nothing"
    assert not bool((held[:, :5] == EOS).any()) and bool(held_mask[:, :5].all())


def test_repetition_penalty_matches_transformers_processor():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(5, 50, generator=g) * 3
    ids = torch.randint(0, 50, (5, 12), generator=g)  # repeats included
    for penalty in (1.3, 0.6):
        expected = RepetitionPenaltyLogitsProcessor(penalty)(ids, logits.clone())
        got = decoding.penalize_repetitions(
            logits, decoding.seen_tokens(ids, torch.ones_like(ids, dtype=torch.bool), 50)[:, :-1], penalty
        )
        assert torch.equal(got, expected)


def test_top_k_matches_transformers_warper_ties_included():
    logits = torch.tensor([[3.0, 1.0, 3.0, 2.0, 2.0, -1.0]])
    for k in (1, 2, 3, 6, 10):
        got = decoding.truncate(logits, Sampling(1, 1, top_k=k))
        assert torch.equal(got, TopKLogitsWarper(k)(None, logits.clone()))


def test_defaults_draw_as_before_bitwise():
    """With top_k 0, min_new_tokens 0, penalty 1 the step is today's formula, bit for bit: the race
    over softmax(logits / T) and log_softmax(logits / T) at the token (main's `_next_token`)."""
    logits = torch.randn(7, 33, generator=torch.Generator().manual_seed(2)) * 4
    for temperature in (1.0, 0.7):
        tok, lp = sampler._next_token(logits, Sampling(1, 1, temperature), torch.Generator().manual_seed(5), None)
        scaled = logits / temperature
        want = _draw(scaled.softmax(-1), torch.Generator().manual_seed(5))
        assert torch.equal(tok, want)
        assert torch.equal(lp, scaled.log_softmax(-1).gather(-1, want[:, None])[:, 0])
    ids, mask = torch.ones(2, 3, dtype=torch.long), torch.ones(2, 3, dtype=torch.bool)
    assert decoding.shaping(ids, mask, 4, 33, 1, Sampling(1, 1)) is None


@pytest.mark.parametrize("penalty,min_new", [(1.0, 0), (1.4, 0), (1.0, 6), (0.8, 3)])
def test_greedy_equals_hf_generate_without_sampling(penalty, min_new):
    """temperature=0 is argmax decoding: HF `generate(do_sample=False)` per prompt, unpadded (HF
    penalizes a left-padded batch's pad id too), with the same penalty and minimum."""
    model = tiny_lm("gpt2").eval()
    prompts = _prompts(5, seed=3)
    ids, mask = _left_pad(prompts)
    s = Sampling(T_NEW, ids.shape[1], 0.0, repetition_penalty=penalty, min_new_tokens=min_new)
    got, got_mask, lps = sampler.sample_tokens(
        model, ids, mask, s, eos_id=EOS, pad_id=PAD, k=2, generator=torch.Generator().manual_seed(0),
    )  # fmt: skip
    for i, p in enumerate(prompts):
        extra = dict(repetition_penalty=penalty) if penalty != 1.0 else {}
        extra |= dict(min_new_tokens=min_new) if min_new else {}
        hf = model.generate(
            torch.tensor([p]), attention_mask=torch.ones(1, len(p), dtype=torch.long), do_sample=False,
            max_new_tokens=T_NEW, eos_token_id=EOS, pad_token_id=PAD, **extra,
        )[0, len(p) :].tolist()  # fmt: skip
        for row in (2 * i, 2 * i + 1):  # k identical rows
            assert got[row][got_mask[row]].tolist() == hf
    full = model(input_ids=torch.tensor([prompts[0] + got[0][got_mask[0]].tolist()])).logits[0].float()
    steps = full[len(prompts[0]) - 1 : -1].log_softmax(-1)  # temperature 1: greedy's log-probs
    want = steps.gather(-1, got[0][got_mask[0]][:, None])[:, 0]
    assert_close(lps[0][got_mask[0]], want, TINY_MODEL_FORWARD)


def test_greedy_breaks_ties_at_the_first_index():
    logits = torch.tensor([[0.0, 2.0, 2.0, 1.0], [5.0, 5.0, 5.0, 5.0]])
    tok, _ = sampler._next_token(logits, Sampling(1, 1, 0.0), None, None)
    assert tok.tolist() == [1, 0]
    top1 = Sampling(1, 1, 0.9, top_k=1)
    assert sampler._next_token(torch.tensor([[0.0, 2.0, 3.0, 1.0]]), top1, None, None)[0].tolist() == [2]


def _bpe():
    """A byte-level BPE (merges across letters, tokens of several characters) with EOS/PAD."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    words = "the cat sat on a mat; then it ran to the barn, and the dog ran after it. summary: cats run"
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    tok.train_from_iterator(
        [words] * 20, trainers.BpeTrainer(vocab_size=300, special_tokens=["<eos>", "<pad>"], initial_alphabet=alphabet)
    )
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>", pad_token="<pad>", padding_side="left")


def _first_hit(tok, ids: list[int], stop: str) -> int | None:
    """The number of tokens up to the one whose decoded prefix first contains `stop`."""
    return next((j for j in range(1, len(ids) + 1) if stop in tok.decode(ids[:j], skip_special_tokens=True)), None)


def _mid_token_stop(tok, ids: list[int]) -> str:
    """A readable stop string that starts in one token and ends inside a later multi-character one."""
    for j in range(2, len(ids) + 1):
        before, upto = tok.decode(ids[: j - 1]), tok.decode(ids[:j])
        stop = upto[len(before) - 1 : len(before) + 1]
        if len(upto) - len(before) >= 2 and before and upto.startswith(before) and stop.isprintable():
            return stop
    raise AssertionError("no multi-character token after a readable one in the sample")


def test_stop_strings_end_at_the_token_that_completes_them():
    """Same noise with and without `stop`: each row is the unstopped row cut after the first token
    whose decoded prefix contains the stop string (it may end inside that token), not truncated."""
    tok = _bpe()
    model = tiny_lm("llama", tokenizer=tok).eval()
    prompts, k, n = ["the cat sat", "a dog ran to the"], 3, 6
    s = Sampling(max_new_tokens=12, max_prompt_tokens=8)
    free = sampler.rollout(model, tok, prompts, k, s, generator=torch.Generator().manual_seed(1), rows=(0, n))
    rows = [free.completion_ids[i][free.completion_mask[i]].tolist() for i in range(n)]
    stop = _mid_token_stop(tok, rows[0])
    cut = sampler.rollout(
        model, tok, prompts, k, s.replace(stop=(stop,)), generator=torch.Generator().manual_seed(1), rows=(0, n)
    )
    ended = 0
    for i, row in enumerate(rows):
        j = _first_hit(tok, row, stop)
        want = row if j is None else row[:j]
        assert cut.completion_ids[i][cut.completion_mask[i]].tolist() == want, f"row {i}"
        if j is not None:
            ended += 1
            assert stop in cut.raw_completions[i] and not bool(cut.truncated[i])
            assert torch.equal(cut.logprobs[i][:j], free.logprobs[i][:j]) and not bool(cut.logprobs[i][j:].any())
    assert ended >= 1 and len(rows[0]) > _first_hit(tok, rows[0], stop), "the stop string cut nothing"


def _vllm_end(tok, ids: list[int], stop: str, n: int) -> int | None:
    """vLLM's rule for `stop` under min_tokens=n (vllm/v1/engine/detokenizer.py, 0.32), one token a step:
    no check while the row has n tokens or fewer; then each step searches only where a match ends in
    the text the new token added. The number of tokens up to the one that ended the row, or None."""
    for j in range(n + 1, len(ids) + 1):
        before, text = tok.decode(ids[: j - 1], skip_special_tokens=True), tok.decode(ids[:j], skip_special_tokens=True)
        if len(text) > len(before) and text.find(stop, max(0, len(before) - len(stop) + 1)) >= 0:
            return j
    return None


def test_stop_strings_under_min_new_tokens_end_rows_where_vllm_does():
    """min_new_tokens=n with a stop string found inside the first n tokens' text (the last two
    characters there of a row r whose first n tokens decode to readable text): vLLM's rule ignores
    it, so the row goes on; each row is the unstopped row cut where `_vllm_end` says, and its
    truncation flag is the unstopped row's when nothing cut it. The old rule (the whole text
    searched from token n on) ended row r at token n."""
    tok = _bpe()
    model = tiny_lm("llama", tokenizer=tok).eval()
    prompts, k, n, rows_n = ["the cat sat", "a dog ran to the"], 16, 3, 32
    s = Sampling(max_new_tokens=12, max_prompt_tokens=8, min_new_tokens=n)
    free = sampler.rollout(model, tok, prompts, k, s, generator=torch.Generator().manual_seed(1), rows=(0, rows_n))
    rows = [free.completion_ids[i][free.completion_mask[i]].tolist() for i in range(rows_n)]
    heads = [tok.decode(row[:n], skip_special_tokens=True) for row in rows]  # most are bytes of no character
    clean = [
        len(h) >= 2 and h.isascii() and h.isprintable() and len(row) > n for h, row in zip(heads, rows, strict=True)
    ]
    r = clean.index(True)
    stop = heads[r][-2:]
    cut = sampler.rollout(
        model, tok, prompts, k, s.replace(stop=(stop,)), generator=torch.Generator().manual_seed(1), rows=(0, rows_n)
    )
    for i, row in enumerate(rows):
        j = _vllm_end(tok, row, stop, n)
        got = cut.completion_ids[i][cut.completion_mask[i]].tolist()
        assert got == (row if j is None else row[:j]), f"row {i}: stop {stop!r}"
        assert bool(cut.truncated[i]) == (j is None and bool(free.truncated[i])), f"row {i}"
    assert int(cut.completion_mask[r].sum()) > n, f"row {r} ended inside its first n tokens' text"


def test_padding_is_not_a_seen_token():
    ids = torch.tensor([[0, 0, 5, 6], [7, 0, 0, 0]])
    mask = torch.tensor([[False, False, True, True], [True, True, False, False]])
    assert decoding.seen_tokens(ids, mask, 8)[:, :-1].nonzero().tolist() == [[0, 5], [0, 6], [1, 0], [1, 7]]
