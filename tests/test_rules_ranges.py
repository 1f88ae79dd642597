"""Rules of range requests into a sparse shard: what a drop frees, and which runs are one request."""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from fastload.remote.ranges import PAGE, RangeFiller

GAP_PAGES = 2  # the documented join gap, JOIN_GAP = 2 * PAGE, in pages


class FakeRemote:
    """An object of known bytes; every ranged GET recorded as (start, end)."""

    def __init__(self, data: bytes) -> None:
        self.data, self.calls = data, []

    def get_range(self, name: str, start: int, end: int, *, e_tag: str | None = None) -> bytes:
        self.calls.append((start, end))
        return self.data[start:end]


def filler(tmp_path: Path, pages: int) -> tuple[RangeFiller, FakeRemote, bytes]:
    size = pages * PAGE - 100  # a last page cut short
    data = np.random.default_rng(pages).integers(0, 256, size, dtype=np.uint8).tobytes()
    fd = os.open(tmp_path / "shard", os.O_RDWR | os.O_CREAT, 0o644)
    os.ftruncate(fd, size)
    remote = FakeRemote(data)
    f = RangeFiller(remote, "shard-0", fd, size, None, ThreadPoolExecutor(1))
    return f, remote, data


def pages_of(off: int, n: int) -> set[int]:
    return set(range(off // PAGE, -(-(off + n) // PAGE)))


def whole_pages_in(off: int, n: int) -> set[int]:
    return {p for p in pages_of(off, n) if p * PAGE >= off and (p + 1) * PAGE <= off + n}


# (records laid out end to end, as (offset, length); which are read then dropped, in order)
DROP_TABLE = [
    # two records sharing page 1: dropping the first must keep page 1 for the second
    ([(0, PAGE + PAGE // 2), (PAGE + PAGE // 2, 2 * PAGE)], [0, 1]),
    # a small record inside one page with its neighbours: nothing of it is freed alone
    ([(0, 100), (100, 200), (300, 3 * PAGE)], [1, 0, 2]),
    # records on exact page bounds: each one's pages freed whole
    ([(0, PAGE), (PAGE, 2 * PAGE), (3 * PAGE, PAGE)], [2, 0, 1]),
    # a record straddling three pages between two others
    ([(0, PAGE - 10), (PAGE - 10, 2 * PAGE + 20), (3 * PAGE + 10, PAGE)], [1, 2, 0]),
]


@pytest.mark.parametrize("records,order", DROP_TABLE)
def test_a_drop_frees_only_pages_wholly_inside_read_records_and_never_one_a_later_record_needs(tmp_path, records, order):
    """Bug: a drop rounding its page span outward frees the page a record still to be read shares
    with the one just read; the next read then finds zeros there, or fetches it again. The rule
    written out: a drop of (off, n) frees exactly the pages p with off <= p*PAGE and
    (p+1)*PAGE <= off+n; a record's bytes read after any drop are the object's bytes."""
    f, remote, data = filler(tmp_path, 6)
    f.fill(records, wait=True)
    fetched_once = len(remote.calls)
    here = set().union(*(pages_of(o, n) for o, n in records))
    for k in order:
        off, n = records[k]
        assert os.pread(f.fd, n, off) == data[off : off + n]
        f.drop([(off, n)])
        here -= whole_pages_in(off, n)
        for o2, n2 in records:
            still = pages_of(o2, n2) <= here
            assert f._here(o2, n2) == still  # noqa: SLF001 - what a reader's wait would see
    assert len(remote.calls) == fetched_once  # nothing fetched twice by the drops


def test_a_drop_of_a_record_then_a_read_of_its_neighbour_on_a_shared_page_needs_no_request(tmp_path):
    """Bug: the page record A shares with record B freed when A is dropped: B's read either sees
    zeros (a hole) or must ask the store again. Expected: B's bytes, no new request."""
    f, remote, data = filler(tmp_path, 4)
    a, b = (0, PAGE + 7), (PAGE + 7, PAGE)
    f.fill([a, b], wait=True)
    n = len(remote.calls)
    f.drop([a])
    f.fill([b], wait=True)
    assert len(remote.calls) == n
    assert os.pread(f.fd, b[1], b[0]) == data[b[0] : b[0] + b[1]]


# (pages already here, pages then wanted, the requests expected: runs of missing pages,
#  joined when at most GAP_PAGES apart and every page between is missing too)
RUN_TABLE = [
    ([], [0, 2], [(0, 3)]),  # gap of one missing page: one request, the gap fetched too
    ([1], [0, 2], [(0, 1), (2, 3)]),  # the page between is here: never fetched again
    ([], [0, 3], [(0, 4)]),  # gap of two missing pages (= JOIN_GAP): joined
    ([], [0, 4], [(0, 1), (4, 5)]),  # gap of three: two requests
    ([2], [0, 3], [(0, 1), (3, 4)]),  # one page of the gap here: not joined
    ([5], [0, 1, 2, 3, 4, 6], [(0, 5), (6, 7)]),
]


@pytest.mark.parametrize("here,want,expected", RUN_TABLE)
def test_runs_are_joined_only_across_missing_pages(tmp_path, here, want, expected):
    """Bug: two runs joined across a page already in the file (the join looking only at the
    distance): that page is fetched again and written over while a reader may be using it.
    Expected requests: the rule in the table's comment, worked out by hand."""
    f, remote, data = filler(tmp_path, 8)
    if here:
        f.fill([(p * PAGE, 1) for p in here], wait=True)
    remote.calls.clear()
    f.fill([(p * PAGE, 1) for p in want], wait=True)
    got = sorted(remote.calls)
    assert got == [(p0 * PAGE, min(p1 * PAGE, len(data))) for p0, p1 in expected]
    for p in set(want) | set(here):
        assert os.pread(f.fd, 1, p * PAGE) == data[p * PAGE : p * PAGE + 1]


def test_a_simulated_epoch_of_reads_and_drops_matches_a_page_model(tmp_path):
    """Scenario: batches of records read (fill, wait), then dropped, in a shuffled order, against a
    model of the pages written out here: every read returns the object's bytes, every byte fetched
    is of a page the model says was missing, and at the end only pages shared with unread
    records, or never wholly inside a record, stay."""
    rng = np.random.default_rng(7)
    f, remote, data = filler(tmp_path, 40)
    cuts = np.sort(rng.choice(np.arange(1, len(data)), 30, replace=False))
    records = [(int(a), int(b - a)) for a, b in zip([0, *cuts], [*cuts, len(data)])]
    model: set[int] = set()
    for batch in np.array_split(rng.permutation(len(records)), 8):
        rs = [records[k] for k in batch]
        before = len(remote.calls)
        f.fill(rs, wait=True)
        for s, e in remote.calls[before:]:
            fetched = set(range(s // PAGE, -(-e // PAGE)))
            assert not fetched & model, "a page already here fetched again"
            model |= fetched
        for o, n in rs:
            assert os.pread(f.fd, n, o) == data[o : o + n]
        f.drop(rs)
        for o, n in rs:
            model -= whole_pages_in(o, n)
