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


def suffix_group(item, group: str) -> None:
    """Append `@group` to an item's node id, which `--dist loadgroup` schedules by (one worker per group).

    pytest-xdist's worker does this itself in its pytest_collection_modifyitems by setting
    `item._nodeid`, which pytest 9.2 no longer reads (a node id is a `NodeId` in `item._id`): with
    xdist 3.8 the marks were ignored, a file's tests went to both workers and a shared session
    fixture (the torchrun launch) was built twice. tests/unit/test_xdist_groups.py checks the suffix."""
    nodeid = f"{item.nodeid}@{group}"
    if hasattr(item, "_id"):  # pytest >= 9.2
        from _pytest.nodeid import coerce_node_id

        item._id = coerce_node_id(nodeid)
    else:
        item._nodeid = nodeid
