"""Corrupt data is found and named: by ``fastload verify``, on read, and during training.

A flipped payload byte is reported by ``verify`` (exit 1, naming the shard and the
sample) and, during training, by ``FastLoader.__next__`` with the shard, the sample
and its source path. A truncated, missing or structurally damaged shard is a clear
error when it is opened, never a crash (SIGBUS) of the reading process.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import struct
import subprocess
import sys
import tracemalloc
from pathlib import Path

import pytest

import fastload
from fastload import CorruptDataError, FastLoader, FormatError, LoaderError
from fastload.cli import main
from fastload.format import LABELS_NAME, MANIFEST_NAME

from conftest import encode_color, write_image

N_CLASSES, PER_CLASS = 3, 10
N = N_CLASSES * PER_CLASS


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> Path:
    base = tmp_path_factory.mktemp("corruption")
    index = 0
    for label in range(N_CLASSES):
        for j in range(PER_CLASS):
            size = (480, 360) if j % 4 == 0 else (64, 48)  # overflow-page and leaf-page records
            write_image(base / "src" / f"class {label}" / f"img_{j:02d}.jpg", encode_color(label, index), size=size, quality=90)
            index += 1
    out = base / "packed"
    fastload.pack(base / "src", out, workers=1, shard_size="32KiB", progress=False)
    assert len(fastload.Dataset(out).shards) >= 3
    return out


@pytest.fixture
def packed(pristine, tmp_path) -> Path:
    """A fresh copy to damage."""
    return Path(shutil.copytree(pristine, tmp_path / "packed"))


def _locate(root: Path, index: int) -> tuple[Path, int, int, str]:
    """(shard file, offset of the record's value in it, value length, source path) of a sample."""
    ds = fastload.Dataset(root)
    header, value, _ = ds.raw(index)
    shard = root / next(s.file for s in ds.shards if s.first <= index < s.first + s.count)
    at = shard.read_bytes().find(bytes(value))
    assert at >= 0
    return shard, at, len(value), ds.source_path(index)


def _flip(path: Path, offset: int, mask: int = 0xFF) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ mask]))


def _run(capsys, *argv) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


# ----------------------------------------------------------------------------- a flipped payload byte


@pytest.mark.parametrize("index", [0, 13])  # a record in overflow pages, one inside a leaf page
def test_verify_names_shard_and_sample_of_a_flipped_payload_byte(packed, capsys, index):
    shard, at, length, _ = _locate(packed, index)
    _flip(packed / shard.name, at + length - 100)
    code, out, err = _run(capsys, "verify", packed)
    assert code == 1 and out == ""
    lines = err.splitlines()
    assert lines == [
        f"bad shard {shard}: SHA-256 differs from the manifest",
        f"sample {index} in {shard}: payload XXH3 checksum mismatch (the image bytes were altered)",
        f"fastload verify: 2 problem(s) in {packed} ({len(fastload.Dataset(packed).shards)} shards, {N} samples checked)",
    ]
    assert "Traceback" not in err
    # the other shards are not blamed, and --decode says the same
    code, _, err2 = _run(capsys, "verify", packed, "--decode")
    assert code == 1 and err2.splitlines()[:2] == lines[:2]


def _batches_before_error(packed: Path, prefetch: int) -> tuple[list, LoaderError]:
    got = []
    with FastLoader(packed, 4, device="cpu", crop=16, shuffle=False, prefetch=prefetch) as loader:
        with pytest.raises(LoaderError) as e:
            for _, y in loader:
                got.append(y.tolist())
    return got, e.value


@pytest.mark.parametrize("prefetch", [1, 2])
def test_training_reports_shard_sample_and_source_path(packed, prefetch):
    index = 13
    shard, at, length, source = _locate(packed, index)
    _flip(shard, at + length - 100)
    got, err = _batches_before_error(packed, prefetch)
    msg = str(err)
    assert f"sample {index} ({source}) in {shard}" in msg and "XXH3 checksum mismatch" in msg, msg
    assert source == "class 1/img_03.jpg"
    labels = fastload.Dataset(packed).labels.tolist()
    assert [y for b in got for y in b] == labels[: 4 * len(got)]  # what arrived before the error is right
    with pytest.raises(CorruptDataError, match=rf"{shard} sample {index}: payload XXH3 checksum mismatch"):
        fastload.Dataset(packed, check=True)[index]


def test_training_error_arrives_with_the_bad_batch_whatever_the_prefetch(packed):
    shard, at, length, _ = _locate(packed, 13)
    _flip(shard, at + length - 100)
    got, _ = _batches_before_error(packed, prefetch=3)
    assert len(got) == 13 // 4  # batches 0..2 are good; batch 3 holds sample 13


def test_unchecked_reads_do_not_see_altered_payloads(packed):
    """The documented trade-off: ``Dataset(check=False)`` (the default) skips the CRC-32."""
    shard, at, length, _ = _locate(packed, 5)
    before = fastload.Dataset(packed)[5][0]
    _flip(shard, at + length - 100)
    after, label = fastload.Dataset(packed, check=False)[5]
    assert after != before and len(after) == len(before) and label == 0


def test_a_flipped_size_in_a_record_header_is_refused(packed):
    """The header is outside the payload's CRC-32: an impossible size is caught by its own check."""
    shard, at, _, source = _locate(packed, 7)
    _flip(shard, at + 12 + 3, 0x80)  # the top byte of the stored width
    with pytest.raises(CorruptDataError, match=rf"{shard} sample 7: header says the jpeg image is \d+x48, an impossible size"):
        fastload.Dataset(packed, check=True)[7]
    with FastLoader(packed, 8, device="cpu", crop=16, shuffle=False) as loader:
        with pytest.raises(LoaderError, match=rf"sample 7 .* in {shard}.*impossible size"):
            list(loader)


def test_a_record_under_another_index_is_refused(packed):
    """A flipped bit in a record's key would make LMDB return another sample for the index."""
    ds = fastload.Dataset(packed)
    shard = packed / ds.shards[0].file
    data = shard.read_bytes()
    k = data.find(struct.pack(">Q", 2) + fastload.format.RECORD_MAGIC)  # the key of sample 2, inside a leaf node
    assert k > 0
    _flip(shard, k + 7, 0x01)  # key 2 -> 3: two records claim index 3
    with pytest.raises(CorruptDataError, match=rf"{shard}: damaged shard \(LMDB keys are not the sample indices 0\.\.\d+\)"):
        fastload.Dataset(packed, check=True)[3]
    rep = fastload.verify(packed)
    assert f"sample 3 in {shard}: unexpected key (expected sample 2)" in rep.problems


# ----------------------------------------------------------------------------- truncated, missing, damaged shards


def test_truncated_shard_is_a_clear_error_everywhere(packed, capsys):
    ds0 = fastload.Dataset(packed)
    s = ds0.shards[1]
    shard = packed / s.file
    data = shard.read_bytes()
    shard.write_bytes(data[: len(data) // 2])
    ds = fastload.Dataset(packed)  # opening reads only the manifest and labels
    assert ds[0][1] == 0  # other shards still read
    msg = f"{shard}: shard is {len(data) // 2} bytes, the manifest says {len(data)}; it was truncated or replaced"
    with pytest.raises(CorruptDataError, match=msg.replace(".", r"\.")):
        ds[s.first]
    with FastLoader(packed, 5, device="cpu", crop=16, shuffle=False) as loader:
        with pytest.raises(LoaderError, match=rf"sample {s.first} \(\?\) in {shard}: .*truncated or replaced"):
            list(loader)
    code, _, err = _run(capsys, "verify", packed)
    assert code == 1 and f"bad shard {shard}: {len(data) // 2} bytes, the manifest says {len(data)} (truncated or replaced)" in err
    code, _, err = _run(capsys, "inspect", packed)
    assert code == 2 and err.strip() == f"fastload: error: {shard}: {len(data) // 2} bytes, the manifest says {len(data)}; run `fastload verify {packed}`"


def test_missing_shard_is_a_clear_error_everywhere(packed, capsys):
    s = fastload.Dataset(packed).shards[-1]
    (packed / s.file).unlink()
    ds = fastload.Dataset(packed)
    with pytest.raises(FormatError, match=rf"{packed / s.file}: shard file is missing; the dataset is incomplete"):
        ds[s.first]
    with FastLoader(packed, 5, device="cpu", crop=16, shuffle=False) as loader:
        with pytest.raises(LoaderError, match=rf"{packed / s.file}: shard file is missing"):
            list(loader)
    code, _, err = _run(capsys, "verify", packed)
    assert code == 1 and f"bad shard {packed / s.file}: missing" in err
    code, _, err = _run(capsys, "inspect", packed)
    assert code == 2 and err.strip() == f"fastload: error: {packed / s.file}: shard file is missing; run `fastload verify {packed}`"


_OPEN_DAMAGED = r"""
import sys, fastload
path, index = sys.argv[1], int(sys.argv[2])
try:
    fastload.Dataset(path, check=True)[index]
    print("read")
except fastload.FastloadError as e:
    print(f"{type(e).__name__}: {e}")
rep = fastload.verify(path)
print("\n".join(rep.problems))
"""


def test_damaged_lmdb_page_is_an_error_not_sigbus(packed):
    """A flipped bit in a leaf page's node-offset table made LMDB read past the end of the file
    (SIGBUS, the process dies). The reader checks the page structure before LMDB touches it."""
    ds = fastload.Dataset(packed)
    s = ds.shards[0]
    shard = packed / s.file
    data = shard.read_bytes()
    psize = struct.unpack_from("<I", data, 40)[0]
    leaf = next(p for p in range(2, len(data) // psize) if struct.unpack_from("<H", data, p * psize + 10)[0] & 0x02)
    _flip(shard, leaf * psize + 16 + 1, 0x80)  # high byte of the first node offset: 32 KiB further on
    r = subprocess.run([sys.executable, "-c", _OPEN_DAMAGED, str(packed), str(s.first)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, f"reader died with {r.returncode}: {r.stderr[-2000:]}"
    lines = r.stdout.splitlines()
    assert lines[0] == (
        f"CorruptDataError: {shard}: damaged shard (LMDB node offset outside its page); run `fastload verify {packed}`"
    )
    assert lines[1:] == [
        f"bad shard {shard}: SHA-256 differs from the manifest",
        f"bad shard {shard}: damaged LMDB structure (LMDB node offset outside its page)",
    ]


def test_shard_overwritten_with_random_bytes(packed, capsys):
    import random

    s = fastload.Dataset(packed).shards[0]
    shard = packed / s.file
    shard.write_bytes(random.Random(3).randbytes(shard.stat().st_size))
    with pytest.raises(CorruptDataError, match=rf"{shard}: damaged shard \(not an LMDB file \(bad meta page\)\)"):
        fastload.Dataset(packed)[0]
    code, _, err = _run(capsys, "verify", packed)
    assert code == 1 and f"bad shard {shard}: damaged LMDB structure (not an LMDB file (bad meta page))" in err


# ----------------------------------------------------------------------------- labels and manifest


def test_huge_replaced_labels_file_is_refused_without_reading_it(packed):
    labels = packed / LABELS_NAME
    labels.unlink()
    with open(labels, "wb") as f:  # a sparse 8 GiB file: reading it would need 8 GiB of memory
        f.truncate(8 << 30)
    tracemalloc.start()
    try:
        with pytest.raises(CorruptDataError, match=rf"{labels}: {8 << 30} bytes, expected {4 * N} for {N} samples"):
            fastload.Dataset(packed)
        rep = fastload.verify(packed)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert f"{labels}: {8 << 30} bytes, expected {4 * N}" in rep.problems
    assert peak < 16 << 20, peak


def test_edited_labels_and_manifest_are_refused(packed):
    labels = packed / LABELS_NAME
    raw = bytearray(labels.read_bytes())
    raw[4 * 5] ^= 0x01  # sample 5: class 0 -> 1
    labels.write_bytes(bytes(raw))
    with pytest.raises(CorruptDataError, match=rf"{labels}: SHA-256 differs from the manifest; the labels were altered"):
        fastload.Dataset(packed)
    # re-hashing labels.bin in the manifest does not help: the record's own label disagrees
    m = json.loads((packed / MANIFEST_NAME).read_text())
    m["labels"]["sha256"] = hashlib.sha256(bytes(raw)).hexdigest()
    (packed / MANIFEST_NAME).write_text(json.dumps(m))
    ds = fastload.Dataset(packed, check=True)
    with pytest.raises(CorruptDataError, match=r"sample 5: label 0 differs from labels.bin \(1\)"):
        ds[5]
    assert any("sample 5" in p and "label 0 differs" in p for p in fastload.verify(packed).problems)
