"""The on-disk format: record header bytes, keys, manifest JSON and its refusals."""

from __future__ import annotations

import json
import zlib

import pytest
import xxhash

from fastload.errors import CorruptDataError, FormatError
from fastload.format import (
    ENC_JPEG,
    FLAG_ORIENTED,
    FLAG_PROGRESSIVE,
    FORMAT_VERSION,
    HEADER_SIZE,
    Manifest,
    ShardInfo,
    decode_header,
    encode_record,
    key,
    payload_checksum,
    record_path,
    record_payload,
    shard_name,
)


def _record(**kw):
    args = dict(label=5, encoding=ENC_JPEG, width=640, height=480, orig_width=1280, orig_height=960,
                flags=FLAG_PROGRESSIVE | FLAG_ORIENTED, path="a/b.jpg")  # fmt: skip
    args.update(kw)
    return encode_record(b"abc", **args)


def test_header_exact_bytes_little_endian():
    value = _record()
    assert HEADER_SIZE == 40
    expected = (
        b"FLRC"  # magic
        + b"\x02\x00"  # record version 2, u16 LE
        + b"\x01"  # encoding jpeg
        + b"\x09"  # flags: progressive | oriented
        + b"\x05\x00\x00\x00"  # label 5, i32 LE
        + b"\x80\x02\x00\x00"  # width 640
        + b"\xe0\x01\x00\x00"  # height 480
        + b"\x00\x05\x00\x00"  # orig width 1280
        + b"\xc0\x03\x00\x00"  # orig height 960
        + (xxhash.xxh3_64_intdigest(b"abc") & 0xFFFFFFFF).to_bytes(4, "little")  # low 32 bits of XXH3-64
        + b"\x03\x00\x00\x00"  # payload length 3
        + b"\x07\x00"  # path length 7
        + b"\x00\x00"  # reserved
    )
    assert value[:HEADER_SIZE] == expected
    assert value[HEADER_SIZE:] == b"a/b.jpgabc"


def test_header_round_trip():
    value = _record(label=-1, path="ünï cødé/ä b.jpg")
    h = decode_header(value)
    assert (h.encoding, h.label, h.width, h.height, h.orig_width, h.orig_height) == (ENC_JPEG, -1, 640, 480, 1280, 960)
    assert h.progressive and h.flags & FLAG_ORIENTED
    assert h.payload_len == 3 and h.checksum == xxhash.xxh3_64_intdigest(b"abc") & 0xFFFFFFFF and h.version == 2
    assert record_path(value, h) == "ünï cødé/ä b.jpg"
    assert record_payload(value, h, check=True) == b"abc"


def test_keys_are_big_endian_so_byte_order_is_index_order():
    assert key(1) == b"\x00\x00\x00\x00\x00\x00\x00\x01"
    assert key(258) == b"\x00\x00\x00\x00\x00\x00\x01\x02"
    keys = [key(i) for i in (0, 1, 255, 256, 65535, 65536, 2**40)]
    assert keys == sorted(keys)
    assert shard_name(0) == "shard-00000.lmdb" and shard_name(12) == "shard-00012.lmdb"


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda v: v[:10], "shorter than its 40-byte header"),
        (lambda v: b"XXXX" + v[4:], "bad record magic"),
        (lambda v: v[:4] + b"\x04\x00" + v[6:], "record version 4 is not supported"),
        (lambda v: v[:4] + b"\x00\x00" + v[6:], "record version 0 is not supported"),
        (lambda v: v[:6] + b"\x09" + v[7:], "unknown payload encoding 9"),
        (lambda v: v + b"extra", "header says"),
    ],
)
def test_decode_header_refuses_malformed(mutate, message):
    with pytest.raises(CorruptDataError, match=message):
        decode_header(mutate(_record()), where="here")


def test_payload_crc_detects_altered_bytes():
    value = bytearray(_record())
    value[-1] ^= 0xFF
    h = decode_header(bytes(value))
    with pytest.raises(CorruptDataError, match="XXH3 checksum mismatch"):
        record_payload(bytes(value), h, check=True)


def test_version_1_records_are_read_and_checked_with_crc32():
    """Datasets packed before record version 2 store zlib's CRC-32: still read, still checked."""
    v2 = _record()
    v1 = bytearray(v2)
    v1[4:6] = (1).to_bytes(2, "little")
    v1[28:32] = zlib.crc32(b"abc").to_bytes(4, "little")
    h = decode_header(bytes(v1))
    assert h.version == 1 and h.checksum == zlib.crc32(b"abc")
    assert record_payload(bytes(v1), h, check=True) == b"abc"
    v1[-1] ^= 0x01
    with pytest.raises(CorruptDataError, match="payload CRC-32 mismatch"):
        record_payload(bytes(v1), decode_header(bytes(v1)), check=True)
    # a version-2 header over the same bytes holds XXH3, not CRC-32: the CRC would not pass
    assert payload_checksum(b"abc", 2) != payload_checksum(b"abc", 1)


@pytest.mark.parametrize("size", [0, 1, 64 << 10, (64 << 10) + 1, 200_003])
def test_payload_checksum_in_slices_equals_one_shot_xxh3(size):
    """Payloads above 64 KiB are hashed in slices (so the GIL is kept): the same value as one call."""
    b = bytes(range(256)) * (size // 256) + bytes(size % 256)
    assert payload_checksum(b) == xxhash.xxh3_64_intdigest(b) & 0xFFFFFFFF
    assert payload_checksum(memoryview(b)) == payload_checksum(bytearray(b))


def _manifest() -> Manifest:
    return Manifest(
        num_samples=5,
        classes=["cat", "dog"],
        class_counts=[2, 3],
        shards=[ShardInfo("shard-00000.lmdb", 0, 3, 4096, "a" * 64), ShardInfo("shard-00001.lmdb", 3, 2, 8192, "b" * 64)],
        labels_sha256="c" * 64,
        skipped=[{"path": "x/bad.jpg", "reason": "zero-byte file"}],
        stats={"progressive": 1},
        options={"quality": 95},
        created="2026-01-01T00:00:00+00:00",
        fastload_version="0.1.0",
    )


def test_manifest_round_trip():
    m = _manifest()
    text = m.dumps()
    d = json.loads(text)
    assert d["format"] == "fastload" and d["version"] == FORMAT_VERSION
    assert d["labels"] == {"file": "labels.bin", "dtype": "<i4", "bytes": 20, "sha256": "c" * 64}
    assert d["shards"][1] == {"file": "shard-00001.lmdb", "first": 3, "count": 2, "bytes": 8192, "sha256": "b" * 64}
    back = Manifest.loads(text)
    assert back == m


def test_format_1_manifests_are_still_read():
    """Datasets packed before format 2.0 (record version 1, CRC-32) stay readable."""
    d = json.loads(_manifest().dumps())
    assert d["version"] == FORMAT_VERSION == "2.0"
    old = Manifest.loads(json.dumps({**d, "version": "1.0"}))
    assert old.version == "1.0" and old.num_samples == 5


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda d: "not json{", "not valid JSON"),
        (lambda d: {**d, "format": "webdataset"}, "not a fastload manifest"),
        (lambda d: {**d, "version": "4.0"}, "newer than this fastload reads"),
        (lambda d: {**d, "version": "0.9"}, "not supported"),
        (lambda d: {k: v for k, v in d.items() if k != "classes"}, "malformed manifest"),
        (lambda d: {**d, "num_samples": 6}, "shards hold 5 samples"),
        (lambda d: {**d, "class_counts": [1, 3]}, "class_counts do not match"),
        (lambda d: {**d, "shards": [d["shards"][1], d["shards"][0]]}, "starts at 3, expected 0"),
        (lambda d: {**d, "shards": [{**d["shards"][0], "file": "../x.lmdb"}, d["shards"][1]]}, "invalid shard entry"),
    ],
)
def test_manifest_refusals(edit, message):
    d = json.loads(_manifest().dumps())
    new = edit(d)
    text = new if isinstance(new, str) else json.dumps(new)
    with pytest.raises(FormatError, match=message):
        Manifest.loads(text)


def test_newer_minor_version_is_read():
    d = json.loads(_manifest().dumps())
    d["version"] = "1.7"
    d["future_field"] = {"x": 1}
    assert Manifest.loads(json.dumps(d)).num_samples == 5
