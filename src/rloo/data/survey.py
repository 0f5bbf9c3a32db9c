"""The pipeline's length survey: each stage's texts of the user's data, as the stage will read them
(its split, the tokenizer's chat template), counted against max_prompt_tokens and
max_response_tokens before any stage runs.

Each stage says what it cuts when it runs (rloo.data.lengths); this survey only makes the pipeline
refuse at once, rather than after SFT has trained, when a later stage would refuse. The limits are
never changed here: they are the config's, and the refusal names the value that would keep every
text whole (or says that the model's context cannot hold it).
"""

from __future__ import annotations

from rloo.config import PipelineConfig
from rloo.data.lengths import check_cuts, count
from rloo.data.split import eval_records, train_eval_records, train_records
from rloo.errors import RlooError
from rloo.runtime.inputs.sizes import shape_of


def _texts(values: list[str | None]) -> list[str]:
    """A field's texts from records read with that field (every record has it, so none is None)."""
    return [v for v in values if v is not None]


def survey_pipeline(cfg: PipelineConfig) -> None:
    """Raise check_cuts' one line for the first stage that would cut more than max_cut_share of a kind."""
    if cfg.dataset is None or (tok := _tokenizer(cfg.tokenizer or cfg.model, cfg.trust_remote_code)) is None:
        return
    shape = shape_of(cfg.model) if cfg.model else None
    context, share = (shape.context if shape else None), cfg.max_cut_share
    p_max, r_max = cfg.max_prompt_tokens, cfg.max_response_tokens

    def prompts(records, what="prompts"):
        return count(tok, [r.prompt for r in records], what, p_max)

    sft = train_records(cfg.dataset, ("prompt", "completion"), tokenizer=tok)
    check_cuts("sft", [prompts(sft), count(tok, _texts([r.completion for r in sft]), "targets", r_max)], share, context)
    if cfg.trains_reward_model() and cfg.reward.model is None:  # another model's tokenizer: its stage counts
        fields = ("prompt", "chosen", "rejected")
        pairs, _ = train_eval_records(cfg.reward.dataset or cfg.dataset, fields, cfg.reward.eval_pairs, tok)
        responses = _texts([r.chosen for r in pairs] + [r.rejected for r in pairs])
        check_cuts("reward", [prompts(pairs), count(tok, responses, "responses", r_max)], share, context)
    train, held = train_eval_records(cfg.dataset, ("prompt",), cfg.rl.eval_prompts, tok, optional=("completion",))
    check_cuts("rl", [prompts(train), prompts(held, "eval prompts")], share, context)
    held = eval_records(cfg.dataset, ("prompt", "completion"), cfg.eval.num_prompts, tokenizer=tok)
    check_cuts("eval", [prompts(held)], share, context)


def _tokenizer(path: str | None, trust_remote_code: bool):
    """The tokenizer the stages will use, or None when it cannot load here (the SFT stage says why)."""
    if path is None:
        return None
    from rloo.runtime.inputs.saved_tokenizer import auto_tokenizer  # imports transformers: only with a dataset

    try:
        return auto_tokenizer(path, trust_remote_code=trust_remote_code)
    except (OSError, ValueError, RlooError):
        return None
