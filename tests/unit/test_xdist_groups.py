"""The suite's pytest-xdist groups: a file's tests in one worker, files sharing a costly session fixture
together (tests/helpers/xdist_groups.py), so that no fixture is built twice under `make test`."""

from __future__ import annotations

from types import SimpleNamespace

from helpers.xdist_groups import SHARED_FIXTURES, xdist_groups


def _item(nodeid: str, *fixtures: str):
    return SimpleNamespace(nodeid=nodeid, fixturenames=["tmp_path", *fixtures])


def test_files_that_share_a_session_fixture_are_one_group():
    items = [
        _item("a.py::t1"),
        _item("b.py::t1", "tuned_study"),
        _item("c.py::t1"),
        _item("c.py::t2", "tuned_study", "reference"),
        _item("d.py::t1", "reference"),
        _item("e.py::t1", "tiny_model_dir"),  # session-scoped but cheap: not a reason to group
    ]
    a, b, c1, c2, d, e = xdist_groups(items)
    assert b == c1 == c2 == d  # b and c through tuned_study, c and d through reference
    assert len({a, b, e}) == 3


def test_the_collected_suite_is_grouped_so(request):
    """The real marks (tests/conftest.py): one group per file, one per shared fixture."""
    group = {}
    for item in request.session.items:
        (mark,) = [m.args[0] for m in item.iter_markers("xdist_group")]
        group.setdefault(item.nodeid.split("::")[0], set()).add(mark)
        for f in SHARED_FIXTURES:
            if f in item.fixturenames:
                group.setdefault(f, set()).add(mark)
    assert all(len(g) == 1 for g in group.values()), {k: g for k, g in group.items() if len(g) > 1}
    # under `make test`: xdist schedules by these marks, through the @group suffix of the node id
    if request.config.getoption("loadgroup", default=False):
        assert request.node.nodeid.endswith("@" + group[request.node.nodeid.split("::")[0]].pop()), request.node.nodeid
