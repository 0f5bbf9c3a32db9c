"""`rloo bench`'s TRL worker: TRL's RLOOTrainer (the `bench` extra), one optimizer step each time the parent
says go (rloo.experiments.bench_workers starts it and rloo's workers).

What it compares against, as run here: the policy loaded in fp32 (`dtype=torch.float32`; TRL 1.16 loads a
model given by name in fp32 too, unless `model_init_kwargs` says otherwise), `bf16=True` under
dtype=bfloat16 (accelerate's autocast around the model's forward: fp32 master weights, as rloo's), and TRL's
default generation path, `model.generate` (no vLLM, not `use_transformers_continuous_batching`, the path
that casts the training model itself to bf16). The first step's report says what was seen: the
parameters' dtype, the path taken, and the dtype a linear layer's output had while generating
(`setup`). Its generation time (TRL's `_generate_single_turn`, the device synchronised) is the phase
time/generate, beside the completion width: the bench's sampling ms per decode step.

With `trl_micro_rows` (a batch larger than fits in one pass), TRL generates the whole batch at once and
accumulates the update over micro-batches of that many rows (gradient_accumulation_steps): one optimizer
step per batch, as rloo's rl.micro_batch_size does.
"""

from __future__ import annotations

import time

import torch
from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer, TrainerCallback

from rloo.config.generation import Sampling
from rloo.experiments.bench_machine import peak_memory_gb, release_cache


class _Stopped(Exception):
    """The parent said stop before TRL's last step (a bench shape stopped at its time budget)."""


def trl_args(job: dict):
    """TRL's RLOOConfig for a bench job: the same k, lengths, beta, lr, AdamW and precision as rloo's."""
    from trl import RLOOConfig  # optional: the `bench` extra, imported only in this worker

    n = job["batch_size"] * job["k"]
    micro = job.get("trl_micro_rows") or n
    if n % micro:
        raise ValueError(f"trl_micro_rows={micro} does not divide the batch's {n} rows")
    # TRL draws as the bench's rloo workers do: rloo's default Sampling (temperature 1, no truncation)
    draw = Sampling(job["max_new_tokens"], job["max_prompt_tokens"]).hf_draw()
    return RLOOConfig(
        output_dir=job["tmp"],
        per_device_train_batch_size=micro,
        gradient_accumulation_steps=n // micro,  # the generation batch is their product: the n rows at once
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
        **draw,
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


def timed_generation(trainer, device: str) -> dict:
    """Wrap the trainer's generation (`_generate_single_turn`): its seconds (device synchronised) and the
    dtype a linear layer's output had inside it are written to the returned dict at each call."""
    seen: dict = {"seconds": 0.0, "linear_out_dtype": None}
    inner = trainer._generate_single_turn
    linear = next(m for m in trainer.model.modules() if isinstance(m, torch.nn.Linear))

    def hook(_module, _inputs, output):
        seen["linear_out_dtype"] = str(output.dtype)

    def generate(*a, **kw):
        sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
        handle = linear.register_forward_hook(hook)
        sync()
        t0 = time.perf_counter()
        try:
            return inner(*a, **kw)
        finally:
            sync()
            seen["seconds"] += time.perf_counter() - t0
            handle.remove()

    trainer._generate_single_turn = generate
    return seen


def setup_seen(trainer, generation: dict) -> dict:
    """What TRL ran, read off the trainer after its first step (the bench's JSON and docs say it)."""
    import trl  # optional: the `bench` extra, imported only in this worker

    args = trainer.args
    path = (
        "vllm" if args.use_vllm else "continuous_batching" if args.use_transformers_continuous_batching else "generate"
    )
    return {
        "trl_version": trl.__version__,
        "policy_param_dtype": str(next(trainer.model.parameters()).dtype),
        "generate_path": path,
        "mixed_precision": str(trainer.accelerator.mixed_precision),
        "generation_linear_out_dtype": generation["linear_out_dtype"],
        "gradient_accumulation_steps": args.gradient_accumulation_steps,
    }


def _trl_worker(conn, job: dict) -> None:
    from datasets import Dataset  # optional: TRL's training data, only in this worker
    from trl import RLOOTrainer

    torch.set_num_threads(job["threads"])

    class Pace(TrainerCallback):
        """Blocks each step until the parent says go; reports its time, tokens and peak memory."""

        steps = 0

        def on_step_begin(self, args, state, control, **kw):
            if conn.recv() == "stop":
                raise _Stopped
            self.t0, self.gen0 = time.perf_counter(), generation["seconds"]

        def on_step_end(self, args, state, control, **kw):
            if job["device"].startswith("cuda"):
                torch.cuda.synchronize()
            dt = time.perf_counter() - self.t0
            m = trainer._metrics["train"]
            msg = {
                "time": dt,
                "tokens": int(round(m["completions/mean_length"][-1] * job["batch_size"] * job["k"])),
                "width": int(m["completions/max_length"][-1]),
                "rss_gb": peak_memory_gb(job["device"]),
                "phases": {"time/generate": generation["seconds"] - self.gen0},
            }
            self.steps += 1
            if self.steps == 1:
                msg["setup"] = setup_seen(trainer, generation)
            release_cache(job)
            conn.send(msg)

    tok = AutoTokenizer.from_pretrained(job["policy"])
    model = AutoModelForCausalLM.from_pretrained(job["policy"], dtype=torch.float32)
    rm = AutoModelForSequenceClassification.from_pretrained(job["reward"], num_labels=1, dtype=torch.float32)
    data = Dataset.from_dict({"prompt": [p for batch in job["batches"] for p in batch]})
    trainer = RLOOTrainer(
        model=model,
        reward_funcs=rm,
        args=trl_args(job),
        train_dataset=data,
        processing_class=tok,
        reward_processing_classes=tok,
        callbacks=[Pace()],
    )
    generation = timed_generation(trainer, job["device"])
    conn.send({"ready": True, "rss_gb": peak_memory_gb(job["device"])})
    try:
        trainer.train()
    except _Stopped:  # the parent's "stop" already taken: nothing more to wait for
        return
    conn.recv()  # "stop"
