"""Careless and hostile finished datasets: every reader refuses them in one line, never hangs or balloons.

The readers are ``fastload.Dataset`` (open, then ``record``/``where`` of every sample),
``fastload.inspect`` and ``fastload.verify``. Each damaged copy is read in a child process,
under a timeout (a regression fails, it does not hang CI) and an address-space limit,
which reports its peak resident memory. The classes attacked:

* dataset files that are not regular files: FIFOs, directories, symlinks to ``/dev/zero``
  and ``/dev/urandom``, dangling symlinks, symlink loops;
* shard names that leave the dataset directory (``../x.lmdb``, absolute paths, ``a/b``) and
  shard files that are symlinks resolving outside it;
* sizes and counts claimed by the files (samples, records per shard, classes, the size of
  ``manifest.json``, a sparse 8 GB ``labels.bin``) checked before anything is allocated;
* record headers whose image size is huge, or not the payload's own (the header is not
  covered by the CRC), refused before anything decodes them;
* names from the manifest and the records printed escaped; bool indices refused.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import fastload
from fastload import CorruptDataError, FormatError
from fastload.checks import format_inspect
from fastload.format import (
    DEFAULT_MAX_PIXELS,
    HEADER_SIZE,
    LABELS_NAME,
    MANIFEST_NAME,
    MAX_MANIFEST_BYTES,
    MIN_RECORD_BYTES,
    Manifest,
    RECORD_MAGIC,
    jpeg_frame,
)
from fastload.errors import printable

from conftest import encode_color, write_image

N_CLASSES, PER_CLASS = 3, 5
N = N_CLASSES * PER_CLASS


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> Path:
    base = tmp_path_factory.mktemp("hostile_read")
    index = 0
    for label in range(N_CLASSES):
        for j in range(PER_CLASS):
            size = (480, 360) if j == 0 else (64, 48)  # overflow-page and leaf-page records
            write_image(base / "src" / f"c{label}" / f"{j}.jpg", encode_color(label, index), size=size, quality=90)
            index += 1
    out = base / "packed"
    fastload.pack(base / "src", out, workers=1, shard_size="32KiB", progress=False)
    assert len(fastload.Dataset(out).shards) >= 3
    return out


@pytest.fixture
def packed(pristine, tmp_path) -> Path:
    """A fresh copy to damage."""
    return Path(shutil.copytree(pristine, tmp_path / "packed"))


def _manifest(root: Path) -> dict:
    return json.loads((root / MANIFEST_NAME).read_text())


def _write_manifest(root: Path, d: dict) -> None:
    (root / MANIFEST_NAME).write_text(json.dumps(d))


# ----------------------------------------------------------------------------- the child that reads

_READERS = r"""
import json, resource, sys, traceback
resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))  # a regression fails with MemoryError, not an OOM
import fastload
from fastload import FastloadError
path = sys.argv[1]
for op in sys.argv[2].split(","):
    try:
        if op == "dataset":
            ds = fastload.Dataset(path, check=True)
            for i in range(len(ds)):
                ds.record(i)
                ds.where(i)
            r = {"outcome": "ok"}
        elif op == "inspect":
            from fastload.checks import format_inspect
            format_inspect(fastload.inspect(path))
            r = {"outcome": "ok"}
        else:
            rep = fastload.verify(path, decode=op == "verify_decode")
            r = {"outcome": "report", "problems": rep.problems}
    except FastloadError as e:
        r = {"outcome": "error", "type": type(e).__name__, "msg": str(e)}
    except BaseException as e:
        r = {"outcome": "CRASH", "type": type(e).__name__, "msg": traceback.format_exc()[-3000:]}
    print(json.dumps({"op": op, **r}), flush=True)
hwm = next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM:"))
print(json.dumps({"hwm_mb": hwm / 1024}), flush=True)
"""

ALL = ("dataset", "inspect", "verify", "verify_decode")


def read_in_child(path: Path, ops=ALL, *, timeout: float = 120) -> tuple[dict[str, dict], float]:
    """Each reader's outcome on ``path`` and the child's peak memory (MB); fails on a hang or a crash."""
    try:
        r = subprocess.run([sys.executable, "-c", _READERS, str(path), ",".join(ops)], capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        pytest.fail(f"a reader hung (> {timeout} s) on {path}; finished: {out.splitlines()}")
    assert r.returncode == 0, f"reader process died ({r.returncode}): {r.stderr[-3000:]}"
    lines = [json.loads(ln) for ln in r.stdout.splitlines() if ln.startswith("{")]
    results = {x["op"]: x for x in lines if "op" in x}
    assert list(results) == list(ops), r.stdout + r.stderr[-2000:]
    crashes = [x for x in results.values() if x["outcome"] == "CRASH"]
    assert not crashes, crashes
    for x in results.values():  # one line each
        for msg in [x.get("msg", "")] + x.get("problems", []):
            assert "\n" not in msg and "Traceback" not in msg, msg
    return results, lines[-1]["hwm_mb"]


def _error(results: dict, op: str) -> str:
    x = results[op]
    assert x["outcome"] == "error", x
    return x["msg"]


def _problems(results: dict, op: str) -> list[str]:
    x = results[op]
    assert x["outcome"] == "report", x
    return x["problems"]


# ----------------------------------------------------------------------------- 1. only regular files are opened


def _make_fifo(p: Path) -> str:
    p.unlink()
    os.mkfifo(p)
    return "is a FIFO, not a regular file"


def _make_dir(p: Path) -> str:
    p.unlink()
    p.mkdir()
    (p / "x").write_bytes(b"x")
    return "is a directory, not a regular file"


def _link_to(target: str):
    def make(p: Path) -> str:
        p.unlink()
        p.symlink_to(target)
        return "is a character device, not a regular file"

    return make


def _dangling(p: Path) -> str:
    p.unlink()
    p.symlink_to(p.parent / "gone")
    return f"is a symlink to {str(p.parent / 'gone')!r}, which does not exist"


def _loop(p: Path) -> str:
    p.unlink()
    p.symlink_to(p.name)  # points at itself
    return "cannot be opened (Too many levels of symbolic links)"


KINDS = {"fifo": _make_fifo, "dir": _make_dir, "dev-zero": _link_to("/dev/zero"), "dev-urandom": _link_to("/dev/urandom"),
         "dangling": _dangling, "loop": _loop}  # fmt: skip


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_manifest_that_is_not_a_regular_file(packed, kind):
    what = KINDS[kind](packed / MANIFEST_NAME)
    results, _ = read_in_child(packed, ("dataset", "inspect", "verify"))
    for op in results:
        assert _error(results, op) == f"{packed / MANIFEST_NAME}: cannot read manifest: it {what}"


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_labels_that_are_not_a_regular_file(packed, kind):
    what = KINDS[kind](packed / LABELS_NAME)
    results, _ = read_in_child(packed)
    assert _error(results, "dataset") == f"{packed / LABELS_NAME}: cannot read labels: it {what}"
    assert results["inspect"]["outcome"] == "ok"  # inspect reads headers, not labels.bin
    for op in ("verify", "verify_decode"):
        lp = packed / LABELS_NAME
        assert _problems(results, op) == [f"{lp}: {what}"]


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_shard_that_is_not_a_regular_file(packed, kind):
    s = fastload.Dataset(packed).shards[1]
    sp = packed / s.file
    what = KINDS[kind](sp)
    results, _ = read_in_child(packed)
    assert _error(results, "dataset") == f"{sp}: shard file {what}; run `fastload verify {packed}`"
    assert _error(results, "inspect") == f"{sp}: shard file {what}; run `fastload verify {packed}`"
    for op in ("verify", "verify_decode"):
        assert _problems(results, op) == [f"bad shard {sp}: {what}"]


def test_the_other_shards_still_read(packed):
    """A shard that is a FIFO is refused when it is needed: opening the dataset and reading
    the other shards still works (as for a missing shard)."""
    ds0 = fastload.Dataset(packed)
    s = ds0.shards[1]
    _make_fifo(packed / s.file)
    ds = fastload.Dataset(packed)
    assert ds[0] == ds0[0] and ds[s.first - 1] == ds0[s.first - 1]
    with pytest.raises(FormatError, match=f"shard file is a FIFO, not a regular file"):
        ds[s.first]


def _empty_entries(root: Path) -> dict:
    """The manifest with an extra shard entry holding no records (count 0, bytes 0)."""
    d = _manifest(root)
    d["shards"].append({"file": "shard-99999.lmdb", "first": d["num_samples"], "count": 0, "bytes": 0, "sha256": "0" * 64})
    return d


@pytest.mark.parametrize("kind", ["fifo", "dev-zero"])
def test_files_that_claim_to_be_empty_are_not_opened(packed, kind):
    """What hung before: a FIFO or /dev/zero reports 0 bytes, which matched an empty labels.bin or
    a 0-byte shard entry, and then open() blocked or read() never ended."""
    d = _empty_entries(packed)
    _write_manifest(packed, d)
    (packed / "shard-99999.lmdb").write_bytes(b"")
    what = KINDS[kind](packed / "shard-99999.lmdb")
    results, hwm = read_in_child(packed)
    assert _error(results, "inspect") == f"{packed / 'shard-99999.lmdb'}: shard file {what}; run `fastload verify {packed}`"
    assert f"bad shard {packed / 'shard-99999.lmdb'}: {what}" in _problems(results, "verify")
    # an empty dataset whose labels.bin is a FIFO or /dev/zero
    empty = packed.parent / "empty"
    empty.mkdir()
    _write_manifest(empty, {**d, "num_samples": 0, "classes": ["a"], "class_counts": [0], "shards": [],
                            "labels": {**d["labels"], "bytes": 0}})  # fmt: skip
    (empty / LABELS_NAME).write_bytes(b"")
    what = KINDS[kind](empty / LABELS_NAME)
    results, hwm2 = read_in_child(empty, ("dataset", "verify"))
    assert _error(results, "dataset") == f"{empty / LABELS_NAME}: cannot read labels: it {what}"
    assert _problems(results, "verify") == [f"{empty / LABELS_NAME}: {what}"]
    assert max(hwm, hwm2) < 300


# ----------------------------------------------------------------------------- 2. shard paths stay inside the dataset


@pytest.mark.parametrize("name", ["../x.lmdb", "/tmp/x.lmdb", "sub/shard-00000.lmdb", "a\\b.lmdb", ".hidden.lmdb", "-x.lmdb",
                                  "manifest.json", "labels.bin", "shard-00000.lmdb\n", "shard\x1b[2J.lmdb", "shard-\udcff.lmdb",
                                  "shard-\ud800.lmdb", "", "x" * 300 + ".lmdb"])  # fmt: skip
def test_shard_names_are_plain_names(packed, name):
    d = _manifest(packed)
    outside = packed.parent / "x.lmdb"
    shutil.copy(packed / d["shards"][0]["file"], outside)  # a real shard waits outside, at ../x.lmdb
    d["shards"][0]["file"] = name
    (packed / MANIFEST_NAME).write_text(json.dumps(d, ensure_ascii=True))
    results, _ = read_in_child(packed, ("dataset", "inspect", "verify"))
    for op in results:
        msg = _error(results, op)
        assert msg.startswith(f"{packed / MANIFEST_NAME}: invalid shard entry {{"), msg
        assert "the file must be a plain name like shard-00000.lmdb" in msg and "\x1b" not in msg, msg
    with pytest.raises(FormatError, match="must be a plain name"):
        Manifest.loads(json.dumps(d, ensure_ascii=True))


def test_shard_symlink_outside_the_dataset_is_refused(packed, tmp_path):
    ds0 = fastload.Dataset(packed)
    s = ds0.shards[0]
    sp = packed / s.file
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    shutil.move(sp, elsewhere / s.file)  # the same bytes, right size and hash, outside the directory
    sp.symlink_to(elsewhere / s.file)
    real = os.path.realpath(elsewhere / s.file)
    what = f"resolves to {real!r}, outside the dataset directory"
    results, _ = read_in_child(packed)
    assert _error(results, "dataset") == f"{sp}: shard file {what}; run `fastload verify {packed}`"
    assert _error(results, "inspect") == f"{sp}: shard file {what}; run `fastload verify {packed}`"
    assert _problems(results, "verify") == [f"bad shard {sp}: {what}"]


def test_shard_symlink_inside_the_dataset_is_read(packed):
    """The rule is about where a shard resolves, not about symlinks: one inside the directory reads."""
    ds0 = fastload.Dataset(packed)
    good = [ds0[i] for i in range(N)]
    s = ds0.shards[0]
    (packed / "store").mkdir()
    shutil.move(packed / s.file, packed / "store" / s.file)
    (packed / s.file).symlink_to(Path("store") / s.file)
    ds = fastload.Dataset(packed, check=True)
    assert [ds[i] for i in range(N)] == good
    assert fastload.verify(packed, decode=True).ok and fastload.inspect(packed)["samples"] == N


# ----------------------------------------------------------------------------- 3. claimed sizes and counts


def test_forged_num_samples_with_a_sparse_labels_file_allocates_nothing(packed):
    """A 100 KB dataset whose manifest claims 2*10**9 samples (shard counts and sizes made to
    add up) and whose labels.bin is a sparse 8 GB file: refused from file sizes, nothing read."""
    d = _manifest(packed)
    n = 2 * 10**9
    last = d["shards"][-1]
    extra = n - d["num_samples"]
    last.update(count=last["count"] + extra, bytes=last["bytes"] + extra * MIN_RECORD_BYTES)
    d.update(num_samples=n, class_counts=[d["class_counts"][0] + extra] + d["class_counts"][1:])
    _write_manifest(packed, d)
    lp = packed / LABELS_NAME
    lp.unlink()
    with open(lp, "wb") as f:
        f.truncate(4 * n)  # 8 GB, sparse: it takes no disk space
    results, hwm = read_in_child(packed, ("dataset", "verify"))
    shard = packed / last["file"]
    size = shard.stat().st_size
    have = sum(min((packed / s["file"]).stat().st_size, s["bytes"]) for s in d["shards"])
    expected = (
        f"{packed / MANIFEST_NAME}: claims {n} samples but its shard files hold {have} bytes, room for at most "
        f"{have // MIN_RECORD_BYTES} records ({shard}: shard is {size} bytes, the manifest says {last['bytes']}); "
        "the dataset is incomplete or was altered: pack it again"
    )
    assert _error(results, "dataset") == expected
    assert _problems(results, "verify")[0] == expected
    assert hwm < 200, hwm  # the labels (8 GB, 24 GB as int64) were never read


def test_a_count_its_shard_cannot_hold_is_refused(packed):
    d = _manifest(packed)
    s = d["shards"][0]
    extra = s["bytes"]  # one record per byte: impossible
    s["count"] += extra
    for t in d["shards"][1:]:
        t["first"] += extra
    d.update(num_samples=d["num_samples"] + extra, class_counts=[d["class_counts"][0] + extra] + d["class_counts"][1:])
    _write_manifest(packed, d)
    results, _ = read_in_child(packed, ("dataset", "inspect", "verify"))
    for op in results:
        assert _error(results, op) == (
            f"{packed / MANIFEST_NAME}: shard {s['file']} claims {s['count']} records in {s['bytes']} bytes; "
            f"a record takes at least {MIN_RECORD_BYTES} bytes (the manifest was altered)"
        )


def test_a_sparse_huge_manifest_is_not_read(packed):
    mp = packed / MANIFEST_NAME
    mp.unlink()
    with open(mp, "wb") as f:
        f.truncate(2 * MAX_MANIFEST_BYTES)
    results, hwm = read_in_child(packed, ("dataset", "inspect", "verify"))
    for op in results:
        assert _error(results, op) == (
            f"{mp}: {2 * MAX_MANIFEST_BYTES} bytes, more than the {MAX_MANIFEST_BYTES} a manifest may have; "
            "it is not a fastload manifest or it was damaged: pack the dataset again"
        )
    assert hwm < 200, hwm


def test_caps_on_samples_and_classes(packed, monkeypatch):
    d = _manifest(packed)
    with pytest.raises(FormatError, match=r"num_samples 9007199254740993 is outside 0\.\.9007199254740992"):
        Manifest.loads(json.dumps({**d, "num_samples": 2**53 + 1}), where="m.json")
    for bad in ("cats", {"a": 1}, [1, 2, 3]):
        with pytest.raises(FormatError, match=r"^m\.json: (classes is a|a class name is not a string)"):
            Manifest.loads(json.dumps({**d, "classes": bad}), where="m.json")
    monkeypatch.setattr(fastload.format, "MAX_CLASSES", 2)  # the real cap, 2**24, makes a 50 MB manifest
    with pytest.raises(FormatError, match=r"^m\.json: 3 classes, more than the 2 a dataset may have$"):
        Manifest.loads(json.dumps(d), where="m.json")


# ----------------------------------------------------------------------------- 4. image sizes at load time


def _locate(root: Path, index: int) -> tuple[Path, int, bytes]:
    """(shard file, offset of the record's value in it, the value)."""
    ds = fastload.Dataset(root)
    _, value, _ = ds.raw(index)
    shard = root / next(s.file for s in ds.shards if s.first <= index < s.first + s.count)
    at = shard.read_bytes().find(bytes(value))
    assert at >= 0
    return shard, at, bytes(value)


def _poke(path: Path, offset: int, data: bytes) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(data)


def _rehash(root: Path) -> None:
    """Make the manifest agree with the shards again (an attacker who rewrote the hashes too)."""
    import hashlib

    d = _manifest(root)
    for s in d["shards"]:
        s["sha256"] = hashlib.sha256((root / s["file"]).read_bytes()).hexdigest()
    _write_manifest(root, d)


@pytest.mark.parametrize("index", [0, 7])  # a record in overflow pages, one inside a leaf page
def test_a_header_claiming_a_huge_image_is_refused_on_read(packed, index):
    shard, at, value = _locate(packed, index)
    w, h = struct.unpack_from("<II", value, 12)
    _poke(shard, at + 12, struct.pack("<II", 60000, 60000))  # a side JPEG allows, 3.6 gigapixels
    _rehash(packed)
    where = f"{shard} sample {index}"
    msg = (f"{where}: header says the image is 60000x60000 = 3,600,000,000 pixels, more than the {DEFAULT_MAX_PIXELS:,} "
           "this dataset allows (options.max_pixels); the record header was altered")  # fmt: skip
    ds = fastload.Dataset(packed)  # check=False: the cap does not depend on the CRC check
    with pytest.raises(CorruptDataError) as e:
        ds.record(index)
    assert str(e.value) == msg
    with pytest.raises(CorruptDataError):
        ds[index]
    results, hwm = read_in_child(packed, ("dataset", "verify", "verify_decode"))
    assert _error(results, "dataset") == msg
    sample = f"sample {index} in {shard}"
    expected = f"{sample}: header says the image is 60000x60000 = 3,600,000,000 pixels, more than the {DEFAULT_MAX_PIXELS:,} this dataset allows (options.max_pixels); the record header was altered"
    assert _problems(results, "verify") == [expected] and _problems(results, "verify_decode") == [expected]
    assert hwm < 300, hwm


def test_a_header_that_is_not_the_payloads_size_is_refused(packed):
    index = 7
    shard, at, value = _locate(packed, index)
    w, h = struct.unpack_from("<II", value, 12)
    _poke(shard, at + 12, struct.pack("<I", w + 1))  # within the cap, but not the JPEG's own size
    _rehash(packed)
    with pytest.raises(CorruptDataError) as e:
        fastload.Dataset(packed).record(index)
    assert str(e.value) == (f"{shard} sample {index}: header says the jpeg image is {w + 1}x{h} but its payload declares "
                            f"{w}x{h}; the record was altered (run `fastload verify`)")  # fmt: skip
    rep = fastload.verify(packed)
    assert rep.problems == [f"sample {index} in {shard}: its payload declares {w}x{h} pixels, the header says {w + 1}x{h}"]


def _with_sof(jpeg: bytes, width: int, height: int) -> bytes:
    """The same JPEG with its (first) frame header claiming another size."""
    b = bytearray(jpeg)
    i = 2
    while b[i + 1] not in (0xC0, 0xC1, 0xC2):
        i += 2 + ((b[i + 2] << 8) | b[i + 3])
    struct.pack_into(">HH", b, i + 5, height, width)
    return bytes(b)


def _replace_payload(root: Path, index: int, payload: bytes) -> Path:
    """Store another payload for sample ``index``, its CRC right, the manifest re-hashed: what an
    attacker who knows the format can do. Returns the shard file."""
    import lmdb

    from fastload.format import decode_header, encode_record, key

    ds = fastload.Dataset(root)
    shard = root / next(s.file for s in ds.shards if s.first <= index < s.first + s.count)
    fastload.store.close_shared()
    env = lmdb.open(str(shard), subdir=False, lock=False)
    with env.begin(write=True) as txn:
        h = decode_header(txn.get(key(index)))
        txn.put(key(index), encode_record(payload, label=h.label, encoding=h.encoding, width=h.width, height=h.height,
                                          orig_width=h.orig_width, orig_height=h.orig_height, flags=h.flags))  # fmt: skip
    env.close()
    d = _manifest(root)
    for s in d["shards"]:
        if s["file"] == shard.name:
            s["bytes"] = shard.stat().st_size
    _write_manifest(root, d)
    _rehash(root)
    return shard


def test_a_payload_whose_own_header_claims_a_huge_image_is_never_decoded(packed):
    """The payload's SOF says 30000x30000, the record header 64x48, the CRC is right. The readers
    refuse it from a few bytes; verify --decode does not hand it to PIL (whose own bomb check
    fastload switches off), so nothing of 2.7 GB is allocated."""
    index = 7
    payload = _with_sof(fastload.Dataset(packed)[index][0], 30000, 30000)
    assert jpeg_frame(payload) == (0xC0, 30000, 30000)
    shard = _replace_payload(packed, index, payload)
    results, hwm = read_in_child(packed, ("dataset", "verify", "verify_decode"))
    assert _error(results, "dataset") == (f"{shard} sample {index}: header says the jpeg image is 64x48 but its payload "
                                          "declares 30000x30000; the record was altered (run `fastload verify`)")  # fmt: skip
    expected = [f"sample {index} in {shard}: its payload declares 30000x30000 pixels, the header says 64x48"]
    assert _problems(results, "verify") == expected and _problems(results, "verify_decode") == expected
    assert hwm < 300, hwm


def test_two_frame_headers_are_not_decoded(packed):
    """PIL sizes a JPEG by its last SOF, DALI by its first: a second SOF (30000x30000) after a
    first of the header's size is never handed to PIL."""
    index = 7
    payload = fastload.Dataset(packed)[index][0]
    sof = payload.find(b"\xff\xc0")
    seg = payload[sof : sof + 2 + ((payload[sof + 2] << 8) | payload[sof + 3])]
    forged = payload[: sof + len(seg)] + _with_sof(b"\xff\xd8" + seg, 30000, 30000)[2:] + payload[sof + len(seg) :]
    assert jpeg_frame(forged) == (0xC0, 64, 48) and jpeg_frame(forged, to_scan=True) is None
    shard = _replace_payload(packed, index, forged)
    results, hwm = read_in_child(packed, ("dataset", "verify", "verify_decode"))
    assert results["dataset"]["outcome"] == "ok"  # what DALI decodes: the first frame, of the header's size
    assert _problems(results, "verify") == []
    assert _problems(results, "verify_decode") == [
        f"sample {index} in {shard}: does not decode (no single frame header before its image data)"
    ]
    assert hwm < 300, hwm


def test_the_pixel_cap_comes_from_the_manifest(packed):
    d = _manifest(packed)
    d["options"]["max_pixels"] = 64 * 48  # the small images fit exactly, the 480x360 ones do not
    _write_manifest(packed, d)
    ds = fastload.Dataset(packed)
    assert ds.record(1)[0].width == 64
    with pytest.raises(CorruptDataError, match=rf"sample 0: header says the image is 480x360 = 172,800 pixels, more than the 3,072"):
        ds.record(0)
    for bad in (0, -5, "many", 1.5, True):
        _write_manifest(packed, {**d, "options": {**d["options"], "max_pixels": bad}})
        with pytest.raises(FormatError, match=rf"manifest.json: options.max_pixels .* is not a positive integer"):
            fastload.Dataset(packed)


def test_jpeg_frame_walk():
    buf = io.BytesIO()
    Image.new("RGB", (33, 17)).save(buf, "JPEG", progressive=True)
    jpg = buf.getvalue()
    assert jpeg_frame(jpg) == (0xC2, 33, 17) and jpeg_frame(jpg, to_scan=True) == (0xC2, 33, 17)
    assert jpeg_frame(jpg[:5]) is None and jpeg_frame(b"") is None and jpeg_frame(b"\xff\xd8") is None
    assert jpeg_frame(b"\xff\xd8" + b"\xff\xe0\x00\x02" * 5000 + jpg[2:]) is None  # more segments than the walk takes
    assert jpeg_frame(b"\xff\xd8\xff\xd9") is None and jpeg_frame(b"\xff\xd8\x00\x00" + jpg[2:]) is None  # EOI, junk
    assert jpeg_frame(b"\xff\xd8\xff\xff\xff" + jpg[2:]) == (0xC2, 33, 17)  # fill bytes


# ----------------------------------------------------------------------------- 5. what the errors say


def test_names_from_the_manifest_are_printed_escaped(packed):
    d = _manifest(packed)
    d["classes"] = ["\x1b[2Jwipe", "caf\udce9", "right\u202eto-left"]
    d["created"] = "2026\r\nfake line"
    d["skipped"] = [{"path": "a\x07b\udcff.jpg", "reason": "zero-byte file"}]
    (packed / MANIFEST_NAME).write_text(json.dumps(d, ensure_ascii=True))
    m = fastload.Dataset(packed).manifest
    assert m.classes == d["classes"] and m.skipped == d["skipped"]  # the names round-trip
    assert Manifest.loads(m.dumps()) == m
    info = fastload.inspect(packed)
    assert [c["name"] for c in info["classes"]] == d["classes"]
    text = format_inspect(info)
    assert "\x1b" not in text and "\r" not in text and "\u202e" not in text and "\udce9" not in text
    assert "\\x1b[2Jwipe" in text and "caf\\xe9" in text and "right\\u202eto-left" in text and "created 2026\\x0d\\x0afake line" in text
    text.encode("utf-8")  # printable on any UTF-8 terminal


def test_printable():
    assert printable("ünï cødé/ä b.jpg") == "ünï cødé/ä b.jpg"
    assert printable("a\x1b[31mb\x00\x7f\x9b") == "a\\x1b[31mb\\x00\\x7f\\x9b"
    assert printable("x\udc80\ud800\u2028\U000e0001") == "x\\x80\\ud800\\u2028\\U000e0001"


def test_source_paths_with_control_characters_are_printed_escaped(tmp_path):
    src = tmp_path / "src"
    write_image(src / "c" / "a\x1b[2Jb.jpg", (10, 20, 30), quality=90)
    fastload.pack(src, tmp_path / "out", workers=1, progress=False)
    ds = fastload.Dataset(tmp_path / "out")
    assert ds.source_path(0) == "c/a\x1b[2Jb.jpg"  # stored as it was
    assert ds.where(0) == f"sample 0 (c/a\\x1b[2Jb.jpg) in {tmp_path / 'out' / ds.shards[0].file}"


def test_error_quality_of_odd_paths(packed, tmp_path):
    for bad in ("a\0b", "\ud800x", str(packed) + "\0"):
        with pytest.raises(FormatError, match="not a usable dataset path"):
            fastload.Dataset(bad)
        with pytest.raises(FormatError, match="not a usable dataset path"):
            fastload.inspect(bad)
    s = fastload.Dataset(packed).shards[0]
    (packed / s.file).unlink()
    with pytest.raises(FormatError, match=rf"{packed / s.file}: shard file is missing; the dataset is incomplete"):
        fastload.Dataset(packed)[0]


def test_indices_as_numpy_does(pristine):
    import torch

    ds = fastload.Dataset(pristine)
    for i in (np.int64(3), np.int32(3), np.uint8(3), np.array(3), torch.tensor(3), 3):
        assert ds[i] == ds[3]
    for b in (True, False, np.True_, np.array(True), torch.tensor(True)):
        with pytest.raises(TypeError, match="dataset index must be an integer"):
            ds[b]
    for b in (1.0, np.float64(1), "1", None, np.array([1])):
        with pytest.raises(TypeError, match="dataset index must be an integer"):
            ds[b]


@pytest.mark.parametrize("err", [PermissionError(13, "Permission denied"), NotADirectoryError(20, "Not a directory"),
                                 OSError(5, "Input/output error")])  # fmt: skip
def test_a_present_but_unreadable_shard_says_why(packed, monkeypatch, err):
    """Not "missing": what the system said. (CI runs as root, which reads files whatever their
    permissions, so the error is injected where the reader looks at the file.)"""
    s = fastload.Dataset(packed).shards[1]
    sp = str(packed / s.file)
    real_stat = os.stat

    def stat(p, *a, **kw):
        if os.fspath(p) == sp:
            raise type(err)(err.errno, err.strerror, sp)
        return real_stat(p, *a, **kw)

    monkeypatch.setattr(os, "stat", stat)
    what = f"cannot be opened ({err.strerror})"
    with pytest.raises(FormatError) as e:
        fastload.Dataset(packed)[s.first]
    assert str(e.value) == f"{sp}: shard file {what}; run `fastload verify {packed}`"
    with pytest.raises(FormatError) as e:
        fastload.inspect(packed)
    assert str(e.value) == f"{sp}: shard file {what}; run `fastload verify {packed}`"
    assert fastload.verify(packed).problems == [f"bad shard {sp}: {what}"]


def test_a_dataset_path_through_a_file_is_not_a_usable_path(packed):
    with pytest.raises(FormatError, match=rf"^{packed / LABELS_NAME}/x: not a usable dataset path \(Not a directory\)$"):
        fastload.Dataset(packed / LABELS_NAME / "x")
