"""The LMDB B-tree of a shard file, read with ``pread`` and checked page by page: random access to its records.

Everything that reads records of a finished shard goes through here: :class:`fastload.Dataset`
(through :class:`ShardFile`, one per file per process: :func:`open_shard_file`) and the
structure check before a scan (:func:`check_shard_structure`).
"""

from __future__ import annotations

import bisect
import errno
import os
import struct
import threading
import weakref
from typing import Iterator, Protocol, Sequence

import numpy as np

from ..errors import CorruptDataError, FormatError
from .files import (
    FADV_DONTNEED,
    FADV_RANDOM,
    FADV_WILLNEED,
    UnusableFileError,
    advise,
    close_fd,
    file_identity,
    file_problem,
    nowait_read,
    open_regular,
)


# -- LMDB structure ----------------------------------------------------------------------------
# LMDB trusts its own pages: a flipped bit in a page's node-offset table or a node's size makes
# it read outside the file through its mmap, which kills the process with SIGBUS (or SIGSEGV),
# and a flipped page number can hand back another sample's bytes. fastload therefore reads the
# B-tree itself, with pread (never through a map: a short read is an error, not a signal), and
# checks every page before it uses anything in it: page numbers, node-offset tables, node and
# key sizes, that each value (inline or in overflow pages) lies inside the file, that the keys
# are the manifest's sample indices, and (for records in overflow pages) that no two records
# share overflow pages. Layout: lmdb.h/mdb.c of LMDB 0.9 on 64-bit platforms.
#
# How much of a shard that reads before its first record (docs/loader.md, "Reading"):
# * a shard whose records sit in overflow pages (values above ~2 KB: photos) is walked once, in
#   full, when it is opened: its branch and leaf pages only, about 0.03 % of a shard of 100 KB
#   records. Only the whole tree shows that no other record points into a record's pages.
# * a shard whose meta page counts no overflow pages (all records inside leaf pages) is checked
#   lazily: the meta pages when it is opened, then the pages on the path to each record, once.
# Pages are read with an exact POSIX_FADV_WILLNEED first, so the kernel reads them (in parallel)
# and nothing around them.
_LMDB_MAGIC = 0xBEEFC0DE
_P_BRANCH, _P_LEAF, _P_OVERFLOW, _P_META = 0x01, 0x02, 0x04, 0x08
_F_BIGDATA = 0x01
_P_INVALID = 2**64 - 1
_PAGEHDR = 16  # mp_pgno u64 | mp_pad u16 | mp_flags u16 | mp_lower u16 | mp_upper u16 (overflow: mp_pages u32)
#: Bytes :meth:`ShardFile.read_into` may need beyond a value's length (its overflow page's header).
READ_SLACK = _PAGEHDR
_NODEHDR = 8  # mn_lo u16 | mn_hi u16 | mn_flags u16 | mn_ksize u16
_PAGE = struct.Struct("<Q2xHHH")  # pgno, flags, lower, upper
_OVPAGE = struct.Struct("<Q2xHI")  # pgno, flags, pages
_NODE = struct.Struct("<HHHH")  # lo, hi, flags, ksize
_KEY = struct.Struct(">Q")  # fastload's keys: the sample index, big-endian
_U64 = struct.Struct("<Q")
# magic, version, address, mapsize, FREE db (skipped), MAIN db (pad, flags, depth, branch_pages,
# leaf_pages, overflow_pages, entries, root), last_pg, txnid
_META = struct.Struct("<IIQQ48xIHHQQQQQQQ")
_MAX_DEPTH = 32  # LMDB's CURSOR_STACK
_SPLIT_MIN = 16384  # values above this may be read in two parts (see ShardFile.read)
_SCAN_PAGES = 32  # leaf pages a ShardScan reads at a time


class Filler(Protocol):
    """What fills a shard file that is only partly on disk (a sparse copy of an object in a store).

    :class:`ShardFile` calls :meth:`fill` before it reads any byte range (``wait=True``: the bytes
    must be in the file when it returns) and when records are announced ahead
    (:meth:`ShardFile.willneed`: ``wait=False``), and :meth:`drop` when their pages are no longer
    wanted (:meth:`ShardFile.evict`). ``ranges`` are ``(offset, length)`` pairs.
    """

    def fill(self, ranges: Sequence[tuple[int, int]], *, wait: bool) -> None: ...

    def drop(self, ranges: Sequence[tuple[int, int]]) -> None: ...


class _Damage(Exception):
    """A structural problem of a shard file; ``args[0]`` says what, for a message."""


class DamagedShardError(CorruptDataError):
    """A shard file whose LMDB structure is damaged: ``"<path>: damaged shard (<problem>)"``."""

    def __init__(self, path: str, problem: str) -> None:
        super().__init__(f"{path}: damaged shard ({problem})")
        self.path = path
        self.problem = problem


class _Tree:
    """The LMDB B-tree of one open shard file, read with ``pread`` and checked page by page.

    Raises :class:`_Damage` for anything that is not a well-formed fastload shard: from the
    constructor (meta pages), :meth:`walk` (every branch and leaf page) and :meth:`branch` /
    :meth:`leaf` (one page). ``keys`` is ``(first, count)`` from the manifest, or None when it is
    not known (then keys are not checked).
    """

    def __init__(self, fd: int, size: int, keys: tuple[int, int] | None, filler: "Filler | None" = None) -> None:
        self.fd, self.size, self.keys, self.filler = fd, size, keys, filler
        self.bytes_read = 0
        if keys is not None:
            self.keys_problem = f"LMDB keys are not the sample indices {keys[0]}..{keys[0] + keys[1] - 1}"
        if size < 2 * 512:
            raise _Damage(f"{size} bytes is too small for an LMDB file")
        head = self._pread(0, _PAGEHDR + _META.size)
        psize = struct.unpack_from("<I", head, _PAGEHDR + 24)[0]  # meta 1 sits at meta 0's page size
        metas, heads = [], []
        for off in (0, psize):
            if off + _PAGEHDR + _META.size > size:
                raise _Damage("LMDB meta page outside the file")
            b = head if off == 0 else self._pread(off, _PAGEHDR + _META.size)
            (flags,) = struct.unpack_from("<H", b, 10)
            m = _META.unpack_from(b, _PAGEHDR)
            if not flags & _P_META or m[0] != _LMDB_MAGIC or m[1] != 1:
                raise _Damage("not an LMDB file (bad meta page)")
            metas.append(m)
            heads.append(b)
        if psize < 512 or psize > 65536 or psize & (psize - 1) or struct.unpack_from("<I", heads[1], _PAGEHDR + 24)[0] != psize:
            raise _Damage(f"LMDB page size {psize} is invalid")
        meta = metas[1] if metas[0][-1] < metas[1][-1] else metas[0]  # the newer transaction, as LMDB picks
        self.psize = psize
        self.depth, self.entries, self.overflow_pages = meta[6], meta[10], meta[9]
        root, self.last = meta[-3], meta[-2]
        if (self.last + 1) * psize > size:
            raise _Damage(f"LMDB meta page says {self.last + 1} pages, the file holds {size // psize}")
        self.root: int | None = None
        if root == _P_INVALID:
            if keys and keys[1]:
                raise _Damage(f"LMDB file holds no records, the manifest says {keys[1]}")
            return
        if root > self.last:
            raise _Damage("LMDB root page is past the last page")
        if keys is not None and self.entries != keys[1]:
            raise _Damage(f"LMDB file holds {self.entries} records, the manifest says {keys[1]}")
        self.root = root

    # -- reading -------------------------------------------------------------------------------
    def _pread(self, off: int, n: int) -> bytes:
        if self.filler is not None:
            self.filler.fill([(off, n)], wait=True)
        advise(self.fd, [(off, n)], FADV_WILLNEED)  # exactly these pages: no read-around
        try:
            b = os.pread(self.fd, n, off)
        except OSError as e:
            raise _Damage(f"cannot read the file ({e.strerror or type(e).__name__})") from None
        self.bytes_read += n
        if len(b) != n:
            raise _Damage("the file is shorter than its LMDB meta page says (it changed while being read)")
        return b

    def pages(self, pgnos: list[int]) -> list[bytes]:
        """The pages ``pgnos`` (each at most ``last``), asked of the kernel all at once, then read."""
        ps = self.psize
        if self.filler is not None:
            self.filler.fill([(p * ps, ps) for p in pgnos], wait=True)
        advise(self.fd, ((p * ps, ps) for p in pgnos), FADV_WILLNEED)
        out = []
        for p in pgnos:
            try:
                b = os.pread(self.fd, ps, p * ps)
            except OSError as e:
                raise _Damage(f"cannot read the file ({e.strerror or type(e).__name__})") from None
            if len(b) != ps:
                raise _Damage("the file is shorter than its LMDB meta page says (it changed while being read)")
            out.append(b)
        self.bytes_read += ps * len(pgnos)
        return out

    # -- one page ------------------------------------------------------------------------------
    # Plain struct reads: a page holds a few to a few hundred nodes, and this runs once per page
    # a process uses (for small records, once per few records read), where NumPy's per-call
    # overhead would cost more than the work.
    def _nodes(self, page: bytes, pgno: int, want: int) -> tuple[tuple[int, ...], list[tuple[int, int, int, int]]]:
        """Node offsets and headers (lo, hi, flags, ksize) of a branch or leaf page, its node table checked."""
        pg, flags, lower, upper = _PAGE.unpack_from(page)
        kind = flags & 0x7F
        if kind != _P_BRANCH and kind != _P_LEAF:
            raise _Damage("LMDB B-tree reaches a page that is neither a branch nor a leaf")
        if kind != want:
            raise _Damage("LMDB B-tree level mixes branch and leaf pages")
        if pg != pgno:
            raise _Damage(f"LMDB page {pgno} says it is page {pg}")
        n = (lower - _PAGEHDR) >> 1
        if n < 1 or lower > upper or upper > self.psize:
            raise _Damage("LMDB page with an invalid node table")
        ptrs = struct.unpack_from(f"<{n}H", page, _PAGEHDR)
        if min(ptrs) < upper or max(ptrs) > self.psize - _NODEHDR:
            raise _Damage("LMDB node offset outside its page")
        return ptrs, [_NODE.unpack_from(page, q) for q in ptrs]

    def branch(self, pgno: int, page: bytes, lo: int, hi: int) -> tuple[list[int], list[int]]:
        """``(bounds, children)`` of a branch page whose keys must lie in ``[lo, hi)``: child ``j``
        holds keys ``bounds[j] <= k < bounds[j + 1]`` (the last one up to ``hi``)."""
        ptrs, hdrs = self._nodes(page, pgno, _P_BRANCH)
        psize, last = self.psize, self.last
        child = [a | (b << 16) | (f << 32) for a, b, f, _k in hdrs]
        if max(q + _NODEHDR + h[3] for q, h in zip(ptrs, hdrs)) > psize or max(child) > last:
            raise _Damage("LMDB branch node outside its page or pointing past the last page")
        if self.keys is None:
            return [lo] * len(child), child
        # LMDB never compares a branch page's first key: node j >= 1 holds child j's lower bound
        if any(h[3] != 8 for h in hdrs[1:]):
            raise _Damage(self.keys_problem)
        bounds = [lo] + [_KEY.unpack_from(page, q + _NODEHDR)[0] for q in ptrs[1:]]
        if bounds[-1] >= hi or any(a >= b for a, b in zip(bounds, bounds[1:])):
            raise _Damage(self.keys_problem)
        return bounds, child

    def leaf(self, pgno: int, page: bytes, lo: int, hi: int) -> tuple[int, list[int], list[int]]:
        """``(first key, value offsets, value sizes)`` of a leaf page whose keys must be consecutive
        and lie in ``[lo, hi)``. A value in overflow pages has a negative offset: ``-(offset)``,
        where ``offset`` is just after its first overflow page's header."""
        ptrs, hdrs = self._nodes(page, pgno, _P_LEAF)
        psize, last = self.psize, self.last
        if any(h[2] & ~_F_BIGDATA for h in hdrs):
            raise _Damage("LMDB leaf node with unsupported flags")
        sizes = [a | (b << 16) for a, b, _f, _k in hdrs]
        ends = [q + _NODEHDR + h[3] for q, h in zip(ptrs, hdrs)]
        if any(e + (8 if h[2] else d) > psize for e, h, d in zip(ends, hdrs, sizes)):
            raise _Damage("LMDB leaf node outside its page")
        base = pgno * psize
        offsets = []
        for e, h, d in zip(ends, hdrs, sizes):
            if h[2]:  # F_BIGDATA: the value is in overflow pages, the node holds their first page number
                ov = _U64.unpack_from(page, e)[0]
                if ov > last or ov * psize + _PAGEHDR + d > (last + 1) * psize:
                    raise _Damage("LMDB record points past the end of the file")
                offsets.append(-(ov * psize + _PAGEHDR))
            else:
                offsets.append(base + e)
        k0 = 0
        if self.keys is not None:
            if any(h[3] != 8 for h in hdrs):
                raise _Damage(self.keys_problem)
            keys = [_KEY.unpack_from(page, q + _NODEHDR)[0] for q in ptrs]
            k0 = keys[0]
            if not lo <= k0 <= hi - len(keys) or keys != list(range(k0, k0 + len(keys))):
                raise _Damage(self.keys_problem)
        return k0, offsets, sizes

    # -- the whole tree ------------------------------------------------------------------------
    def walk(self) -> list[tuple[int, list[int], list[int]]]:
        """Every leaf of the tree (see :meth:`leaf`), in key order, every branch and leaf page checked,
        and the checks only the whole tree allows: the number of records, no shared overflow pages."""
        if self.root is None:
            return []
        first, count = self.keys if self.keys is not None else (0, 2**63 - 1)
        level, seen = [(self.root, first, first + count)], 0
        leaves: list[tuple[int, list[int], list[int]]] = []
        for _depth in range(_MAX_DEPTH):
            seen += len(level)
            if seen > self.last + 1 or len({p for p, _, _ in level}) != len(level):
                raise _Damage("LMDB B-tree pages are referenced more than once")
            pages = self.pages([p for p, _, _ in level])
            if _PAGE.unpack_from(pages[0])[1] & 0x7F == _P_LEAF:
                leaves = [self.leaf(p, page, lo, hi) for (p, lo, hi), page in zip(level, pages)]
                break
            nxt: list[tuple[int, int, int]] = []
            for (p, lo, hi), page in zip(level, pages):
                bounds, child = self.branch(p, page, lo, hi)  # raises for a page of any other kind
                nxt += zip(child, bounds, bounds[1:] + [hi])
            level = nxt
        else:
            raise _Damage("LMDB B-tree deeper than 32 levels")
        offs = np.array([o for _, leaf_offs, _ in leaves for o in leaf_offs], dtype=np.int64)
        sizes = np.array([n for _, _, leaf_sizes in leaves for n in leaf_sizes], dtype=np.int64)
        big = offs < 0
        if big.any():
            start = (-offs[big] - _PAGEHDR) // self.psize
            npages = -(-(_PAGEHDR + sizes[big]) // self.psize)
            order = np.argsort(start, kind="stable")
            start, npages = start[order], npages[order]
            if (start[1:] < start[:-1] + npages[:-1]).any():
                raise _Damage("two LMDB records share overflow pages")
        if self.keys is not None and offs.size != count:
            raise _Damage(f"LMDB file holds {offs.size} records, the manifest says {count}")
        return leaves

    # -- a scan of every record -----------------------------------------------------------------
    def scan(self) -> Iterator[tuple[int, bytes, list[bytes], list[int], list[int]]]:
        """Every leaf page in key order: ``(pgno, page, its keys as stored, value offsets, value sizes)``.

        For :class:`ShardScan` (``keys`` None). Each page is checked before it is used, as by
        :meth:`walk`; the branch pages are read level by level (as deep as the meta page says:
        a page of the wrong kind at a level is damage), the leaf pages :data:`_SCAN_PAGES` at a
        time, so a scan holds a few hundred KB of pages, not the leaf level of the whole file.
        """
        if self.root is None:
            return
        if not 1 <= self.depth <= _MAX_DEPTH:
            raise _Damage(f"LMDB meta page says the B-tree is {self.depth} levels deep")
        level, seen = [(self.root, 0, 2**63 - 1)], 0
        for depth in range(1, self.depth + 1):
            seen += len(level)
            if seen > self.last + 1 or len({p for p, _, _ in level}) != len(level):
                raise _Damage("LMDB B-tree pages are referenced more than once")
            if depth == self.depth:
                break
            nxt: list[tuple[int, int, int]] = []
            for (p, lo, hi), page in zip(level, self.pages([p for p, _, _ in level])):
                bounds, child = self.branch(p, page, lo, hi)
                nxt += zip(child, bounds, bounds[1:] + [hi])
            level = nxt
        for at in range(0, len(level), _SCAN_PAGES):
            part = level[at : at + _SCAN_PAGES]
            for (p, lo, hi), page in zip(part, self.pages([p for p, _, _ in part])):
                _k0, offs, sizes = self.leaf(p, page, lo, hi)
                lower = _PAGE.unpack_from(page)[2]
                ptrs = struct.unpack_from(f"<{(lower - _PAGEHDR) >> 1}H", page, _PAGEHDR)
                # each key lies inside the page: leaf() checked where its node ends
                keys = [page[q + _NODEHDR : q + _NODEHDR + _NODE.unpack_from(page, q)[3]] for q in ptrs]
                yield p, page, keys, offs, sizes


def check_shard_structure(
    path: str | os.PathLike, size: int, *, first: int | None = None, count: int | None = None
) -> str | None:
    """Why the shard file ``path`` of ``size`` bytes cannot be read safely, or None if it can.

    Checks the meta pages and every branch and leaf page reachable from the root: page
    numbers, node-offset tables, node and key sizes, that each value (inline or in
    overflow pages) lies inside the file, and that no two records share overflow pages.
    With ``first`` and ``count`` (from the manifest), also that the keys are exactly
    ``first .. first + count - 1``, so a record can never be found under another index.
    The values themselves are checked by their header, label and CRC-32. Reads exactly
    the pages it checks (``pread``), never the records' overflow pages.
    """
    try:
        fd, st = open_regular(path)
    except OSError as e:
        return f"the file {file_problem(e)}"
    try:
        return _check_fd(fd, st, size, None if first is None or count is None else (first, count))
    finally:
        os.close(fd)


def _check_fd(fd: int, st: os.stat_result, size: int, keys: tuple[int, int] | None) -> str | None:
    if st.st_size != size:
        return f"the file is {st.st_size} bytes, expected {size} (it changed while being checked)"
    try:
        _Tree(fd, size, keys).walk()
    except _Damage as e:
        return str(e.args[0])
    return None


class ShardFile:
    """One shard file of a dataset, read with ``pread``: random access to its records' bytes.

    Opening reads and checks the meta pages (and, for a shard with records in overflow pages,
    every branch and leaf page); a shard of records inside leaf pages is checked lazily, the
    pages on the path to each record the first time it is located. Each record's place in the
    file is remembered once known (12 bytes per record located). Thread-safe; usable after
    ``fork`` (the descriptor is inherited, ``pread`` shares no file offset). Nothing is mapped,
    so reading adds nothing to the process's resident memory but the bytes it returns.

    Get one through :func:`open_shard_file` (one per file per process).

    Raises:
        DamagedShardError: (from the constructor and every method that locates records) the
            file's LMDB structure is damaged.
        OSError: the file cannot be opened, or is not the file ``identity`` describes.
    """

    def __init__(self, path: str, identity: tuple[int, int, int], *, first: int, count: int,
                 filler: "Filler | None" = None) -> None:  # fmt: skip
        self.path, self.first, self.count, self._filler = path, first, count, filler
        fd, st = open_regular(path)
        try:
            # a sparse copy being filled (``filler``) changes its mtime with every write: its inode and size say which file it is
            if (file_identity(st) if filler is None else (st.st_ino, st.st_size, 0)) != identity:
                raise UnusableFileError(errno.ESTALE, "was replaced while being opened; try again", path)
            # No read-around: this disk's read_ahead_kb may be 8 MiB, and LMDB's pages and random
            # records gain nothing from it. What is worth reading ahead, ReadAhead asks for exactly.
            advise(fd, [(0, 0)], FADV_RANDOM)
            try:
                self._tree = _Tree(fd, st.st_size, (first, count), filler)
                self.psize = self._tree.psize
                #: records in overflow pages: the whole tree is checked now, else page by page
                self.lazy = self._tree.overflow_pages == 0
                self._off = np.empty(count, dtype=np.int64)  # untouched pages cost no memory
                self._len = np.zeros(count, dtype=np.uint32)  # 0: not located yet (a value has >= 40 bytes)
                self._branches: dict[tuple[int, int, int], tuple[list[int], list[int]]] = {}
                if not self.lazy:
                    for k0, offs, sizes in self._tree.walk():
                        self._publish(k0, offs, sizes)
            except _Damage as e:
                raise DamagedShardError(path, str(e.args[0])) from None
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        self.closed = False
        self._lock, self._lock_pid = threading.Lock(), os.getpid()
        self._finalizer = weakref.finalize(self, close_fd, fd)

    @property
    def structure_bytes(self) -> int:
        """Bytes of LMDB meta, branch and leaf pages read so far (what checking the tree cost)."""
        return self._tree.bytes_read

    def close(self) -> None:
        """Close the descriptor; later reads raise :class:`~fastload.errors.FormatError`."""
        self.closed = True
        self._finalizer()

    def _publish(self, k0: int, offs: list[int], sizes: list[int]) -> None:
        j = k0 - self.first
        self._off[j : j + len(offs)] = offs  # the offsets first: a size != 0 says the entry is complete
        self._len[j : j + len(offs)] = sizes

    def _locked(self) -> threading.Lock:
        if self._lock_pid != os.getpid():  # forked: the parent's lock may have been held by a thread gone here
            self._lock, self._lock_pid = threading.Lock(), os.getpid()
        return self._lock

    def _resolve(self, indices: Sequence[int]) -> None:
        """Locate ``indices`` (global, of this shard): check and read the pages on their paths.

        Level by level, each page the paths need is read once (all of a level's pages asked
        of the kernel together) and checked against the key range its parent gives it.
        """
        tree = self._tree
        if self.closed:
            raise FormatError(f"{self.path}: shard file was closed (fastload.store.close_shared()); open the dataset again")
        if not self.lazy or tree.root is None:
            return
        try:
            if not 1 <= tree.depth <= _MAX_DEPTH:
                raise _Damage(f"LMDB meta page says the B-tree is {tree.depth} levels deep")
            top = (tree.root, self.first, self.first + self.count)
            at = dict.fromkeys(indices, top)
            for _level in range(tree.depth - 1):
                todo = list({g for g in at.values() if g not in self._branches})
                for g, page in zip(todo, tree.pages([p for p, _, _ in todo])):
                    checked = tree.branch(g[0], page, g[1], g[2])
                    with self._locked():
                        self._branches[g] = checked
                for i, g in at.items():
                    bounds, child = self._branches[g]
                    c = bisect.bisect_right(bounds, i) - 1
                    at[i] = (child[c], bounds[c], bounds[c + 1] if c + 1 < len(bounds) else g[2])
            leaves = list(set(at.values()))
            for (p, lo, hi), page in zip(leaves, tree.pages([p for p, _, _ in leaves])):
                k0, offs, sizes = tree.leaf(p, page, lo, hi)
                if min(offs) < 0:
                    raise _Damage("LMDB meta page counts no overflow pages, but records are stored in them")
                with self._locked():
                    self._publish(k0, offs, sizes)
        except _Damage as e:
            raise DamagedShardError(self.path, str(e.args[0])) from None

    def locate(self, index: int) -> tuple[int, int]:
        """``(offset, length)`` of the value of sample ``index`` in the file.

        Raises:
            CorruptDataError: the record is missing (or the structure on its path is damaged).
        """
        j = index - self.first
        n = int(self._len[j])
        if not n:
            self._resolve([index])
            n = int(self._len[j])
            if not n:
                raise CorruptDataError(f"{self.path} sample {index}: record missing from its shard")
        off = int(self._off[j])
        return (-off if off < 0 else off), n

    def _place(self, index: int) -> tuple[int, int, int]:
        """``(length, offset, extra)`` of sample ``index``'s value, located first if need be:
        ``extra`` bytes before ``offset`` are its overflow page's header (0 inside a leaf page)."""
        j = index - self.first
        n = int(self._len[j])
        if not n:
            self.locate(index)
            n = int(self._len[j])
        off = int(self._off[j])
        return (n, -off, _PAGEHDR) if off < 0 else (n, off, 0)

    def value(self, index: int) -> bytes | memoryview:
        """The stored value of sample ``index`` (a header, the source path, the payload).

        Raises:
            CorruptDataError: the record is missing, the structure on its path is damaged
                (:class:`DamagedShardError`), a read failed, or the file became shorter.
        """
        return self.read(index)[0]

    def read(self, index: int, head: int = 0) -> tuple[bytes | memoryview, int, int]:
        """``(value, length, offset)`` of sample ``index``, or with ``head``, maybe only the value's start.

        With ``head`` > 0, a value of more than :data:`_SPLIT_MIN` bytes comes back as its
        first ``head`` bytes; the caller reads the rest with :meth:`pread` straight into the
        object it keeps, saving a copy of the payload. The value's byte range is asked of the
        kernel first (``POSIX_FADV_WILLNEED``: one request of exactly its bytes if it is not
        cached, nearly free if it is), so the two reads never make two disk requests. A
        value in overflow pages is read with its first page's header, which must be that
        page's own: the record does not point into another record's pages.

        Raises:
            CorruptDataError: as :meth:`value`.
        """
        n, off, extra = self._place(index)
        if self._filler is not None:  # the whole value at once: one request, not a head and a rest
            self._filler.fill([(off - extra, n + extra)], wait=True)
        if head and n > max(head, _SPLIT_MIN):
            if not self.closed:
                advise(self._fd, [(off - extra, n + extra)], FADV_WILLNEED)
            b = self.pread(off - extra, extra + head, index)
        else:
            b = self.pread(off - extra, n + extra, index)
        if extra:
            self._check_overflow(b, off - extra, n, index)
            return memoryview(b)[extra:], n, off
        return b, n, off

    def _check_overflow(self, b: bytes | bytearray, start: int, n: int, index: int) -> None:
        pg, flags, pages = _OVPAGE.unpack_from(b)
        if pg != start // self.psize or flags & 0x7F != _P_OVERFLOW or pages < -(-(n + _PAGEHDR) // self.psize):
            raise DamagedShardError(self.path, f"the LMDB record of sample {index} points at page {start // self.psize}, "
                                               "which does not start its overflow pages")  # fmt: skip

    def pread(self, off: int, n: int, index: int) -> bytes:
        """``n`` bytes at ``off`` of the file (part of sample ``index``'s value, for messages).

        Raises:
            FormatError: the file was closed (:func:`close_shared`).
            CorruptDataError: the read failed, or the file is shorter than when it was opened.
        """
        if self.closed:
            raise FormatError(f"{self.path}: shard file was closed (fastload.store.close_shared()); open the dataset again")
        if self._filler is not None:
            self._filler.fill([(off, n)], wait=True)
        try:
            b = os.pread(self._fd, n, off)
        except OSError as e:
            raise CorruptDataError(f"{self.path} sample {index}: cannot read it ({e.strerror or type(e).__name__})") from None
        if len(b) != n:
            raise CorruptDataError(f"{self.path}: shard became shorter while open; it was truncated or replaced (run `fastload verify`)")
        return b

    def _spans(self, indices: Sequence[int]) -> list[tuple[int, int, bool]]:
        """``(start, end, in overflow pages)`` in the file of the located records among ``indices``, sorted.

        Plain Python: called for a few records of each shard a batch touches, where NumPy's
        per-call overhead would cost more than the work."""
        lens, offs, first = self._len, self._off, self.first
        out = []
        for i in indices:
            n = int(lens[i - first])
            if n:
                o = int(offs[i - first])
                out.append((-o - _PAGEHDR, -o + n, True) if o < 0 else (o, o + n, False))
        out.sort()
        return out

    def willneed(self, indices: Sequence[int]) -> None:
        """Have the kernel read the records ``indices`` (global, of this shard) into the page cache.

        Locates them first (reading the structure pages their paths need: for records
        inside leaf pages, that reads them), then asks for exactly their byte ranges, sorted,
        neighbours (at most two pages apart: LMDB puts a leaf page between records now and
        then) joined into one request, with ``POSIX_FADV_WILLNEED``: the kernel reads them
        all in parallel and this returns at once.

        Raises:
            DamagedShardError: the structure on their paths is damaged.
        """
        lens, first = self._len, self.first
        indices = [int(i) for i in indices]
        unknown = [i for i in indices if not lens[i - first]]
        if unknown:
            self._resolve(unknown)
            if self.lazy:  # their leaf pages, which hold them, were just read
                fresh = set(unknown)
                indices = [i for i in indices if i not in fresh]
        if self.closed or not indices:
            return
        ranges: list[tuple[int, int]] = []
        gap = 2 * self.psize
        for start, end, _big in self._spans(indices):
            if ranges and start <= ranges[-1][1] + gap:
                ranges[-1] = (ranges[-1][0], max(end, ranges[-1][1]))
            else:
                ranges.append((start, end))
        if self._filler is not None:
            self._filler.fill([(a, b - a) for a, b in ranges], wait=False)
        advise(self._fd, [(a, b - a) for a, b in ranges], FADV_WILLNEED)

    def evict(self, indices: Sequence[int]) -> None:
        """Drop from the page cache the pages only the records ``indices`` occupy (their overflow
        pages; records inside leaf pages share them and are left), with ``POSIX_FADV_DONTNEED``."""
        if self.closed:
            return
        ps = self.psize
        ranges = [(start, -(-(end - start) // ps) * ps) for start, end, big in self._spans([int(i) for i in indices]) if big]
        advise(self._fd, ranges, FADV_DONTNEED)
        if self._filler is not None:
            self._filler.drop(ranges)


    def read_into(self, index: int, buf: np.ndarray, pos: int, addr: int) -> tuple[int, int]:
        """Read sample ``index``'s stored value into ``buf[pos:]``; ``(where it starts in buf, length)``.

        The hot path of :meth:`fastload.Dataset.read_batch`. The value is read with one
        ``preadv2(RWF_NOWAIT)`` that keeps the GIL (:func:`nowait_read`): it copies what the
        page cache holds without giving another thread the chance to take the GIL (a thread
        that hands the GIL to a busy training loop waits up to 5 ms for it). Only what is not
        cached is read with ``os.preadv``, which releases the GIL while the disk works.
        ``buf`` (a writable uint8 array, whose data starts at address ``addr``) needs room for
        the value and :data:`READ_SLACK` bytes more.

        Raises:
            CorruptDataError: as :meth:`value`.
        """
        n, off, extra = self._place(index)
        start, total = off - extra, extra + n
        if self.closed:
            raise FormatError(f"{self.path}: shard file was closed (fastload.store.close_shared()); open the dataset again")
        if self._filler is not None:
            self._filler.fill([(start, total)], wait=True)
        got = nowait_read(self._fd, addr + pos, total, start)
        if got < total:
            got = max(got, 0)
            try:
                got += os.preadv(self._fd, [memoryview(buf)[pos + got : pos + total]], start + got)
            except OSError as e:
                raise CorruptDataError(f"{self.path} sample {index}: cannot read it ({e.strerror or type(e).__name__})") from None
            if got != total:
                raise CorruptDataError(f"{self.path}: shard became shorter while open; it was truncated or replaced (run `fastload verify`)")
        if extra:
            self._check_overflow(buf[pos : pos + extra], start, n, index)
        return pos + extra, n


class ShardScan:
    """Every record of one shard file, in key order, read with ``pread``: what ``inspect``,
    ``verify`` and a resumed pack read a whole shard with.

    Nothing is mapped: a file cut short or damaged while it is read is a
    :class:`DamagedShardError` naming it, never SIGBUS. Without the manifest's keys: the
    keys come back as stored (``verify`` names a record under the wrong index). Every page
    is checked before it is used: for a shard with records in overflow pages, the whole tree
    when it is opened (as :func:`check_shard_structure`; its branch and leaf pages are then
    read again by the scan, 0.03 % of the file); otherwise page by page as the scan reaches
    them. Each value in overflow pages is read with its first page's header, which must be
    that page's own. Close it (or use it as a context manager).

    Raises:
        DamagedShardError: (from the constructor and :meth:`records`) the file's structure is
            damaged, or it became shorter than its meta page says while it was read.
        OSError: the file cannot be opened, or is not a regular file (:class:`UnusableFileError`).
    """

    def __init__(self, path: str | os.PathLike, size: int | None = None) -> None:
        self.path = os.fspath(path)
        fd, st = open_regular(self.path)
        try:
            if size is not None and st.st_size != size:
                raise DamagedShardError(self.path, f"the file is {st.st_size} bytes, expected {size} (it changed while being checked)")
            try:
                self._tree = _Tree(fd, st.st_size, None)
                #: no record in overflow pages (the meta page counts none): checked page by page
                self.lazy = self._tree.overflow_pages == 0
                if not self.lazy:
                    self._tree.walk()
            except _Damage as e:
                raise DamagedShardError(self.path, str(e.args[0])) from None
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd

    def close(self) -> None:
        """Close the descriptor (twice is fine)."""
        fd, self._fd = self._fd, -1
        if fd >= 0:
            os.close(fd)

    def __enter__(self) -> "ShardScan":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def records(self, head: int = 0) -> Iterator[tuple[bytes, bytes | memoryview, int]]:
        """``(key as stored, value, the value's length)`` of every record, in key order.

        With ``head`` > 0, a value in overflow pages longer than ``head`` comes back as its
        first ``head`` bytes (values inside leaf pages come whole: they were read with their
        page), and the kernel is told not to read ahead: a scan of headers reads about one
        page per such record, not the file.

        Raises:
            DamagedShardError: a page or a value's overflow header is damaged, a read failed,
                or the file became shorter than its meta page says.
        """
        tree, psize = self._tree, self._tree.psize
        if head and not self.lazy:
            advise(self._fd, [(0, 0)], FADV_RANDOM)
        try:
            for pgno, page, keys, offs, sizes in tree.scan():
                base, view = pgno * psize, memoryview(page)
                for k, off, n in zip(keys, offs, sizes):
                    if off >= 0:
                        yield k, view[off - base : off - base + n], n
                        continue
                    if self.lazy:
                        raise _Damage("LMDB meta page counts no overflow pages, but records are stored in them")
                    start = -off - _PAGEHDR
                    b = tree._pread(start, _PAGEHDR + (min(n, head) if head else n))
                    pg, flags, pages = _OVPAGE.unpack_from(b)
                    if pg != start // psize or flags & 0x7F != _P_OVERFLOW or pages < -(-(n + _PAGEHDR) // psize):
                        raise _Damage(f"the LMDB record of key {bytes(k).hex()} points at page {start // psize}, "
                                      "which does not start its overflow pages")  # fmt: skip
                    yield k, memoryview(b)[_PAGEHDR:], n
        except _Damage as e:
            raise DamagedShardError(self.path, str(e.args[0])) from None


# One ShardFile per (file, identity) per process while anything uses it; the file's identity
# (inode, size, mtime) is part of the key, so a shard replaced on disk (a pack with --overwrite
# into the same OUT) is opened anew while a Dataset opened before keeps reading the file it opened.
_FILES: "weakref.WeakValueDictionary[tuple, ShardFile]" = weakref.WeakValueDictionary()
_FILES_LOCK = threading.Lock()
_OPENING: dict[tuple, threading.Lock] = {}


def _after_fork() -> None:  # a lock held by a thread of the parent would never be released here
    global _FILES_LOCK
    _FILES_LOCK = threading.Lock()
    _OPENING.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)


def open_shard_file(path: str, identity: tuple[int, int, int], *, first: int, count: int,
                    filler: "Filler | None" = None) -> ShardFile:  # fmt: skip
    """This process's :class:`ShardFile` of ``path`` (opened if needed; only if it still has ``identity``).

    Raises:
        DamagedShardError: the file's LMDB structure is damaged.
        OSError: the file cannot be opened, is not a regular file, or was replaced since it was
            looked at (:class:`UnusableFileError`).
    """
    key = (path, identity, first, count)
    with _FILES_LOCK:
        f = _FILES.get(key)
        if f is not None and not f.closed:
            return f
        opening = _OPENING.setdefault(key, threading.Lock())
    with opening:  # one thread opens (and checks) a file; the others wait for it
        with _FILES_LOCK:
            f = _FILES.get(key)
        if f is None or f.closed:
            try:
                f = ShardFile(path, identity, first=first, count=count, filler=filler)
            finally:
                with _FILES_LOCK:
                    _OPENING.pop(key, None)
            with _FILES_LOCK:
                _FILES[key] = f
    return f


def close_shared() -> None:
    """Close every shard file this process holds open for :class:`fastload.Dataset`.

    For tools that open many datasets one after another and want the number of open files
    bounded (files are also closed when the last dataset using them is collected). A
    :class:`fastload.Dataset` opened before opens its shards again when next read.
    """
    with _FILES_LOCK:
        files = list(_FILES.values())
        _FILES.clear()
    for f in files:
        f.close()


__all__ = [
    "READ_SLACK", "DamagedShardError", "Filler", "check_shard_structure", "ShardFile", "open_shard_file",
    "close_shared", "ShardScan",
]  # fmt: skip
