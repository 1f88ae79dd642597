"""fastload.reader's record reads, batch buffer, field reads and read-ahead threads against their documented
behaviour, every refusal's message whole.

The expected record bytes come from the shard files themselves, read here with the ``lmdb`` package and
split with ``struct`` by the record layout of docs/format.md (a 40-byte little-endian header
``<4sHBBiIIIIIIHH``, the UTF-8 source path, the payload; keys are big-endian u64), and from the source
files (a JPEG or PNG is stored as it was packed): never by the reader. Damage is made by writing bytes into
the shard files at places found the same way. Some records are larger than 16 KiB, so that both of the
reader's ways of reading a value (whole, or its head and then the rest) are taken, and some are stored in
LMDB overflow pages, whose page header (its page number, a u64) the reader checks.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import struct
import threading
import time
import zlib
from pathlib import Path

import lmdb
import numpy as np
import pytest
import xxhash
from PIL import Image

import fastload
from fastload import ConfigError, CorruptDataError, FormatError
from fastload.reader import ReadAhead, _Token, _Workers, read_manifest
from fastload.store import READ_SLACK, close_shared

from conftest import encode_color, paint_folder, write_image

HEAD = struct.Struct("<4sHBBiIIIIIIHH")
# sample -> its source file in the image folder (the packer takes a class's files before its subfolders'):
# 0, 2 and 3 noise JPEGs of about 18 KB (stored in overflow pages), 1 a PNG, 4 and 5 small JPEGs
LONG = "d" * 200 + "/" + "e" * 200 + "/" + "f" * 80  # a path longer than the 512 bytes read first, with its header
SOURCES = {
    0: "c0/0.jpg",
    1: "c0/1.png",
    2: f"c0/{LONG}/2.jpg",
    3: "c1/3.jpg",
    4: "c1/4.jpg",
    5: "c1/5.jpg",
}
BIG = (0, 2, 3)
N = len(SOURCES)


def _paint(src: Path) -> None:
    rng = np.random.default_rng(7)
    for i, rel in SOURCES.items():
        p = src / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        if i in BIG:
            Image.fromarray(rng.integers(0, 256, (120, 160, 3), dtype=np.uint8)).save(p, quality=90)
        elif rel.endswith(".png"):
            write_image(p, encode_color(i // 3, i), size=(40, 30))
        else:
            write_image(p, encode_color(i // 3, i), size=(64, 48), quality=90)


def put_record(root: Path, i: int, payload: bytes, *, encoding: int, width: int, height: int, version: int = 2) -> None:
    """Store ``payload`` as sample ``i``'s, with a header written by the layout (its checksum zlib's CRC-32 for
    record version 1, the low 32 bits of XXH3-64 for version 2), as a packer does; the manifest's size and
    hash of the shard made the file's."""
    shard = shard_of(root, i)
    h, path, _ = split(stored(root, i))
    check = zlib.crc32(payload) if version == 1 else xxhash.xxh3_64_intdigest(payload) & 0xFFFFFFFF
    head = HEAD.pack(b"FLRC", version, encoding, 0, h[4], width, height, width, height, check, len(payload), len(path), 0)
    env = lmdb.open(str(shard), subdir=False, lock=False)
    with env.begin(write=True) as txn:
        txn.put(struct.pack(">Q", i), head + path + payload)
    env.close()
    m = json.loads((root / "manifest.json").read_text())
    for s in m["shards"]:
        if s["file"] == shard.name:
            s["bytes"], s["sha256"] = shard.stat().st_size, hashlib.sha256(shard.read_bytes()).hexdigest()
    (root / "manifest.json").write_text(json.dumps(m))


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> Path:
    """The image folder (``src``) and its dataset (``ds``), sample 1 stored as the PNG it was."""
    base = tmp_path_factory.mktemp("reader2")
    _paint(base / "src")
    fastload.pack(base / "src", base / "ds", workers=1, progress=False, shard_size="48KiB")
    put_record(base / "ds", 1, (base / "src" / SOURCES[1]).read_bytes(), encoding=2, width=40, height=30)  # a lossless PNG
    return base


@pytest.fixture
def root(pristine, tmp_path) -> Path:
    """A fresh copy of the dataset directory, to damage."""
    close_shared()
    return Path(shutil.copytree(pristine / "ds", tmp_path / "ds"))


def shards(root: Path) -> list[dict]:
    return json.loads((root / "manifest.json").read_text())["shards"]


def shard_of(root: Path, i: int) -> Path:
    return root / next(s["file"] for s in shards(root) if s["first"] <= i < s["first"] + s["count"])


def stored(root: Path, i: int) -> bytes:
    """The stored value of sample ``i``, straight from its LMDB file."""
    env = lmdb.open(str(shard_of(root, i)), subdir=False, lock=False, readonly=True)
    try:
        with env.begin() as txn:
            v = txn.get(struct.pack(">Q", i))
    finally:
        env.close()
    assert v is not None
    return bytes(v)


def split(value: bytes) -> tuple[tuple, bytes, bytes]:
    """(header fields, path bytes, payload) of a stored value by the documented layout."""
    h = HEAD.unpack_from(value)
    path_len, payload_len = h[11], h[10]
    return h, value[40 : 40 + path_len], value[40 + path_len : 40 + path_len + payload_len]


def at_in_file(root: Path, i: int) -> tuple[Path, int]:
    """(shard file, offset of sample ``i``'s value in it)."""
    shard = shard_of(root, i)
    data = shard.read_bytes()
    v = stored(root, i)
    k = data.find(v)
    assert k > 0 and data.find(v, k + 1) < 0
    return shard, k


def poke(path: Path, offset: int, data: bytes) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(data)


def test_the_fixture_takes_every_read_path(pristine):
    """The premises the other tests rely on, checked on the files: three shards, of samples 0-1, 2 and 3-5;
    the noise JPEGs over 16 KiB and in overflow pages (a page whose u64 page number is its offset / 4096
    sits right before them); sample 2's path past the first 512 bytes of its value; the payloads the
    source files' bytes."""
    root = pristine / "ds"
    assert [(s["first"], s["count"]) for s in shards(root)] == [(0, 2), (2, 1), (3, 3)]
    for i in BIG:
        shard, at = at_in_file(root, i)
        assert len(stored(root, i)) > 16384
        assert (at - 16) % 4096 == 0 and struct.unpack_from("<Q", shard.read_bytes(), at - 16)[0] == (at - 16) // 4096
    assert 40 + len(SOURCES[2]) > 512
    for i, rel in SOURCES.items():
        h, path, payload = split(stored(root, i))
        assert path.decode() == rel and payload == (pristine / "src" / rel).read_bytes()
        assert h[4] == i // 3  # the label


# ----------------------------------------------------------------------------- Dataset._read


def test_read_returns_each_records_own_header_payload_and_path(pristine):
    """``_read`` of every sample, small and large, with and without its path and check: the header's fields,
    the payload bytes and the source path are the stored value's, split by the layout.
    Kills: the payload or path sliced or read at the wrong offset on either read path, the path of a
    long name read from the head instead of the file, the path returned when not asked for."""
    root = pristine / "ds"
    ds = fastload.Dataset(root)
    for i, rel in SOURCES.items():
        h, path, payload = split(stored(root, i))
        for check in (False, True):
            header, got, got_path = ds._read(i, check=check, want_path=True)
            assert (header.encoding, header.label, header.width, header.height) == (h[2], h[4], h[5], h[6]), i
            assert (header.checksum, header.payload_len, header.path_len, header.version) == (h[9], h[10], h[11], h[1]), i
            assert type(got) is bytes and got == payload, i
            assert got_path == rel, i
            assert ds._read(i, check=check, want_path=False) == (header, payload, None)
        assert ds[i] == (payload, i // 3) and ds.record(i)[1] == payload


def test_a_path_that_is_not_utf8_reads_back_as_the_file_systems_name(tmp_path):
    """A source file name that is not UTF-8 is stored as its bytes and read back as Python names such a file
    (``surrogateescape``). Kills: the path decoded strictly or with another error handler."""
    src = tmp_path / "src"
    write_image(src / "c0" / "a.jpg", encode_color(0, 0))
    name = os.fsdecode(b"\xff\xfe.jpg")
    write_image(src / "c0" / name, encode_color(0, 1))
    fastload.pack(src, tmp_path / "ds", workers=1, progress=False)
    ds = fastload.Dataset(tmp_path / "ds")
    paths = sorted(ds._read(i, check=True, want_path=True)[2] for i in range(2))
    assert sorted(paths) == sorted(["c0/a.jpg", f"c0/{name}"])
    assert os.fsencode(f"c0/{name}") in {split(stored(tmp_path / "ds", i))[1] for i in range(2)}


@pytest.mark.parametrize("i", [0, 1, 3, 4])  # large (head, then the rest) and small (whole), in both shards
def test_a_record_with_a_foreign_magic_is_refused_naming_its_shard_and_sample(root, i):
    """Kills: the header decoded from something else than the value (or its head with the value's length),
    the message's sample named by another shard or index, or with a prefix of its own."""
    shard, at = at_in_file(root, i)
    poke(shard, at, b"XLRC")
    ds = fastload.Dataset(root)
    msg = f"{shard} sample {i}: bad record magic b'XLRC' (expected b'FLRC')"
    with pytest.raises(CorruptDataError) as e:
        ds[i]
    assert str(e.value) == msg and type(e.value) is CorruptDataError
    rb = ds.read_batch([i, 5 if i < 5 else 2])
    assert list(rb.errors) == [0] and str(rb.errors[0]) == msg and type(rb.errors[0]) is CorruptDataError
    assert rb.payloads[0] is None and (rb.widths[0], rb.heights[0]) == (0, 0)
    assert bytes(rb.payloads[1]) == split(stored(root, 5))[2]
    with pytest.raises(CorruptDataError) as e:
        ds.field_values([i])
    assert str(e.value) == msg
    with pytest.raises(CorruptDataError) as e:
        ds.header(i)  # the record read whole, by raw()
    assert str(e.value) == msg


@pytest.mark.parametrize("i", [0, 3])
def test_a_record_pointing_at_a_page_that_is_not_its_overflow_page_is_a_damaged_shard(root, i):
    """The u64 page number of the record's first overflow page made another's: every read of it says the shard
    is damaged and to run verify on the dataset. Kills: the damage let through unwrapped (no advice), or
    its message replaced."""
    shard, at = at_in_file(root, i)
    page = (at - 16) // 4096
    poke(shard, at - 16, struct.pack("<Q", page + 1))
    ds = fastload.Dataset(root)
    msg = (f"{shard}: damaged shard (the LMDB record of sample {i} points at page {page}, which does not start its "
           f"overflow pages); run `fastload verify {root}`")  # fmt: skip
    for read in (lambda: ds[i], lambda: ds.field_values([i]), lambda: ds.header(i)):
        with pytest.raises(CorruptDataError) as e:
            read()
        assert str(e.value) == msg and type(e.value) is CorruptDataError
    rb = ds.read_batch([1, i, 4])
    assert list(rb.errors) == [1] and str(rb.errors[1]) == msg and type(rb.errors[1]) is CorruptDataError
    assert [p is None for p in rb.payloads] == [False, True, False]
    assert list(rb.widths) == [40, 0, 64] and list(rb.heights) == [30, 0, 48]


@pytest.mark.parametrize("i", [0, 4, 1])  # a large JPEG, a small one, a PNG
def test_altered_image_bytes_are_refused_only_when_checked(root, i):
    """One byte of the payload's end (in the image data, before the end marker: its frame header still
    agrees with the record header) flipped: ``check=True`` refuses it naming the XXH3 checksum (records
    of version 2), ``check=False`` returns the altered bytes. Kills: the check dropped or forced on."""
    shard, at = at_in_file(root, i)
    h, path, payload = split(stored(root, i))
    flip = 40 + len(path) + len(payload) - (3 if i != 1 else 20)  # a PNG's last chunk (IEND) is 12 bytes
    data = shard.read_bytes()
    poke(shard, at + flip, bytes([data[at + flip] ^ 0x10]))
    altered = split(stored(root, i))[2]
    assert altered != payload
    msg = f"{shard} sample {i}: payload XXH3 checksum mismatch (the image bytes were altered)"
    for read in (lambda ds: ds[i], lambda ds: ds.record(i)):
        with pytest.raises(CorruptDataError) as e:
            read(fastload.Dataset(root, check=True))
        assert str(e.value) == msg
    rb = fastload.Dataset(root, check=True).read_batch([i])
    assert str(rb.errors[0]) == msg and rb.payloads[0] is None
    assert fastload.Dataset(root)[i][0] == altered
    assert bytes(fastload.Dataset(root).read_batch([i]).payloads[0]) == altered


def test_a_png_whose_header_is_not_its_payloads_size_is_refused(root):
    """The record header's width of the PNG made one more than its IHDR's (the header is not covered by the
    checksum). Kills: a PNG's size compared with something else than its own IHDR."""
    i = 1
    shard, at = at_in_file(root, i)
    poke(shard, at + 12, struct.pack("<I", 41))
    ds = fastload.Dataset(root)
    msg = (f"{shard} sample {i}: header says the png image is 41x30 but its payload declares 40x30; "
           "the record was altered (run `fastload verify`)")  # fmt: skip
    with pytest.raises(CorruptDataError) as e:
        ds[i]
    assert str(e.value) == msg
    assert str(ds.read_batch([i]).errors[0]) == msg


# ----------------------------------------------------------------------------- read_batch's buffer


def need_of(root: Path, indices) -> int:
    """What read_batch documents it needs: each value's bytes and READ_SLACK more."""
    return sum(len(stored(root, i)) + READ_SLACK for i in indices)


def test_read_batch_buffer_is_at_least_a_mebibyte_grown_by_a_quarter_past_it_and_reused_when_it_fits(pristine):
    """A new buffer holds max(need, 1 MiB, need * 1.25) bytes; a buffer passed back is used as it is when it
    has ``need`` bytes, replaced when it has one fewer; the payloads are views of the buffer, each record's
    own bytes. Kills: the size's terms or factor changed, the reuse test off by one, views of another buffer."""
    root = pristine / "ds"
    ds = fastload.Dataset(root)
    small = [5, 0, 2, 3, -6]
    need = need_of(root, [5, 0, 2, 3, 0])
    rb = ds.read_batch(np.array(small))
    assert rb.buffer.dtype == np.uint8 and rb.buffer.size == 1 << 20
    exact = np.zeros(need, np.uint8)
    rb = ds.read_batch(small, buffer=exact)
    assert rb.buffer is exact
    for p, i in zip(rb.payloads, [5, 0, 2, 3, 0]):
        assert np.shares_memory(p, exact) and bytes(p) == split(stored(root, i))[2]
    assert list(rb.widths) == [64, 160, 160, 160, 160] and list(rb.heights) == [48, 120, 120, 120, 120]
    short = np.zeros(need - 1, np.uint8)
    rb = ds.read_batch(small, buffer=short)
    assert rb.buffer is not short and rb.buffer.size == 1 << 20
    assert not any(np.shares_memory(p, short) for p in rb.payloads)
    big = [0, 3] * 30  # about 1.1 MB of values: past 1 MiB / 1.25
    need = need_of(root, [0, 3])
    rb = ds.read_batch(big)
    assert rb.buffer.size == int(need * 30 * 1.25) and rb.buffer.size > need * 30 > 1 << 20
    want = [split(stored(root, i))[2] for i in (0, 3)]
    assert all(bytes(p) == want[k % 2] for k, p in enumerate(rb.payloads)) and not rb.errors


def test_read_batch_of_a_missing_shard_reports_it_for_its_samples_and_reads_the_others(root):
    """Kills: a shard that cannot be opened stopping the batch, or its samples' error replaced."""
    (root / "shard-00002.lmdb").unlink()
    rb = fastload.Dataset(root).read_batch([3, 1, 5])
    msg = f"{root}/shard-00002.lmdb: shard file is missing; the dataset is incomplete"
    assert sorted(rb.errors) == [0, 2] and all(str(e) == msg for e in rb.errors.values())
    assert rb.payloads[0] is None and rb.payloads[2] is None and bytes(rb.payloads[1]) == split(stored(root, 1))[2]
    assert list(rb.widths) == [0, 40, 0] and list(rb.heights) == [0, 30, 0]


# ----------------------------------------------------------------------------- field_values


def grey(i: int) -> int:
    return (i * 40 + 20) % 240


class Captioned:
    """Dict samples whose fields are functions of the index; samples 1 and 4 noise images (large records)."""

    def __len__(self) -> int:
        return 6

    def __getitem__(self, i: int) -> dict:
        if i in (1, 4):
            img = np.random.default_rng(i).integers(0, 256, (120, 160, 3), dtype=np.uint8)
        else:
            img = np.full((24, 32, 3), grey(i), np.uint8)
        return {"image": img, "label": i % 2, "caption": f"sample {i} grey {grey(i)}", "step": 3 * i - 7}


@pytest.fixture(scope="module")
def fields_pristine(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("reader2_fields") / "ds"
    fastload.pack_dataset(Captioned(), out, workers=1, progress=False, shard_size="48KiB")
    return out


@pytest.fixture
def froot(fields_pristine, tmp_path) -> Path:
    close_shared()
    return Path(shutil.copytree(fields_pristine, tmp_path / "fields"))


def test_field_values_of_small_and_large_records_in_the_order_asked(fields_pristine):
    """Kills: the field block of a large record (read apart from its head) read from the wrong offset or
    length, the order or repeats of the indices lost, negative and NumPy indices not taken as
    ``Dataset[i]`` takes them."""
    root = fields_pristine
    assert len(shards(root)) > 1
    assert all(len(stored(root, i)) > 16384 for i in (1, 4)) and all(len(stored(root, i)) <= 16384 for i in (0, 2, 3, 5))
    for check in (False, True):
        ds = fastload.Dataset(root, check=check)
        order = [4, 0, 1, 5, 4, -5]
        want = [{"caption": f"sample {i} grey {grey(i)}", "step": 3 * i - 7} for i in [4, 0, 1, 5, 4, 1]]
        assert ds.field_values(order) == want
        assert ds.field_values(np.array(order)) == want
        assert ds.field_values([]) == []


def test_an_altered_field_is_refused_naming_the_sample_only_when_checked(froot):
    """Sample 4's caption (a large record) with one byte changed: with ``check`` the block's checksum is
    refused naming the shard and sample, without it the altered text is returned. Kills: the check not
    passed on, or forced; the sample named wrongly."""
    shard = shard_of(froot, 4)
    data = shard.read_bytes()
    text = f"sample 4 grey {grey(4)}".encode()
    k = data.find(text)
    assert k > 0 and data.find(text, k + 1) < 0
    poke(shard, k + 7, b"5")
    with pytest.raises(CorruptDataError) as e:
        fastload.Dataset(froot, check=True).field_values([0, 4])
    assert str(e.value) == f"{shard} sample 4: field block checksum mismatch (the field bytes were altered)"
    assert fastload.Dataset(froot).field_values([4])[0]["caption"] == f"sample 5 grey {grey(4)}"
    assert fastload.Dataset(froot).fields(4, ["caption"]) == {"caption": f"sample 5 grey {grey(4)}"}
    with pytest.raises(CorruptDataError) as e:
        fastload.Dataset(froot, check=True).fields(4, ["caption"])
    assert str(e.value) == f"{shard} sample 4: field block checksum mismatch (the field bytes were altered)"


def test_field_values_where_the_manifest_and_the_records_disagree(froot, root):
    """Records with a field block under a manifest that declares no typed fields, and records without one under a
    manifest that declares some: both refused naming the sample; records without blocks under a manifest
    without fields have no values. Kills: the record's version or the schema's fields not consulted."""
    assert fastload.Dataset(root).field_values([4, 0]) == [{}, {}]
    m = json.loads((froot / "manifest.json").read_text())
    m["fields"] = [f for f in m["fields"] if f["kind"] in ("image", "label")]
    (froot / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(CorruptDataError) as e:
        fastload.Dataset(froot).field_values([2])
    assert str(e.value) == f"{shard_of(froot, 2)} sample 2: the record has a field block, but the manifest declares no fields"
    m = json.loads((root / "manifest.json").read_text())
    m.update(version="3.0", fields=[{"name": "image", "kind": "image"}, {"name": "label", "kind": "label"},
                                    {"name": "txt", "kind": "str"}])  # fmt: skip
    (root / "manifest.json").write_text(json.dumps(m))
    for i in (3, 1):
        with pytest.raises(CorruptDataError) as e:
            fastload.Dataset(root).field_values([i])
        assert str(e.value) == f"{shard_of(root, i)} sample {i}: record version 2 has no field block, but the manifest declares fields"


# ----------------------------------------------------------------------------- ReadAhead's arguments


@pytest.mark.parametrize("kw, msg", [
    ({"threads": 0}, "threads must be an int in [1, 64], got 0"),
    ({"threads": 65}, "threads must be an int in [1, 64], got 65"),
    ({"threads": 2.0}, "threads must be an int, got 2.0"),
    ({"depth": 0}, "depth must be an int in [1, 1024], got 0"),
    ({"depth": 1025}, "depth must be an int in [1, 1024], got 1025"),
    ({"depth": "4"}, "depth must be an int, got '4'"),
    ({"runs": 0}, "runs must be an int in [1, 4611686018427387904], got 0"),
    ({"runs": 2**62 + 1}, "runs must be an int in [1, 4611686018427387904], got 4611686018427387905"),
    ({"evict": 1}, "evict must be True or False, got 1"),
    ({"evict": None}, "evict must be True or False, got None"),
])  # fmt: skip
def test_read_ahead_refuses_arguments_out_of_their_documented_ranges(pristine, kw, msg):
    with pytest.raises(ConfigError) as e:
        ReadAhead(fastload.Dataset(pristine / "ds"), **kw)
    assert str(e.value) == msg


def test_read_ahead_takes_the_ends_of_its_ranges_and_has_the_documented_defaults(pristine):
    """Kills: a bound one off, a default changed."""
    ds = fastload.Dataset(pristine / "ds")
    ra = ReadAhead(ds)
    assert (ra.dataset, ra.threads, ra.depth, ra.evict, ra.runs, ra.requested) == (ds, 4, 4, False, None, 0)
    for kw, attr, v in (("threads", "threads", 1), ("threads", "threads", 64), ("depth", "depth", 1),
                        ("depth", "depth", 1024), ("runs", "runs", 1), ("runs", "runs", 2**62), ("evict", "evict", True)):  # fmt: skip
        assert getattr(ReadAhead(ds, **{kw: v}), attr) == v
    assert ReadAhead(ds, threads=np.int64(3)).threads == 3 and type(ReadAhead(ds, threads=np.int64(3)).threads) is int
    with pytest.raises(ConfigError) as e:
        ReadAhead(str(pristine / "ds"))
    assert str(e.value) == "dataset must be a fastload.Dataset, got str"


# ----------------------------------------------------------------------------- the read-ahead's threads


def test_read_ahead_threads_are_named_daemons_started_once_and_joined_by_close(pristine):
    """``threads`` daemon threads ``fastload-readahead-0..``, started on first use and kept for the next
    requests; ``close`` ends them all before it returns, and later requests start nothing.
    Kills: a name or the daemon flag changed, one thread too few or many, the pool made again on every
    request (its process id not kept), close returning before the threads end."""
    ds = fastload.Dataset(pristine / "ds")
    ra = ReadAhead(ds, threads=3)
    assert ra._workers is None
    ra.start()
    w = ra._workers
    assert [t.name for t in w.threads] == ["fastload-readahead-0", "fastload-readahead-1", "fastload-readahead-2"]
    assert all(t.daemon and t.is_alive() for t in w.threads) and w.pid == os.getpid()
    ra.prefetch([0, 1, 2, 3])
    ra.start()
    assert ra._workers is w and ra.requested == 4
    ra.close()
    assert not any(t.is_alive() for t in w.threads) and ra._workers is None
    ra.prefetch([4])
    assert ra._workers is None and ra.requested == 4
    assert not any(t.name.startswith("fastload-readahead-") for t in threading.enumerate() if t in w.threads)


class SlowReads:
    """A stand-in dataset whose read-ahead takes 0.3 s or ``seconds`` (a cold disk, which a test cannot make on demand):
    what it was asked, once each request is done."""

    def __init__(self, seconds: float = 0.3) -> None:
        self.seconds = seconds
        self.done: list[tuple[str, list[int]]] = []

    def prefetch(self, idx) -> None:
        time.sleep(self.seconds)
        self.done.append(("prefetch", [int(i) for i in idx]))

    def evict(self, idx) -> None:
        self.done.append(("evict", [int(i) for i in idx]))


def test_stop_waits_for_the_requests_in_progress():
    """Kills: the threads not joined (or not told to end: one sentinel per thread), the join skipped in the
    process that started them."""
    slow = SlowReads()
    w = _Workers(slow, 2)  # type: ignore[arg-type]
    w.queue.put((None, False, np.array([1, 2])))
    w.queue.put((None, False, np.array([3])))
    time.sleep(0.05)  # both taken
    w.stop()
    assert sorted(slow.done) == [("prefetch", [1, 2]), ("prefetch", [3])]
    assert not any(t.is_alive() for t in w.threads)


def test_workers_run_each_request_as_asked_skip_cancelled_ones_and_count_failures(pristine):
    """Requests are ``(token, evict, indices)``: a prefetch opens the shard it reads, an eviction leaves shards
    not opened alone; a request whose token was cancelled is not run; one that raises is counted in
    ``failed`` and the thread goes on. Kills: evict and prefetch swapped, the token test inverted or
    applied to requests without one, a failure not counted or counted twice, a thread ended by one."""
    ds = fastload.Dataset(pristine / "ds")
    w = _Workers(ds, 1)
    live, cancelled = _Token(), _Token()
    cancelled.cancelled = True
    assert w.failed == 0
    w.queue.put((None, True, np.array([0])))  # evict: shard 0 is not open, nothing happens
    w.queue.put((cancelled, False, np.array([N])))  # would fail, but is not run
    w.queue.put((cancelled, False, np.array([1])))  # would open shard 0, but is not run
    w.queue.put((live, False, np.array([N])))  # out of range: fails
    w.queue.put((None, True, np.array([-1])))  # fails too
    w.queue.put((live, False, np.array([5])))  # opens shard 2
    w.stop()
    assert w.failed == 2
    assert ds._files[0] is None and ds._files[1] is None and ds._files[2] is not None


# ----------------------------------------------------------------------------- more of the same, from the survivors


def test_an_array_of_bools_is_refused_as_a_list_of_them_is(pristine):
    """``read_batch`` and ``field_values`` take an array's items as Python values (``tolist``), so a bool
    array is refused naming the bool as Python writes it. Kills: the array iterated as NumPy scalars."""
    ds = fastload.Dataset(pristine / "ds")
    for read in (ds.read_batch, ds.field_values):
        for given in ([True], np.array([True])):
            with pytest.raises(TypeError) as e:
                read(given)
            assert str(e.value) == "dataset index must be an integer, not a bool (True)"


def test_a_batch_of_overflow_records_fits_a_buffer_of_exactly_what_it_needs(pristine):
    """Each record in overflow pages uses all of its READ_SLACK (its page header is read with it), so a buffer
    of exactly the documented need leaves no byte over: the payloads, the last ending at the buffer's end,
    are whole. Kills: the first record written past the buffer's start."""
    root = pristine / "ds"
    batch = [3, 0, 2, 0]
    buf = np.zeros(need_of(root, batch), np.uint8)
    rb = fastload.Dataset(root).read_batch(batch, buffer=buf)
    assert rb.buffer is buf and not rb.errors
    assert [bytes(p) for p in rb.payloads] == [split(stored(root, i))[2] for i in batch]


def test_prefetch_and_evict_refuse_indices_naming_the_first_bad_one(pristine):
    """Kills: the message replaced, the upper bound read as ``>`` (``evict`` of an unopened shard then says
    nothing)."""
    ds = fastload.Dataset(pristine / "ds")
    for act in (ds.prefetch, ds.evict):
        for bad, msg in (([N], f"sample index {N} out of range for a dataset of {N} samples"),
                         ([2, -1, N + 3], f"sample index -1 out of range for a dataset of {N} samples"),
                         ([0, N + 3], f"sample index {N + 3} out of range for a dataset of {N} samples")):  # fmt: skip
            with pytest.raises(IndexError) as e:
                act(bad)
            assert str(e.value) == msg
        with pytest.raises(TypeError) as e:
            act(np.array([1.0, 2.0]))
        assert str(e.value) == "sample indices must be integers, got an array of float64"
    assert ds._files == [None, None, None]  # the refusals opened nothing


class Batch:
    """A batch object as the samplers yield them: its sample indices in ``indices``."""

    def __init__(self, indices) -> None:
        self.indices = np.asarray(indices)


def test_ahead_reads_a_batch_objects_indices(pristine):
    """Kills: the batch's ``indices`` attribute not looked up (the object itself taken as the indices)."""
    ds = fastload.Dataset(pristine / "ds")
    batches = [Batch([0, 1]), Batch([5]), Batch([2, 3, 4])]
    with ReadAhead(ds, threads=2, depth=1) as ra:
        assert list(ra.ahead(batches)) == batches
        assert ra.requested == 6


def test_a_read_ahead_that_fails_is_logged_at_debug_level_with_its_cause(pristine, caplog):
    """Kills: the log line's format or its arguments changed."""
    ds = fastload.Dataset(pristine / "ds")
    caplog.set_level("DEBUG", logger="fastload.reader")
    w = _Workers(ds, 1)
    w.queue.put((None, False, np.array([4, N, N + 1])))
    w.stop()
    lines = [r.getMessage() for r in caplog.records if r.name == "fastload.reader"]
    assert lines == [f"read-ahead of 3 records failed: sample index {N + 1} out of range for a dataset of {N} samples"]


class RefuseThreads:
    """``threading.Thread.start`` refusing read-ahead threads after the first ``after`` of them, as a process
    limit would (``ulimit -u``, a container's pids.max: not something a test may set for its own process)."""

    def __init__(self, monkeypatch, after: int) -> None:
        self.started: list[threading.Thread] = []
        real, me = threading.Thread.start, self

        def start(t: threading.Thread) -> None:
            if t.name.startswith("fastload-readahead-"):
                if len(me.started) >= after:
                    raise RuntimeError("can't start new thread")
                me.started.append(t)
            real(t)

        monkeypatch.setattr(threading.Thread, "start", start)


def test_threads_that_cannot_start_are_a_loader_error_and_those_started_end(pristine, monkeypatch):
    """Kills: the start error's cause dropped from the message, the threads never started joined (a
    RuntimeError instead of the LoaderError), those that started left running."""
    from fastload.errors import LoaderError
    from fastload.threads import HINT

    refuse = RefuseThreads(monkeypatch, after=2)
    ra = ReadAhead(fastload.Dataset(pristine / "ds"), threads=3)
    with pytest.raises(LoaderError) as e:
        ra.start()
    assert str(e.value) == f"could not start the read-ahead's 3 threads: can't start new thread; {HINT}"
    assert len(refuse.started) == 2
    for t in refuse.started:
        t.join(5)
        assert not t.is_alive()


def test_a_read_ahead_dropped_without_close_ends_its_threads(pristine):
    """The ReadAhead's finaliser stops its threads when it is collected. Kills: the finaliser given nothing
    to call."""
    import gc

    ra = ReadAhead(fastload.Dataset(pristine / "ds"), threads=2)
    ra.start()
    threads = list(ra._workers.threads)
    del ra
    gc.collect()
    for t in threads:
        t.join(5)
        assert not t.is_alive()


def test_prefetch_of_nothing_starts_no_threads_and_close_before_start_or_twice_is_fine(pristine):
    """Kills: an empty request going on to start the threads (and split into no parts), close of a ReadAhead
    that never started detaching a finaliser it does not have."""
    ra = ReadAhead(fastload.Dataset(pristine / "ds"), threads=2)
    ra.prefetch([])
    ra.prefetch(np.zeros(0, np.int64))
    assert ra._workers is None and ra.requested == 0
    ra.close()
    ra.close()
    assert ra._workers is None
    with ReadAhead(fastload.Dataset(pristine / "ds")) as ra2:
        pass
    assert ra2._closed


def test_ahead_drops_its_requests_not_started_when_the_iteration_ends(pristine):
    """With one thread busy on the first batch's read (a stand-in for a cold disk: 0.3 s), the iteration is
    closed after that batch; the two batches asked for after it are then never read ahead. Kills: the
    requests made without the iteration's token, or the token not cancelled at its end."""
    ds = fastload.Dataset(pristine / "ds")
    slow = SlowReads()
    ds.prefetch = slow.prefetch  # type: ignore[method-assign]
    ra = ReadAhead(ds, threads=1, depth=4)
    it = ra.ahead([[0], [1], [2]])
    assert next(it) == [0]
    it.close()
    ra.close()
    assert slow.done in ([], [("prefetch", [0])])
    assert ra.requested == 3


def test_ahead_with_evict_drops_every_batch_once_read(pristine, monkeypatch):
    """Each batch is evicted when the next one is asked for, the last when the iteration asks past it; with
    every shard open, each shard's ``evict`` gets exactly the read batches' records of that shard. Kills:
    something else than the batch just read handed to the eviction."""
    from fastload.store import ShardFile

    ds = fastload.Dataset(pristine / "ds")
    for i in (0, 2, 3):
        ds.record(i)  # open every shard: evict skips shards not open
    got: dict[str, set[int]] = {}
    real = ShardFile.evict

    def spy(f, indices):
        got.setdefault(Path(f.path).name, set()).update(int(i) for i in indices)
        return real(f, indices)

    monkeypatch.setattr(ShardFile, "evict", spy)
    ra = ReadAhead(ds, threads=2, depth=1, evict=True)
    batches = [[1, 0], [2, 4], [5]]
    assert list(ra.ahead(batches)) == batches
    w = ra._workers
    ra.close()
    assert got == {"shard-00000.lmdb": {0, 1}, "shard-00001.lmdb": {2}, "shard-00002.lmdb": {4, 5}} and w.failed == 0


def test_fields_of_the_image_alone_are_its_payload_checked_when_asked(root):
    """``fields(i, ["image"])`` of a dataset without typed fields reads the record; with ``check`` an altered
    payload is refused. Kills: the record not read when only the image is asked for, the check not
    passed on."""
    h, path, payload = split(stored(root, 4))
    assert fastload.Dataset(root).fields(4, ["image"]) == {"image": payload}
    assert fastload.Dataset(root).fields(4, ["label", "image"]) == {"label": 1, "image": payload}
    assert fastload.Dataset(root).fields(4) == {"label": 1}
    shard, at = at_in_file(root, 4)
    flip = at + 40 + len(path) + len(payload) - 3
    poke(shard, flip, bytes([shard.read_bytes()[flip] ^ 0x10]))
    with pytest.raises(CorruptDataError) as e:
        fastload.Dataset(root, check=True).fields(4, ["image"])
    assert str(e.value) == f"{shard} sample 4: payload XXH3 checksum mismatch (the image bytes were altered)"
    assert fastload.Dataset(root).fields(4, ["image"])["image"] == split(stored(root, 4))[2]


@pytest.fixture
def small_only(tmp_path) -> Path:
    """Three small JPEGs in one shard: no overflow pages, so the shard opens without its leaf page being
    read (it is checked when its records are first located)."""
    for i in range(3):
        write_image(tmp_path / "src" / "c0" / f"{i}.jpg", encode_color(0, i), size=(32, 24), quality=90)
    fastload.pack(tmp_path / "src", tmp_path / "ds", workers=1, progress=False)
    return tmp_path / "ds"


def test_a_damaged_leaf_page_is_reported_by_every_read_that_locates_a_record(small_only):
    """The leaf page's own page number (its header's first u64) made another: each read that locates a
    record says the shard is damaged and to verify the dataset. Kills: the damage let through unwrapped
    (no advice) by locate, read_batch, prefetch or a record read."""
    shard = small_only / "shard-00000.lmdb"
    data = shard.read_bytes()
    leaves = [p for p in range(len(data) // 4096) if struct.unpack_from("<Q2xH", data, p * 4096)[1] & 0x7F == 2]
    assert len(leaves) == 1
    poke(shard, leaves[0] * 4096, struct.pack("<Q", 999))
    msg = f"{shard}: damaged shard (LMDB page {leaves[0]} says it is page 999); run `fastload verify {small_only}`"
    for read in ("locate", "record", "prefetch", "field_values", "read_batch"):
        ds = fastload.Dataset(small_only)
        if read == "read_batch":
            rb = ds.read_batch([1, 2])
            assert [str(rb.errors[p]) for p in (0, 1)] == [msg, msg] and rb.payloads == [None, None], read
            assert all(type(e) is CorruptDataError for e in rb.errors.values())
            continue
        with pytest.raises(CorruptDataError) as e:
            getattr(ds, read)([1] if read in ("prefetch", "field_values") else 1)
        assert str(e.value) == msg and type(e.value) is CorruptDataError, read


def test_a_version_1_record_is_checked_by_its_crc32(root):
    """A record of version 1 (format 1.x) carries zlib's CRC-32 of its payload: it reads with ``check``, and
    altered it is refused naming the CRC-32. Kills: the record's version not passed to the checksum."""
    i = 4
    payload = split(stored(root, i))[2]
    put_record(root, i, payload, encoding=1, width=64, height=48, version=1)
    assert fastload.Dataset(root, check=True)[i] == (payload, 1)
    altered = payload[:-3] + bytes([payload[-3] ^ 0x10]) + payload[-2:]
    put_record(root, i, altered, encoding=1, width=64, height=48, version=1)
    shard, at = at_in_file(root, i)
    crc = zlib.crc32(altered)
    poke(shard, at + 28, struct.pack("<I", crc ^ 1))  # the stored CRC-32 one bit off the payload's
    with pytest.raises(CorruptDataError) as e:
        fastload.Dataset(root, check=True)[i]
    assert str(e.value) == f"{shard} sample {i}: payload CRC-32 mismatch (the image bytes were altered)"


def test_a_shard_of_another_size_than_the_manifests_is_refused_with_both_sizes(root):
    """Kills: the message replaced."""
    shard = root / "shard-00001.lmdb"
    with open(shard, "ab") as f:
        f.write(b"\0" * 4096)
    with pytest.raises(CorruptDataError) as e:
        fastload.Dataset(root)[2]
    assert str(e.value) == (f"{shard}: shard is 36864 bytes, the manifest says 32768; "
                            "it was truncated or replaced (run `fastload verify`)")  # fmt: skip
    assert fastload.Dataset(root)[4][1] == 1  # the other shards still read


def test_a_shard_whose_tree_is_damaged_is_refused_when_opened(root):
    """Shard 2 holds a record in overflow pages, so opening it reads its leaf page, whose page number is made
    another's here. Kills: the damage found on opening let through without the advice."""
    shard = root / "shard-00002.lmdb"
    data = shard.read_bytes()
    leaves = [p for p in range(len(data) // 4096) if struct.unpack_from("<Q2xH", data, p * 4096)[1] & 0x7F == 2]
    assert len(leaves) == 1
    poke(shard, leaves[0] * 4096, struct.pack("<Q", 999))
    msg = f"{shard}: damaged shard (LMDB page {leaves[0]} says it is page 999); run `fastload verify {root}`"
    for i in (3, 5):
        with pytest.raises(CorruptDataError) as e:
            fastload.Dataset(root)[i]
        assert str(e.value) == msg and type(e.value) is CorruptDataError


def test_more_samples_than_the_shards_can_hold_is_refused_naming_the_short_shard(root):
    """The manifest claims 5000 more samples in its last shard, its count and size made to agree (a record
    takes at least 58 bytes: a 40-byte header, an 8-byte key, LMDB's 8-byte node header and 2-byte slot),
    labels.bin their size: the files on disk hold too few bytes, and the message names the first shard
    whose size is not the manifest's (the last one; the others are right). Kills: a shard of the right size
    named, the first wrong one lost, the manifest's path shortened, the check skipped for local datasets."""
    m = json.loads((root / "manifest.json").read_text())
    extra, last = 5000, m["shards"][-1]
    real = (root / last["file"]).stat().st_size
    last.update(count=last["count"] + extra, bytes=last["bytes"] + extra * 58)
    m.update(num_samples=N + extra, class_counts=[m["class_counts"][0] + extra] + m["class_counts"][1:])
    (root / "manifest.json").write_text(json.dumps(m))
    (root / "labels.bin").write_bytes(b"\0" * 4 * (N + extra))
    have = sum((root / s["file"]).stat().st_size for s in m["shards"])
    with pytest.raises(CorruptDataError) as e:
        fastload.Dataset(root)
    assert str(e.value) == (
        f"{root}/manifest.json: claims {N + extra} samples but its shard files hold {have} bytes, room for at most "
        f"{have // 58} records ({root / last['file']}: shard is {real} bytes, the manifest says {last['bytes']}); "
        "the dataset is incomplete or was altered: pack it again"
    )


def test_url_only_options_are_refused_for_a_local_path_naming_them(pristine):
    """Kills: an option's name in the message changed."""
    root = pristine / "ds"
    for kw, names in (({"storage_options": {}}, "storage_options"), ({"cache_dir": "/x", "fetch": "shards"}, "cache_dir, fetch"),
                      ({"cache_limit": "1GB", "retry_deadline": 3.0}, "cache_limit, retry_deadline")):  # fmt: skip
        with pytest.raises(ConfigError) as e:
            fastload.Dataset(root, **kw)
        assert str(e.value) == f"{names}: only for a dataset URL (s3://...), not the local path {str(root)!r}"


def test_a_url_hands_its_options_to_the_object_stores_reader(tmp_path):
    """A URL's ``cache_limit`` and ``fetch`` are checked by the node cache before anything is fetched (no server
    is needed to refuse them). Kills: the URL taken for a local path, ``cache_limit`` or ``retry_deadline`` not
    passed on."""
    url, cache = "s3://bucket/ds", tmp_path / "cache"
    with pytest.raises(ConfigError) as e:
        fastload.Dataset(url, cache_dir=cache, cache_limit="many")
    assert str(e.value) == "cache_limit must be bytes or a size like '50GB' or '512MiB', got 'many'"
    with pytest.raises(ConfigError) as e:
        fastload.Dataset(url, cache_dir=cache, retry_deadline=-1)
    assert str(e.value) == "retry_deadline must be a number of seconds in (0, 1e6), got -1"
    with pytest.raises(ConfigError) as e:
        fastload.Dataset(url, cache_dir=cache, fetch="bogus")
    assert str(e.value).startswith("fetch must be 'shards' or 'records', got 'bogus'")


def test_numpy_and_zero_d_bools_are_refused_as_bools(pristine):
    """Kills: NumPy's bool dtype not recognised (its scalars would be refused as not integers, naming another
    type)."""
    ds = fastload.Dataset(pristine / "ds")
    for index, shown in ((np.True_, "np.True_"), (np.array(False), "array(False)"), (True, "True")):
        with pytest.raises(TypeError) as e:
            ds[index]
        assert str(e.value) == f"dataset index must be an integer, not a bool ({shown})"
    assert ds[np.int16(4)] == ds[4] and ds[np.array(-2)] == ds[4]


def test_a_missing_manifest_hints_at_resume_only_beside_an_unfinished_pack(root):
    """Kills: the hint given always, or looked for under another name than the packer's ``*.tmp``."""
    (root / "manifest.json").unlink()
    with pytest.raises(FormatError) as e:
        fastload.Dataset(root)
    assert str(e.value) == f"{root}/manifest.json: missing manifest; {root} is not a complete fastload dataset"
    (root / "shard-00003.lmdb.tmp").write_bytes(b"")
    with pytest.raises(FormatError) as e:
        fastload.Dataset(root)
    assert str(e.value) == (f"{root}/manifest.json: missing manifest; {root} is not a complete fastload dataset"
                            " (an unfinished pack: continue it with `fastload pack --resume`)")  # fmt: skip


def test_a_manifest_of_exactly_the_cap_is_read_one_byte_more_is_not(root, monkeypatch):
    """The cap (1 GiB) made this manifest's size, so that the bound is tested on a small file. Kills: the cap
    read as ``>=``."""
    import fastload.reader as reader

    size = (root / "manifest.json").stat().st_size
    monkeypatch.setattr(reader, "MAX_MANIFEST_BYTES", size)
    assert len(fastload.Dataset(root)) == N
    monkeypatch.setattr(reader, "MAX_MANIFEST_BYTES", size - 1)
    with pytest.raises(FormatError) as e:
        fastload.Dataset(root)
    assert str(e.value) == (f"{root}/manifest.json: {size} bytes, more than the {size - 1} a manifest may have; "
                            "it is not a fastload manifest or it was damaged: pack the dataset again")  # fmt: skip


def test_a_manifest_that_grows_while_read_is_refused(root):
    """A file of /proc says it has 0 bytes and reads more: what a manifest being rewritten in place looks like.
    Kills: the message replaced."""
    (root / "manifest.json").unlink()
    (root / "manifest.json").symlink_to("/proc/self/status")
    with pytest.raises(FormatError) as e:
        fastload.Dataset(root)
    assert str(e.value) == (f"{root}/manifest.json: grew while being read; a manifest is written once, atomically: "
                            "open the dataset again")  # fmt: skip


def test_the_finaliser_of_a_dropped_read_ahead_does_not_wait_for_a_read_in_progress(pristine):
    """The finaliser runs in whichever thread drops the last reference (a training loop): it tells the threads
    to end and returns, without waiting for a read in progress (a stand-in taking 2 s, for a cold disk).
    Kills: the finaliser's stop waiting (its timeout 0 dropped for the default)."""
    ds = fastload.Dataset(pristine / "ds")
    slow = SlowReads(2.0)
    ds.prefetch = slow.prefetch  # type: ignore[method-assign]
    ra = ReadAhead(ds, threads=1)
    ra.prefetch([0])
    threads = list(ra._workers.threads)
    time.sleep(0.1)  # the read has started
    t0 = time.monotonic()
    del ra  # no cycle holds it: finalised here
    assert time.monotonic() - t0 < 1.0
    assert threads[0].is_alive() and slow.done == []


# ----------------------------------------------------------------------------- a URL's dataset (a real S3 server)


@pytest.fixture(scope="module")
def bucket(s3, tmp_path_factory):
    """Eight images packed to s3://BUCKET/ds, one per 4 KB shard; the source folder for the expected bytes."""
    base = tmp_path_factory.mktemp("reader2_s3")
    paint_folder(base / "src", 2, 4)
    old = os.environ.get("FASTLOAD_CACHE")
    os.environ["FASTLOAD_CACHE"] = str(base / "packcache")
    try:
        url = f"s3://{s3.make_bucket()}/ds"
        fastload.pack(base / "src", url, shard_size="4KB", storage_options=s3.options(), progress=False, workers=1)
    finally:
        if old is None:
            del os.environ["FASTLOAD_CACHE"]
        else:
            os.environ["FASTLOAD_CACHE"] = old
    sources = sorted((base / "src").rglob("*.jpg"))  # class_<label>/img_<j>: ImageFolder order
    return {"url": url, "options": s3.options(), "sources": sources}


@pytest.mark.parametrize("fetch", ["shards", "records"])
def test_a_urls_records_are_read_through_the_node_cache(bucket, tmp_path, fetch):
    """Whole shards downloaded, or single records fetched into sparse copies: either way each record's payload
    is its source file's bytes, and the dataset names its URL. Kills: the cache's directory not taken as the
    dataset's path, the URL not kept, a sparse copy read without its filler (zeros)."""
    ds = fastload.Dataset(bucket["url"], cache_dir=tmp_path / "cache", storage_options=bucket["options"], fetch=fetch)
    assert ds.url == bucket["url"] and repr(ds) == f"Dataset({bucket['url']!r}, samples=8, classes=2, shards=8)"
    assert [s.first for s in ds.shards] == list(range(8))
    for i, src in enumerate(bucket["sources"]):
        assert ds[i] == (src.read_bytes(), i // 4), i


def test_follow_epoch_of_a_url_closes_the_shards_the_next_hold_batches_do_not_need(bucket, tmp_path):
    """One shard a batch; shard 0 is read by the first batch and again by the last (the 13th). With
    ``hold=20`` it is needed within the next 20 batches all along, so it stays open; with ``hold=8`` it is
    closed once its next use is more than 8 batches ahead (after batches 1 to 3) and opened again for the
    last. Kills: ``hold`` not passed on, the dataset's release not handed to the download order."""
    order = [0, 1, 2, 3, 4, 5, 6, 7, 1, 2, 3, 4, 0]
    assert shard0_open_after_each(bucket, tmp_path, order, 20) == [True] * 13
    # release happens before each batch is handed on: shard 0's next use (12) > pos + 8 for pos 1..3
    assert shard0_open_after_each(bucket, tmp_path, order, 8) == [True] + [False] * 11 + [True]


def shard0_open_after_each(bucket, tmp_path: Path, order: list[int], hold: int | None) -> list[bool]:
    """Batches of one sample each (one shard a batch) through ``follow_epoch`` (``hold`` not given when None),
    each read; whether shard 0 is open after each."""
    ds = fastload.Dataset(bucket["url"], cache_dir=tmp_path / f"cache{hold}", storage_options=bucket["options"])
    seen = []
    for b in ds.follow_epoch([[k] for k in order], iter, **({} if hold is None else {"hold": hold})):
        assert ds[b[0]][0] == bucket["sources"][b[0]].read_bytes()
        seen.append(ds._files[0] is not None and not ds._files[0].closed)
    return seen


def test_follow_epoch_holds_shards_needed_within_8_batches_by_default(bucket, tmp_path):
    """Shard 0 read by batch 0 and again by batch 10: after batch 1 its next use is 9 batches ahead, more
    than the default 8, so it is closed then (and opened again for batch 10); with ``hold=9`` it stays open.
    Kills: the default changed."""
    order = [0, 1, 2, 3, 4, 5, 6, 7, 1, 2, 0]
    assert shard0_open_after_each(bucket, tmp_path, order, 9) == [True] * 11
    assert shard0_open_after_each(bucket, tmp_path, order, None) == [True] + [False] * 9 + [True]


def test_a_jpeg_whose_header_width_is_its_height_is_refused(root):
    """Sample 4 is 64x48; its record header made to say 48x48 (the header is not covered by the checksum).
    Kills: the frame's width compared with its height instead of its own width."""
    i = 4
    shard, at = at_in_file(root, i)
    poke(shard, at + 12, struct.pack("<I", 48))
    with pytest.raises(CorruptDataError) as e:
        fastload.Dataset(root)[i]
    assert str(e.value) == (f"{shard} sample {i}: header says the jpeg image is 48x48 but its payload declares 64x48; "
                            "the record was altered (run `fastload verify`)")  # fmt: skip


def test_a_manifest_that_cannot_be_read_says_what_the_system_said(root):
    """/proc/self/mem is a regular file whose first byte cannot be read (EIO). Kills: the message replaced."""
    (root / "manifest.json").unlink()
    (root / "manifest.json").symlink_to("/proc/self/mem")
    with pytest.raises(FormatError) as e:
        fastload.Dataset(root)
    assert str(e.value) == f"{root}/manifest.json: cannot read manifest: Input/output error"


def test_a_shard_that_cannot_be_opened_says_why(root):
    """The process's open-files limit lowered to its lowest free descriptor, so that the next open fails for
    real (EMFILE), after the dataset was opened. Kills: the system's reason lost from the message."""
    import resource

    ds = fastload.Dataset(root)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    fd = os.dup(0)
    os.close(fd)
    resource.setrlimit(resource.RLIMIT_NOFILE, (fd, hard))
    try:
        with pytest.raises(FormatError) as e:
            ds[4]
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert str(e.value) == f"{root}/shard-00002.lmdb: cannot open shard: it cannot be opened (Too many open files)"
    assert ds[4][1] == 1


# ----------------------------------------------------------------------------- from the held-out sample's survivors


def test_prefetch_epoch_of_a_local_dataset_starts_nothing_and_stop_fetching_is_a_no_op(pristine):
    """A local dataset has nothing to download: ``prefetch_epoch`` says no downloads started (False) and opens
    no shard, ``stop_fetching`` returns. Kills: either one's URL test inverted (a local dataset asking its
    absent node cache)."""
    ds = fastload.Dataset(pristine / "ds")
    assert ds.prefetch_epoch([[0, 1], [5]]) is False
    assert ds.stop_fetching() is None
    assert ds._files == [None, None, None]


def test_prefetch_epoch_of_a_url_downloads_its_shards_before_any_read(bucket, tmp_path):
    """Whole shards with no cache limit all fit: ``prefetch_epoch`` says it started, and every shard file
    arrives in the cache directory, whole (the size and SHA-256 of the bucket's manifest), while nothing is
    read; with single records there is nothing to download ahead (False)."""
    ds = fastload.Dataset(bucket["url"], cache_dir=tmp_path / "cache", storage_options=bucket["options"])
    m = json.loads((ds.path / "manifest.json").read_text())
    files = [ds.path / s["file"] for s in m["shards"]]
    assert not any(p.exists() for p in files)
    assert ds.prefetch_epoch([[k] for k in (3, 1, 0, 2, 4, 5, 6, 7)]) is True
    deadline = time.monotonic() + 30
    while not all(p.exists() and p.stat().st_size == s["bytes"] for p, s in zip(files, m["shards"])):
        assert time.monotonic() < deadline, [p.name for p in files if not p.exists()]
        time.sleep(0.05)
    assert [hashlib.sha256(p.read_bytes()).hexdigest() for p in files] == [s["sha256"] for s in m["shards"]]
    assert ds._files == [None] * 8
    ds.stop_fetching()
    rec = fastload.Dataset(bucket["url"], cache_dir=tmp_path / "cache_r", storage_options=bucket["options"], fetch="records")
    assert rec.prefetch_epoch([[0], [1]]) is False


def test_a_failed_sample_takes_only_its_slack_in_the_batch_buffer(root):
    """A sample whose shard is missing needs no room but its READ_SLACK: a buffer of the other samples' need
    plus READ_SLACK for each failed one is used as it is. The sizes are int64, 0 where a sample failed.
    Kills: a failed sample counted with a byte of its own, the heights of another dtype."""
    (root / "shard-00002.lmdb").unlink()
    batch = [3, 1, 5, 0]
    buf = np.zeros(need_of(root, [1, 0]) + 2 * READ_SLACK, np.uint8)
    rb = fastload.Dataset(root).read_batch(batch, buffer=buf)
    assert rb.buffer is buf and sorted(rb.errors) == [0, 2]
    assert [bytes(p) if p is not None else None for p in rb.payloads] == [None, split(stored(root, 1))[2], None,
                                                                           split(stored(root, 0))[2]]  # fmt: skip
    assert rb.widths.dtype == np.int64 and rb.heights.dtype == np.int64
    assert rb.widths.tolist() == [0, 40, 0, 160] and rb.heights.tolist() == [0, 30, 0, 120]


def test_starting_and_closing_the_read_ahead_wait_for_its_lock(pristine):
    """Starting and stopping the threads is serialised by one lock: while another holder has it, ``close``
    waits (the epoch thread, the next epoch's and a finaliser may get there at once), and goes on once it is
    released. Kills: a new lock made on every use in the process that made it (instead of after a fork)."""
    ra = ReadAhead(fastload.Dataset(pristine / "ds"), threads=1)
    lock = ra._locked()
    done = threading.Event()

    def close() -> None:
        ra.close()
        done.set()

    with lock:
        t = threading.Thread(target=close)
        t.start()
        assert not done.wait(0.3)  # close waits for the lock
        assert not ra._closed
    assert done.wait(5) and ra._closed
    t.join(5)


def test_a_foreign_or_newer_manifest_is_refused_naming_its_file(root):
    """A JSON file that is not a fastload manifest, and one of a newer major version: both refused, the message
    naming the dataset's manifest file by its path. Kills: the path not handed to the manifest's parser."""
    m = json.loads((root / "manifest.json").read_text())
    (root / "manifest.json").write_text(json.dumps({**m, "format": "other"}))
    with pytest.raises(FormatError) as e:
        fastload.Dataset(root)
    assert str(e.value) == f"{root}/manifest.json: not a fastload manifest (format='other'); create one with `fastload pack`"
    (root / "manifest.json").write_text(json.dumps({**m, "version": "99.0"}))
    with pytest.raises(FormatError) as e:
        read_manifest(root)
    assert str(e.value).startswith(f"{root}/manifest.json: format version 99.0 is newer than this fastload reads (")


def test_a_shard_is_opened_once_its_file_deleted_after_the_first_read_is_still_read(root):
    """A shard's file is opened and checked on its first read and kept open: the file's name unlinked after it
    (a cleanup of the directory while a job runs), the open shard still reads every record of it, the
    source's bytes; a shard never opened is reported missing. Kills: the open file not reused (the file
    looked up and checked again on every read)."""
    ds = fastload.Dataset(root)
    want = {i: split(stored(root, i))[2] for i in range(N)}
    assert ds[3][0] == want[3]
    (root / "shard-00002.lmdb").unlink()
    (root / "shard-00001.lmdb").unlink()
    assert [ds[i] for i in (4, 5, 3)] == [(want[i], i // 3) for i in (4, 5, 3)]
    rb = ds.read_batch([5, 3])
    assert [bytes(p) for p in rb.payloads] == [want[5], want[3]] and not rb.errors
    with pytest.raises(FormatError) as e:
        ds[2]
    assert str(e.value) == f"{root}/shard-00001.lmdb: shard file is missing; the dataset is incomplete"


def test_a_sample_whose_shard_is_damaged_takes_only_its_slack_in_the_batch_buffer(tmp_path):
    """Three small JPEGs, one a shard (no overflow pages: a leaf page is checked when a record is first located);
    shard 0's leaf page made to say it is another page. Its sample fails when located, and takes only its
    READ_SLACK of the buffer: a buffer of the other two samples' need plus READ_SLACK is used as it is.
    Kills: a sample of a damaged shard counted with a byte of its own."""
    for i in range(3):
        write_image(tmp_path / "src" / "c0" / f"{i}.jpg", encode_color(0, i), size=(32, 24), quality=90)
    fastload.pack(tmp_path / "src", tmp_path / "ds", workers=1, progress=False, shard_size="4KB")
    root = tmp_path / "ds"
    assert [(s["first"], s["count"]) for s in shards(root)] == [(0, 1), (1, 1), (2, 1)]
    shard = root / "shard-00000.lmdb"
    data = shard.read_bytes()
    leaves = [p for p in range(len(data) // 4096) if struct.unpack_from("<Q2xH", data, p * 4096)[1] & 0x7F == 2]
    assert len(leaves) == 1
    want = {i: split(stored(root, i))[2] for i in (1, 2)}
    poke(shard, leaves[0] * 4096, struct.pack("<Q", 999))
    buf = np.zeros(need_of(root, [2, 1]) + READ_SLACK, np.uint8)
    rb = fastload.Dataset(root).read_batch([2, 0, 1], buffer=buf)
    assert rb.buffer is buf and list(rb.errors) == [1]
    assert str(rb.errors[1]) == (f"{shard}: damaged shard (LMDB page {leaves[0]} says it is page 999); "
                                 f"run `fastload verify {root}`")  # fmt: skip
    assert [bytes(p) if p is not None else None for p in rb.payloads] == [want[2], None, want[1]]


def test_labels_that_cannot_be_read_say_what_the_system_said(root):
    """A dataset of no samples (its manifest made to say so: ``pack`` refuses an empty source) whose labels.bin
    is /proc/self/mem, a regular file of 0 bytes whose first byte cannot be read (EIO). Kills: the message
    replaced."""
    m = json.loads((root / "manifest.json").read_text())
    m.update(num_samples=0, shards=[], class_counts=[0] * len(m["classes"]))
    (root / "manifest.json").write_text(json.dumps(m))
    (root / "labels.bin").unlink()
    (root / "labels.bin").symlink_to("/proc/self/mem")
    with pytest.raises(FormatError) as e:
        fastload.Dataset(root)
    assert str(e.value) == f"{root}/labels.bin: cannot read labels: it cannot be opened (Input/output error)"
    assert type(e.value) is FormatError


def test_where_of_a_record_that_cannot_be_read_shows_a_question_mark_for_its_path(root):
    """``where`` describes a sample in an error message, so it does not fail on a damaged record: its source
    path, unreadable (a foreign magic), is shown as ``?``. Kills: another placeholder."""
    shard, at = at_in_file(root, 4)
    poke(shard, at, b"XLRC")
    ds = fastload.Dataset(root)
    assert ds.where(4) == f"sample 4 (?) in {shard}"
    assert ds.where(5) == f"sample 5 ({SOURCES[5]}) in {shard}"


def test_runs_are_asked_for_whole_even_for_a_batch_of_one_sample(pristine):
    """With ``runs=3`` a batch of one sample asks for its whole run of 3, once: [4] asks for 3, 4, 5, then [5]
    for nothing more, then [0] for 0, 1, 2: 6 records requested. Kills: a batch of one sample asked for alone
    (3 requested)."""
    ds = fastload.Dataset(pristine / "ds")
    asked: list[list[int]] = []
    ds.prefetch = lambda idx: asked.append(sorted(int(i) for i in idx))  # type: ignore[method-assign]
    ra = ReadAhead(ds, threads=1, depth=1, runs=3)
    assert list(ra.ahead([[4], [5], [0]])) == [[4], [5], [0]]
    ra.close()
    # requested counts what was asked for; the threads may not have got to every request before the end
    assert ra.requested == 6 and all(a in ([0, 1, 2], [3, 4, 5]) for a in asked)


def test_a_payload_read_apart_that_fails_names_its_shard_and_sample(root, monkeypatch):
    """Sample 0 is over 16 KiB: its head is read first, then its payload apart. A stand-in ``os.pread`` fails
    that second read with EIO, as a disk's bad sector would (not something a test can make): the error names
    the shard and the sample. Kills: the sample's index not passed to the payload's read."""
    import errno

    shard, at = at_in_file(root, 0)
    h, path, payload = split(stored(root, 0))
    where = (at + 40 + len(path), len(payload))
    real = os.pread

    def pread(fd: int, n: int, off: int) -> bytes:
        if (off, n) == where:
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        return real(fd, n, off)

    ds = fastload.Dataset(root)
    monkeypatch.setattr(os, "pread", pread)
    with pytest.raises(CorruptDataError) as e:
        ds[0]
    assert str(e.value) == f"{shard} sample 0: cannot read it (Input/output error)"
    assert ds[1][1] == 0
