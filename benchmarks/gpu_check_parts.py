"""The parts of benchmarks/gpu_check.py, each run in its own process with its own time limit:

    python benchmarks/gpu_check_parts.py PART --device cuda --assets DIR --result FILE [--dry-run]

Each part writes one JSON object to FILE. Every part would have caught one of the CUDA defects docs/precision.md lists:
  update_fraction  one AdamW step at lr 1e-6 under dtype=auto's weights: the fraction of weights changed (fp32's)
  collectives      a one-rank NCCL group (gloo on CPU): mean_metrics, all_done, FSDP2 wrap (fp32 logits under
                   bf16 autocast), clipping, state dict
  train_resume     `rloo train device=... eval_every=1 save_every=1`, then `--resume` (sampler, eval, checkpoints)
  logprobs         on the 1B shape: sampler log-probs against a policy forward, the step-0 KL against a frozen
                   copy, the first PPO ratio, reward-score ties; the same KL and ratio through PEFT LoRA
                   (a wrapper running the model's own forward: its head must stay fp32 under autocast)
  guard_memory     peak memory of one 1B training step with the weight guard on
  async_steps      rl.max_staleness=1 with the producer and the trainer on one GPU: `rloo train` finishes with
                   is/* metrics and lag 1, and s/step at N = 0 and N = 1 on the M shape (gpu_check_async.py)
  profile          one rloo step (captured decode) at 1B under torch.profiler: per phase its top operators and
                   kernels with device times, and its % of bound (gpu_check_profile.py)
The dry run (CPU, tiny shapes, gloo) checks the script itself: tests/integration/test_gpu_check.py.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# this checkout's rloo, unless PYTHONPATH names one (gpu_check.sh's src/, or the mutated copy of src/ that
# benchmarks/mutation_check.py puts first: the checks here and in the children must run on that one)
if not any(
    (Path(p) / "rloo" / "__init__.py").is_file() for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p
):
    sys.path.insert(0, str(ROOT / "src"))

import torch  # noqa: E402

from gpu_check_async import async_steps, child_env, tiny_policy  # noqa: E402 - beside this file
from gpu_check_profile import profile  # noqa: E402 - beside this file


def _model(device: str, dry: bool, cls=None):
    """A Llama of the bench's 1B shape (random weights, fp32 masters), or a tiny one in the dry run; its
    output head in fp32 under autocast, as rloo's loaders give it (rloo.modeling.fp32_head)."""
    from transformers import LlamaForCausalLM

    from rloo.experiments.bench_assets import SHAPES, llama_config
    from rloo.modeling.fp32_head import use_fp32_heads

    shape = SHAPES["1B"]
    cfg = llama_config(shape, 512 if dry else shape.vocab_size)
    if dry:
        cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers, cfg.num_attention_heads = 32, 64, 2, 2
        cfg.num_key_value_heads = 2
    cfg.num_labels = 1
    torch.manual_seed(0)
    with torch.device(device):
        return use_fp32_heads((cls or LlamaForCausalLM)(cfg))


def _peak_reset(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()


def _peak_gb(device: str) -> float | None:
    return torch.cuda.max_memory_allocated() / 2**30 if device.startswith("cuda") else None


def update_fraction(device: str, dry: bool, assets: Path) -> dict:
    from rloo.runtime.precision import resolve_precision, update_fraction

    prec = resolve_precision("auto", device)
    gen = torch.Generator().manual_seed(0)
    w, g = 0.02 * torch.randn(1 << 20, generator=gen), torch.randn(1 << 20, generator=gen)
    fp32 = update_fraction(w.to(device), g.to(device), lr=1e-6)
    run = update_fraction(w.to(device, prec.weights), g.to(device), lr=1e-6)
    bf16 = update_fraction(w.to(device, torch.bfloat16), g.to(device), lr=1e-6)
    return {"weights": str(prec.weights), "compute": str(prec.compute), "fraction": run, "fp32": fp32,
            "pure_bf16": bf16, "ok": run == fp32}  # fmt: skip


def collectives(device: str, dry: bool, assets: Path) -> dict:
    import torch.distributed as tdist

    from rloo.algorithms.base import total
    from rloo.runtime import distributed
    from rloo.runtime.distributed import Dist
    from rloo.runtime.precision import resolve_precision

    cuda = device.startswith("cuda")
    if cuda:
        torch.cuda.set_device(0)
    tdist.init_process_group("nccl" if cuda else "gloo", init_method=f"file://{assets / 'rdzv'}", rank=0, world_size=1)
    try:
        out = {"backend": tdist.get_backend(), "comm_device": str(distributed.comm_device())}
        d = Dist(rank=0, world=2, parallel="fsdp")  # `enabled` over a one-rank group: means come out halved
        out["mean_metrics"] = d.mean_metrics({"a": 2.0})
        out["all_done"] = [d.all_done(torch.tensor([True], device=device)), d.all_done(torch.tensor([False]))]
        model = d.wrap(_model(device, True))
        ids = torch.randint(2, 500, (2, 8), device=device)
        with resolve_precision("bfloat16", device).autocast(), torch.no_grad():  # the head inside FSDP2: fp32
            out["fsdp_autocast_logits_dtype"] = str(model(input_ids=ids).logits.dtype)
        model(input_ids=ids, labels=ids).loss.backward()
        out["grad_norm"] = float(total(torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)))
        out["state_dict_keys"] = len(d.saveable(model).state_dict)
        out["ok"] = (out["mean_metrics"] == {"a": 1.0} and out["all_done"] == [True, False]
                     and out["grad_norm"] > 0 and out["state_dict_keys"] > 0
                     and out["fsdp_autocast_logits_dtype"] == "torch.float32")  # fmt: skip
        return out
    finally:
        tdist.destroy_process_group()


def train_resume(device: str, dry: bool, assets: Path) -> dict:
    model_dir, run = tiny_policy(assets), assets / "train_run"
    base = [sys.executable, "-m", "rloo.cli", "train", f"policy={model_dir}", f"reward_model={model_dir}",
            f"output_dir={run}", f"device={device}", "batch_size=2", "k=2", "max_new_tokens=5", "eval_every=1",
            "eval_prompts=4", "eval.batch_size=4", "save_every=1"]  # fmt: skip
    env = child_env()  # the children import the rloo this process imported
    out = {}
    for name, extra in (("first", ["steps=2", "--overwrite"]), ("resumed", ["steps=3", "--resume"])):
        proc = subprocess.run(base + extra, capture_output=True, text=True, env=env, cwd=assets)
        out[name] = {"rc": proc.returncode, "tail": (proc.stdout + proc.stderr)[-1500:]}
    metrics = run / "metrics.jsonl"
    out["steps_logged"] = len(metrics.read_text().splitlines()) if metrics.exists() else 0
    out["ok"] = out["first"]["rc"] == 0 and out["resumed"]["rc"] == 0 and "resuming from" in out["resumed"]["tail"]
    return out


def logprobs(device: str, dry: bool, assets: Path) -> dict:
    from transformers import LlamaForSequenceClassification

    from rloo.config import Sampling
    from rloo.modeling.forward import completion_logprobs, reward_scores
    from rloo.rollout.sampler import sample_tokens
    from rloo.runtime.precision import resolve_precision

    prec = resolve_precision("bfloat16", device)
    policy = _model(device, dry)
    ref = copy.deepcopy(policy).eval().requires_grad_(False)
    rm = _model(device, dry, LlamaForSequenceClassification).eval().requires_grad_(False)
    B, P, k, T = (2, 6, 2, 4) if dry else (8, 32, 4, 32)
    ids = torch.randint(2, policy.config.vocab_size, (B, P), generator=torch.Generator().manual_seed(1)).to(device)
    mask = torch.ones_like(ids, dtype=torch.bool)
    with prec.autocast():
        c_ids, c_mask, lps = sample_tokens(policy, ids, mask, Sampling(T, P), eos_id=1, pad_id=0, k=k,
                                           generator=torch.Generator().manual_seed(2))  # fmt: skip
        p_ids, p_mask = ids.repeat_interleave(k, 0), mask.repeat_interleave(k, 0)
        with torch.no_grad():
            fwd = completion_logprobs(policy.eval(), p_ids, p_mask, c_ids, c_mask)
            lp_ref = completion_logprobs(ref, p_ids, p_mask, c_ids, c_mask)
            scores = reward_scores(rm, p_ids, p_mask, c_ids, c_mask)
    m = c_mask
    n = int(m.sum())
    wrapped = _lora_logprobs(policy, prec, lps, lp_ref, (p_ids, p_mask, c_ids, c_mask))
    return {
        "precision": prec.why,
        "tokens": n,
        "sampler_vs_forward_max_abs": float((lps - fwd).abs()[m].max()),
        "step0_kl_mean": float((fwd - lp_ref)[m].sum() / n),  # the same weights: 0 exactly
        "first_ratio_max_dev": float((fwd - lps)[m].exp().sub(1).abs().max()),
        "reward_dtype": str(scores.dtype),
        "reward_ties": int(scores.numel() - scores.unique().numel()),
        **wrapped,
        "ok": float((fwd - lp_ref)[m].abs().max()) == 0.0
        and scores.dtype == torch.float32
        and wrapped.get("lora_step0_kl_max_abs", 0.0) == 0.0,
    }


def _lora_logprobs(policy, prec, lps, lp_ref, batch) -> dict:
    """The wrapped path: the policy under PEFT LoRA (rloo.modeling.lora.add_lora; B = 0, so the same
    function) runs its own forward, whose LM head must still compute in fp32 under autocast
    (rloo.modeling.fp32_head): its log-probs then equal the plain pass's bits, a step-0 KL of exactly 0
    against the frozen copy. Wraps `policy` in place: call it last."""
    try:
        import peft  # noqa: F401
    except ImportError:
        return {"lora": "peft is not installed: the wrapped path was not run"}
    from rloo.config import LoraSettings
    from rloo.modeling.forward import completion_logprobs
    from rloo.modeling.lora import add_lora

    lora = add_lora(policy, LoraSettings(r=8, alpha=16, target_modules=["q_proj", "v_proj"])).eval()
    with prec.autocast(), torch.no_grad():
        lp = completion_logprobs(lora, *batch)
    m = batch[3]
    return {"lora_step0_kl_max_abs": float((lp - lp_ref)[m].abs().max()),
            "lora_first_ratio_max_dev": float((lp - lps)[m].exp().sub(1).abs().max())}  # fmt: skip


def guard_memory(device: str, dry: bool, assets: Path) -> dict:
    from rloo.modeling.forward import completion_logprobs
    from rloo.runtime.paramguard import ParamGuard
    from rloo.runtime.precision import resolve_precision

    prec = resolve_precision("bfloat16", device)
    _peak_reset(device)
    policy = _model(device, dry)
    n_params = sum(p.numel() for p in policy.parameters())
    opt = torch.optim.AdamW(policy.parameters(), lr=1e-6)
    guard = ParamGuard(policy.parameters(), opt, growth=10.0)
    N, P, T = (2, 6, 4) if dry else (8, 128, 64)
    gen = torch.Generator().manual_seed(3)
    p_ids = torch.randint(2, policy.config.vocab_size, (N, P), generator=gen).to(device)
    c_ids = torch.randint(2, policy.config.vocab_size, (N, T), generator=gen).to(device)
    p_mask, c_mask = torch.ones_like(p_ids, dtype=torch.bool), torch.ones_like(c_ids, dtype=torch.bool)
    t0 = time.perf_counter()
    for _ in range(2):  # the second step has AdamW's moments and the guard's buffers allocated
        with prec.autocast():
            loss = -completion_logprobs(policy, p_ids, p_mask, c_ids, c_mask).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        guard.before_step()
        opt.step()
        problem = guard.problem()
    return {"params": n_params, "peak_gb": _peak_gb(device), "seconds": time.perf_counter() - t0,
            # weights + grads + 2 AdamW moments (16 B) + the guard's copies (12 B) per fp32 parameter
            "estimate_gb_without_activations": 28 * n_params / 2**30, "guard_problem": problem,
            "ok": problem is None}  # fmt: skip


PARTS = {
    f.__name__: f for f in (update_fraction, collectives, train_resume, logprobs, guard_memory, async_steps, profile)
}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("part", choices=sorted(PARTS))
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--assets", type=Path, required=True)
    ap.add_argument("--result", type=Path, required=True)
    ap.add_argument("--dry-run", action="store_true")
    args = ap.parse_args(argv)
    args.assets.mkdir(parents=True, exist_ok=True)
    res = PARTS[args.part](args.device, args.dry_run, args.assets)
    args.result.write_text(json.dumps(res, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
