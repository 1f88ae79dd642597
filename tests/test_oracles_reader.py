"""fastload.reader on 1 and 3 shards: batches across shard boundaries, with and without read-ahead.

Each image's colour encodes its index (``encode_color``), so a record read from the wrong shard or
the wrong place in it shows in its pixels. Which records reach which shard file is recorded at the
shard files' own ``willneed``/``evict`` and compared with the manifest's ranges
(``[first, first + count)`` of each shard): the expected split is computed from the manifest, not by
the reader. Batches are chosen to straddle every boundary; the table is shard count 1/3 x read-ahead
off/on x ``runs`` (none, 4) x ``evict``.
"""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import fastload
from fastload.reader import ReadAhead
from fastload.store import ShardFile

from conftest import decode_color, encode_color, write_image

N = 30


@pytest.fixture(scope="module", params=[1, 3], ids=["1-shard", "3-shards"])  # 3: three to five
def packed(request, tmp_path_factory):
    base = tmp_path_factory.mktemp(f"reader{request.param}")
    for i in range(N):
        write_image(base / "src" / f"class_{i // 10}" / f"{i:03d}.jpg", encode_color(i // 10, i), size=(96, 80), quality=95)
    probe = base / "probe"
    fastload.pack(base / "src", probe, workers=1, progress=False)
    one = fastload.Dataset(probe)
    # the writer keeps 4 pages of headroom in each shard (tests/test_pack_pixels.py)
    shard_size = "64GB" if request.param == 1 else one.shards[0].bytes // 3 + 5 * 4096
    fastload.pack(base / "src", base / "packed", workers=1, progress=False, shard_size=shard_size)
    ds = fastload.Dataset(base / "packed")
    assert (len(ds.shards) == 1) if request.param == 1 else (3 <= len(ds.shards) <= 5), [s.count for s in ds.shards]
    return ds


def index_of(payload) -> int:
    with Image.open(io.BytesIO(bytes(payload))) as im:
        return decode_color(np.asarray(im.convert("RGB"), dtype=np.float64).reshape(-1, 3).mean(axis=0))[1]


def ranges(ds) -> list[range]:
    return [range(s.first, s.first + s.count) for s in ds.shards]


def boundary_batches(ds, size=4) -> list[list[int]]:
    """Batches of ``size`` consecutive indices centred on each shard boundary, plus the ends, unsorted."""
    cuts = [s.first for s in ds.shards[1:]] or [N // 2]
    out = [[c - 2, c + 1, c - 1, c] for c in cuts]
    return out + [[N - 1, 0, N - 2, 1], [5, 5, 6, 4]]


def test_read_batch_across_shard_boundaries_reads_each_records_own_pixels(packed):
    """Kills: a record located in the shard before or after its own (off by one at ``first``), the
    shard's local index computed from the wrong ``first``, a batch sorted or deduplicated."""
    buf = None
    for batch in boundary_batches(packed):
        rb = packed.read_batch(batch, buffer=buf)
        buf = rb.buffer
        assert not rb.errors
        assert [index_of(p) for p in rb.payloads] == batch
        assert list(rb.widths) == [96] * len(batch) and list(rb.heights) == [80] * len(batch)
        assert [index_of(packed[i][0]) for i in batch] == batch
        assert [int(packed[i][1]) for i in batch] == [i // 10 for i in batch]
    for i in range(N):
        shard = next(k for k, r in enumerate(ranges(packed)) if i in r)
        assert packed.locate(i)[0] == str(packed.path / packed.shards[shard].file)


class Spy:
    """Records, per shard file, the indices its ``willneed``/``evict`` were asked for."""

    def __init__(self, monkeypatch) -> None:
        self.calls: list[tuple[str, str, list[int]]] = []
        spy = self
        for name in ("willneed", "evict"):
            real = getattr(ShardFile, name)

            def wrapped(f, indices, _real=real, _name=name):
                spy.calls.append((_name, Path(f.path).name, [int(i) for i in indices]))
                return _real(f, indices)

            monkeypatch.setattr(ShardFile, name, wrapped)

    def by_shard(self, what: str) -> dict[str, set[int]]:
        out: dict[str, set[int]] = {}
        for name, shard, idx in self.calls:
            if name == what:
                out.setdefault(shard, set()).update(idx)
        return out


def expected_split(ds, indices) -> dict[str, set[int]]:
    want: dict[str, set[int]] = {}
    for s, r in zip(ds.shards, ranges(ds)):
        mine = {i for i in indices if i in r}
        if mine:
            want[s.file] = mine
    return want


def test_prefetch_sends_each_shard_exactly_its_own_records(packed, monkeypatch):
    """Kills: a boundary index sent to the neighbouring shard, the last shard's end taken as another
    shard's, an index dropped at a boundary."""
    spy = Spy(monkeypatch)
    for batch in boundary_batches(packed):
        spy.calls.clear()
        packed.prefetch(np.array(batch))
        assert spy.by_shard("willneed") == expected_split(packed, batch)
        for _, shard, idx in spy.calls:
            assert idx == sorted(set(idx))  # sorted, once each
    spy.calls.clear()
    packed.prefetch(list(range(N)))
    assert spy.by_shard("willneed") == expected_split(packed, range(N))
    packed.prefetch([])
    with pytest.raises(IndexError):
        packed.prefetch([N])
    with pytest.raises(IndexError):
        packed.prefetch([-1])
    with pytest.raises(TypeError):
        packed.prefetch(np.array([1.0]))


def test_evict_reaches_each_opened_shard_with_exactly_its_own_records(packed, monkeypatch):
    for s in packed.shards:
        packed.record(s.first)  # open every shard (evict skips shards not opened yet)
    spy = Spy(monkeypatch)
    for batch in boundary_batches(packed):
        spy.calls.clear()
        packed.evict(batch)
        assert spy.by_shard("evict") == expected_split(packed, batch)
        assert [index_of(packed[i][0]) for i in batch] == batch  # evicted pages read back the same


@pytest.mark.parametrize("runs", [None, 4])
@pytest.mark.parametrize("evict", [False, True])
@pytest.mark.parametrize("depth", [1, 3])
def test_read_ahead_over_batches_that_cross_shards(packed, monkeypatch, runs, evict, depth):
    """``ahead`` yields the batches unchanged and in order and counts the records it asked for (with
    ``runs``: the whole runs ``[k*4, k*4+4)`` they touch, clipped at N, each once); what its threads
    got to before the iteration ended (requests not started are dropped then) went to each record's
    own shard, and only batches already read were evicted, from their own shards.
    Kills: a batch skipped or repeated by the window, a run cut at the wrong end or asked twice, a
    shard asked for another's records, the eviction of a batch not yet read."""
    spy = Spy(monkeypatch)
    batches = [np.array(b) for b in boundary_batches(packed)]
    ra = ReadAhead(packed, threads=2, depth=depth, evict=evict, runs=runs)
    got = []
    for b in ra.ahead(batches):
        got.append(b.tolist())
        assert [index_of(p) for p in packed.read_batch(b).payloads] == b.tolist()
    ra.close()
    assert got == [b.tolist() for b in batches]
    wanted = {int(i) for b in batches for i in b}
    if runs:
        wanted = {j for i in wanted for j in range(i // runs * runs, min(i // runs * runs + runs, N))}
        assert ra.requested == len(wanted)
    else:
        assert ra.requested == sum(len(b) for b in batches)
    split = expected_split(packed, wanted)
    for shard, idx in spy.by_shard("willneed").items():
        assert idx <= split[shard], shard
    # each batch is evicted when the next is asked for (the last: when the loop asks past it)
    read = expected_split(packed, {int(i) for b in batches for i in b})
    for shard, idx in spy.by_shard("evict").items():
        assert evict and idx <= read[shard], shard


def test_location_header_repr_and_iteration_name_each_sample_by_its_own_shard(packed):
    """``location(i)`` names the shard file whose range (from the manifest) holds ``i``; ``header(i)`` is
    the record's own (its payload length is the payload's, the label and size its image's); ``repr`` states the counts; iterating yields ``ds[i]``
    in order. Kills: the shard found off by one at a boundary, a negative index not wrapped, the repr's
    fields swapped or missing, header of another record."""
    ds = packed
    for s in ds.shards:
        for i in (s.first, s.first + s.count - 1):
            assert ds.location(i) == f"{ds.path / s.file} sample {i}"
    last = ds.shards[-1]
    assert ds.location(-1) == f"{ds.path / last.file} sample {N - 1}"
    for i in (0, N // 2, N - 1):
        payload, _ = ds[i]
        h = ds.header(i)
        assert (h.payload_len, h.label, h.width, h.height) == (len(payload), i // 10, 96, 80)
    assert repr(ds) == f"Dataset({str(ds.path)!r}, samples={N}, classes=3, shards={len(ds.shards)})"
    got = list(ds)
    assert [index_of(p) for p, _ in got] == list(range(N)) and [lab for _, lab in got] == [i // 10 for i in range(N)]


def test_a_pickled_dataset_opens_its_own_shard_files(packed):
    """The pickled state holds no open file (a copy opens its own, through the process's shard files).
    Kills: ``_files`` kept in the state (the descriptors would be pickled)."""
    import pickle

    ds = fastload.Dataset(packed.path)
    ds[0], ds[N - 1]  # open the first and the last shard
    copy = pickle.loads(pickle.dumps(ds))
    assert [index_of(copy[i][0]) for i in (0, N - 1)] == [0, N - 1]
    state = ds.__getstate__()
    assert state["_files"] == [None] * len(ds.shards) and state["path"] == ds.path


def test_follow_epoch_of_a_local_dataset_is_ahead_of_the_batches(packed):
    """Kills: ``ahead`` not called, or called with something else than the batches (a local dataset has
    no download order to follow)."""
    batches = [[0, 1], [2]]
    seen = []

    def ahead(b):
        seen.append(b)
        return iter(["x"])

    assert list(packed.follow_epoch(batches, ahead, hold=2)) == ["x"] and seen == [batches] and seen[0] is batches


def test_release_closes_a_shard_and_the_next_read_reopens_it(packed):
    """Kills: the released file left open or its slot not cleared (the next read would use a closed file)."""
    ds = fastload.Dataset(packed.path)
    assert index_of(ds[N - 1][0]) == N - 1
    k = len(ds.shards) - 1
    f = ds._files[k]
    ds._release(k)
    assert f.closed and ds._files[k] is None
    assert index_of(ds[N - 1][0]) == N - 1 and ds._files[k] is not None and not ds._files[k].closed
    ds._release(0 if k else k)  # a shard not open: nothing to close
