"""Which tests run in one pytest-xdist worker (`make test` runs `-n auto --dist loadgroup`)."""

from __future__ import annotations

# Session fixtures that cost seconds to minutes and are read by tests in several files.
SHARED_FIXTURES = ("tuned_study", "reference", "tiny_study", "train_run", "async_run", "two_process_runs")


def xdist_groups(items) -> list[str]:
    """One group per item: a worker builds each module- and session-scoped fixture its tests use, so
    every test of a file goes to one worker, and the files whose tests read one of SHARED_FIXTURES
    go to the same worker (union-find over files and those fixtures): a second tuned study or
    torchrun launch would cost more than the parallelism wins. Items need `nodeid` and
    `fixturenames`; the group is a file's path (the first of its union)."""
    parent: dict[str, str] = {}

    def find(x: str) -> str:
        while parent.setdefault(x, x) != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    nodes = [[item.nodeid.split("::")[0], *(f for f in SHARED_FIXTURES if f in item.fixturenames)] for item in items]
    for first, *rest in nodes:
        for other in rest:
            parent[find(other)] = find(first)
    return [find(first) for first, *_ in nodes]
