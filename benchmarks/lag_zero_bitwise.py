"""N = 0 stays bitwise unchanged (docs/async.md): two SGD steps of every online method on a
tiny Llama, the parameters saved, then compared with `torch.equal` against another checkout's.

    PYTHONPATH=<old checkout>/src python benchmarks/lag_zero_bitwise.py old.pt
    PYTHONPATH=src python benchmarks/lag_zero_bitwise.py new.pt --compare old.pt
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from helpers.tiny_archs import save_tiny_lm  # noqa: E402

PROMPTS = ["post : job rent tl;dr :", "post : exam tl;dr :", "post : loan sister car mom tl;dr :"]


def reward(prompts, completions):
    return [len(set(c.split())) / 4 + 0.1 * (sum(map(ord, c)) % 7) for c in completions]


def two_steps(path: Path, method: str, out: Path) -> dict[str, torch.Tensor]:
    from rloo.algorithms import make_algorithm
    from rloo.config import RLConfig
    from rloo.training.rl import load_models

    torch.manual_seed(0)
    cfg = RLConfig(policy=str(path), output_dir=str(out), algorithm=method, k=4, beta=0.1, max_new_tokens=8, seed=0)
    models = load_models(cfg, reward_fn=reward)
    algo, opt = make_algorithm(cfg, models), torch.optim.SGD(models.policy.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(0)
    for _ in range(2):
        algo.step(models, opt, PROMPTS, cfg, gen)
    return {k: v.detach().clone() for k, v in models.policy.state_dict().items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--compare", type=Path, help="parameters saved by another checkout")
    args = ap.parse_args()
    from rloo.config.methods import names

    methods = names(online=True)  # the table's online methods (of the checkout on PYTHONPATH)
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as d:
        path = save_tiny_lm(Path(d) / "model", "llama")
        params = {m: two_steps(path, m, Path(d) / m) for m in methods}
    torch.save(params, args.out)
    if args.compare:
        other = torch.load(args.compare)
        for m in methods:
            equal = all(torch.equal(params[m][k], other[m][k]) for k in params[m])
            print(f"{m}: {'bitwise equal' if equal else 'DIFFERENT'} ({len(params[m])} tensors)")


if __name__ == "__main__":
    main()
