"""Which methods and settings combine with the asynchronous / off-policy update (rl.max_staleness,
is_correction, is_kl, producer_address; docs/async.md): one function of the RL
settings, run by RLSettings' validator (also for `rloo compare`'s shared section, whose every method
would run the off-policy update)."""

from __future__ import annotations

from typing import Any

from rloo.config.methods import METHOD_SPECS, require


def check_off_policy(s: Any) -> None:
    """Raises ValueError, one line, for a combination the off-policy update does not define. `s`: an
    RLSettings (its off_policy_correction, algorithm and the settings named above)."""
    if (correction := s.off_policy_correction) is not None:
        spec, what = METHOD_SPECS[s.algorithm], "max_staleness > 0 and is_correction"
        if not spec.online:
            raise ValueError(f"{what}: {s.algorithm} is offline (it trains on fixed pairs: no sampler to lag)")
        require("off_policy", s.algorithm, what)
        if not spec.importance and correction != "none":
            raise ValueError(
                f"is_correction={correction}: {s.algorithm} trains on lagged samples as they are (SFT on the "
                "best of k, whose selection has no tractable importance ratio); leave it unset or none"
            )
    if s.is_kl == "unweighted":
        if correction is None:
            raise ValueError(
                "is_kl=unweighted: for the importance-weighted update (max_staleness > 0 or is_correction)"
            )
        require("kl_outside", s.algorithm, "updates with is_kl=unweighted")
    if s.producer_address is not None and not s.max_staleness:
        raise ValueError("producer_address: the producer samples ahead of the trainer, set max_staleness >= 1")
