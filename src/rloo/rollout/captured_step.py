"""One decode step with fixed shapes, a pure function of the state it reads and writes in place: the
previous token (N,), positions (N, 1), the static KV cache (rloo.modeling.static_cache), the weights
and the uniforms drawn before the loop (T, N), indexed by a step tensor. It runs the forward pass,
the logit shaping (min_new_tokens, repetition penalty), the draw by inverse CDF, the log-prob and
the EOS bookkeeping with no host synchronisation, so CUDA can capture it once as a graph and
replay it (`CapturedStep`). The same arithmetic as the eager loop's (rloo.rollout.decode_steps
with `rows`: the same up-front uniforms): `_next_token`, `penalize_repetitions`."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from rloo.config import Sampling
from rloo.modeling.forward import lm_logits
from rloo.modeling.kvcache import cache_kwarg
from rloo.modeling.static_cache import StaticCache
from rloo.rollout.decoding import penalize_repetitions
from rloo.rollout.draw import _next_token


@dataclass(frozen=True)
class StepSettings:
    """What a step does besides the forward pass: the rollout's Sampling and the tokenizer's ids;
    fixed for a captured step (a graph bakes them in)."""

    s: Sampling
    eos_id: int
    pad_id: int

    @property
    def shapes(self) -> bool:
        """Whether the logits are shaped (the eager loop's `Shaping` exists)."""
        return self.s.min_new_tokens > 0 or self.s.repetition_penalty != 1.0


class DecodeState:
    """The step's inputs and outputs, allocated once for N rows and T tokens: tok (N,) the last
    token, pos (N, 1) its next position, t (1,) the step index, noise (T, N), done (N,), seen
    (N, V+1) (with a repetition penalty), and the outputs ids/mask/lps (N, T)."""

    def __init__(self, n: int, steps: int, vocab: int, seen: bool, device: torch.device):
        def z(*shape, dtype=torch.long):
            return torch.zeros(*shape, dtype=dtype, device=device)

        self.tok, self.pos, self.t = z(n), z(n, 1), z(1)
        self.noise = z(steps, n, dtype=torch.float32)
        self.done = z(n, dtype=torch.bool)
        self.seen = z(n, vocab + 1, dtype=torch.bool) if seen else None
        self.ids, self.mask, self.lps = z(n, steps), z(n, steps, dtype=torch.bool), z(n, steps, dtype=torch.float32)


def shaped_logits(logits: Tensor, state: DecodeState, s: StepSettings) -> Tensor | None:
    """rloo.rollout.decoding.Shaping with the step as a tensor: the repetition penalty over the seen
    tokens, EOS forbidden while t < min_new_tokens. (N, V) -> (N, V); None when nothing shapes."""
    if not s.shapes:
        return None
    penalty, min_new = s.s.repetition_penalty, s.s.min_new_tokens
    out = logits if state.seen is None else penalize_repetitions(logits, state.seen[:, :-1], penalty)
    if min_new > 0:
        out = out.clone()
        eos = out[:, s.eos_id]
        out[:, s.eos_id] = torch.where(state.t < min_new, torch.full_like(eos, float("-inf")), eos)
    return out


def advance(logits: Tensor, state: DecodeState, s: StepSettings) -> None:
    """Draw token t of every row from its (N, V) logits and record it (the eager loop's body: `Draw`,
    then `decode`'s masking, `Shaping.add` and the EOS half of `Ends.after`), in place; t += 1."""
    u = state.noise.index_select(0, state.t).squeeze(0)
    shaped = shaped_logits(logits, state, s)
    tok, lp = _next_token(logits, s.s, None, u, shaped)
    done = state.done
    tok = tok.masked_fill(done, s.pad_id)
    state.ids.index_copy_(1, state.t, tok[:, None])
    state.mask.index_copy_(1, state.t, ~done[:, None])
    state.lps.index_copy_(1, state.t, lp.masked_fill(done, 0.0)[:, None])
    if state.seen is not None:
        where = torch.where(done, torch.full_like(tok, state.seen.shape[1] - 1), tok)  # padding: the last column
        state.seen.scatter_(1, where[:, None], torch.ones_like(done[:, None]))
    done.logical_or_(tok == s.eos_id)
    state.tok.copy_(tok)
    state.t.add_(1)


class _Logits(torch.nn.Module):
    """The model's (N, V) float32 next-token logits (`lm_logits`) as a module, so `functional_call`
    can run it with the captured weights in place of the model's own attributes."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    def forward(self, tok: Tensor, mask: Tensor, pos: Tensor, cache) -> Tensor:
        step = {"input_ids": tok[:, None], "attention_mask": mask, "position_ids": pos, cache_kwarg(self.model): cache}
        return lm_logits(self.model, 1, **step, use_cache=True)[0][:, -1]


def weight_refs(model: torch.nn.Module) -> dict[str, Tensor]:
    """The tensors a captured step reads its weights from: the model's parameters (tied ones once),
    named as `_Logits` holds them."""
    return {f"model.{name}": p for name, p in model.named_parameters()}


def decode_step(model, weights: dict[str, Tensor], cache: StaticCache, state: DecodeState, s) -> None:
    """One token of every row, in place: column `cache.col` opens in the mask, the forward pass of the
    last token at its position writes that column, positions and column move on, and `advance` draws."""
    cache.mask.index_fill_(3, cache.col, True)
    args = (state.tok, cache.mask, state.pos, cache.cache)
    logits = torch.func.functional_call(_Logits(model), weights, args, tie_weights=True, strict=False)
    state.pos.add_(1)
    cache.col.add_(1)
    advance(logits, state, s)


# Eager runs of the step on a side stream before capture (cuBLAS handles, lazily allocated workspaces)
WARMUP_STEPS = 2


class CapturedStep:
    """`decode_step` bound to its cache and state, reading its weights from the tensors the model held
    when the step was built (`weight_refs`), as a CUDA graph does: on CUDA the step is captured once
    (`capture`) and replayed; elsewhere it runs op by op on the same tensors. New weights reach it
    only through those tensors' storage: `refresh` copies a rebound parameter's values into the
    captured tensor (an optimizer step, updating in place, needs nothing), and `check` refuses a
    captured tensor that was itself replaced (a graph would keep reading the old storage)."""

    def __init__(self, model: torch.nn.Module, cache: StaticCache, state: DecodeState, settings: StepSettings):
        self.weights = weight_refs(model)  # the tensors, not the model: the step does not keep it alive
        self.ptrs = {name: t.data_ptr() for name, t in self.weights.items()}
        self.cache, self.state, self.settings = cache, state, settings
        self.graph = None

    def body(self, model) -> None:
        decode_step(model, self.weights, self.cache, self.state, self.settings)

    def refresh(self, model: torch.nn.Module) -> None:
        """Bring `model`'s current weights into the captured tensors, copying where a parameter was
        rebound (a merged LoRA, a cast copy); then `check`."""
        for name, t in weight_refs(model).items():
            held = self.weights.get(name)
            if held is None or held.shape != t.shape:
                raise RuntimeError(f"captured decode step: parameter {name} is new or changed shape; rebuild the step")
            if t.data_ptr() != held.data_ptr():
                held.copy_(t.detach())
        self.check()

    def check(self) -> None:
        for name, t in self.weights.items():
            if t.data_ptr() != self.ptrs[name]:
                raise RuntimeError(
                    f"captured decode step: weight {name} was rebound after capture (its graph reads the old "
                    f"storage); copy new weights into the captured tensors instead"
                )

    def capture(self, model, start_col: int, pool) -> None:
        """Capture the step as a CUDA graph (in `pool`, shared by every captured step); its warm-up runs
        write the state, which the caller fills afterwards. Autocast's weight-cast cache stays off
        while capturing: a cast cached at capture would outlive the weights it was cast from."""
        device = self.state.tok.device
        amp = torch.autocast(
            "cuda", torch.get_autocast_dtype("cuda"), enabled=torch.is_autocast_enabled("cuda"), cache_enabled=False
        )
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with amp:
            with torch.cuda.stream(side):
                for _ in range(WARMUP_STEPS):
                    self._rewind(start_col)
                    self.body(model)
            torch.cuda.current_stream(device).wait_stream(side)
            self._rewind(start_col)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                self.body(model)
        self.graph = graph

    def _rewind(self, start_col: int) -> None:
        self.state.t.fill_(1)
        self.cache.col.fill_(start_col)

    def replay(self, model) -> None:
        if self.graph is not None:
            self.graph.replay()
        else:
            self.body(model)
