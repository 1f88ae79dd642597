"""fastload.store.btree against shard files whose every byte the test lays out itself, by LMDB's layout.

The layout is LMDB 0.9's on 64-bit platforms (lmdb.h, mdb.c; docs/format.md: one record per sample, the
key the sample index as a big-endian u64): a 16-byte page header (``mp_pgno`` u64, ``mp_pad`` u16,
``mp_flags`` u16, ``mp_lower`` u16, ``mp_upper`` u16; an overflow page has ``mp_pages`` u32 where lower
and upper are), the node-offset table after it, nodes of an 8-byte header (``mn_lo``, ``mn_hi``,
``mn_flags``, ``mn_ksize``: u16 each) then the key then the value (a leaf) or nothing (a branch, whose
child page number is ``lo | hi << 16 | flags << 32``); a value of ``F_BIGDATA`` holds the page number of
its first overflow page. Pages 0 and 1 are meta pages: ``MDB_meta`` after the header, the page size in
the FREE database's ``md_pad``, the newer transaction's wins.

:class:`Shard` below writes such files, deliberately small (a few records a leaf, a few children a
branch) so that 30 records make a tree four levels deep, with values inside leaf pages and values
spanning one to five overflow pages. It records where it put each value, each page and each node: the
expected offsets, pages read and ranges asked for are those, worked out from the layout, never from
the reader. A corrupt file is a correct one with a few bytes written over at a place the builder
names, and each refusal's message is checked whole. One more file is written by LMDB itself (the
``lmdb`` package), its values found in the file's bytes by search.

What cannot be made on a real file: a :class:`~fastload.store.Filler` is fastload's own interface for
a file filled while it is read; the one here records the ranges it is asked for (and one truncates the
file when asked, a file that changes while it is read).
"""

from __future__ import annotations

import ctypes
import errno
import mmap
import os
import signal
import struct
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from fastload.errors import CorruptDataError, FormatError
from fastload.store import DamagedShardError, READ_SLACK, ShardFile, ShardScan, check_shard_structure, drop_cached, file_identity
from fastload.store import btree, files, iter_headers
from fastload.format import ENC_JPEG, encode_record

PH = 16  # page header
NH = 8  # node header
META_HEAD = PH + 136  # what is read of each meta page: the header and MDB_meta (magic .. txnid)
P_BRANCH, P_LEAF, P_OVERFLOW, P_META = 0x01, 0x02, 0x04, 0x08
F_BIGDATA = 0x01
INVALID = 2**64 - 1
MAGIC = 0xBEEFC0DE
FIRST = 1000  # the shards' first sample index: not 0, so an index taken for a position shows


def key(i: int) -> bytes:
    return i.to_bytes(8, "big")


def value(i: int, n: int) -> bytes:
    """``n`` bytes that name sample ``i`` and each byte's own position."""
    j = np.arange(n, dtype=np.int64)
    body = ((j * 13 + i * 7 + j // 251) % 256).astype(np.uint8).tobytes()
    return (key(i) + body)[:n]


class Shard:
    """An LMDB file laid out page by page; ``recs[key] = (offset of its value, length, overflow page or None)``."""

    def __init__(self, psize: int = 4096) -> None:
        self.psize = psize
        self.pages: dict[int, bytearray] = {}
        self.next = 2
        self.recs: dict[int, tuple[int, int, int | None]] = {}
        self.nodes: dict[int, list[int]] = {}  # page -> its nodes' offsets in the page, in key order
        self.leaves: list[tuple[int, list[int]]] = []  # (page, its keys), in key order
        self.branches: list[int] = []
        self.levels: list[list[int]] = []  # the pages of each level, root first
        self.overflow_pages = 0

    def alloc(self, n: int = 1) -> int:
        p, self.next = self.next, self.next + n
        return p

    def overflow(self, v: bytes) -> int:
        ps = self.psize
        n = -(-(PH + len(v)) // ps)
        p = self.alloc(n)
        buf = bytearray(n * ps)
        struct.pack_into("<QHHI", buf, 0, p, 0, P_OVERFLOW, n)
        buf[PH : PH + len(v)] = v
        self.pages[p] = buf
        self.overflow_pages += n
        return p

    def node_page(self, p: int, flags: int, nodes: list[bytes]) -> None:
        ps = self.psize
        buf = bytearray(ps)
        upper, offs = ps, []
        for nd in nodes:  # from the end of the page down, 2-byte aligned, as LMDB does
            upper -= len(nd) + (len(nd) & 1)
            buf[upper : upper + len(nd)] = nd
            offs.append(upper)
        lower = PH + 2 * len(nodes)
        assert lower <= upper, "the page is too full"
        struct.pack_into("<QHHHH", buf, 0, p, 0, flags, lower, upper)
        struct.pack_into(f"<{len(nodes)}H", buf, PH, *offs)
        self.pages[p], self.nodes[p] = buf, offs

    def leaf(self, items: list[tuple[int, bytes, bool]]) -> int:
        ovs = [self.overflow(v) if big else None for _k, v, big in items]  # LMDB writes them before the leaf
        nodes = []
        for (k, v, big), ov in zip(items, ovs):
            data = struct.pack("<Q", ov) if big else v
            nodes.append(struct.pack("<HHHH", len(v) & 0xFFFF, len(v) >> 16, F_BIGDATA if big else 0, 8) + key(k) + data)
        p = self.alloc()
        self.node_page(p, P_LEAF, nodes)
        for (k, v, big), ov, q in zip(items, ovs, self.nodes[p]):
            self.recs[k] = (ov * self.psize + PH, len(v), ov) if big else (p * self.psize + q + NH + 8, len(v), None)
        self.leaves.append((p, [k for k, _v, _b in items]))
        return p

    def branch(self, children: list[tuple[int, int]]) -> int:
        nodes = []
        for j, (k, c) in enumerate(children):  # the first node's key is empty: LMDB never compares it
            kb = b"" if j == 0 else key(k)
            nodes.append(struct.pack("<HHHH", c & 0xFFFF, (c >> 16) & 0xFFFF, c >> 32, len(kb)) + kb)
        p = self.alloc()
        self.node_page(p, P_BRANCH, nodes)
        self.branches.append(p)
        return p

    def tree(self, items: list[tuple[int, bytes, bool]], per_leaf: list[int], fanout: int) -> None:
        """Leaves of ``per_leaf[0], per_leaf[1], ...`` (cycled) records, branches of ``fanout`` children."""
        level, at, j = [], 0, 0
        while at < len(items):
            n = per_leaf[j % len(per_leaf)]
            level.append((items[at][0], self.leaf(items[at : at + n])))
            at, j = at + n, j + 1
        self.levels = [[p for _k, p in level]]
        while len(level) > 1:
            level = [(level[i][0], self.branch(level[i : i + fanout])) for i in range(0, len(level), fanout)]
            self.levels.insert(0, [p for _k, p in level])
        self.root, self.depth, self.entries = level[0][1], len(self.levels), len(items)

    def meta(self, pgno: int, txnid: int, *, root: int, depth: int, entries: int, last: int, overflow: int,
             psize: int | None = None) -> bytes:  # fmt: skip
        b = bytearray(self.psize)
        struct.pack_into("<QHHHH", b, 0, pgno, 0, P_META, 0, 0)
        struct.pack_into("<IIQQ", b, PH, MAGIC, 1, 0, 1 << 30)
        # FREE db: md_pad is the page size; empty
        struct.pack_into("<IHHQQQQQ", b, PH + 24, self.psize if psize is None else psize, 0, 0, 0, 0, 0, 0, INVALID)
        struct.pack_into("<IHHQQQQQ", b, PH + 72, 0, 0, depth, len(self.branches), len(self.leaves), overflow, entries, root)
        struct.pack_into("<QQ", b, PH + 120, last, txnid)
        return bytes(b)

    def image(self, *, newer: int = 1, extra_pages: int = 0, overflow: int | None = None) -> bytearray:
        """The file: meta page ``newer`` describes the tree (transaction 2), the other an empty
        database (transaction 1, as after LMDB's first commit); ``extra_pages`` unused pages at the end."""
        ps, last = self.psize, self.next - 1
        out = bytearray((last + 1 + extra_pages) * ps)
        for p, buf in self.pages.items():
            out[p * ps : p * ps + len(buf)] = buf
        ov = self.overflow_pages if overflow is None else overflow
        full = dict(root=self.root, depth=self.depth, entries=self.entries, last=last, overflow=ov)
        empty = dict(root=INVALID, depth=0, entries=0, last=1, overflow=0)
        for m in (0, 1):
            out[m * ps : (m + 1) * ps] = self.meta(m, 2 if m == newer else 1, **(full if m == newer else empty))
        return out

    # where things are, for corruptions
    def node_at(self, pgno: int, j: int) -> int:
        """Offset in the file of node ``j`` of page ``pgno``."""
        return pgno * self.psize + self.nodes[pgno][j]

    def expected_leaves(self, keyed: bool = True) -> list[tuple[int, list[int], list[int]]]:
        """What ``_Tree.walk`` must give: per leaf, its first key (0 without keys), value offsets (an
        overflow value's negated), sizes."""
        out = []
        for _p, ks in self.leaves:
            offs = [-self.recs[k][0] if self.recs[k][2] is not None else self.recs[k][0] for k in ks]
            out.append((ks[0] if keyed else 0, offs, [self.recs[k][1] for k in ks]))
        return out


N = 30
PER_LEAF = [3, 1, 4, 2]  # 30 records: 12 leaves, then 4, 2, 1 branch pages: four levels
SIZES = [100, 5000, 300, 9000, 20000, 41, 4070]  # inline, or 2, 3, 5, 1 overflow pages


def items(big: bool, n: int = N) -> list[tuple[int, bytes, bool]]:
    """Sample ``FIRST + j``: of ``SIZES[j % 7]`` bytes, in overflow pages if ``big`` and over 2000 bytes."""
    out = []
    for j in range(n):
        s = SIZES[j % len(SIZES)] if big else 40 + (j * 37) % 200
        out.append((FIRST + j, value(FIRST + j, s), big and s > 2000))
    return out


def built(big: bool, psize: int = 4096) -> Shard:
    s = Shard(psize)
    s.tree(items(big), PER_LEAF, 3)
    return s


def write(path: Path, data: bytes | bytearray) -> Path:
    path.write_bytes(bytes(data))
    return path


def open_file(path: Path, filler=None, first: int = FIRST, count: int = N) -> ShardFile:
    st = os.stat(path)
    ident = file_identity(st) if filler is None else (st.st_ino, st.st_size, 0)
    return ShardFile(str(path), ident, first=first, count=count, filler=filler)


class Recorder:
    """A :class:`~fastload.store.Filler` of a file that is whole already: it records what it is asked."""

    def __init__(self) -> None:
        self.fills: list[tuple[list[tuple[int, int]], bool]] = []
        self.drops: list[list[tuple[int, int]]] = []

    def fill(self, ranges, *, wait: bool) -> None:
        self.fills.append(([tuple(r) for r in ranges], wait))

    def drop(self, ranges) -> None:
        self.drops.append([tuple(r) for r in ranges])

    def pages(self, psize: int) -> list[int]:
        """The pages asked for with ``wait=True``, in order, each a whole page (meta reads excepted)."""
        out = []
        for ranges, wait in self.fills:
            assert wait
            for off, n in ranges:
                assert (off % psize, n) == (0, psize), (off, n)
                out.append(off // psize)
        return out


@pytest.fixture(params=["small", "big"])
def shard(request, tmp_path):
    s = built(request.param == "big")
    return s, write(tmp_path / "s.lmdb", s.image())


# -- the tree built is what the docstrings say ---------------------------------------------------
def test_the_builder_makes_a_four_level_tree():
    """The layout the other tests rely on (not fastload's code): 12 leaves under 4, 2, 1 branches."""
    for big in (False, True):
        s = built(big)
        assert s.depth == 4 and [len(lv) for lv in s.levels] == [1, 2, 4, 12]
        assert [len(ks) for _p, ks in s.leaves] == [3, 1, 4, 2] * 3
        assert sorted(s.recs) == list(range(FIRST, FIRST + N))
        assert (s.overflow_pages > 0) == big
    s = built(True)
    assert {s.recs[FIRST + j][2] is not None for j in range(N) if SIZES[j % 7] > 2000} == {True}
    assert s.overflow_pages == sum(-(-(PH + SIZES[j % 7]) // 4096) for j in range(N) if SIZES[j % 7] > 2000)


# -- reading -------------------------------------------------------------------------------------
@pytest.mark.parametrize("newer", [0, 1])
@pytest.mark.parametrize("big", [False, True], ids=["small", "big"])
def test_every_record_reads_back_as_written(tmp_path, big, newer):
    """Every value through locate, value, read and read_into, at the offset the builder put it,
    whichever meta page is the newer (the older one describes an empty database)."""
    s = built(big)
    path = write(tmp_path / "s.lmdb", s.image(newer=newer, extra_pages=3))
    f = open_file(path)
    assert f.lazy is (not big) and f.psize == 4096
    buf = np.zeros(40000, dtype=np.uint8)
    addr = buf.ctypes.data
    for i in reversed(range(FIRST, FIRST + N)):  # from the end: no leaf read for one record serves the next by chance
        off, n, ov = s.recs[i]
        want = value(i, n)
        assert f.locate(i) == (off, n)
        assert bytes(f.value(i)) == want
        b, n2, off2 = f.read(i)
        assert (bytes(b), n2, off2) == (want, n, off)
        for pos in (0, 5, 100):  # 100: past the 16 bytes of an overflow page's header
            start, n3 = f.read_into(i, buf, pos, addr)
            extra = PH if ov is not None else 0
            assert (start, n3) == (pos + extra, n)
            assert bytes(buf[start : start + n]) == want
            if ov is not None:  # the overflow page's own header came with it
                assert struct.unpack_from("<QHHI", buf, pos) == (ov, 0, P_OVERFLOW, -(-(PH + n) // 4096))
    f.close()


def test_meta_pages_of_the_same_transaction_read_as_meta_page_0(tmp_path):
    """Both meta pages of one transaction number: meta page 0 is taken, as LMDB's mdb_env_pick_meta does
    (page 1 only if 0's transaction is older): here 0 describes the tree, 1 an empty database."""
    s = built(False)
    d = s.image(newer=0)
    put(d, 4096 + PH + 128, "<Q", 2)  # meta 1's txnid: 2, as meta 0's
    path = write(tmp_path / "s.lmdb", d)
    assert check_shard_structure(path, len(d), first=FIRST, count=N) is None
    f = open_file(path)
    assert [bytes(f.value(i)) for i in range(FIRST, FIRST + N)] == [value(i, s.recs[i][1]) for i in range(FIRST, FIRST + N)]
    f.close()
    d = s.image(newer=1)
    put(d, PH + 128, "<Q", 2)  # the other way round: meta 0 the empty one, of the same transaction
    path = write(tmp_path / "e.lmdb", d)
    assert check_shard_structure(path, len(d), first=FIRST, count=N) == f"LMDB file holds no records, the manifest says {N}"


def test_read_into_of_records_not_in_the_page_cache(tmp_path):
    """After the file is dropped from the page cache, ``preadv2(RWF_NOWAIT)`` gets little or nothing
    and the rest is read with ``preadv``: the same bytes."""
    s = built(True)
    path = write(tmp_path / "s.lmdb", s.image())
    f = open_file(path)
    buf = np.zeros(2 * 20000 + READ_SLACK, dtype=np.uint8)
    for i in range(FIRST, FIRST + N):
        drop_cached(path)
        off, n, ov = s.recs[i]
        start, n2 = f.read_into(i, buf, 7, buf.ctypes.data)
        assert (start, n2) == (7 + (PH if ov is not None else 0), n)
        assert bytes(buf[start : start + n]) == value(i, n)
    f.close()


@pytest.mark.parametrize("head", [0, 5, 16384, 30000])
def test_read_with_a_head_returns_the_start_of_long_values_only(tmp_path, head):
    """``read(i, head)``: a value over max(head, 16384) bytes comes back as its first ``head`` bytes,
    every other whole; length and offset are always the whole value's."""
    s = built(True)
    f = open_file(write(tmp_path / "s.lmdb", s.image()))
    for i in range(FIRST, FIRST + N):
        off, n, _ov = s.recs[i]
        b, n2, off2 = f.read(i, head)
        cut = head if head and n > max(head, 16384) else n
        assert (bytes(b), n2, off2) == (value(i, n)[:cut], n, off)
    assert any(n > 16384 for _o, n, _v in s.recs.values())
    f.close()


@pytest.mark.parametrize("keyed", [True, False])
def test_walk_lists_every_leaf_in_key_order(shard, keyed):
    """``_Tree.walk``: per leaf, its first key (0 when the keys are not known), the value offsets
    (negated for overflow values) and sizes, as laid out."""
    s, path = shard
    fd = os.open(path, os.O_RDONLY)
    try:
        t = btree._Tree(fd, os.path.getsize(path), (FIRST, N) if keyed else None)
        assert (t.psize, t.depth, t.entries, t.root, t.last) == (4096, 4, N, s.root, s.next - 1)
        assert t.overflow_pages == s.overflow_pages
        assert t.walk() == s.expected_leaves(keyed)
        assert t.bytes_read == 2 * META_HEAD + (len(s.branches) + len(s.leaves)) * 4096
        assert [(p, bytes(pg) == bytes(s.pages[p])) for p, pg, *_ in t.scan()] == [(p, True) for p, _ks in s.leaves]
    finally:
        os.close(fd)


def test_opening_a_shard_of_overflow_records_reads_its_branch_and_leaf_pages_once(tmp_path):
    """Eager: the meta pages, then level by level every branch and leaf page, no overflow page."""
    s = built(True)
    path = write(tmp_path / "s.lmdb", s.image())
    rec = Recorder()
    f = open_file(path, rec)
    assert rec.fills[:2] == [([(0, META_HEAD)], True), ([(4096, META_HEAD)], True)]
    del rec.fills[:2]
    assert [sorted(r[0] // 4096 for r in rs) for rs, _w in rec.fills] == [sorted(lv) for lv in s.levels]
    assert f.structure_bytes == 2 * META_HEAD + (len(s.branches) + len(s.leaves)) * 4096
    rec.fills.clear()
    assert f.locate(FIRST + 4) == s.recs[FIRST + 4][:2]
    assert rec.fills == []  # every record was located when it was opened
    f.close()


def test_a_lazy_shard_reads_only_the_pages_on_each_records_path(tmp_path):
    """Lazy: the path root -> leaf of the first record located, each branch page once, a leaf page
    again only for a record not yet located."""
    s = built(False)
    path = write(tmp_path / "s.lmdb", s.image())
    rec = Recorder()
    f = open_file(path, rec)
    assert f.structure_bytes == 2 * META_HEAD
    rec.fills.clear()

    def path_of(i):
        j = next(n for n, (_p, ks) in enumerate(s.leaves) if i in ks)
        lv = [j]
        for _ in range(3):
            lv.insert(0, lv[0] // 3)
        return [level[x] for level, x in zip(s.levels, lv)]

    seen: set[int] = set()
    located: set[int] = set()
    for i in [FIRST + 29, FIRST + 0, FIRST + 1, FIRST + 13, FIRST + 5, FIRST + 29]:
        rec.fills.clear()
        f.locate(i)
        want = [] if i in located else [p for p in path_of(i)[:-1] if p not in seen] + [path_of(i)[-1]]
        assert rec.pages(4096) == want, i
        seen.update(want)
        if i not in located:
            located.update(next(ks for p, ks in s.leaves if p == path_of(i)[-1]))
    assert f.structure_bytes == 2 * META_HEAD + len(seen) * 4096 + 0 * len(located)
    f.close()


def test_resolve_of_many_records_reads_each_page_of_a_level_once(tmp_path):
    """willneed of records in several leaves: per level the pages their paths need, asked together, once."""
    s = built(False)
    rec = Recorder()
    f = open_file(write(tmp_path / "s.lmdb", s.image()), rec)
    rec.fills.clear()
    f.willneed([FIRST + 0, FIRST + 29, FIRST + 2, FIRST + 28])  # leaves 0 and 11: both halves of the tree
    waits = [(sorted(o // 4096 for o, _n in rs), w) for rs, w in rec.fills]
    lv = s.levels
    assert waits == [([lv[0][0]], True), (sorted([lv[1][0], lv[1][1]]), True), (sorted([lv[2][0], lv[2][3]]), True),
                     (sorted([lv[3][0], lv[3][11]]), True)]  # fmt: skip
    f.close()


@pytest.mark.parametrize("head", [0, 6])
def test_scan_gives_every_record_with_its_key_as_stored(shard, head):
    """ShardScan.records: in key order, the key bytes as stored, the value (with a head: the start of
    an overflow value longer than it; inline values whole), the whole length."""
    s, path = shard
    with ShardScan(path, os.path.getsize(path)) as scan:
        assert scan.lazy is (s.overflow_pages == 0)
        got = [(bytes(k), bytes(v), n) for k, v, n in scan.records(head)]
    want = []
    for i in range(FIRST, FIRST + N):
        _off, n, ov = s.recs[i]
        cut = head if head and ov is not None and n > head else n
        want.append((key(i), value(i, n)[:cut], n))
    assert got == want


def test_scan_of_a_shard_with_other_keys_gives_them_as_stored(tmp_path):
    """ShardScan does not know the manifest: keys that are not 8 bytes, not consecutive, come back."""
    s = Shard()
    ks = [b"a", b"bb", b"ccc", b"zzzzzzzzzz"]
    p = s.alloc()
    s.node_page(p, P_LEAF, [struct.pack("<HHHH", 50, 0, 0, len(k)) + k + bytes([j]) * 50 for j, k in enumerate(ks)])
    s.leaves, s.root, s.depth, s.entries = [(p, [])], p, 1, 4
    path = write(tmp_path / "s.lmdb", s.image())
    with ShardScan(path) as scan:
        assert [(bytes(k), bytes(v), n) for k, v, n in scan.records()] == [(k, bytes([j]) * 50, 50) for j, k in enumerate(ks)]
    assert check_shard_structure(path, os.path.getsize(path)) is None
    assert check_shard_structure(path, os.path.getsize(path), first=0, count=4) == "LMDB keys are not the sample indices 0..3"


def test_an_empty_database_has_no_records(tmp_path):
    s = Shard()
    s.root, s.depth, s.entries = INVALID, 0, 0
    path = write(tmp_path / "s.lmdb", s.image())
    with ShardScan(path) as scan:
        assert list(scan.records()) == []
    assert check_shard_structure(path, 8192) is None
    assert check_shard_structure(path, 8192, first=5, count=0) is None
    assert check_shard_structure(path, 8192, first=5, count=2) == "LMDB file holds no records, the manifest says 2"
    f = open_file(path, count=0)
    f.willneed([])
    f.close()


# -- willneed, evict, _spans ---------------------------------------------------------------------
def spans(s: Shard, indices) -> list[tuple[int, int, bool]]:
    """Each record's bytes in the file (an overflow value's from its first page's start), sorted."""
    out = []
    for i in indices:
        off, n, ov = s.recs[i]
        out.append((ov * s.psize, off + n, True) if ov is not None else (off, off + n, False))
    return sorted(out)


def joined(s: Shard, indices) -> list[tuple[int, int]]:
    """The spans, neighbours at most two pages apart joined, as (offset, length)."""
    out: list[list[int]] = []
    for a, b, _big in spans(s, indices):
        if out and a <= out[-1][1] + 2 * s.psize:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b - a) for a, b in out]


BATCHES = [[FIRST + 4], [FIRST + 29, FIRST + 0], [FIRST + 3, FIRST + 4, FIRST + 5, FIRST + 6, FIRST + 11],
           list(range(FIRST + 20, FIRST + 10, -1)), list(range(FIRST, FIRST + N)), [FIRST + 8, FIRST + 1, FIRST + 8]]  # fmt: skip


def test_spans_willneed_and_evict_of_overflow_records(tmp_path):
    """Eager shard: ``_spans`` are each record's bytes (an overflow value's from its page's start),
    willneed asks for them joined, evict drops the whole overflow pages of those in overflow pages."""
    s = built(True)
    rec = Recorder()
    f = open_file(write(tmp_path / "s.lmdb", s.image()), rec)
    for batch in BATCHES:
        assert f._spans(batch) == spans(s, batch)
        rec.fills.clear()
        f.willneed(batch)
        assert rec.fills == [(joined(s, batch), False)]
        rec.drops.clear()
        f.evict(batch)
        big = sorted((s.recs[i][2] * 4096, -(-(PH + s.recs[i][1]) // 4096) * 4096) for i in batch if s.recs[i][2] is not None)
        assert rec.drops == [big]
    f.close()


def test_willneed_of_a_lazy_shard(tmp_path):
    """Lazy: records not located yet are located (their leaf pages read: nothing more to ask), those
    located already are asked for joined."""
    s = built(False)
    rec = Recorder()
    f = open_file(write(tmp_path / "s.lmdb", s.image()), rec)
    rec.fills.clear()
    f.willneed([FIRST + 0, FIRST + 1])
    assert [w for _r, w in rec.fills] == [True] * 4  # the four pages of the path, nothing else
    rec.fills.clear()
    f.willneed([FIRST + 1, FIRST + 2, FIRST + 3])  # 1001, 1002 located; 1003 alone in the next leaf, same branches
    assert [(r, w) for r, w in rec.fills if r] == [([(s.levels[3][1] * 4096, 4096)], True), (joined(s, [FIRST + 1, FIRST + 2]), False)]
    rec.fills.clear()
    f.willneed([FIRST + 3, FIRST + 0])
    assert rec.fills == [(joined(s, [FIRST + 0, FIRST + 3]), False)]
    assert f._spans([FIRST + 3, FIRST + 0, FIRST + 7]) == spans(s, [FIRST + 0, FIRST + 3])  # 7 not located: left out
    rec.drops.clear()
    f.evict([FIRST + 0, FIRST + 3])  # inside leaf pages: nothing of theirs alone to drop
    assert rec.drops == [[]]
    f.close()


@pytest.mark.parametrize("short", [0, 1])
def test_joining_spans_by_hand(tmp_path, short):
    """Two overflow records with two unused pages between them: if the first ends its last page,
    the gap is exactly two pages and the two are asked for as one range; a byte shorter, as two."""
    s = Shard()
    n0 = 2 * 4096 - PH - short
    a = s.overflow(value(0, n0))
    s.alloc(2)
    b = s.overflow(value(1, 5000))
    p = s.alloc()
    s.node_page(p, P_LEAF, [struct.pack("<HHHH", n, 0, F_BIGDATA, 8) + key(j) + struct.pack("<Q", ov)
                            for j, (n, ov) in enumerate([(n0, a), (5000, b)])])  # fmt: skip
    s.leaves, s.root, s.depth, s.entries = [(p, [0, 1])], p, 1, 2
    assert (a, b, p) == (2, 6, 8)
    rec = Recorder()
    f = open_file(write(tmp_path / "s.lmdb", s.image()), rec, first=0, count=2)
    rec.fills.clear()
    f.willneed([1, 0])
    end0, end1 = 2 * 4096 + PH + n0, 6 * 4096 + PH + 5000
    assert end0 == 4 * 4096 - short
    want = [(2 * 4096, end1 - 2 * 4096)] if not short else [(2 * 4096, end0 - 2 * 4096), (6 * 4096, end1 - 6 * 4096)]
    assert rec.fills == [(want, False)]
    f.evict([0, 1])
    assert rec.drops == [[(2 * 4096, 2 * 4096), (6 * 4096, 2 * 4096)]]
    f.close()


# -- damage --------------------------------------------------------------------------------------
def put(data: bytearray, off: int, fmt: str, *vals) -> None:
    struct.pack_into(fmt, data, off, *vals)


def damaged(tmp_path, big: bool, edit, newer: int = 1) -> tuple[Shard, Path, int]:
    s = built(big)
    data = s.image(newer=newer)
    edit(s, data)
    path = write(tmp_path / "d.lmdb", data)
    return s, path, len(data)


def leaf_of(s: Shard, i: int) -> int:
    return next(p for p, ks in s.leaves if i in ks)


META = [
    ("meta 0 not a meta page", lambda s, d: put(d, 10, "<H", P_LEAF), "not an LMDB file (bad meta page)"),
    ("meta 1 not a meta page", lambda s, d: put(d, 4096 + 10, "<H", 0), "not an LMDB file (bad meta page)"),
    ("meta 0 magic", lambda s, d: put(d, PH, "<I", MAGIC + 1), "not an LMDB file (bad meta page)"),
    ("meta 1 magic", lambda s, d: put(d, 4096 + PH, "<I", 0xDEC0EFBE), "not an LMDB file (bad meta page)"),
    ("meta 0 version 2", lambda s, d: put(d, PH + 4, "<I", 2), "not an LMDB file (bad meta page)"),
    ("meta 1 version 0", lambda s, d: put(d, 4096 + PH + 4, "<I", 0), "not an LMDB file (bad meta page)"),
    ("meta 1 other page size", lambda s, d: put(d, 4096 + PH + 24, "<I", 8192), "LMDB page size 4096 is invalid"),
    ("root past the last page", lambda s, d: put(d, 4096 + PH + 72 + 40, "<Q", s.next), "LMDB root page is past the last page"),
    ("entries", lambda s, d: put(d, 4096 + PH + 72 + 32, "<Q", N + 1), f"LMDB file holds {N + 1} records, the manifest says {N}"),
    ("last page past the file", lambda s, d: put(d, 4096 + PH + 120, "<Q", s.next), "{pages}"),
]  # fmt: skip


@pytest.mark.parametrize("what, edit, message", META, ids=[m[0] for m in META])
@pytest.mark.parametrize("big", [False, True], ids=["small", "big"])
def test_damaged_meta_pages(tmp_path, what, edit, message, big):
    s, path, size = damaged(tmp_path, big, edit)
    msg = message.format(pages=f"LMDB meta page says {s.next + 1} pages, the file holds {s.next}")
    assert check_shard_structure(path, size, first=FIRST, count=N) == msg
    with pytest.raises(DamagedShardError) as e:
        open_file(path)
    assert str(e.value) == f"{path}: damaged shard ({msg})"
    assert (e.value.path, e.value.problem) == (str(path), msg)


@pytest.mark.parametrize("psize", [256, 3072, 131072, 262144])
def test_invalid_page_sizes(tmp_path, psize):
    """A page size below 512, not a power of two, or above 65536, both meta pages agreeing (meta 1
    copied to where meta 0's page size puts it); or one that puts meta 1 outside the file."""
    s = built(False)
    data = s.image(extra_pages=40)
    assert 131072 + META_HEAD < len(data) < 262144
    put(data, PH + 24, "<I", psize)
    if psize < len(data):
        data[psize : psize + META_HEAD] = data[4096 : 4096 + META_HEAD]
        put(data, psize + PH + 24, "<I", psize)
    path = write(tmp_path / "d.lmdb", data)
    want = f"LMDB page size {psize} is invalid" if psize < len(data) else "LMDB meta page outside the file"
    assert check_shard_structure(path, len(data)) == want


def test_page_sizes_at_the_limits_are_read(tmp_path):
    for psize in (512, 65536):
        s = Shard(psize)
        s.tree(items(False, 8), [1], 2)
        assert s.depth == 4
        path = write(tmp_path / f"s{psize}.lmdb", s.image())
        assert check_shard_structure(path, os.path.getsize(path), first=FIRST, count=8) is None
        f = open_file(path, count=8)
        assert [bytes(f.value(i)) for i in range(FIRST, FIRST + 8)] == [v for _k, v, _b in items(False, 8)]
        f.close()


def test_files_too_small_or_cut_before_their_meta_pages(tmp_path):
    assert check_shard_structure(write(tmp_path / "a", b"\0" * 1023), 1023) == "1023 bytes is too small for an LMDB file"
    s = built(False)
    data = s.image()
    assert check_shard_structure(write(tmp_path / "b", data[:1024]), 1024) == "LMDB meta page outside the file"
    cut = data[: 4096 + META_HEAD - 1]
    assert check_shard_structure(write(tmp_path / "c", cut), len(cut)) == "LMDB meta page outside the file"
    cut = data[: 4096 + META_HEAD]
    assert check_shard_structure(write(tmp_path / "d", cut), len(cut)) == f"LMDB meta page says {s.next} pages, the file holds 1"
    whole = write(tmp_path / "e", data[: s.next * 4096])
    assert check_shard_structure(whole, s.next * 4096, first=FIRST, count=N) is None


def test_the_file_and_its_size(tmp_path):
    s = built(False)
    path = write(tmp_path / "s.lmdb", s.image())
    size = os.path.getsize(path)
    assert check_shard_structure(tmp_path / "none.lmdb", size) == "the file is missing"
    assert check_shard_structure(tmp_path, size) == "the file is a directory, not a regular file"
    assert check_shard_structure(path, size + 1) == f"the file is {size} bytes, expected {size + 1} (it changed while being checked)"
    with pytest.raises(DamagedShardError) as e:
        ShardScan(path, size - 1)
    assert str(e.value) == f"{path}: damaged shard (the file is {size} bytes, expected {size - 1} (it changed while being checked))"
    with ShardScan(path, size) as scan:
        scan.close()  # twice is fine
        scan.close()
    os.fstat(1)  # and closes nothing else: not standard output, say


def test_a_page_size_of_two_to_the_31_puts_the_second_meta_page_outside_the_file(tmp_path):
    """A shard (written by LMDB itself) whose meta page 0 says its page size is 2**31 (bytes 40..43, little-endian:
    the page header is 16 bytes, then magic, version, address and map size): the second meta page would be at
    byte 2**31, past the end of the file."""
    lmdb = pytest.importorskip("lmdb")
    p = tmp_path / "ps.lmdb"
    env = lmdb.open(str(p), subdir=False, map_size=1 << 20, lock=False)
    with env.begin(write=True) as txn:
        txn.put((0).to_bytes(8, "big"), b"v")
    env.close()
    data = bytearray(p.read_bytes())
    data[40:44] = (2**31).to_bytes(4, "little")
    p.write_bytes(data)
    assert check_shard_structure(p, len(data)) == "LMDB meta page outside the file"


def keys_problem():
    return f"LMDB keys are not the sample indices {FIRST}..{FIRST + N - 1}"


def first_leaf(s):
    return s.leaves[0][0]


def root_node(s, j):
    return s.node_at(s.root, j)


TREE = [
    # _nodes
    ("a leaf page of kind overflow", lambda s, d: put(d, first_leaf(s) * 4096 + 10, "<H", P_OVERFLOW),
     "LMDB B-tree reaches a page that is neither a branch nor a leaf"),
    ("the root of kind meta", lambda s, d: put(d, s.root * 4096 + 10, "<H", P_META),
     "LMDB B-tree reaches a page that is neither a branch nor a leaf"),
    ("a leaf where a branch is", lambda s, d: put(d, s.levels[2][1] * 4096 + 10, "<H", P_LEAF), "LMDB B-tree level mixes branch and leaf pages"),
    ("a branch where a leaf is", lambda s, d: put(d, s.levels[3][5] * 4096 + 10, "<H", P_BRANCH), "LMDB B-tree level mixes branch and leaf pages"),
    ("a page number", lambda s, d: put(d, s.levels[3][7] * 4096, "<Q", 7777), "LMDB page {p} says it is page 7777"),
    ("no nodes", lambda s, d: put(d, s.levels[3][3] * 4096 + 12, "<H", PH), "LMDB page with an invalid node table"),
    ("lower above upper", lambda s, d: put(d, s.levels[3][3] * 4096 + 12, "<HH", 4000, 3999), "LMDB page with an invalid node table"),
    ("upper past the page", lambda s, d: put(d, s.levels[1][1] * 4096 + 14, "<H", 4097), "LMDB page with an invalid node table"),
    # upper at the page's end is a well-formed table header; it leaves no room for the nodes it lists
    ("upper at the page's end", lambda s, d: put(d, s.levels[3][3] * 4096 + 14, "<H", 4096), "LMDB node offset outside its page"),
    ("a node below upper", lambda s, d: put(d, s.levels[3][2] * 4096 + PH + 2, "<H", s.nodes[s.levels[3][2]][-1] - 2),
     "LMDB node offset outside its page"),
    ("a node past the page", lambda s, d: put(d, s.levels[3][2] * 4096 + PH, "<H", 4096 - NH + 1), "LMDB node offset outside its page"),
    # branch
    ("a child past the last page", lambda s, d: put(d, root_node(s, 1), "<HHH", (s.next) & 0xFFFF, 0, 0),
     "LMDB branch node outside its page or pointing past the last page"),
    ("a child's high bits", lambda s, d: put(d, root_node(s, 0) + 4, "<H", 1),
     "LMDB branch node outside its page or pointing past the last page"),
    ("a branch key past the page", lambda s, d: put(d, root_node(s, 1) + 6, "<H", 4096),
     "LMDB branch node outside its page or pointing past the last page"),
    # the root's node 0 is the page's last 8 bytes (its key is empty): a key of 8 ends 8 bytes past the page
    ("a first branch key past the page", lambda s, d: put(d, root_node(s, 0) + 6, "<H", 8),
     "LMDB branch node outside its page or pointing past the last page"),
    ("a branch key of 7 bytes", lambda s, d: put(d, root_node(s, 1) + 6, "<H", 7), "{keys}"),
    ("a branch bound out of order", lambda s, d: put(d, s.node_at(s.levels[2][1], 1) + NH, ">Q", FIRST), "{keys}"),
    ("bounds equal", lambda s, d: put(d, s.node_at(s.levels[2][1], 1) + NH, ">Q", FIRST + 8), "{keys}"),
    ("a bound past the parent's range", lambda s, d: put(d, s.node_at(s.levels[1][0], 1) + NH, ">Q", FIRST + 99), "{keys}"),
    # leaves 0, 1, 2 (keys FIRST..+2, +3, +4..+7) under one branch, bounds FIRST, +3, +4: the second bound made +2,
    # still in order, puts leaf 0's last key at its right neighbour's lower bound
    ("a bound below its left child's last key", lambda s, d: put(d, s.node_at(s.levels[2][0], 1) + NH, ">Q", FIRST + 2), "{keys}"),
    # leaves 3, 4, 5 (keys +8..+9, +10..+12, +13), bounds +8, +10, +13: the last bound made +12 puts leaf 4's
    # last key, the next to last child's, at it
    ("a last bound below its left child's last key", lambda s, d: put(d, s.node_at(s.levels[2][1], 2) + NH, ">Q", FIRST + 12),
     "{keys}"),
    # leaf
    ("unsupported flags", lambda s, d: put(d, s.node_at(s.levels[3][4], 0) + 4, "<H", 0x02), "LMDB leaf node with unsupported flags"),
    ("a value past its page", lambda s, d: put(d, s.node_at(s.levels[3][6], 0), "<H", 4096), "LMDB leaf node outside its page"),
    ("a key past its page", lambda s, d: put(d, s.node_at(s.levels[3][6], 0) + 6, "<H", 4096), "LMDB leaf node outside its page"),
    ("a leaf key of 9 bytes", lambda s, d: put(d, s.node_at(s.levels[3][6], 2) + 6, "<H", 9), "{keys}"),
    ("a leaf key changed", lambda s, d: put(d, s.node_at(s.levels[3][6], 0) + NH, ">Q", FIRST + 99), "{keys}"),
    ("two leaf keys swapped", lambda s, d: swap_ptrs(s, d, s.levels[3][2]), "{keys}"),
]  # fmt: skip


def swap_ptrs(s: Shard, d: bytearray, p: int) -> None:
    a, b = struct.unpack_from("<2H", d, p * 4096 + PH)
    put(d, p * 4096 + PH, "<2H", b, a)


@pytest.mark.parametrize("what, edit, message", TREE, ids=[t[0] for t in TREE])
@pytest.mark.parametrize("big", [False, True], ids=["small", "big"])
def test_damaged_branch_and_leaf_pages(tmp_path, what, edit, message, big):
    """Each damage is named by check_shard_structure (the whole tree), by opening a shard of overflow
    records (the whole tree too) and, for a lazy shard, by locating every record (the damaged page
    is on some record's path)."""
    s, path, size = damaged(tmp_path, big, edit)
    msg = message.format(keys=keys_problem(), p=s.levels[3][7])
    assert check_shard_structure(path, size, first=FIRST, count=N) == msg
    if big:
        with pytest.raises(DamagedShardError) as e:
            open_file(path)
    else:
        f = open_file(path)
        with pytest.raises(DamagedShardError) as e:
            for i in range(FIRST, FIRST + N):
                f.locate(i)
        f.close()
    assert str(e.value) == f"{path}: damaged shard ({msg})"
    if "keys" not in message:  # without the manifest's keys, the structure is still checked
        assert check_shard_structure(path, size) == msg
        with pytest.raises(DamagedShardError) as e:
            list(ShardScan(path).records())
        assert e.value.problem == msg


def test_without_keys_only_the_structure_is_checked(tmp_path):
    """Keys of other sizes, out of order, not the manifest's: a scan without keys reads them."""
    edits = {what: edit for what, edit, _m in TREE}
    for what in ("a branch key of 7 bytes", "a branch bound out of order", "bounds equal", "a bound past the parent's range",
                 "a bound below its left child's last key", "a last bound below its left child's last key", "a leaf key of 9 bytes", "a leaf key changed",
                 "two leaf keys swapped"):  # fmt: skip
        edit = edits[what]
        s, path, size = damaged(tmp_path, True, edit)
        assert check_shard_structure(path, size) is None
        assert check_shard_structure(path, size, first=FIRST) is None  # count not given: keys not checked
        with ShardScan(path) as scan:
            assert len(list(scan.records())) == N


@pytest.mark.parametrize("big", [False, True], ids=["small", "big"])
def test_a_key_range_of_another_shard(tmp_path, big):
    s = built(big)
    path = write(tmp_path / "s.lmdb", s.image())
    size = os.path.getsize(path)
    assert check_shard_structure(path, size, first=FIRST + 1, count=N) == f"LMDB keys are not the sample indices {FIRST + 1}..{FIRST + N}"
    assert check_shard_structure(path, size, first=FIRST - 1, count=N) == f"LMDB keys are not the sample indices {FIRST - 1}..{FIRST + N - 2}"
    assert check_shard_structure(path, size, first=FIRST, count=N - 1) == f"LMDB file holds {N} records, the manifest says {N - 1}"


def test_overflow_pointers(tmp_path):
    """An overflow page number past the last page, an overflow value running past the end of the
    file, two records sharing overflow pages (whole or in part), and a value that ends exactly
    at the end of the file (read)."""
    s = built(True)
    big = [i for i in range(FIRST, FIRST + N) if s.recs[i][2] is not None]

    def data_field(i):
        p = leaf_of(s, i)
        j = next(ks for q, ks in s.leaves if q == p).index(i)
        return s.node_at(p, j) + NH + 8

    cases = [
        (lambda d: put(d, data_field(big[0]), "<Q", s.next), "LMDB record points past the end of the file"),
        (lambda d: put(d, data_field(big[0]), "<Q", s.next - 1), "LMDB record points past the end of the file"),
        (lambda d: put(d, data_field(big[1]), "<Q", s.recs[big[0]][2]), "two LMDB records share overflow pages"),
        (lambda d: put(d, data_field(big[1]), "<Q", s.recs[big[0]][2] + 1), "two LMDB records share overflow pages"),
        (lambda d: put(d, data_field(big[0]), "<Q", s.recs[big[1]][2] + 1), "two LMDB records share overflow pages"),
        # the overlap between the second and third in page order, not the first and second: each value's pages
        # are checked against its own neighbour's start, not the first one's
        (lambda d: put(d, data_field(big[2]), "<Q", s.recs[big[1]][2] + 1), "two LMDB records share overflow pages"),
    ]
    for j, (edit, msg) in enumerate(cases):
        d = s.image()
        edit(d)
        path = write(tmp_path / f"o{j}.lmdb", d)
        assert check_shard_structure(path, len(d)) == msg, j
        with pytest.raises(DamagedShardError) as e:
            ShardScan(path)
        assert e.value.problem == msg


def test_a_scan_refuses_an_overflow_run_one_page_short_of_its_value_and_its_header(tmp_path):
    """A value of 4096 bytes needs 2 overflow pages with their 16-byte header (4112 bytes); its first overflow page
    says 1: ShardScan.records refuses it (the count is checked against the value plus the header)."""
    s = Shard()
    v = value(FIRST, 4096)
    p = s.alloc()
    ov = s.overflow(v)
    s.node_page(p, P_LEAF, [struct.pack("<HHHH", len(v), 0, F_BIGDATA, 8) + key(FIRST) + struct.pack("<Q", ov)])
    s.leaves, s.root, s.depth, s.entries = [(p, [FIRST])], p, 1, 1
    data = s.image()
    assert struct.unpack_from("<I", data, ov * 4096 + 12)[0] == 2  # mp_pages, after pgno, pad and flags
    put(data, ov * 4096 + 12, "<I", 1)
    path = write(tmp_path / "s.lmdb", data)
    with ShardScan(path) as scan, pytest.raises(DamagedShardError) as e:
        list(scan.records())
    assert e.value.problem == f"the LMDB record of key {key(FIRST).hex()} points at page {ov}, which does not start its overflow pages"


@pytest.mark.parametrize("pages", [1, 2])
def test_an_overflow_value_that_ends_the_file(tmp_path, pages):
    """The last page of the file is an overflow value's last page (its first too, for one page),
    filled to its last byte."""
    s = Shard()
    v = value(FIRST, pages * 4096 - PH)
    p = s.alloc()
    ov = s.overflow(v)
    s.node_page(p, P_LEAF, [struct.pack("<HHHH", len(v), 0, F_BIGDATA, 8) + key(FIRST) + struct.pack("<Q", ov)])
    s.leaves, s.root, s.depth, s.entries = [(p, [FIRST])], p, 1, 1
    data = s.image()
    assert (p, ov, len(data)) == (2, 3, (3 + pages) * 4096) and data.endswith(v[-50:])
    path = write(tmp_path / "s.lmdb", data)
    assert check_shard_structure(path, len(data), first=FIRST, count=1) is None
    f = open_file(path, count=1)
    assert bytes(f.value(FIRST)) == v
    f.close()
    # one byte longer: it would run past the file
    put(data, s.node_at(p, 0), "<H", len(v) + 1)
    path = write(tmp_path / "t.lmdb", data)
    assert check_shard_structure(path, len(data)) == "LMDB record points past the end of the file"


def test_overflow_headers_that_are_not_their_records_own(tmp_path):
    """A record pointing at a page that is not the first of its overflow run (another kind, another
    page number, fewer pages than its value needs) is refused when it is read, by read, read_into
    and a scan; the number of pages it needs exactly is fine."""
    s = built(True)
    i = next(i for i in range(FIRST, FIRST + N) if s.recs[i][1] == 9000)
    ov = s.recs[i][2]
    need = -(-(PH + 9000) // 4096)
    for j, (fmt, vals, ok) in enumerate([("<Q", (ov + 1,), False), ("<H", (P_LEAF,), False), ("<I", (need - 1,), False),
                                          ("<I", (need,), True), ("<H", (P_OVERFLOW | 0x8000,), True)]):  # fmt: skip
        d = s.image()
        put(d, ov * 4096 + {"<Q": 0, "<H": 10, "<I": 12}[fmt], fmt, *vals)
        path = write(tmp_path / f"h{j}.lmdb", d)
        f = open_file(path)
        msg = f"the LMDB record of sample {i} points at page {ov}, which does not start its overflow pages"
        buf = np.zeros(10000 + READ_SLACK, dtype=np.uint8)
        with ShardScan(path) as scan:
            if ok:
                assert bytes(f.value(i)) == value(i, 9000)
                assert f.read_into(i, buf, 0, buf.ctypes.data) == (PH, 9000)
                assert len(list(scan.records())) == N
                continue
            with pytest.raises(DamagedShardError) as e:
                f.read(i)
            assert str(e.value) == f"{path}: damaged shard ({msg})"
            with pytest.raises(DamagedShardError) as e:
                f.read_into(i, buf, 0, buf.ctypes.data)
            assert str(e.value) == f"{path}: damaged shard ({msg})"
            with pytest.raises(DamagedShardError) as e:
                list(scan.records(head=4))
            scanned = f"the LMDB record of key {key(i).hex()} points at page {ov}, which does not start its overflow pages"
            assert str(e.value) == f"{path}: damaged shard ({scanned})"
        f.close()


def test_overflow_records_in_a_shard_whose_meta_page_counts_none(tmp_path):
    s = built(True)
    path = write(tmp_path / "s.lmdb", s.image(overflow=0))
    msg = "LMDB meta page counts no overflow pages, but records are stored in them"
    with ShardScan(path) as scan:
        assert scan.lazy
        with pytest.raises(DamagedShardError) as e:
            list(scan.records())
    assert e.value.problem == msg
    f = open_file(path)
    assert [n for _p, ks in s.leaves for n in ks if all(s.recs[k][2] is None for k in ks)] == [FIRST + 23]
    assert bytes(f.value(FIRST + 23)) == value(FIRST + 23, 300)  # its leaf holds no overflow record: read
    with pytest.raises(DamagedShardError) as e:
        f.value(FIRST + 20)
    assert e.value.problem == msg
    f.close()


@pytest.mark.parametrize("depth", [0, 33])
def test_a_depth_the_meta_page_cannot_mean(tmp_path, depth):
    s = built(False)
    d = s.image()
    put(d, 4096 + PH + 72 + 6, "<H", depth)
    path = write(tmp_path / "s.lmdb", d)
    msg = f"LMDB meta page says the B-tree is {depth} levels deep"
    with pytest.raises(DamagedShardError) as e:
        list(ShardScan(path).records())
    assert e.value.problem == msg
    with pytest.raises(DamagedShardError) as e:
        open_file(path).locate(FIRST)
    assert e.value.problem == msg


@pytest.mark.parametrize("depth", [3, 5])
def test_a_depth_that_is_not_the_trees(tmp_path, depth):
    """The meta page's depth is what a scan and a lazy shard follow: a level of the wrong kind is damage."""
    s = built(False)
    d = s.image()
    put(d, 4096 + PH + 72 + 6, "<H", depth)
    path = write(tmp_path / "s.lmdb", d)
    msg = "LMDB B-tree level mixes branch and leaf pages"
    with pytest.raises(DamagedShardError) as e:
        list(ShardScan(path).records())
    assert e.value.problem == msg
    with pytest.raises(DamagedShardError) as e:
        open_file(path).locate(FIRST)
    assert e.value.problem == msg
    assert check_shard_structure(path, len(d)) is None  # the whole walk goes by the pages' kinds


def test_pages_referenced_twice(tmp_path):
    """Two nodes of a branch page, or of two branch pages of a level, pointing at the same page."""
    for edit in (lambda s, d: put(d, s.node_at(s.levels[2][0], 1), "<HHH", s.levels[3][0], 0, 0),
                 lambda s, d: put(d, s.node_at(s.root, 1), "<HHH", s.levels[1][0], 0, 0)):  # fmt: skip
        s, path, size = damaged(tmp_path, True, edit)
        assert check_shard_structure(path, size) == "LMDB B-tree pages are referenced more than once"
        with pytest.raises(DamagedShardError) as e:
            list(ShardScan(path).records())
        assert e.value.problem == "LMDB B-tree pages are referenced more than once"
        s, path, size = damaged(tmp_path, False, edit)
        with pytest.raises(DamagedShardError) as e:
            list(ShardScan(path).records())
        assert e.value.problem == "LMDB B-tree pages are referenced more than once"


def chain(n: int) -> Shard:
    """A leaf under ``n`` branch pages of one child each."""
    s = Shard()
    p = s.leaf([(FIRST, value(FIRST, 64), False)])
    for _ in range(n):
        p = s.branch([(FIRST, p)])
    s.root, s.depth, s.entries = p, n + 1, 1
    return s


def test_depth_limit(tmp_path):
    """32 levels are read, 33 are not (LMDB's cursor stack)."""
    s = chain(31)
    path = write(tmp_path / "a.lmdb", s.image())
    assert check_shard_structure(path, os.path.getsize(path), first=FIRST, count=1) is None
    with ShardScan(path) as scan:
        assert [bytes(v) for _k, v, _n in scan.records()] == [value(FIRST, 64)]
    f = open_file(path, count=1)
    assert bytes(f.value(FIRST)) == value(FIRST, 64)
    f.close()
    s = chain(32)
    path = write(tmp_path / "b.lmdb", s.image())
    assert check_shard_structure(path, os.path.getsize(path), first=FIRST, count=1) == "LMDB B-tree deeper than 32 levels"
    assert check_shard_structure(path, os.path.getsize(path)) == "LMDB B-tree deeper than 32 levels"


@pytest.mark.parametrize("keyed", [True, False])
def test_a_branch_that_is_its_own_child(tmp_path, keyed):
    """A branch page whose only child is itself: each level is one page, and after as many levels as
    the file has pages (31 here, under LMDB's 32 levels) some page was referenced twice."""
    s = Shard()
    s.leaf([(FIRST, value(FIRST, 64), False)])
    s.alloc(27)
    r = s.alloc()
    s.node_page(r, P_BRANCH, [struct.pack("<HHHH", r, 0, 0, 0)])
    s.root, s.depth, s.entries = r, 2, 1
    assert r == 30
    d = s.image()
    path = write(tmp_path / "s.lmdb", d)
    msg = "LMDB B-tree pages are referenced more than once"
    assert check_shard_structure(path, len(d), **(dict(first=FIRST, count=1) if keyed else {})) == msg
    put(d, 4096 + PH + 72 + 6, "<H", 32)  # a scan goes as deep as the meta page says: 32 levels of one page
    path = write(tmp_path / "s.lmdb", d)
    with pytest.raises(DamagedShardError) as e:
        list(ShardScan(path).records())
    assert e.value.problem == msg
    # 31 levels: 31 references to pages of a 31-page file need not repeat one (the count alone does not
    # tell); the scan reads its leaf level, the 31st, and finds the branch page there
    put(d, 4096 + PH + 72 + 6, "<H", 31)
    path = write(tmp_path / "s.lmdb", d)
    with pytest.raises(DamagedShardError) as e:
        list(ShardScan(path).records())
    assert e.value.problem == "LMDB B-tree level mixes branch and leaf pages"
    d = s.image(extra_pages=1)  # 32 pages: 32 levels are read before the page count is passed
    path = write(tmp_path / "t.lmdb", d)
    put(d, 4096 + PH + 120, "<Q", 31)
    path = write(tmp_path / "t.lmdb", d)
    assert check_shard_structure(path, len(d)) == "LMDB B-tree deeper than 32 levels"


def test_a_record_the_tree_does_not_hold(tmp_path):
    """A lazy shard whose leaf holds fewer keys than its parent's range: the missing sample is named."""
    s = Shard()
    a = s.leaf([(FIRST + j, value(FIRST + j, 64), False) for j in range(3)])
    b = s.leaf([(FIRST + 5, value(FIRST + 5, 64), False)])  # 1003, 1004 in no leaf
    r = s.branch([(FIRST, a), (FIRST + 3, b)])
    s.root, s.depth, s.entries = r, 2, 6
    path = write(tmp_path / "s.lmdb", s.image())
    f = open_file(path, count=6)
    assert bytes(f.value(FIRST + 5)) == value(FIRST + 5, 64)
    with pytest.raises(CorruptDataError) as e:
        f.locate(FIRST + 3)
    assert str(e.value) == f"{path} sample {FIRST + 3}: record missing from its shard"
    with pytest.raises(CorruptDataError) as e:
        f.read(FIRST + 4)
    assert str(e.value) == f"{path} sample {FIRST + 4}: record missing from its shard"
    f.close()
    assert check_shard_structure(path, os.path.getsize(path), first=FIRST, count=6) == "LMDB file holds 4 records, the manifest says 6"


# -- a file that changes, a file closed ----------------------------------------------------------
class Cutter(Recorder):
    """A Filler that cuts the file to ``keep`` bytes the ``at``-th time it is asked to fill."""

    def __init__(self, path: Path, at: int, keep: int) -> None:
        super().__init__()
        self.path, self.at, self.keep = path, at, keep

    def fill(self, ranges, *, wait: bool) -> None:
        super().fill(ranges, wait=wait)
        if len(self.fills) == self.at:
            os.truncate(self.path, self.keep)


def test_a_file_cut_while_its_tree_is_read(tmp_path):
    msg = "the file is shorter than its LMDB meta page says (it changed while being read)"
    s = built(True)
    for at, keep in [(1, 100), (2, 4096 + 100), (3, 0), (5, s.levels[3][0] * 4096)]:
        path = write(tmp_path / "s.lmdb", s.image())
        with pytest.raises(DamagedShardError) as e:
            open_file(path, Cutter(path, at, keep))
        assert e.value.problem == msg, at


def test_a_file_cut_after_it_was_opened(tmp_path):
    s = built(True)
    path = write(tmp_path / "s.lmdb", s.image())
    f = open_file(path)
    i = next(i for i in range(FIRST, FIRST + N) if s.recs[i][2] is not None)
    os.truncate(path, s.recs[i][0])  # just before the value: its header is still there
    msg = f"{path}: shard became shorter while open; it was truncated or replaced (run `fastload verify`)"
    with pytest.raises(CorruptDataError) as e:
        f.read(i)
    assert str(e.value) == msg
    buf = np.zeros(30000, dtype=np.uint8)
    for pos in (0, 3):
        with pytest.raises(CorruptDataError) as e:
            f.read_into(i, buf, pos, buf.ctypes.data)
        assert str(e.value) == msg
    drop_cached(path)
    with pytest.raises(CorruptDataError) as e:
        f.read_into(i, buf, 0, buf.ctypes.data)
    assert str(e.value) == msg
    f.close()


def test_a_lazy_file_cut_after_it_was_opened(tmp_path):
    s = built(False)
    path = write(tmp_path / "s.lmdb", s.image())
    f = open_file(path)
    os.truncate(path, 3 * 4096)
    with pytest.raises(DamagedShardError) as e:
        f.locate(FIRST)
    assert e.value.problem == "the file is shorter than its LMDB meta page says (it changed while being read)"
    f.close()


def test_a_closed_shard_file(tmp_path):
    """Every read of a closed file says so (and so does locating a record); willneed of records
    located already and evict do nothing."""
    for big in (False, True):
        s = built(big)
        path = write(tmp_path / "s.lmdb", s.image())
        rec = Recorder()
        f = open_file(path, rec)
        f.locate(FIRST)
        f.close()
        msg = f"{path}: shard file was closed (fastload.store.close_shared()); open the dataset again"
        buf = np.zeros(30000, dtype=np.uint8)
        calls = [lambda: f.read(FIRST), lambda: f.read_into(FIRST, buf, 0, buf.ctypes.data), lambda: f.pread(0, 10, FIRST),
                 lambda: f.read(FIRST, 8)]  # fmt: skip
        if not big:  # a record not located yet (every one is, in a shard of overflow records)
            calls += [lambda: f.locate(FIRST + 29), lambda: f.willneed([FIRST + 29])]
        for call in calls:
            with pytest.raises(FormatError) as e:
                call()
            assert str(e.value) == msg
        rec.fills.clear()
        f.willneed([FIRST])
        f.evict([FIRST, FIRST + 1])
        assert (rec.fills, rec.drops) == ([], [])


# -- a file LMDB wrote ---------------------------------------------------------------------------
def test_a_shard_lmdb_wrote_itself(tmp_path):
    """Records put by the ``lmdb`` package (not in key order, small and large), read back: each value
    at the place a search of the file's bytes finds it; the tree three levels deep by LMDB's own stat."""
    lmdb = pytest.importorskip("lmdb")
    n = 9000
    sizes = {i: (5000 + i % 7 * 1000 if i % 97 == 0 else 40 + i % 23) for i in range(n)}
    path = tmp_path / "l.lmdb"
    env = lmdb.open(str(path), subdir=False, map_size=1 << 28, lock=False)
    with env.begin(write=True) as txn:
        for i in sorted(range(n), key=lambda i: (i * 7919) % n):
            txn.put(key(FIRST + i), value(FIRST + i, sizes[i]))
    depth = env.stat()["depth"]
    env.close()
    assert depth >= 3
    data = path.read_bytes()
    size = len(data)
    assert check_shard_structure(path, size, first=FIRST, count=n) is None
    f = open_file(path, count=n)
    assert f.lazy is False
    buf = np.zeros(20000, dtype=np.uint8)
    for i in list(range(0, n, 101)) + [j for j in range(0, n, 97)]:
        v = value(FIRST + i, sizes[i])
        found, at = [], data.find(v)
        while at >= 0:  # LMDB leaves old copies of pages it split in the file
            found.append(at)
            at = data.find(v, at + 1)
        off, m = f.locate(FIRST + i)
        assert off in found and m == len(v)
        start, m = f.read_into(FIRST + i, buf, 1, buf.ctypes.data)
        assert bytes(buf[start : start + m]) == v
    f.close()
    with ShardScan(path, size) as scan:
        ks = [bytes(k) for k, _v, _n in scan.records(head=8)]
    assert ks == [key(FIRST + i) for i in range(n)]


# -- one ShardFile per file per process ----------------------------------------------------------
def test_open_shard_file_shares_one_open_file_per_file_and_range(tmp_path):
    """The same (path, identity, first, count) gives the same object until it is closed; another
    range is another object; nothing is left in the table of files being opened."""
    s = built(False)
    path = str(write(tmp_path / "s.lmdb", s.image()))
    ident = file_identity(os.stat(path))
    a = btree.open_shard_file(path, ident, first=FIRST, count=N)
    assert btree.open_shard_file(path, ident, first=FIRST, count=N) is a
    assert (a.path, a.first, a.count, a.closed) == (path, FIRST, N, False)
    assert bytes(a.value(FIRST + 7)) == value(FIRST + 7, s.recs[FIRST + 7][1])
    with pytest.raises(DamagedShardError) as e:
        btree.open_shard_file(path, ident, first=FIRST, count=N - 1)
    assert e.value.problem == f"LMDB file holds {N} records, the manifest says {N - 1}"
    assert btree._OPENING == {}
    a.close()
    b = btree.open_shard_file(path, ident, first=FIRST, count=N)
    assert b is not a and not b.closed
    assert btree.open_shard_file(path, ident, first=FIRST, count=N) is b
    btree.close_shared()
    assert b.closed
    c = btree.open_shard_file(path, ident, first=FIRST, count=N)
    assert c is not b and bytes(c.value(FIRST)) == value(FIRST, s.recs[FIRST][1])
    btree.close_shared()


def test_a_shard_file_that_is_not_the_one_described(tmp_path):
    """An identity (inode, size, mtime) that is not the file's: ESTALE, the reason, the path."""
    s = built(False)
    path = str(write(tmp_path / "s.lmdb", s.image()))
    ino, size, mtime = file_identity(os.stat(path))
    for ident in ((ino, size + 1, mtime), (ino, size, mtime + 1), (ino + 1, size, mtime)):
        with pytest.raises(btree.UnusableFileError) as e:
            ShardFile(path, ident, first=FIRST, count=N)
        assert (e.value.errno, e.value.strerror, e.value.filename) == (errno.ESTALE, "was replaced while being opened; try again", path)
    # with a filler the mtime is not part of it (a sparse copy being filled changes it)
    f = ShardFile(path, (ino, size, 0), first=FIRST, count=N, filler=Recorder())
    f.close()
    with pytest.raises(btree.UnusableFileError):
        ShardFile(path, (ino, size, mtime), first=FIRST, count=N, filler=Recorder())


def test_a_scan_closes_its_file(tmp_path):
    s = built(True)
    path = write(tmp_path / "s.lmdb", s.image())
    scan = ShardScan(path)
    fd = scan._fd
    os.fstat(fd)
    scan.close()
    with pytest.raises(OSError) as e:
        os.fstat(fd)
    assert e.value.errno == errno.EBADF
    scan.close()


@pytest.mark.parametrize("head", [5, 16384, 16385])
def test_read_with_a_head_at_the_split_size(tmp_path, head):
    """Values of 16383, 16384 and 16385 bytes: only one over max(head, 16384) is cut to its head."""
    s = Shard()
    s.tree([(j, value(j, 16383 + j), True) for j in range(3)], [3], 2)
    f = open_file(write(tmp_path / "s.lmdb", s.image()), first=0, count=3)
    for j in range(3):
        n = 16383 + j
        b, n2, off = f.read(j, head)
        cut = head if n > max(head, 16384) else n
        assert (bytes(b), n2, off) == (value(j, n)[:cut], n, s.recs[j][0])
    f.close()


def test_a_one_page_tree(tmp_path):
    """A tree of one leaf (depth 1), read lazily, scanned, checked."""
    s = Shard()
    s.tree(items(False, 5), [5], 2)
    assert s.depth == 1
    path = write(tmp_path / "s.lmdb", s.image())
    f = open_file(path, count=5)
    assert f.lazy
    assert [bytes(f.value(i)) for i in range(FIRST, FIRST + 5)] == [v for _k, v, _b in items(False, 5)]
    f.close()
    with ShardScan(path) as scan:
        assert [bytes(k) for k, _v, _n in scan.records()] == [key(i) for i in range(FIRST, FIRST + 5)]
    assert check_shard_structure(path, os.path.getsize(path), first=FIRST, count=5) is None


def test_page_numbers_above_16_bits(tmp_path):
    """A branch node's child page number is lo | hi << 16 | flags << 32: a leaf at page 65538 (a
    sparse file of 512-byte pages), the last page of the file, is found."""
    s = Shard(512)
    r = s.alloc()
    s.next = 65538
    leaf = s.leaf([(FIRST + j, value(FIRST + j, 100), False) for j in range(3)])
    nodes = [struct.pack("<HHHH", leaf & 0xFFFF, leaf >> 16, 0, 0)]
    s.node_page(r, P_BRANCH, nodes)
    s.branches.append(r)
    s.root, s.depth, s.entries = r, 2, 3
    assert (leaf, s.next - 1) == (65538, 65538)
    path = tmp_path / "s.lmdb"
    with open(path, "wb") as out:  # sparse: only the pages written take room
        for p, buf in sorted(s.pages.items()) + [(0, s.meta(0, 1, root=INVALID, depth=0, entries=0, last=1, overflow=0)),
                                                  (1, s.meta(1, 2, root=r, depth=2, entries=3, last=leaf, overflow=0))]:  # fmt: skip
            out.seek(p * 512)
            out.write(buf)
    assert os.path.getsize(path) == 65539 * 512
    assert check_shard_structure(path, 65539 * 512, first=FIRST, count=3) is None
    f = open_file(path, count=3)
    assert [bytes(f.value(FIRST + j)) for j in range(3)] == [value(FIRST + j, 100) for j in range(3)]
    assert f.locate(FIRST)[0] // 512 == 65538
    f.close()
    with ShardScan(path) as scan:
        assert len(list(scan.records())) == 3


def test_page_numbers_above_32_bits(tmp_path):
    """The high part of a child's page number is mn_flags << 32: a leaf at page 2**32 + 1 (a sparse
    file of 512-byte pages, 2 TiB), the last page of the file, is found."""
    s = Shard(512)
    r = s.alloc()
    s.next = 2**32 + 1
    leaf = s.leaf([(FIRST + j, value(FIRST + j, 100), False) for j in range(3)])
    s.node_page(r, P_BRANCH, [struct.pack("<HHHH", leaf & 0xFFFF, (leaf >> 16) & 0xFFFF, leaf >> 32, 0)])
    s.branches.append(r)
    assert leaf == 2**32 + 1 and struct.unpack_from("<HHH", s.pages[r], s.nodes[r][0]) == (1, 0, 1)
    path = tmp_path / "s.lmdb"
    size = (leaf + 1) * 512
    try:
        with open(path, "wb") as out:  # sparse: only the pages written take room
            for p, buf in sorted(s.pages.items()) + [(0, s.meta(0, 1, root=INVALID, depth=0, entries=0, last=1, overflow=0)),
                                                      (1, s.meta(1, 2, root=r, depth=2, entries=3, last=leaf, overflow=0))]:  # fmt: skip
                out.seek(p * 512)
                out.write(buf)
    except OSError as e:
        if e.errno != errno.EFBIG:
            raise
        pytest.skip("this file system has no files of 2 TiB")
    assert os.path.getsize(path) == size
    assert check_shard_structure(path, size, first=FIRST, count=3) is None
    f = open_file(path, count=3)
    assert [bytes(f.value(FIRST + j)) for j in range(3)] == [value(FIRST + j, 100) for j in range(3)]
    assert f.locate(FIRST)[0] // 512 == leaf
    f.close()
    with ShardScan(path) as scan:
        assert [bytes(v) for _k, v, _n in scan.records()] == [value(FIRST + j, 100) for j in range(3)]


def test_a_scan_given_descriptor_0_closes_it(tmp_path):
    """In a process whose standard input is closed, a scan's file gets descriptor 0 (the lowest free):
    closing the scan closes it."""
    path = write(tmp_path / "s.lmdb", built(True).image())
    saved = os.dup(0)
    try:
        os.close(0)
        scan = ShardScan(path)
        try:
            assert scan._fd == 0
        finally:
            scan.close()
        with pytest.raises(OSError) as e:
            os.fstat(0)
        assert e.value.errno == errno.EBADF
    finally:
        os.dup2(saved, 0)
        os.close(saved)


def test_a_record_of_no_bytes_is_missing(tmp_path):
    """A record whose value is empty (fastload writes none: a value holds a 40-byte header) is
    never taken as located: reading it says it is missing, in an eager shard as in a lazy one."""
    for big in (True, False):
        s = Shard()
        its = [(FIRST, value(FIRST, 5000 if big else 50), big), (FIRST + 1, b"", False), (FIRST + 2, value(FIRST + 2, 60), False)]
        s.tree(its, [3], 2)
        path = write(tmp_path / "z.lmdb", s.image())
        f = open_file(path, count=3)
        assert f.lazy is not big
        assert bytes(f.value(FIRST + 2)) == value(FIRST + 2, 60)
        with pytest.raises(CorruptDataError) as e:
            f.locate(FIRST + 1)
        assert str(e.value) == f"{path} sample {FIRST + 1}: record missing from its shard"
        f.close()


def test_a_descriptor_that_cannot_be_read(tmp_path, monkeypatch):
    """A read that fails (the shard's descriptor made to refer to a directory) is named with the
    system's reason: by the tree's page reads and by read and read_into. (preadv2 of a directory
    fails with EOPNOTSUPP, which marks RWF_NOWAIT unavailable: on a flag of this test's own, not the
    process's.)"""
    monkeypatch.setattr(files, "_NOWAIT_OK", [True])
    for big in (False, True):
        s = built(big)
        path = write(tmp_path / "s.lmdb", s.image())
        f = open_file(path)
        d = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
        os.dup2(d, f._fd)
        os.close(d)
        i = FIRST + 9
        buf = np.zeros(30000, dtype=np.uint8)
        if not big:
            with pytest.raises(DamagedShardError) as e:
                f.locate(i)
            assert e.value.problem == "cannot read the file (Is a directory)"
            f._len[i - FIRST], f._off[i - FIRST] = s.recs[i][1], s.recs[i][0]  # as if located before
        for call in (lambda: f.read(i), lambda: f.read_into(i, buf, 0, buf.ctypes.data)):
            with pytest.raises(CorruptDataError) as e:
                call()
            assert str(e.value) == f"{path} sample {i}: cannot read it (Is a directory)"
        f.close()
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        with pytest.raises(btree._Damage) as e:
            btree._Tree(fd, 8192, None)
        assert e.value.args[0] == "cannot read the file (Is a directory)"
    finally:
        os.close(fd)


class Gate(Recorder):
    """A Filler whose first fill waits until it is let go: a file being opened slowly."""

    def __init__(self) -> None:
        super().__init__()
        self.entered, self.go = threading.Event(), threading.Event()

    def fill(self, ranges, *, wait: bool) -> None:
        if not self.entered.is_set():
            self.entered.set()
            assert self.go.wait(10)
        super().fill(ranges, wait=wait)


def gated_shard(tmp_path) -> tuple[str, tuple[int, int, int], Gate]:
    """A shard file, its identity and a Gate for two threads to open it at once."""
    path = str(write(tmp_path / "s.lmdb", built(True).image()))
    st = os.stat(path)
    return path, (st.st_ino, st.st_size, 0), Gate()


def race(opener, gate: Gate) -> None:
    """``opener(0)`` in a thread held inside its opening, ``opener(1)`` in another that then waits for it,
    then both let go and joined."""
    a = threading.Thread(target=opener, args=(0,))
    a.start()
    assert gate.entered.wait(10)
    b = threading.Thread(target=opener, args=(1,))
    b.start()
    time.sleep(0.3)  # b is waiting for a's opening to finish
    gate.go.set()
    a.join(10), b.join(10)


def test_threads_opening_one_file_at_once_share_it(tmp_path):
    """While one thread opens (and checks) a shard, another asking for it waits and gets the same one."""
    path, ident, gate = gated_shard(tmp_path)
    got: list = [None, None]

    def opener(j):
        got[j] = btree.open_shard_file(path, ident, first=FIRST, count=N, filler=gate)

    race(opener, gate)
    assert got[0] is got[1] and got[0] is not None
    assert btree._OPENING == {}
    btree.close_shared()


@pytest.mark.parametrize("head", [0, 5])
def test_read_asks_the_filler_for_the_whole_value_then_reads_it(tmp_path, head):
    """With a Filler, read asks for the value's whole range (with its overflow header) at once and
    waits, then for the part it reads (all of it, or with a head the header and the head)."""
    s = built(True)
    rec = Recorder()
    f = open_file(write(tmp_path / "s.lmdb", s.image()), rec)
    for i in range(FIRST, FIRST + N):
        off, n, ov = s.recs[i]
        extra = PH if ov is not None else 0
        rec.fills.clear()
        b, _n, _off = f.read(i, head)
        part = head if head and n > max(head, 16384) else n
        assert rec.fills == [([(off - extra, n + extra)], True), ([(off - extra, part + extra)], True)]
        assert bytes(b) == value(i, n)[:part]
    rec.fills.clear()
    buf = np.zeros(30000, dtype=np.uint8)
    off, n, _ov = s.recs[FIRST + 4]
    f.read_into(FIRST + 4, buf, 0, buf.ctypes.data)
    assert rec.fills == [([(off - PH, n + PH)], True)]
    f.close()


# -- what the advice to the page cache leaves in it ----------------------------------------------
def resident_pages(path: Path) -> set[int]:
    """The pages of ``path`` the page cache holds now: mincore of a private map of it, written here
    (a map's pages are not read until touched, and these are never touched)."""
    size = os.path.getsize(path)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    vec = np.zeros(-(-size // mmap.PAGESIZE), dtype=np.uint8)
    with open(path, "rb") as f, mmap.mmap(f.fileno(), size, access=mmap.ACCESS_COPY) as m:
        cell = ctypes.c_char.from_buffer(m)
        rc = libc.mincore(ctypes.c_void_p(ctypes.addressof(cell)), size, vec.ctypes.data_as(ctypes.c_void_p))
        del cell
    assert rc == 0, os.strerror(ctypes.get_errno())
    return {int(p) for p in np.flatnonzero(vec & 1)}


def cold(path: Path) -> None:
    """Drop ``path`` from the page cache (again while a read the kernel started is still in flight: its pages
    are dropped once read), or skip where this file system keeps it (tmpfs)."""
    for _ in range(100):
        drop_cached(path)
        if not resident_pages(path):
            return
        time.sleep(0.01)
    pytest.skip("the page cache keeps this file system's pages")


def settled(path: Path, want: set[int], wait: float = 5.0) -> set[int]:
    """The resident pages of ``path`` once they are ``want`` (advice is carried out in the background), or
    after ``wait`` seconds whatever they are."""
    end = time.monotonic() + wait
    while (got := resident_pages(path)) != want and time.monotonic() < end:
        time.sleep(0.01)
    return got


@pytest.mark.parametrize("big", [False, True], ids=["small", "big"])
def test_a_structure_check_leaves_only_the_pages_it_checks_in_the_page_cache(tmp_path, big):
    """check_shard_structure reads the two meta pages, then the branch and leaf pages, each asked for
    exactly (POSIX_FADV_WILLNEED) before it is read, on a descriptor with the kernel's default read-ahead:
    a cold file holds those pages afterwards and no other, no overflow page (pages 2 and 3 of the big
    shard: its first overflow value's) and none of the unused pages at the end."""
    assert mmap.PAGESIZE == 4096
    s = built(big)
    path = write(tmp_path / "s.lmdb", s.image(extra_pages=8))
    cold(path)
    assert check_shard_structure(path, os.path.getsize(path), first=FIRST, count=N) is None
    want = {0, 1, *s.branches, *(p for p, _ks in s.leaves)}
    assert (s.recs[FIRST + 1][2] == 2) is big and len(want) == 2 + 7 + 12
    assert settled(path, want, 0.3) == want


@pytest.mark.parametrize("n, pages", [(20000, 5), (20454, 5), (20474, 6)])
def test_read_with_a_head_has_the_kernel_read_the_whole_value(tmp_path, n, pages):
    """read(i, head) of a value over 16384 bytes reads only the head, having asked for the whole value
    with its overflow header (POSIX_FADV_WILLNEED: the rest is read with pread next, from the page cache):
    on a cold file its overflow pages (from page 2) come into the page cache, and nothing else, not the
    next record's first page (the shard's descriptor reads no more than it is asked: FADV_RANDOM).
    16 + 20454 bytes end 10 bytes before a page's end; 16 + 20474, 10 bytes into the sixth page."""
    assert mmap.PAGESIZE == 4096
    s = Shard()
    s.tree([(FIRST, value(FIRST, n), True), (FIRST + 1, value(FIRST + 1, 5000), True)], [2], 2)
    assert (s.recs[FIRST][2], s.recs[FIRST + 1][2]) == (2, 2 + pages)
    path = write(tmp_path / "s.lmdb", s.image(extra_pages=8))
    f = open_file(path, count=2)  # its tree was read now
    cold(path)
    b, n2, off = f.read(FIRST, 5)
    assert (bytes(b), n2, off) == (value(FIRST, n)[:5], n, 2 * 4096 + PH)
    want = set(range(2, 2 + pages))
    assert settled(path, want) == want
    f.close()


def test_willneed_has_the_kernel_read_exactly_the_records_asked_for(tmp_path):
    """willneed of one record in overflow pages (20000 bytes, five pages) on a cold file: those five pages
    come into the page cache, nothing else."""
    assert mmap.PAGESIZE == 4096
    s = built(True)
    path = write(tmp_path / "s.lmdb", s.image(extra_pages=8))
    f = open_file(path)
    off, n, ov = s.recs[FIRST + 4]
    assert n == 20000
    cold(path)
    f.willneed([FIRST + 4])
    want = set(range(ov, ov + 5))
    assert settled(path, want) == want
    f.close()


def test_iter_headers_reads_only_the_first_page_of_each_record_in_overflow_pages(tmp_path):
    """iter_headers gives each record's header (fastload records: label j, width 10 + j), reading of a
    record in overflow pages only its header: on a cold file, the meta, branch and leaf pages and the
    first overflow page of each such record come into the page cache, not their other pages."""
    assert mmap.PAGESIZE == 4096
    sizes = [20000, 9000, 300, 5000, 100, 12000]
    recs = [encode_record(bytes(n), label=j, encoding=ENC_JPEG, width=10 + j, height=20, orig_width=10 + j, orig_height=20)
            for j, n in enumerate(sizes)]  # fmt: skip
    s = Shard()
    s.tree([(FIRST + j, r, len(r) > 2000) for j, r in enumerate(recs)], [3], 2)
    path = write(tmp_path / "h.lmdb", s.image(extra_pages=8))
    cold(path)
    got = [(i, h.label, h.width, h.payload_len) for i, h in iter_headers(path)]
    assert got == [(FIRST + j, j, 10 + j, n) for j, n in enumerate(sizes)]
    firsts = {ov for _o, _n, ov in s.recs.values() if ov is not None}
    assert len(firsts) == 4
    want = {0, 1, *s.branches, *(p for p, _ks in s.leaves), *firsts}
    assert settled(path, want, 0.3) == want


def test_read_into_of_a_record_whose_first_page_only_is_cached(tmp_path, monkeypatch):
    """The value's first overflow page in the page cache, the others not: preadv2(RWF_NOWAIT) copies that
    page (4096 bytes, seen by calling nowait_read alone first), preadv reads the rest from where it
    stopped into the buffer where it stopped: the value's bytes, nothing written before ``pos`` or after
    the value. (On a flag of this test's own: another test may have met a descriptor without RWF_NOWAIT.)"""
    monkeypatch.setattr(files, "_NOWAIT_OK", [True])
    assert mmap.PAGESIZE == 4096
    s = built(True)
    path = write(tmp_path / "s.lmdb", s.image())
    f = open_file(path)
    fd = os.open(path, os.O_RDONLY)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)  # reads of this descriptor read only what they ask
    pos = 7
    try:
        seen = 0
        for i in range(FIRST, FIRST + N):
            off, n, ov = s.recs[i]
            if ov is None or PH + n <= 4096:
                continue
            total = PH + n
            probe = np.zeros(total, dtype=np.uint8)
            for _attempt in range(5):  # the kernel may bring the next page in meanwhile (read-ahead of a busy disk)
                cold(path)
                os.pread(fd, 4096, ov * 4096)
                assert resident_pages(path) == {ov}
                if files.nowait_read(fd, probe.ctypes.data, total, ov * 4096) == 4096:
                    break
            else:
                pytest.skip("the page cache kept bringing in more than the page read: RWF_NOWAIT cannot be seen here")
            cold(path)
            os.pread(fd, 4096, ov * 4096)
            buf = np.full(pos + total + 64, 0xEE, dtype=np.uint8)
            assert f.read_into(i, buf, pos, buf.ctypes.data) == (pos + PH, n)
            assert bytes(buf[pos + PH : pos + total]) == value(i, n)
            assert struct.unpack_from("<QHHI", buf, pos) == (ov, 0, P_OVERFLOW, -(-total // 4096))
            assert set(buf[:pos]) == {0xEE} and set(buf[pos + total :]) == {0xEE}
            seen += 1
        assert seen == 13  # the values of 5000, 9000 and 20000 bytes
    finally:
        os.close(fd)
        f.close()


# -- sizes of 64 KiB and more, forks, threads ------------------------------------------------------
def test_values_of_64_kib_and_more(tmp_path):
    """A leaf node's value size is mn_lo | mn_hi << 16: values of 65535, 65536 and 100000 bytes (mn_hi 0,
    1 and 1) are located, read and scanned whole."""
    sizes = [65535, 65536, 100000]
    s = Shard()
    s.tree([(FIRST + j, value(FIRST + j, n), True) for j, n in enumerate(sizes)], [3], 2)
    path = write(tmp_path / "s.lmdb", s.image())
    f = open_file(path, count=3)
    for j, n in enumerate(sizes):
        i = FIRST + j
        assert f.locate(i) == (s.recs[i][0], n)
        b, n2, _off = f.read(i)
        assert (bytes(b), n2) == (value(i, n), n)
    f.close()
    with ShardScan(path) as scan:
        got = [(bytes(k), bytes(v), n) for k, v, n in scan.records()]
    assert got == [(key(FIRST + j), value(FIRST + j, n), n) for j, n in enumerate(sizes)]


def test_a_child_of_fork_locates_records_though_the_parent_held_the_files_lock(tmp_path):
    """A lazy shard's lock, held in the parent at the fork (as by a thread that does not exist in the
    child), is never released in the child: the child takes a lock of its own and reads a record not
    located before as the parent would. (The child is stopped after 5 s: a wait for the parent's lock.)"""
    s = built(False)
    f = open_file(write(tmp_path / "s.lmdb", s.image()))
    assert f.lazy and bytes(f.value(FIRST)) == value(FIRST, s.recs[FIRST][1])  # this process has used the lock
    i = FIRST + N - 1  # in the last leaf, under other branches
    want = value(i, s.recs[i][1])
    r, w = os.pipe()
    with f._lock:
        pid = os.fork()
        if pid == 0:  # the child
            try:
                os.close(r)
                signal.alarm(5)
                os.write(w, b"same" if bytes(f.value(i)) == want else b"other")
            finally:
                os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as rf:
        got = rf.read()
    os.waitpid(pid, 0)
    assert got == b"same"
    assert bytes(f.value(i)) == want  # and the parent's lock was not broken meanwhile
    f.close()


def test_the_fork_handler_gives_the_child_locks_no_thread_holds(tmp_path, monkeypatch):
    """In the child of a fork, a lock that a thread of the parent held (the table's, or the lock of a
    file being opened) would never be released: the handler registered with os.register_at_fork
    replaces the table's lock and forgets the files being opened. Called here as fork calls it in the
    child, both locks held by this thread: a file is then opened (in a thread, given 10 s)."""
    monkeypatch.setattr(btree, "_FILES_LOCK", btree._FILES_LOCK)  # the process's lock, restored afterwards
    s = built(False)
    path = str(write(tmp_path / "s.lmdb", s.image()))
    ident = file_identity(os.stat(path))
    table, opening = btree._FILES_LOCK, threading.Lock()
    monkeypatch.setitem(btree._OPENING, (path, ident, FIRST, N), opening)
    got: list = []

    def opener():
        got.append(btree.open_shard_file(path, ident, first=FIRST, count=N))

    with table, opening:
        btree._after_fork()
        assert btree._OPENING == {}
        t = threading.Thread(target=opener, daemon=True)
        t.start()
        t.join(10)
        assert len(got) == 1 and bytes(got[0].value(FIRST + 3)) == value(FIRST + 3, s.recs[FIRST + 3][1])
    btree.close_shared()


def test_threads_opening_a_damaged_file_at_once_both_say_why(tmp_path):
    """While one thread opens a shard that proves damaged, another asking for it waits; the first fails
    and leaves nothing behind, the second then opens it itself and fails the same way; nothing is left
    in the table of files being opened."""
    path, ident, gate = gated_shard(tmp_path)
    got: list = [None, None]

    def opener(j):
        try:
            btree.open_shard_file(path, ident, first=FIRST, count=N - 1, filler=gate)
        except Exception as e:  # noqa: BLE001 (what each thread met, checked below)
            got[j] = e

    race(opener, gate)
    want = f"LMDB file holds {N} records, the manifest says {N - 1}"
    assert [type(e) for e in got] == [DamagedShardError, DamagedShardError]
    assert [e.problem for e in got] == [want, want]
    assert btree._OPENING == {}
