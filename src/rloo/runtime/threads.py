"""Calling slow user code (environment steps, tools) concurrently, with a timeout.

Daemon threads, one per call: Python cannot stop a thread, so a call that hangs keeps its thread
until it returns; being a daemon, it never keeps the process from exiting (a pool's worker would).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence


def call_all(calls: Sequence[Callable[[], object]], timeout_s: float) -> list[tuple[str, object]]:
    """Run every call at once; per call ("ok", value), ("raised", exception) or ("timeout", None)
    when it had not returned `timeout_s` seconds after the calls started."""
    boxes: list[list] = [[] for _ in calls]

    def run(fn, box):
        try:
            box.append(("ok", fn()))
        except BaseException as e:  # noqa: BLE001 - handed to the caller, who decides
            box.append(("raised", e))

    threads = [threading.Thread(target=run, args=(fn, box), daemon=True) for fn, box in zip(calls, boxes, strict=True)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + timeout_s
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    return [box[0] if box else ("timeout", None) for box in boxes]
