"""The on-disk format of a packed dataset: record layout, keys and manifest.

This module is pure data: it encodes and decodes bytes and JSON and never opens
a shard. ``docs/format.md`` is the human-readable version of what is here.

A packed dataset is a directory::

    manifest.json          written last, atomically (see :class:`Manifest`)
    labels.bin             int32 little-endian, one label per sample, in index order
    shard-00000.lmdb       LMDB single-file environments (``subdir=False``)
    shard-00001.lmdb
    ...

Record key: the sample's global index as 8-byte **big-endian** unsigned int, so
LMDB's byte order equals index order. Record value: a 40-byte **little-endian**
header (:data:`HEADER`), the UTF-8 source path, then the encoded image.
"""

from __future__ import annotations

import dataclasses
import json
import reprlib
import struct
import zlib
from typing import Any, NamedTuple

from .errors import CorruptDataError, FormatError

FORMAT_NAME = "fastload"
#: Manifest format version "MAJOR.MINOR". Readers refuse a newer MAJOR.
FORMAT_VERSION = "1.0"
FORMAT_MAJOR = 1

#: Record header version (bumped with any change of :data:`HEADER`).
RECORD_VERSION = 1
RECORD_MAGIC = b"FLRC"

#: Record header, little-endian, 40 bytes:
#: magic 4s | version u16 | encoding u8 | flags u8 | label i32 | width u32 | height u32 |
#: orig_width u32 | orig_height u32 | payload_crc32 u32 | payload_len u32 | path_len u16 | reserved u16
HEADER = struct.Struct("<4sHBBiIIIIIIHH")
HEADER_SIZE = HEADER.size
KEY = struct.Struct(">Q")

#: Payload encodings.
ENC_JPEG = 1
ENC_PNG = 2
ENCODINGS = {ENC_JPEG: "jpeg", ENC_PNG: "png"}
#: Largest width or height each encoding can express.
_MAX_SIDE = {ENC_JPEG: 65535, ENC_PNG: 2**31 - 1}

#: Flag bits.
FLAG_PROGRESSIVE = 1  # JPEG payload is progressive (the GPU's hardware decoder takes baseline only)
FLAG_CONVERTED = 2  # payload was re-encoded from another format or colour mode
FLAG_RESIZED = 4  # payload was shrunk by --max-size
FLAG_ORIENTED = 8  # EXIF orientation was applied at pack time (payload is upright)

MANIFEST_NAME = "manifest.json"
LABELS_NAME = "labels.bin"
LABELS_DTYPE = "<i4"


def shard_name(i: int) -> str:
    """File name of shard ``i``."""
    return f"shard-{i:05d}.lmdb"


def key(index: int) -> bytes:
    """LMDB key of the sample with global index ``index``."""
    return KEY.pack(index)


class RecordHeader(NamedTuple):
    """Decoded record header. ``width``/``height`` are the stored image's size.

    A NamedTuple rather than a dataclass: it is built once per sample read, and a
    tuple builds several times faster.
    """

    encoding: int
    flags: int
    label: int
    width: int
    height: int
    orig_width: int
    orig_height: int
    crc32: int
    payload_len: int
    path_len: int

    @property
    def progressive(self) -> bool:
        return bool(self.flags & FLAG_PROGRESSIVE)


def encode_record(
    payload: bytes,
    *,
    label: int,
    encoding: int,
    width: int,
    height: int,
    orig_width: int,
    orig_height: int,
    flags: int = 0,
    path: str = "",
) -> bytes:
    """Return the stored value of one sample: header, UTF-8 path, payload."""
    path_b = path.encode("utf-8", "surrogateescape")[:65535]
    head = HEADER.pack(
        RECORD_MAGIC,
        RECORD_VERSION,
        encoding,
        flags,
        label,
        width,
        height,
        orig_width,
        orig_height,
        zlib.crc32(payload),
        len(payload),
        len(path_b),
        0,
    )
    return b"".join((head, path_b, payload))


def decode_header(value: bytes | memoryview, *, where: str = "record") -> RecordHeader:
    """Parse and validate the header of a stored value.

    Raises:
        CorruptDataError: the value is too short, has a foreign magic, an unknown
            version or encoding, lengths that do not add up, or an impossible image size.
    """
    if len(value) < HEADER_SIZE:
        raise CorruptDataError(f"{where}: record is {len(value)} bytes, shorter than its {HEADER_SIZE}-byte header")
    (magic, version, enc, flags, label, w, h, ow, oh, crc, plen, pathlen, _r) = HEADER.unpack_from(value)
    if magic != RECORD_MAGIC:
        raise CorruptDataError(f"{where}: bad record magic {bytes(magic)!r} (expected {RECORD_MAGIC!r})")
    if version != RECORD_VERSION:
        raise CorruptDataError(f"{where}: record version {version} is not supported (this fastload reads {RECORD_VERSION})")
    if enc not in ENCODINGS:
        raise CorruptDataError(f"{where}: unknown payload encoding {enc}")
    if HEADER_SIZE + pathlen + plen != len(value):
        raise CorruptDataError(
            f"{where}: header says {HEADER_SIZE}+{pathlen}+{plen} bytes but the record has {len(value)}"
        )
    if not (0 < w <= _MAX_SIDE[enc] and 0 < h <= _MAX_SIDE[enc]):  # the header is not covered by the CRC
        raise CorruptDataError(f"{where}: header says the {ENCODINGS[enc]} image is {w}x{h}, an impossible size")
    return RecordHeader(enc, flags, label, w, h, ow, oh, crc, plen, pathlen)


def record_path(value: bytes | memoryview, header: RecordHeader) -> str:
    """The source path stored in a record."""
    return bytes(value[HEADER_SIZE : HEADER_SIZE + header.path_len]).decode("utf-8", "surrogateescape")


def json_path(s: str) -> str:
    """A path made safe for JSON/UTF-8 (undecodable bytes shown as ``\\xNN``), as the manifest stores it."""
    return s.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def record_payload(value: bytes | memoryview, header: RecordHeader, *, check: bool = False, where: str = "record") -> bytes:
    """The encoded image bytes of a record, optionally checked against its CRC-32."""
    payload = bytes(value[HEADER_SIZE + header.path_len :])
    if check and zlib.crc32(payload) != header.crc32:
        raise CorruptDataError(f"{where}: payload CRC-32 mismatch (the image bytes were altered)")
    return payload


# --------------------------------------------------------------------------- manifest


@dataclasses.dataclass
class ShardInfo:
    """One shard: file name, first global index, sample count, file size and SHA-256."""

    file: str
    first: int
    count: int
    bytes: int
    sha256: str

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, d: Any, *, where: str) -> "ShardInfo":
        try:
            s = cls(str(d["file"]), int(d["first"]), int(d["count"]), int(d["bytes"]), str(d["sha256"]))
        except (KeyError, TypeError, ValueError, OverflowError) as e:  # OverflowError: int(Infinity)
            raise FormatError(f"{where}: malformed shard entry {reprlib.repr(d)}: {e}") from None
        bad_name = not s.file or any(c in s.file for c in "/\\\0") or s.file.startswith(".")
        if s.first < 0 or s.count < 0 or s.bytes < 0 or bad_name:
            raise FormatError(f"{where}: invalid shard entry {reprlib.repr(d)}")
        return s


@dataclasses.dataclass
class Manifest:
    """Everything a reader needs to know about a packed dataset, as JSON."""

    num_samples: int
    classes: list[str]
    class_counts: list[int]
    shards: list[ShardInfo]
    labels_sha256: str
    skipped: list[dict[str, str]] = dataclasses.field(default_factory=list)
    stats: dict[str, Any] = dataclasses.field(default_factory=dict)
    options: dict[str, Any] = dataclasses.field(default_factory=dict)
    created: str = ""
    fastload_version: str = ""
    version: str = FORMAT_VERSION

    def to_json(self) -> dict[str, Any]:
        return {
            "format": FORMAT_NAME,
            "version": self.version,
            "fastload_version": self.fastload_version,
            "created": self.created,
            "num_samples": self.num_samples,
            "classes": self.classes,
            "class_counts": self.class_counts,
            "labels": {"file": LABELS_NAME, "dtype": LABELS_DTYPE, "bytes": 4 * self.num_samples, "sha256": self.labels_sha256},
            "shards": [s.to_json() for s in self.shards],
            "skipped": self.skipped,
            "stats": self.stats,
            "options": self.options,
        }

    def dumps(self) -> str:
        return json.dumps(self.to_json(), indent=1, ensure_ascii=False) + "\n"

    @classmethod
    def loads(cls, text: str | bytes, *, where: str = MANIFEST_NAME) -> "Manifest":
        """Parse a manifest, refusing foreign formats and newer major versions."""
        try:
            d = json.loads(text)
        except RecursionError:
            raise FormatError(f"{where}: not valid JSON (nested too deeply); the dataset is damaged: pack it again") from None
        except (ValueError, UnicodeDecodeError) as e:
            raise FormatError(f"{where}: not valid JSON ({e}); the dataset is damaged: pack it again") from None
        if not isinstance(d, dict) or d.get("format") != FORMAT_NAME:
            fmt = d.get("format") if isinstance(d, dict) else type(d).__name__
            raise FormatError(f"{where}: not a fastload manifest (format={reprlib.repr(fmt)}); create one with `fastload pack`")
        version = d.get("version")
        try:
            major = int(str(version).split(".")[0])
        except ValueError:
            raise FormatError(f"{where}: unreadable format version {reprlib.repr(version)}") from None
        if major > FORMAT_MAJOR:
            raise FormatError(
                f"{where}: format version {version} is newer than this fastload reads ({FORMAT_VERSION}); "
                "upgrade fastload (pip install -U fastload)"
            )
        if major < 1:
            raise FormatError(f"{where}: format version {version!r} is not supported")
        try:
            n = int(d["num_samples"])
            classes = [str(c) for c in d["classes"]]
            counts = [int(c) for c in d["class_counts"]]
            shards = [ShardInfo.from_json(s, where=where) for s in d["shards"]]
            labels_sha = str(d["labels"]["sha256"])
            skipped = [{"path": str(s["path"]), "reason": str(s["reason"])} for s in d.get("skipped", [])]
            m = cls(
                num_samples=n,
                classes=classes,
                class_counts=counts,
                shards=shards,
                labels_sha256=labels_sha,
                skipped=skipped,
                stats=dict(d.get("stats", {})),
                options=dict(d.get("options", {})),
                created=str(d.get("created", "")),
                fastload_version=str(d.get("fastload_version", "")),
                version=str(version),
            )
        except (KeyError, TypeError, ValueError, AttributeError, OverflowError) as e:  # OverflowError: int(Infinity)
            raise FormatError(f"{where}: malformed manifest ({type(e).__name__}: {e})") from None
        m.validate(where=where)
        return m

    def validate(self, *, where: str = MANIFEST_NAME) -> None:
        """Check internal consistency: contiguous shards, counts that add up."""
        if self.num_samples < 0:
            raise FormatError(f"{where}: negative num_samples")
        nxt = 0
        for s in self.shards:
            if s.first != nxt:
                raise FormatError(f"{where}: shard {s.file} starts at {s.first}, expected {nxt}")
            nxt += s.count
        if nxt != self.num_samples:
            raise FormatError(f"{where}: shards hold {nxt} samples but num_samples is {self.num_samples}")
        if len(self.class_counts) != len(self.classes) or sum(self.class_counts) != self.num_samples:
            raise FormatError(f"{where}: class_counts do not match classes and num_samples")
        if len({s.file for s in self.shards}) != len(self.shards):
            raise FormatError(f"{where}: duplicate shard file names")
