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
header (:data:`HEADER`), the UTF-8 source path, then the encoded image; in format 3
(a dataset with typed fields, :mod:`fastload.fields`) a field block follows the image.
"""

from __future__ import annotations

import dataclasses
import json
import re
import reprlib
import struct
import zlib
from typing import Any, NamedTuple

import xxhash

from .errors import CorruptDataError, FormatError
from .fields import CLASSIC, Field, Schema, decode_block

FORMAT_NAME = "fastload"
#: Manifest format version "MAJOR.MINOR". Readers refuse a newer MAJOR.
FORMAT_VERSION = "2.0"
#: The format version of a dataset with typed fields (record version 3: a field block after the payload).
FIELDS_FORMAT_VERSION = "3.0"
#: The newest MAJOR this fastload reads.
FORMAT_MAJOR = 3

#: Record header version written by this fastload (bumped with any change of :data:`HEADER`).
#: Version 1 (format 1.x) checks the payload with zlib's CRC-32; version 2 (format 2.0, the same
#: layout) with the low 32 bits of its XXH3-64 hash, which costs about a seventh as much.
RECORD_VERSION = 2
#: Record header version of a record with a field block after its payload (format 3.x): the
#: same header and checksum as version 2.
FIELDS_RECORD_VERSION = 3
#: Record versions this fastload reads.
READ_RECORD_VERSIONS = (1, 2, 3)
RECORD_MAGIC = b"FLRC"

#: Record header, little-endian, 40 bytes:
#: magic 4s | version u16 | encoding u8 | flags u8 | label i32 | width u32 | height u32 |
#: orig_width u32 | orig_height u32 | payload_check u32 | payload_len u32 | path_len u16 | reserved u16
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

# -- caps a reader checks before it allocates anything (docs/format.md, "Limits") ----------------
#: Largest ``manifest.json`` a reader reads, bytes (its size is checked before it is read).
MAX_MANIFEST_BYTES = 1 << 30
#: Most samples a dataset may hold (keys are u64; 2**53 keeps every count exact as a float too).
MAX_SAMPLES = 2**53
#: Most classes a dataset may have.
MAX_CLASSES = 2**24
#: Largest shard file, bytes (the largest file size an ``off_t`` can express).
MAX_SHARD_BYTES = 2**63 - 1
#: Fewest bytes one record takes in a shard file: its 40-byte header, its 8-byte key, LMDB's
#: 8-byte leaf-node header and 2-byte slot in the page's node table. A shard of ``bytes`` bytes
#: holds at most ``bytes // MIN_RECORD_BYTES`` records.
MIN_RECORD_BYTES = HEADER_SIZE + KEY.size + 8 + 2
#: Most pixels of one stored image when the manifest's ``options.max_pixels`` is absent (PIL's limit).
DEFAULT_MAX_PIXELS = 89_478_485
#: Most JPEG marker segments (and fill bytes) walked to find the frame header (SOF).
MAX_JPEG_SEGMENTS = 1024

#: What a shard file name may be: a plain name in the dataset directory, ending in ``.lmdb``.
SHARD_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,200}\.lmdb\Z")


def shard_name(i: int) -> str:
    """File name of shard ``i``."""
    return f"shard-{i:05d}.lmdb"


def key(index: int) -> bytes:
    """LMDB key of the sample with global index ``index``."""
    return KEY.pack(index)


def valid_shard_name(name: str) -> bool:
    """Whether ``name`` may name a shard file: a plain name such as ``shard-00000.lmdb``.

    ASCII letters, digits, ``_``, ``.`` and ``-`` only, not starting with ``.`` or ``-``,
    ending in ``.lmdb``: no directory part, no ``..``, nothing that needs escaping.
    """
    return isinstance(name, str) and SHARD_NAME_RE.match(name) is not None


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
    checksum: int  #: the payload's checksum (:func:`payload_checksum` of this record's version)
    payload_len: int
    path_len: int
    version: int = RECORD_VERSION

    @property
    def progressive(self) -> bool:
        return bool(self.flags & FLAG_PROGRESSIVE)

    @property
    def crc32(self) -> int:
        """The payload checksum field (a CRC-32 in version-1 records; kept for older callers)."""
        return self.checksum


#: python-xxhash releases the GIL while it hashes more than 64 KiB at once (its
#: ``XXHASH_GIL_MINSIZE``), and a thread that releases the GIL while a busy Python thread (a
#: training loop) runs waits up to the switch interval (5 ms) to take it back. Hashing in
#: slices of at most 64 KiB keeps the GIL held: 2 us per 100 KB, never a 5 ms wait per record.
_HASH_SLICE = 64 << 10


def payload_checksum(payload: bytes | bytearray | memoryview, version: int = RECORD_VERSION) -> int:
    """The checksum a record of ``version`` stores for ``payload``.

    Version 1: zlib's CRC-32. Version 2: the low 32 bits of XXH3-64 (seed 0), computed in
    slices of at most 64 KiB so that the GIL is never released (see :data:`_HASH_SLICE`).
    """
    if version == 1:
        return zlib.crc32(payload)
    n = len(payload)
    if n <= _HASH_SLICE:
        return xxhash.xxh3_64_intdigest(payload) & 0xFFFFFFFF
    view = payload if isinstance(payload, memoryview) else memoryview(payload)
    h = xxhash.xxh3_64()
    for i in range(0, n, _HASH_SLICE):
        h.update(view[i : i + _HASH_SLICE])
    return h.intdigest() & 0xFFFFFFFF


def checksum_name(version: int) -> str:
    """What the payload checksum of a record of ``version`` is, for messages."""
    return "CRC-32" if version == 1 else "XXH3 checksum"


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
        payload_checksum(payload),
        len(payload),
        len(path_b),
        0,
    )
    return b"".join((head, path_b, payload))


class ValueHead(bytes):
    """The first bytes of a stored value, whose ``len()`` is the whole value's: what
    :func:`~fastload.format.decode_header` needs to check the header's lengths against the
    value without the payload having been read (the payload is read apart, into its own
    ``bytes``, saving a copy of it)."""

    length: int

    def __new__(cls, head: bytes | memoryview, length: int) -> "ValueHead":
        obj = super().__new__(cls, head)
        obj.length = length
        return obj

    def __len__(self) -> int:
        return self.length


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
    if version not in READ_RECORD_VERSIONS:
        raise CorruptDataError(
            f"{where}: record version {version} is not supported (this fastload reads versions "
            f"{', '.join(map(str, READ_RECORD_VERSIONS))})"
        )
    if enc not in ENCODINGS:
        raise CorruptDataError(f"{where}: unknown payload encoding {enc}")
    if HEADER_SIZE + pathlen + plen != len(value) and (version != FIELDS_RECORD_VERSION or HEADER_SIZE + pathlen + plen + 4 > len(value)):
        raise CorruptDataError(
            f"{where}: header says {HEADER_SIZE}+{pathlen}+{plen} bytes but the record has {len(value)}"
        )
    if not (0 < w <= _MAX_SIDE[enc] and 0 < h <= _MAX_SIDE[enc]):  # the header is not covered by the CRC
        raise CorruptDataError(f"{where}: header says the {ENCODINGS[enc]} image is {w}x{h}, an impossible size")
    return RecordHeader(enc, flags, label, w, h, ow, oh, crc, plen, pathlen, version)


# JPEG markers by what the walk does with them: 0 a segment with a length (skipped), 1 a frame
# header (SOF0..SOF15 but DHT C4, JPG C8, DAC CC), 2 start of scan or end of image (the walk ends),
# 3 a marker without a length (TEM, RSTn, SOI), 4 a fill byte (FF).
_SOF = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}
_JPEG_KIND = bytes(
    1 if m in _SOF else 2 if m in (0xD9, 0xDA) else 3 if m == 0x01 or 0xD0 <= m <= 0xD8 else 4 if m == 0xFF else 0
    for m in range(256)
)
_MARKER = struct.Struct(">BBH")  # FF, marker, segment length
_SOF_SIZE = struct.Struct(">HH")  # height, width (after the precision byte)
_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def jpeg_frame(
    b: bytes,
    *,
    to_scan: bool = False,
    _kind: bytes = _JPEG_KIND,  # bound here: this runs on every read
    _marker: Any = _MARKER.unpack_from,
    _sof: Any = _SOF_SIZE.unpack_from,
) -> tuple[int, int, int] | None:
    """``(SOF marker, width, height)`` of a JPEG's frame header, found by walking its marker segments.

    Reads four bytes per segment, never the entropy-coded data: it stops at the first SOFn
    (what decoders size their output from), or with ``to_scan`` at the start of the first
    scan, then also refusing a second SOF (PIL uses the last one). The walk is strict, as
    ``pack``'s JPEG header scan: segments follow each other with no junk between them.
    None if the bytes do not start with SOI, reach no SOF (or no scan) within
    :data:`MAX_JPEG_SEGMENTS` steps, or end inside a marker. The read side checks every
    payload with it; ``pack`` can use it for its JPEG header scan.
    """
    if b[:2] != b"\xff\xd8":
        return None
    i, steps, frame = 2, 0, None
    try:
        while steps < MAX_JPEG_SEGMENTS:
            steps += 1
            ff, m, length = _marker(b, i)
            if ff != 0xFF:
                return None
            k = _kind[m]
            if k == 0:
                i += 2 + length
            elif k == 1:
                if frame is not None:
                    return None
                h, w = _sof(b, i + 5)
                if not to_scan:
                    return m, w, h
                frame = m, w, h
                i += 2 + length
            elif k == 3:
                i += 2
            elif k == 4:
                i += 1
            else:
                return frame if m == 0xDA else None
    except struct.error:  # the bytes end inside a marker
        return None
    return None


def png_size(b: bytes) -> tuple[int, int] | None:
    """``(width, height)`` from a PNG's IHDR chunk, or None if it does not start like a PNG."""
    if len(b) < 24 or b[:8] != _PNG_SIGNATURE or b[12:16] != b"IHDR":
        return None
    return int.from_bytes(b[16:20], "big"), int.from_bytes(b[20:24], "big")


def payload_size(payload: bytes, encoding: int) -> tuple[int, int] | None:
    """``(width, height)`` an encoded payload declares in its own header (None if it declares none);
    for a JPEG, its first frame header (:func:`jpeg_frame`)."""
    if encoding == ENC_JPEG:
        frame = jpeg_frame(payload)
        return None if frame is None else (frame[1], frame[2])
    return png_size(payload) if encoding == ENC_PNG else None


def check_stored_size(header: RecordHeader, payload: bytes | None, *, max_pixels: int, where: str = "record") -> None:
    """Refuse a record whose image a decoder could not decode within ``max_pixels`` pixels.

    The header is not covered by the payload's CRC-32, and decoders size their output from
    the payload's own header: both must agree, and stay within the cap. With ``payload``
    None, only the header is checked against the cap.

    Raises:
        CorruptDataError: more than ``max_pixels`` pixels, or a payload whose own header
            declares another size than the record header (or none).
    """
    w, h = header.width, header.height
    if w * h > max_pixels:
        raise CorruptDataError(
            f"{where}: header says the image is {w}x{h} = {w * h:,} pixels, more than the {max_pixels:,} "
            "this dataset allows (options.max_pixels); the record header was altered"
        )
    if payload is None:
        return
    size = payload_size(payload, header.encoding)
    if size != (w, h):
        found = "no readable frame header" if size is None else f"{size[0]}x{size[1]}"
        raise CorruptDataError(
            f"{where}: header says the {ENCODINGS[header.encoding]} image is {w}x{h} but its payload declares {found}; "
            "the record was altered (run `fastload verify`)"
        )


def record_path(value: bytes | memoryview, header: RecordHeader) -> str:
    """The source path stored in a record."""
    return bytes(value[HEADER_SIZE : HEADER_SIZE + header.path_len]).decode("utf-8", "surrogateescape")


def json_path(s: str) -> str:
    """A path made safe for JSON/UTF-8 (undecodable bytes shown as ``\\xNN``), as the manifest stores it."""
    return s.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def record_payload(value: bytes | memoryview, header: RecordHeader, *, check: bool = False, where: str = "record") -> bytes:
    """The encoded image bytes of a record, optionally checked against its checksum."""
    start = HEADER_SIZE + header.path_len
    payload = bytes(value[start : start + header.payload_len])
    if check and payload_checksum(payload, header.version) != header.checksum:
        raise CorruptDataError(f"{where}: payload {checksum_name(header.version)} mismatch (the image bytes were altered)")
    return payload


def record_fields(value: bytes | memoryview, header: RecordHeader) -> memoryview:
    """The field block of a record (empty for records of version 1 and 2)."""
    return memoryview(value)[HEADER_SIZE + header.path_len + header.payload_len :]


def record_field_values(
    value: bytes | memoryview, header: RecordHeader, stored: tuple[Field, ...], *, check: bool = True, where: str = "record"
) -> dict[str, Any]:
    """The typed field values of a record, whose dataset's block fields are ``stored``.

    Raises:
        CorruptDataError: the record has no field block though fields are declared (or one
            though none are), or its block is damaged (:func:`fastload.fields.decode_block`).
    """
    if header.version != FIELDS_RECORD_VERSION:
        if stored:
            raise CorruptDataError(f"{where}: record version {header.version} has no field block, but the manifest declares fields")
        return {}
    if not stored:
        raise CorruptDataError(f"{where}: the record has a field block, but the manifest declares no fields")
    return decode_block(stored, record_fields(value, header), check=check, where=where)


def fields_offset(header: RecordHeader) -> int:
    """Where a record's field block starts in its value."""
    return HEADER_SIZE + header.path_len + header.payload_len


def with_field_block(record: bytes | bytearray, block: bytes) -> bytearray:
    """A version-2 record made a version-3 one: its version set to 3 and ``block`` appended."""
    out = bytearray(record)
    struct.pack_into("<H", out, 4, FIELDS_RECORD_VERSION)
    out += block
    return out


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
        if not valid_shard_name(s.file):
            raise FormatError(
                f"{where}: invalid shard entry {reprlib.repr(d)}: the file must be a plain name like "
                "shard-00000.lmdb (letters, digits, '_', '.', '-'; no directory part)"
            )
        if s.first < 0 or s.count < 0 or s.bytes < 0:
            raise FormatError(f"{where}: invalid shard entry {reprlib.repr(d)}")
        s.check_bounds(where=where)
        return s

    def check_bounds(self, *, where: str) -> None:
        """Refuse a count its file size cannot hold, and sizes past the documented caps."""
        if not valid_shard_name(self.file):
            raise FormatError(f"{where}: invalid shard file name {reprlib.repr(self.file)} (expected a plain name like shard-00000.lmdb)")
        if self.bytes > MAX_SHARD_BYTES or self.first + self.count > MAX_SAMPLES:
            raise FormatError(f"{where}: shard {self.file} claims {self.bytes} bytes and samples {self.first}+{self.count}, past the format's limits")
        if self.count * MIN_RECORD_BYTES > self.bytes:
            raise FormatError(
                f"{where}: shard {self.file} claims {self.count} records in {self.bytes} bytes; a record takes at "
                f"least {MIN_RECORD_BYTES} bytes (the manifest was altered)"
            )


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
    #: The typed fields (format 3); None for a dataset of the image and its label only.
    fields: Schema | None = None

    @property
    def max_pixels(self) -> int:
        """Most pixels of one stored image: ``options.max_pixels`` (the pack's ``--max-pixels``) if
        present, else :data:`DEFAULT_MAX_PIXELS`. A decode never needs more than 3 bytes per pixel."""
        return self._pixel_cap(MANIFEST_NAME)

    def _pixel_cap(self, where: str) -> int:
        v = self.options.get("max_pixels") if isinstance(self.options, dict) else None
        if v is None:
            return DEFAULT_MAX_PIXELS
        if type(v) is not int or v < 1:
            raise FormatError(f"{where}: options.max_pixels {reprlib.repr(v)} is not a positive integer")
        return v

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
            **({"fields": self.fields.to_json()} if self.fields is not None else {}),
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
                f"{where}: format version {version} is newer than this fastload reads ({FORMAT_MAJOR}.x); "
                "upgrade fastload (pip install -U fastload)"
            )
        if major < 1:
            raise FormatError(f"{where}: format version {version!r} is not supported")
        try:
            n = int(d["num_samples"])
            if not 0 <= n <= MAX_SAMPLES:
                raise FormatError(f"{where}: num_samples {n} is outside 0..{MAX_SAMPLES}")
            for field in ("classes", "class_counts"):
                if not isinstance(d[field], list):
                    raise FormatError(f"{where}: {field} is a {type(d[field]).__name__}, not a list")
                if len(d[field]) > MAX_CLASSES:
                    raise FormatError(f"{where}: {len(d[field])} {field}, more than the {MAX_CLASSES} a dataset may have")
            if not all(isinstance(c, str) for c in d["classes"]):
                raise FormatError(f"{where}: a class name is not a string")
            classes = list(d["classes"])
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
                fields=Schema.from_json(d["fields"], where=where) if "fields" in d else None,
            )
        except (KeyError, TypeError, ValueError, AttributeError, OverflowError) as e:  # OverflowError: int(Infinity)
            raise FormatError(f"{where}: malformed manifest ({type(e).__name__}: {e})") from None
        m.validate(where=where)
        return m

    def validate(self, *, where: str = MANIFEST_NAME) -> None:
        """Check internal consistency and the documented caps: contiguous shards, counts that add
        up, counts each shard's size can hold, shard names, ``options.max_pixels``."""
        if not 0 <= self.num_samples <= MAX_SAMPLES:
            raise FormatError(f"{where}: num_samples {self.num_samples} is outside 0..{MAX_SAMPLES}")
        if len(self.classes) > MAX_CLASSES:
            raise FormatError(f"{where}: {len(self.classes)} classes, more than the {MAX_CLASSES} a dataset may have")
        for s in self.shards:
            s.check_bounds(where=where)
        self._pixel_cap(where)  # refuses an unusable options.max_pixels
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
        if (self.fields is not None) != self.version.startswith("3."):
            raise FormatError(f"{where}: a format-{self.version} manifest {'has' if self.fields is not None else 'lacks'} a fields list; the dataset is damaged")

    @property
    def schema(self) -> Schema:
        """The dataset's fields: its ``fields``, or the image and label of a dataset without typed fields."""
        return self.fields if self.fields is not None else CLASSIC
