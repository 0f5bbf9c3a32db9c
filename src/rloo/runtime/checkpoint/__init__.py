"""Checkpoints: writing them (save), which are whole and the newest good one (verify), what a resume
may change (resumecheck), the random streams saved in them (rng), and the check that an asynchronous
run's checkpoint holds the older weight versions its next batches are sampled with (ringcheck)."""
