"""fastload.reader's refusals of unusable dataset files, the bytes its reads ask the shard files for, and the
read-ahead's window, lock and close, against their documented behaviour, every message whole.

The dataset is the one of ``tests/test_oracles_reader2.py`` (three shards, of samples 0-1, 2 and 3-5; samples
0, 2 and 3 over 16 KiB, sample 2's source path past the first 512 bytes of its value), and the expected bytes
and offsets come from the shard files themselves, read with ``lmdb`` and split by the record layout of
docs/format.md (``split``, ``at_in_file``), never by the reader. A read that would need a disk failing is made
by a stand-in ``os.pread``; the reads a call makes are recorded by one that only passes them on.
"""

from __future__ import annotations

import errno
import os
import shutil
import struct
import time
from pathlib import Path

import pytest

import fastload
import fastload.reader
from fastload import ConfigError, CorruptDataError, FormatError
from fastload.reader import ReadAhead, read_manifest
from fastload.store import close_shared

from test_oracles_reader2 import SOURCES, Captioned, _paint, at_in_file, poke, put_record, shards, split, stored

EIO = os.strerror(errno.EIO)


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> Path:
    """The image folder (``src``) and its dataset (``ds``), sample 1 stored as the PNG it was."""
    base = tmp_path_factory.mktemp("reader3")
    _paint(base / "src")
    fastload.pack(base / "src", base / "ds", workers=1, progress=False, shard_size="48KiB")
    put_record(base / "ds", 1, (base / "src" / SOURCES[1]).read_bytes(), encoding=2, width=40, height=30)
    return base


@pytest.fixture
def root(pristine, tmp_path) -> Path:
    """A fresh copy of the dataset directory, to damage."""
    close_shared()
    return Path(shutil.copytree(pristine / "ds", tmp_path / "ds"))


@pytest.fixture(scope="module")
def fields_root(tmp_path_factory) -> Path:
    """Dict samples with a caption and a step (samples 1 and 4 large records), packed in several shards."""
    out = tmp_path_factory.mktemp("reader3_fields") / "ds"
    fastload.pack_dataset(Captioned(), out, workers=1, progress=False, shard_size="48KiB")
    return out


class Reads:
    """A stand-in ``os.pread`` that records each ``(offset, length)`` asked for, and fails with EIO the ones in
    ``fail``."""

    def __init__(self, fail: tuple[int, int] | None = None) -> None:
        self.real, self.fail, self.asked = os.pread, fail, []

    def __call__(self, fd: int, n: int, off: int) -> bytes:
        self.asked.append((off, n))
        if (off, n) == self.fail:
            raise OSError(errno.EIO, EIO)
        return self.real(fd, n, off)


# ----------------------------------------------------------------------------- the manifest


def test_a_dataset_path_that_is_missing_or_a_file_is_refused_saying_which(tmp_path):
    """A path where nothing is must be refused as no dataset directory, with the command that makes one; a
    path that is a file as not a directory; both messages whole."""
    missing = tmp_path / "nowhere"
    with pytest.raises(FormatError) as e:
        read_manifest(missing)
    assert str(e.value) == f"{missing}: no such dataset directory; create one with `fastload pack SRC {missing}`"
    a_file = tmp_path / "a_file"
    a_file.write_bytes(b"{}")
    with pytest.raises(FormatError) as e:
        fastload.Dataset(a_file)
    assert str(e.value) == f"{a_file}: not a directory; a packed dataset is a directory made by `fastload pack`"


def test_a_manifest_that_is_not_utf8_is_refused_as_damaged_json(root):
    """The manifest is read as bytes and parsed as JSON text: a byte that is not UTF-8 must be refused as a
    FormatError naming the byte and its position, not escape as a decoding error of the read."""
    (root / "manifest.json").write_bytes(b'{"format": "\xff"}')
    with pytest.raises(FormatError) as e:
        fastload.Dataset(root)
    assert str(e.value) == (f"{root}/manifest.json: not valid JSON ('utf-8' codec can't decode byte 0xff in position 12: "
                            "invalid start byte); the dataset is damaged: pack it again")  # fmt: skip


def test_reading_the_manifest_leaves_no_descriptor_open(root):
    """Each read of the manifest closes the descriptor it opened: reading it many times must not add entries
    to ``/proc/self/fd``."""
    read_manifest(root)
    before = sorted(os.listdir("/proc/self/fd"))
    for _ in range(20):
        assert read_manifest(root).num_samples == len(SOURCES)
    assert sorted(os.listdir("/proc/self/fd")) == before


# ----------------------------------------------------------------------------- shard files outside the dataset


def move_out(root: Path, name: str, elsewhere: Path) -> Path:
    """Shard ``name`` moved to ``elsewhere`` (same bytes) and a symlink to it left in its place."""
    elsewhere.mkdir(exist_ok=True)
    target = Path(shutil.move(str(root / name), str(elsewhere / name)))
    (root / name).symlink_to(target)
    return target


def test_shards_that_resolve_outside_the_dataset_hold_no_bytes_for_its_samples(root, tmp_path):
    """Every shard a symlink to a file of the right size outside the dataset directory: those files must not
    count towards the bytes the shards hold (none do), and the message names the first shard and where it
    resolves, whole."""
    names = [s["file"] for s in shards(root)]
    targets = [move_out(root, name, tmp_path / "elsewhere") for name in names]
    with pytest.raises(CorruptDataError) as e:
        fastload.Dataset(root)
    assert str(e.value) == (
        f"{root}/manifest.json: claims {len(SOURCES)} samples but its shard files hold 0 bytes, room for at most 0 "
        f"records ({root}/{names[0]}: shard file resolves to {str(targets[0].resolve())!r}, outside the dataset "
        "directory); the dataset is incomplete or was altered: pack it again"
    )  # fmt: skip


def test_shards_that_are_missing_hold_no_bytes(root):
    """Every shard file deleted: the files on disk hold 0 bytes (not one per shard), and the message names the
    first missing shard, whole."""
    names = [s["file"] for s in shards(root)]
    for name in names:
        (root / name).unlink()
    with pytest.raises(CorruptDataError) as e:
        fastload.Dataset(root)
    assert str(e.value) == (
        f"{root}/manifest.json: claims {len(SOURCES)} samples but its shard files hold 0 bytes, room for at most 0 "
        f"records ({root}/{names[0]}: shard file is missing); the dataset is incomplete or was altered: pack it again"
    )  # fmt: skip


def test_a_shard_that_resolves_outside_the_dataset_is_not_opened(root, tmp_path):
    """Only the shard of sample 2 a symlink to its own bytes outside the dataset directory (the others hold room
    enough for every sample): reading sample 2 must refuse the file, naming where it resolves, and the other
    shards still read."""
    name = shards(root)[1]["file"]
    original = (root / name).read_bytes()
    target = move_out(root, name, tmp_path / "elsewhere")
    ds = fastload.Dataset(root)
    msg = (f"{root}/{name}: shard file resolves to {str(target.resolve())!r}, outside the dataset directory; "
           f"run `fastload verify {root}`")  # fmt: skip
    with pytest.raises(FormatError) as e:
        ds[2]
    assert str(e.value) == msg
    rb = ds.read_batch([2, 3])
    assert list(rb.errors) == [0] and str(rb.errors[0]) == msg
    assert bytes(rb.payloads[1]) == split(stored(root, 3))[2]
    assert target.read_bytes() == original


# ----------------------------------------------------------------------------- labels.bin


def test_labels_replaced_between_their_size_check_and_their_read_are_refused(root, monkeypatch):
    """labels.bin grown by 4 bytes after its size was checked (while the shard sizes are looked at): the read
    must refuse the file as replaced, with the sizes it saw, whole."""
    n = len(SOURCES)
    real = fastload.reader.claimed_samples_problem

    def grow_labels(*args, **kwargs):
        (root / "labels.bin").write_bytes(b"\0" * (4 * n + 4))
        return real(*args, **kwargs)

    monkeypatch.setattr(fastload.reader, "claimed_samples_problem", grow_labels)
    with pytest.raises(CorruptDataError) as e:
        fastload.Dataset(root)
    assert str(e.value) == (f"{root}/labels.bin: changed while being opened ({4 * n + 4} bytes, expected {4 * n}); "
                            "it was replaced: open the dataset again")  # fmt: skip


# ----------------------------------------------------------------------------- a record's header against its payload


def test_a_png_record_holding_a_jpeg_of_its_size_is_refused(root):
    """A record that says PNG but holds a JPEG of exactly its header's size (sample 4's own 64x48 JPEG): the
    payload must be read as the PNG it says it is, whose size it does not declare."""
    put_record(root, 4, split(stored(root, 4))[2], encoding=2, width=64, height=48)
    with pytest.raises(CorruptDataError) as e:
        fastload.Dataset(root)[4]
    assert str(e.value) == (f"{root}/shard-00002.lmdb sample 4: header says the png image is 64x48 but its payload "
                            "declares no readable frame header; the record was altered (run `fastload verify`)")  # fmt: skip


def test_a_jpeg_record_without_a_frame_header_is_refused(root):
    """A record that says JPEG but holds the 40x30 PNG of sample 1 (no JPEG frame header in it): refused as a
    CorruptDataError saying so, not a failure of the reader itself."""
    put_record(root, 1, split(stored(root, 1))[2], encoding=1, width=40, height=30)
    ds = fastload.Dataset(root)
    msg = (f"{root}/shard-00000.lmdb sample 1: header says the jpeg image is 40x30 but its payload declares no "
           "readable frame header; the record was altered (run `fastload verify`)")  # fmt: skip
    with pytest.raises(CorruptDataError) as e:
        ds[1]
    assert str(e.value) == msg
    assert str(ds.read_batch([1]).errors[0]) == msg


def test_a_jpeg_whose_header_height_is_not_its_frames_is_refused(root):
    """Sample 4 is 64x48; its record header made to say 64x49 (the header is not covered by the checksum)."""
    shard, at = at_in_file(root, 4)
    poke(shard, at + 16, struct.pack("<I", 49))
    with pytest.raises(CorruptDataError) as e:
        fastload.Dataset(root)[4]
    assert str(e.value) == (f"{shard} sample 4: header says the jpeg image is 64x49 but its payload declares 64x48; "
                            "the record was altered (run `fastload verify`)")  # fmt: skip


# ----------------------------------------------------------------------------- indices


@pytest.mark.parametrize("index, kind", [("3", "str"), (2.0, "float"), (None, "NoneType"), ([1], "list")])
def test_an_index_that_is_not_an_integer_is_refused_naming_its_type(pristine, index, kind):
    """A string, a float, None or a list as a sample index: refused naming the index's own type."""
    ds = fastload.Dataset(pristine / "ds")
    for read in (lambda: ds[index], lambda: ds.record(index), lambda: ds.field_values([index])):
        with pytest.raises(TypeError) as e:
            read()
        assert str(e.value) == f"dataset index must be an integer, got {kind}"


# ----------------------------------------------------------------------------- the bytes each read asks for


def test_reading_a_record_asks_for_its_head_and_payload_never_its_path(pristine, monkeypatch):
    """``ds[2]`` and ``ds.record(2)`` of a large record whose source path runs past its first 512 bytes: they
    ask the file for the value's first 512 bytes (with its overflow page's 16-byte header) and then its
    payload, and not for the path, which they do not return."""
    root = pristine / "ds"
    shard, at = at_in_file(root, 2)
    h, path, payload = split(stored(root, 2))
    assert 40 + len(path) > 512
    ds = fastload.Dataset(root)
    ds[2]  # the shard opened and the record located
    for read in (lambda: ds[2], lambda: ds.record(2)):
        reads = Reads()
        monkeypatch.setattr(os, "pread", reads)
        got = read()
        monkeypatch.setattr(os, "pread", reads.real)
        assert got[0] == payload or got[1] == payload
        assert reads.asked == [(at - 16, 16 + 512), (at + 40 + len(path), len(payload))]


def test_field_values_of_a_large_record_ask_for_its_head_and_block_never_its_image(fields_root, monkeypatch):
    """``field_values`` of sample 4 (over 16 KiB): the value's first 512 bytes (with its overflow page's header),
    then the field block that follows the image, and nothing else."""
    shard, at = at_in_file(fields_root, 4)
    value = stored(fields_root, 4)
    h, path, payload = split(value)
    assert len(value) > 16384
    ds = fastload.Dataset(fields_root)
    want = ds.field_values([4])  # the shard opened and the record located
    assert want == [{"caption": "sample 4 grey 180", "step": 5}]
    reads = Reads()
    monkeypatch.setattr(os, "pread", reads)
    assert ds.field_values([4]) == want
    monkeypatch.setattr(os, "pread", reads.real)
    block = 40 + len(path) + len(payload)
    assert reads.asked == [(at - 16, 16 + 512), (at + block, len(value) - block)]


# ----------------------------------------------------------------------------- reads that fail


def test_a_path_read_apart_that_fails_names_its_shard_and_sample(root, monkeypatch):
    """Sample 2's source path lies past its value's head, so it is read from the file apart; that read failing
    with EIO (a stand-in ``os.pread``: a disk's bad sector) names the shard and the sample."""
    shard, at = at_in_file(root, 2)
    h, path, payload = split(stored(root, 2))
    ds = fastload.Dataset(root)
    monkeypatch.setattr(os, "pread", Reads(fail=(at + 40, len(path))))
    with pytest.raises(CorruptDataError) as e:
        ds._read(2, check=False, want_path=True)
    assert str(e.value) == f"{shard} sample 2: cannot read it ({EIO})"
    assert ds._read(2, check=False, want_path=False)[1] == payload


def test_a_field_block_read_apart_that_fails_names_its_shard_and_sample_once(fields_root, monkeypatch):
    """Sample 4's field block is read from the file apart from its head; that read failing with EIO names the
    shard and the sample, once (the file's own message, not prefixed with them again)."""
    shard, at = at_in_file(fields_root, 4)
    value = stored(fields_root, 4)
    h, path, payload = split(value)
    block = 40 + len(path) + len(payload)
    ds = fastload.Dataset(fields_root)
    monkeypatch.setattr(os, "pread", Reads(fail=(at + block, len(value) - block)))
    with pytest.raises(CorruptDataError) as e:
        ds.field_values([0, 4])
    assert str(e.value) == f"{shard} sample 4: cannot read it ({EIO})"


# ----------------------------------------------------------------------------- a dataset URL


def test_a_urls_cache_dir_reaches_its_node_cache(tmp_path, monkeypatch):
    """``cache_dir`` given with a URL is the node cache's: one that is not a path is refused naming its type,
    before the other options are looked at (nothing is fetched)."""
    monkeypatch.setenv("FASTLOAD_CACHE", str(tmp_path / "default"))
    with pytest.raises(ConfigError) as e:
        fastload.Dataset("s3://bucket/ds", cache_dir=5, cache_limit="many")
    assert str(e.value) == "cache_dir must be a directory path, got int"


# ----------------------------------------------------------------------------- ReadAhead


def test_ahead_keeps_depth_batches_requested_beyond_the_one_handed_out(pristine):
    """With ``depth=2``, when a batch is handed out the next two have been taken from the batches and asked
    for; near the end, only those there are."""
    ds = fastload.Dataset(pristine / "ds")
    taken = []

    def batches():
        for i in range(5):
            taken.append(i)
            yield [i]

    with ReadAhead(ds, threads=1, depth=2) as ra:
        seen = []
        for b in ra.ahead(batches()):
            seen.append((b, len(taken), ra.requested))
    assert seen == [([0], 3, 3), ([1], 4, 4), ([2], 5, 5), ([3], 5, 5), ([4], 5, 5)]


def test_a_forked_child_of_a_read_ahead_whose_lock_is_held_can_start_and_close_it(pristine):
    """A fork while another thread of the parent holds the read-ahead's lock: the child must not wait for that
    lock (its holder is not in the child) but start its own threads and close them."""
    ra = ReadAhead(fastload.Dataset(pristine / "ds"), threads=1)
    ra.start()
    with ra._locked():
        pid = os.fork()
        if pid == 0:  # the child: exit status 0 only if both worked
            code = 1
            try:
                ra.start()
                ra.prefetch([0, 1])
                ra.close()
                code = 0 if ra._closed and ra._workers is None else 2
            finally:
                os._exit(code)
    deadline = time.monotonic() + 20
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done or time.monotonic() > deadline:
            break
        time.sleep(0.02)
    if not done:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
    ra.close()
    assert done and os.waitstatus_to_exitcode(status) == 0


def test_closing_a_started_read_ahead_twice_is_fine(pristine):
    """``close`` after ``close`` (or a ``with`` block ending after one) must do nothing more, and a request made
    after it nothing either."""
    ra = ReadAhead(fastload.Dataset(pristine / "ds"), threads=2)
    ra.start()
    workers = ra._workers
    ra.close()
    ra.close()
    assert workers is not None and not any(t.is_alive() for t in workers.threads)
    ra.prefetch([0, 1])
    assert ra.requested == 0 and ra._workers is None
    with ReadAhead(fastload.Dataset(pristine / "ds"), threads=1) as ra2:
        ra2.start()
        ra2.close()
    assert ra2._closed
