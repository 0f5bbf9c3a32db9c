"""Config of `rloo produce`: the rollout producer of a trainer on another machine (docs/async.md)."""

from __future__ import annotations

from pydantic import Field, field_validator

from rloo.config.base import MAX_CONNECT_S, Strict, check_address


class ProduceConfig(Strict):
    """`rloo produce`: sample (and score) batches for a trainer on another machine that runs with
    rl.max_staleness >= 1 and rl.producer_address=HOST:PORT; stops when its run ends."""

    address: str = Field(description="HOST:PORT of the trainer: its rl.producer_address.")
    _address = field_validator("address")(classmethod(lambda cls, v: check_address(v)))
    threads: int | None = Field(
        default=None, ge=1, description="torch threads for sampling (null: torch's default, this machine's cores)."
    )
    connect_timeout_s: float = Field(
        default=600.0,
        gt=0,
        le=MAX_CONNECT_S,
        description="Seconds to wait for the trainer to be there (it may start later); then one line, exit 2.",
    )
