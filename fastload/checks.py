"""``inspect`` and ``verify`` a packed dataset (the logic behind ``fastload inspect/verify``)."""

from __future__ import annotations

import dataclasses
import hashlib
import io
import os
from pathlib import Path
from typing import Any

from .errors import CorruptDataError, FastloadError, FormatError
from .format import LABELS_NAME, decode_header, record_payload
from .imaging import pil_settings
from .reader import read_manifest
from .store import HeaderStats, check_shard_structure, file_sha256, iter_headers, iter_records, open_shard_readonly

try:
    import lmdb
except ImportError:  # pragma: no cover
    lmdb = None

#: Bad samples named per shard before the rest are only counted.
MAX_PROBLEMS_PER_SHARD = 20


def inspect(path: str | os.PathLike) -> dict[str, Any]:
    """Describe a packed dataset, reading every record header from the shards.

    Returns a JSON-ready dict: samples, classes with counts, shards, bytes, encodings,
    progressive/converted/oriented/resized counts, min/median/max width and height.

    Raises:
        FormatError: no readable manifest.
        CorruptDataError: a shard is missing, has the wrong size, or a bad record.
    """
    root = Path(path)
    m = read_manifest(root)
    stats = HeaderStats()
    for s in m.shards:
        p = root / s.file
        try:
            size = p.stat().st_size
        except OSError:
            raise FormatError(f"{p}: shard file is missing; run `fastload verify {root}`") from None
        if size != s.bytes:
            raise CorruptDataError(f"{p}: {size} bytes, the manifest says {s.bytes}; run `fastload verify {root}`")
        try:
            for _i, h in iter_headers(p):
                stats.add(h)
        except lmdb.Error as e:
            raise CorruptDataError(f"{p}: unreadable shard ({e}); run `fastload verify {root}`") from None
    st = stats.to_json()
    return {
        "path": str(root),
        "format_version": m.version,
        "fastload_version": m.fastload_version,
        "created": m.created,
        "samples": m.num_samples,
        "classes": [{"name": c, "count": n} for c, n in zip(m.classes, m.class_counts)],
        "shards": [{"file": s.file, "first": s.first, "count": s.count, "bytes": s.bytes} for s in m.shards],
        "bytes": sum(s.bytes for s in m.shards),
        "payload_bytes": st["payload_bytes"],
        "encodings": st["encodings"],
        "progressive": st["progressive"],
        "converted": st["converted"],
        "oriented": st["oriented"],
        "resized": st["resized"],
        "width": st["width"],
        "height": st["height"],
        "skipped": len(m.skipped),
        "options": m.options,
    }


def format_inspect(info: dict[str, Any], *, max_classes: int = 50) -> str:
    """Human-readable text of :func:`inspect`'s result."""
    w, h = info["width"], info["height"]
    lines = [
        f"{info['path']}: fastload format {info['format_version']} (fastload {info['fastload_version']}, created {info['created']})",
        f"samples      {info['samples']}",
        f"classes      {len(info['classes'])}",
        f"shards       {len(info['shards'])}",
        f"bytes        {info['bytes']:,} ({info['bytes'] / 1e6:.1f} MB; payload {info['payload_bytes'] / 1e6:.1f} MB)",
        "encodings    " + (", ".join(f"{k} {v}" for k, v in info["encodings"].items()) or "-"),
        f"progressive  {info['progressive']}",
        f"converted    {info['converted']}",
        f"oriented     {info['oriented']}",
        f"resized      {info['resized']}",
        f"width        min {w['min']}  median {w['median']}  max {w['max']}",
        f"height       min {h['min']}  median {h['median']}  max {h['max']}",
        f"skipped      {info['skipped']}",
        "class counts:",
    ]
    for c in info["classes"][:max_classes]:
        lines.append(f"  {c['count']:>9}  {c['name']}")
    if len(info["classes"]) > max_classes:
        lines.append(f"  ... and {len(info['classes']) - max_classes} more (see --json)")
    return "\n".join(lines)


@dataclasses.dataclass
class VerifyReport:
    """Result of :func:`verify`: ``ok`` when ``problems`` is empty."""

    path: Path
    problems: list[str]
    shards_checked: int
    samples_checked: int
    decoded: bool

    @property
    def ok(self) -> bool:
        return not self.problems

    def __bool__(self) -> bool:
        return self.ok


def _decode_problem(payload: bytes, width: int, height: int) -> str | None:
    from PIL import Image

    try:
        with pil_settings():
            im = Image.open(io.BytesIO(payload))
            im.load()
    except Exception as e:
        return f"does not decode ({str(e).splitlines()[0] if str(e) else type(e).__name__})"
    if im.size != (width, height):
        return f"decodes to {im.size[0]}x{im.size[1]}, the header says {width}x{height}"
    return None


def verify(path: str | os.PathLike, *, decode: bool = False) -> VerifyReport:
    """Check a packed dataset against its manifest.

    Checks labels.bin (size, SHA-256), every shard (present, size, SHA-256) and every
    record (key sequence, header, label against labels.bin, payload CRC-32); with
    ``decode=True`` also decodes every image with PIL and compares its size.

    Returns:
        :class:`VerifyReport`; each problem names the shard or sample.

    Raises:
        FormatError: the manifest is missing or unreadable (nothing can be verified).
    """
    import numpy as np

    root = Path(path)
    m = read_manifest(root)
    problems: list[str] = []
    labels = None
    lp = root / LABELS_NAME
    try:
        size = lp.stat().st_size  # before reading: a replaced file may be huge
        raw = lp.read_bytes() if size == 4 * m.num_samples else b""
        if size != 4 * m.num_samples or len(raw) != size:
            problems.append(f"{lp}: {size} bytes, expected {4 * m.num_samples}")
        elif hashlib.sha256(raw).hexdigest() != m.labels_sha256:
            problems.append(f"{lp}: SHA-256 differs from the manifest (labels altered)")
        else:
            labels = np.frombuffer(raw, dtype="<i4")
    except OSError as e:
        problems.append(f"{lp}: cannot read ({e.strerror})")

    samples = 0
    for s in m.shards:
        p = root / s.file
        try:
            size = p.stat().st_size
        except OSError:
            problems.append(f"bad shard {p}: missing")
            continue
        if size != s.bytes:
            problems.append(f"bad shard {p}: {size} bytes, the manifest says {s.bytes} (truncated or replaced)")
            continue  # opening a short file through mmap can crash the process
        if file_sha256(p) != s.sha256:
            problems.append(f"bad shard {p}: SHA-256 differs from the manifest")
            damage = check_shard_structure(p, size)
            if damage:  # its records cannot be read safely: nothing more to learn from them
                problems.append(f"bad shard {p}: damaged LMDB structure ({damage})")
                continue
        bad: list[str] = []
        expected = s.first
        try:
            with open_shard_readonly(p) as env:
                for i, v in iter_records(env, str(p)):
                    where = f"sample {i} in {p}"
                    if i != expected:
                        bad.append(f"{where}: unexpected key (expected sample {expected})")
                        expected = i
                    expected += 1
                    samples += 1
                    try:
                        h = decode_header(v, where=where)
                        if labels is not None and 0 <= i < len(labels) and int(labels[i]) != h.label:
                            raise CorruptDataError(f"{where}: label {h.label} differs from labels.bin ({int(labels[i])})")
                        payload = record_payload(v, h, check=True, where=where)
                        if decode:
                            why = _decode_problem(payload, h.width, h.height)
                            if why:
                                raise CorruptDataError(f"{where}: {why}")
                    except FastloadError as e:
                        bad.append(str(e))
        except lmdb.Error as e:
            bad.append(f"bad shard {p}: unreadable LMDB ({e})")
        except FastloadError as e:
            bad.append(f"bad shard {p}: {e}")
        if expected != s.first + s.count:
            bad.append(f"bad shard {p}: holds samples {s.first}..{expected - 1}, the manifest says {s.first}..{s.first + s.count - 1}")
        problems.extend(bad[:MAX_PROBLEMS_PER_SHARD])
        if len(bad) > MAX_PROBLEMS_PER_SHARD:
            problems.append(f"bad shard {p}: ... and {len(bad) - MAX_PROBLEMS_PER_SHARD} more bad samples")
    return VerifyReport(root, problems, len(m.shards), samples, bool(decode))


__all__ = ["inspect", "verify", "VerifyReport", "format_inspect"]
