"""The worker processes of `rloo bench`: one trainer each (rloo's step, or TRL's RLOOTrainer), which
takes one step when the parent says go and sends back its time, tokens, widths and peak memory.
Each runs in a process of its own, so each one's peak memory is its own."""

from __future__ import annotations

import multiprocessing as mp
import time

import torch
from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer, TrainerCallback

from rloo.algorithms.rloo import rloo_step
from rloo.config import RLConfig
from rloo.experiments.bench_machine import peak_memory_gb
from rloo.runtime.precision import resolve_precision
from rloo.training.common import adamw, seed_everything
from rloo.training.rl import load_models

# ---------------------------------------------------------------- rloo worker


def _rloo_worker(conn, job: dict) -> None:
    torch.set_num_threads(job["threads"])
    cfg = RLConfig(
        policy=job["policy"],
        reward_model=job["reward"],
        k=job["k"],
        beta=job["beta"],
        lr=job["lr"],
        batch_size=job["batch_size"],
        max_new_tokens=job["max_new_tokens"],
        warmup_steps=0,
        max_prompt_tokens=job["max_prompt_tokens"],
        share_prompt=job["share_prompt"],
        seed=job["seed"],
        gradient_checkpointing=job.get("gradient_checkpointing", False),
        device=job["device"],
        dtype=job["dtype"],
    )
    gen = seed_everything(cfg.seed)
    models = load_models(cfg)
    opt = adamw(models.policy.parameters(), cfg.lr)
    conn.send({"ready": True, "rss_gb": peak_memory_gb(cfg.device)})
    sync = torch.cuda.synchronize if cfg.device.startswith("cuda") else (lambda: None)
    for i, _ in enumerate(iter(conn.recv, "stop")):
        t0 = time.perf_counter()
        batch = job["batches"][i]
        # as `rloo train` runs it: under the stage's precision, rows= as in rloo.runtime.distributed.step_kwargs
        with resolve_precision(cfg.dtype, cfg.device).autocast():
            result = rloo_step(models, opt, batch, cfg, gen, rows=(0, len(batch) * cfg.k))
            stats, roll = result.stats, result.rollout
        sync()
        conn.send(
            {
                "time": time.perf_counter() - t0,
                "tokens": int(roll.completion_mask.sum()),
                "lengths": roll.completion_mask.sum(-1).tolist(),
                "width": roll.completion_ids.shape[1],
                "rss_gb": peak_memory_gb(cfg.device),
                "phases": {k: v for k, v in stats.items() if k.startswith("time/")},
            }
        )


# ---------------------------------------------------------------- TRL worker


def _trl_worker(conn, job: dict) -> None:
    torch.set_num_threads(job["threads"])
    # optional: TRL (the `bench` extra) and the datasets it trains from, only in this worker
    from datasets import Dataset
    from trl import RLOOConfig, RLOOTrainer

    class Pace(TrainerCallback):
        """Blocks each step until the parent says go; reports its time, tokens and peak memory."""

        def on_step_begin(self, args, state, control, **kw):
            conn.recv()
            self.t0 = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            if job["device"].startswith("cuda"):
                torch.cuda.synchronize()
            dt = time.perf_counter() - self.t0
            m = trainer._metrics["train"]
            conn.send(
                {
                    "time": dt,
                    "tokens": int(round(m["completions/mean_length"][-1] * job["batch_size"] * job["k"])),
                    "width": int(m["completions/max_length"][-1]),
                    "rss_gb": peak_memory_gb(job["device"]),
                    "phases": {},
                }
            )

    n = job["batch_size"] * job["k"]
    args = RLOOConfig(
        output_dir=job["tmp"],
        per_device_train_batch_size=n,
        gradient_accumulation_steps=1,
        num_generations=job["k"],
        max_completion_length=job["max_new_tokens"],
        beta=job["beta"],
        learning_rate=job["lr"],
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=0.0,
        adam_beta1=0.9,
        adam_beta2=0.95,
        max_grad_norm=1.0,
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        num_iterations=1,
        max_steps=len(job["batches"]),
        shuffle_dataset=False,
        seed=job["seed"],
        gradient_checkpointing=False,
        bf16=job["dtype"] == "bfloat16",
        fp16=False,
        use_cpu=not job["device"].startswith("cuda"),
        report_to="none",
        logging_steps=10**6,
        save_strategy="no",
        disable_tqdm=True,
        dataloader_num_workers=0,
    )
    tok = AutoTokenizer.from_pretrained(job["policy"])
    model = AutoModelForCausalLM.from_pretrained(job["policy"], dtype=torch.float32)
    rm = AutoModelForSequenceClassification.from_pretrained(job["reward"], num_labels=1, dtype=torch.float32)
    data = Dataset.from_dict({"prompt": [p for batch in job["batches"] for p in batch]})
    trainer = RLOOTrainer(
        model=model,
        reward_funcs=rm,
        args=args,
        train_dataset=data,
        processing_class=tok,
        reward_processing_classes=tok,
        callbacks=[Pace()],
    )
    conn.send({"ready": True, "rss_gb": peak_memory_gb(job["device"])})
    trainer.train()
    conn.recv()  # "stop"


# ---------------------------------------------------------------- starting a worker (in the parent)


def _start(target, job):
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=target, args=(child, job), daemon=True)
    proc.start()
    ready = parent.recv()
    return proc, parent, ready
