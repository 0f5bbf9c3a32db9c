"""What a run reports: metrics.jsonl, the one-line messages and the progress bar (log), the experiment
trackers TensorBoard and wandb (trackers), and plain-text progress lines (progress_text)."""
