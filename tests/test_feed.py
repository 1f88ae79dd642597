"""The loader's feeder: ``Dataset.read_batch``, the GIL-keeping read, and format-1 datasets.

``read_batch`` must return exactly what ``record`` returns, record by record, including for
records whose bytes are not in the page cache (the ``RWF_NOWAIT`` read then copies part or
none of a record and the rest is read with a plain ``preadv``), and a record that cannot be
read must fail alone, named, without stopping the batch. Datasets of format 1.x (record
version 1, zlib's CRC-32) stay readable, checked and verifiable.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import zlib

import lmdb
import numpy as np
import pytest

import fastload
from fastload import store
from fastload.cli import main
from fastload.errors import CorruptDataError
from fastload.format import HEADER, HEADER_SIZE, KEY, decode_header

from conftest import decode_batch


@pytest.fixture(scope="module")
def packed_big(tmp_path_factory):
    """40 JPEGs of about 30-60 KB (records in overflow pages), two classes."""
    from PIL import Image

    root = tmp_path_factory.mktemp("feed")
    rng = np.random.default_rng(7)
    for i in range(40):
        a = rng.integers(0, 256, (120 + i, 160, 3), dtype=np.uint8)
        p = root / "src" / f"c{i % 2}" / f"{i:03d}.jpg"
        p.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(a).save(p, quality=90)
    fastload.pack(root / "src", root / "packed", progress=False)
    return root / "packed"


@pytest.fixture(scope="module")
def packed_small(tmp_path_factory):
    """200 tiny JPEGs (records inside leaf pages, checked lazily)."""
    from PIL import Image

    root = tmp_path_factory.mktemp("feed_small")
    for i in range(200):
        p = root / "src" / f"c{i % 3}" / f"{i:03d}.jpg"
        p.parent.mkdir(parents=True, exist_ok=True)
        Image.new("RGB", (8 + i % 5, 8), (i % 256, 7, 9)).save(p, quality=90)
    fastload.pack(root / "src", root / "packed", progress=False)
    return root / "packed"


@pytest.mark.parametrize("which", ["packed_big", "packed_small"])
@pytest.mark.parametrize("check", [True, False])
def test_read_batch_equals_record_for_every_sample(request, which, check):
    ds = fastload.Dataset(request.getfixturevalue(which), check=check)
    order = np.random.default_rng(1).permutation(len(ds))
    buf = None
    for start in range(0, len(ds), 17):
        idx = order[start : start + 17]
        rb = ds.read_batch(idx, buffer=buf)
        assert not rb.errors
        for k, i in enumerate(idx.tolist()):
            header, payload = ds.record(i)
            assert rb.payloads[k].dtype == np.uint8 and rb.payloads[k].tobytes() == payload
            assert (rb.widths[k], rb.heights[k]) == (header.width, header.height)
        if buf is not None and buf.size >= rb.buffer.size:
            assert rb.buffer is buf  # reused, not reallocated
        buf = rb.buffer


def test_read_batch_grows_its_buffer_and_accepts_repeats(packed_big):
    ds = fastload.Dataset(packed_big, check=True)
    small = np.zeros(16, dtype=np.uint8)
    rb = ds.read_batch([3, 3, 0, len(ds) - 1, -1], buffer=small)
    assert rb.buffer is not small and rb.buffer.size >= sum(p.size for p in rb.payloads)
    assert rb.payloads[0].tobytes() == rb.payloads[1].tobytes() == ds[3][0]
    assert rb.payloads[3].tobytes() == rb.payloads[4].tobytes() == ds[len(ds) - 1][0]
    with pytest.raises(IndexError, match="out of range"):
        ds.read_batch([0, len(ds)])
    with pytest.raises(TypeError):
        ds.read_batch([0.5])


def test_read_batch_reads_records_the_page_cache_dropped(packed_big):
    """Cold records: the GIL-keeping read copies what is cached, the rest is read normally."""
    ds = fastload.Dataset(packed_big, check=True)
    expected = [ds[i][0] for i in range(len(ds))]
    shard = packed_big / ds.shards[0].file
    store.drop_cached(shard)
    if store.resident_bytes(shard) > shard.stat().st_size // 2:
        pytest.skip("this filesystem keeps the shard in memory (tmpfs): nothing to drop")
    rb = ds.read_batch(np.arange(len(ds))[::-1])
    assert not rb.errors
    assert [p.tobytes() for p in rb.payloads] == expected[::-1]


def test_nowait_read_copies_cached_bytes_exactly(tmp_path):
    data = os.urandom(300_000)
    f = tmp_path / "blob"
    f.write_bytes(data)
    buf = np.zeros(200_000, dtype=np.uint8)
    fd = os.open(f, os.O_RDONLY)
    try:
        os.pread(fd, len(data), 0)  # cached now
        got = store.nowait_read(fd, buf.ctypes.data + 10, 150_000, 100_000)
        if got == -1:
            pytest.skip("preadv2(RWF_NOWAIT) is not available here: every read is a plain preadv")
        assert got == 150_000
        assert buf[10 : 10 + got].tobytes() == data[100_000:250_000]
        assert not buf[:10].any() and not buf[10 + got :].any()  # nothing outside the range written
    finally:
        os.close(fd)


def _rewrite_record(packed, index, edit):
    """Apply ``edit(bytearray value) -> bytes`` to one stored record and re-hash its shard."""
    m = json.loads((packed / "manifest.json").read_text())
    for s in m["shards"]:
        if s["first"] <= index < s["first"] + s["count"]:
            path = packed / s["file"]
            env = lmdb.open(str(path), subdir=False, lock=False, map_size=4 * path.stat().st_size + (1 << 20))
            with env.begin(write=True) as txn:
                txn.put(KEY.pack(index), edit(bytearray(txn.get(KEY.pack(index)))))
            env.copy(str(path) + ".tmp", compact=True)
            env.close()
            os.replace(str(path) + ".tmp", path)
            s["bytes"] = path.stat().st_size
            s["sha256"] = hashlib.sha256(path.read_bytes()).hexdigest()
    (packed / "manifest.json").write_text(json.dumps(m))


def test_a_bad_record_fails_alone_and_named(packed_big, tmp_path):
    bad = tmp_path / "bad"
    shutil.copytree(packed_big, bad)

    def flip_payload_bit(v: bytearray) -> bytes:
        v[-100] ^= 0x10
        return bytes(v)

    _rewrite_record(bad, 5, flip_payload_bit)
    ds = fastload.Dataset(bad, check=True)
    rb = ds.read_batch([4, 5, 6])
    assert set(rb.errors) == {1} and rb.payloads[1] is None and rb.widths[1] == 0
    assert isinstance(rb.errors[1], CorruptDataError)
    assert str(rb.errors[1]) == f"{bad / ds.shards[0].file} sample 5: payload XXH3 checksum mismatch (the image bytes were altered)"
    assert rb.payloads[0].tobytes() == ds[4][0] and rb.payloads[2].tobytes() == ds[6][0]
    assert not fastload.Dataset(bad, check=False).read_batch([5]).errors  # the documented trade-off


def _to_format_1(packed):
    """Rewrite a dataset as format 1.0 wrote it: record version 1, zlib's CRC-32 of each payload."""
    m = json.loads((packed / "manifest.json").read_text())
    for s in m["shards"]:
        path = packed / s["file"]
        env = lmdb.open(str(path), subdir=False, lock=False, map_size=4 * path.stat().st_size + (1 << 20))
        with env.begin(write=True) as txn:
            for i in range(s["first"], s["first"] + s["count"]):
                v = bytearray(txn.get(KEY.pack(i)))
                h = decode_header(bytes(v))
                fields = list(HEADER.unpack_from(v))
                fields[1] = 1  # record version
                fields[9] = zlib.crc32(bytes(v[HEADER_SIZE + h.path_len :]))
                HEADER.pack_into(v, 0, *fields)
                txn.put(KEY.pack(i), bytes(v))
        env.copy(str(path) + ".tmp", compact=True)
        env.close()
        os.replace(str(path) + ".tmp", path)
        s["bytes"] = path.stat().st_size
        s["sha256"] = hashlib.sha256(path.read_bytes()).hexdigest()
    m["version"] = "1.0"
    (packed / "manifest.json").write_text(json.dumps(m))


def test_format_1_datasets_are_read_checked_and_verified(make_folder, tmp_path, capsys):
    src = make_folder(classes=2, per_class=6)
    new, old = tmp_path / "new", tmp_path / "old"
    fastload.pack(src, new, progress=False)
    shutil.copytree(new, old)
    _to_format_1(old)
    a, b = fastload.Dataset(new, check=True), fastload.Dataset(old, check=True)
    assert b.manifest.version == "1.0" and b.header(0).version == 1 and a.header(0).version == 2
    assert [b[i] for i in range(len(b))] == [a[i] for i in range(len(a))]
    assert [p.tobytes() for p in b.read_batch(range(len(b))).payloads] == [a[i][0] for i in range(len(a))]
    assert main(["verify", str(old)]) == 0
    capsys.readouterr()
    # the same pixels through the loader, in the same order
    outs = []
    for path in (new, old):
        loader = fastload.FastLoader(path, batch_size=4, device="cpu", shuffle=True, seed=3, crop=32, mean=None, std=None)
        outs.append([(x.numpy().copy(), y.numpy().copy()) for x, y in loader])
        loader.close()
    for (xa, ya), (xb, yb) in zip(*outs):
        assert np.array_equal(xa, xb) and np.array_equal(ya, yb)
    assert [lab for lab, _ in decode_batch(np.concatenate([x for x, _ in outs[1]]))] == np.concatenate(
        [y for _, y in outs[1]]
    ).tolist()

    def flip(v: bytearray) -> bytes:
        v[-3] ^= 0x01
        return bytes(v)

    _rewrite_record(old, 2, flip)
    with pytest.raises(CorruptDataError, match="sample 2: payload CRC-32 mismatch"):
        fastload.Dataset(old, check=True)[2]
    assert main(["verify", str(old)]) == 1
    assert "CRC-32 mismatch" in capsys.readouterr().err
