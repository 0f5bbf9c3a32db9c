"""Side-by-side RL step benchmark: rloo vs TRL's RLOOTrainer on shapes S, M, L.

Same as `rloo bench`; needs the `bench` extra (pip install -e '.[bench]'). Results: docs/bench.md.
    python benchmarks/rl_step.py                      # all shapes, defaults (2 warm-up, 10 / 5 timed steps)
    python benchmarks/rl_step.py shapes=[S] steps=3
"""

import sys

from rloo.cli import main

if __name__ == "__main__":
    sys.exit(main(["bench", *sys.argv[1:]]))
