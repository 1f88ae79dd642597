"""``inspect`` and ``verify`` a packed dataset (the logic behind ``fastload inspect/verify``)."""

from __future__ import annotations

import dataclasses
import hashlib
import io
import os
from pathlib import Path
from typing import Any

from .errors import CorruptDataError, FastloadError, FormatError, printable
from .format import (
    ENC_JPEG,
    LABELS_NAME,
    check_stored_size,
    decode_header,
    jpeg_frame,
    payload_size,
    record_field_values,
    record_payload,
)
from .boxes import box_problem, box_rules
from .fields import FieldStats
from .imaging import pil_settings
from .reader import claimed_samples_problem, read_manifest
from .store import (
    DamagedShardError,
    HeaderStats,
    check_shard_structure,
    file_problem,
    file_sha256,
    iter_headers,
    iter_records,
    open_shard_readonly,
    read_regular,
    stat_regular,
)

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
            size = stat_regular(p, within=root).st_size  # a FIFO or a device would hang the open
        except FileNotFoundError:
            raise FormatError(f"{p}: shard file is missing; run `fastload verify {root}`") from None
        except OSError as e:
            raise FormatError(f"{p}: shard file {file_problem(e)}; run `fastload verify {root}`") from None
        if size != s.bytes:
            raise CorruptDataError(f"{p}: {size} bytes, the manifest says {s.bytes}; run `fastload verify {root}`")
        try:
            for _i, h in iter_headers(p):  # pread, never a map: a shard cut short meanwhile is an error, not SIGBUS
                stats.add(h)
        except DamagedShardError as e:
            raise CorruptDataError(f"{e}; run `fastload verify {root}`") from None
        except OSError as e:
            raise FormatError(f"{p}: cannot read shard: it {file_problem(e)}; run `fastload verify {root}`") from None
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
        "fields": _fields_info(m),
    }


def _fields_info(m: Any) -> list[dict[str, Any]]:
    """The schema with each typed field's statistics from the manifest (lengths, value ranges)."""
    st = m.stats.get("fields", {}) if isinstance(m.stats, dict) else {}
    st = st if isinstance(st, dict) else {}
    out = []
    for f in m.schema:
        d = {"name": f.name, "kind": f.spec}
        extra = st.get(f.name)
        if isinstance(extra, dict):
            d.update({k: v for k, v in extra.items() if k in ("length", "min", "max")})
        out.append(d)
    return out


def _field_line(d: dict[str, Any]) -> str:
    parts = [f"  {printable(d['name']):<16} {printable(d['kind']):<14}"]
    n = d.get("length")
    if isinstance(n, dict):
        parts.append(f"length min {n.get('min')}  median {n.get('median')}  max {n.get('max')}")
    if "min" in d:
        parts.append(f"values {printable(str(d.get('min')))} .. {printable(str(d.get('max')))}")
    return "  ".join(parts).rstrip()


def format_inspect(info: dict[str, Any], *, max_classes: int = 50) -> str:
    """Human-readable text of :func:`inspect`'s result.

    Names from the manifest (class names, versions, dates) are printed with control and
    other unprintable characters escaped (:func:`fastload.errors.printable`): a name cannot
    move the cursor, recolour the terminal or break a line.
    """
    w, h = info["width"], info["height"]
    e = printable
    lines = [
        f"{e(info['path'])}: fastload format {e(info['format_version'])} (fastload {e(info['fastload_version'])}, "
        f"created {e(info['created'])})",
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
    ]
    if len(info.get("fields", [])) > 2 or any(f["kind"] != k for f, k in zip(info.get("fields", []), ("image", "label"))):
        lines.append("fields:")
        lines.extend(_field_line(d) for d in info["fields"])
    coco = info.get("options", {}).get("coco") if isinstance(info.get("options"), dict) else None
    if isinstance(coco, dict) and isinstance(coco.get("categories"), list):  # fastload pack --annotations
        lines.append(f"categories ({e(str(coco.get('annotations')))}; label  COCO id  name):")
        lines.extend(f"  {c.get('label'):>5}  {c.get('id'):>7}  {e(str(c.get('name')))}" for c in coco["categories"] if isinstance(c, dict))
        if coco.get("masks"):
            lines.append(f"masks        {e(str(coco['masks']))}, of labels {e(', '.join(map(str, coco.get('mask_labels') or [])) or '-')}")
    lines += [
        "class counts:",
    ]
    for c in info["classes"][:max_classes]:
        lines.append(f"  {c['count']:>9}  {e(c['name'])}")
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


def _decode_problem(payload: bytes, encoding: int, width: int, height: int) -> str | None:
    from PIL import Image

    # PIL sizes its output from the payload's own header (the last SOF of a JPEG): decode only a
    # payload that declares exactly the header's size, which the pixel cap has bounded.
    if encoding == ENC_JPEG:
        frame = jpeg_frame(payload, to_scan=True)
        declared = None if frame is None else frame[1:]
    else:
        declared = payload_size(payload, encoding)
    if declared is None:
        return "does not decode (no single frame header before its image data)"
    if declared != (width, height):
        return f"its payload declares {declared[0]}x{declared[1]} pixels, the header says {width}x{height}"
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

    Checks labels.bin (size, SHA-256), every shard (a regular file inside the dataset
    directory, size, SHA-256) and every record (key sequence, header, label against
    labels.bin, payload CRC-32, the pixel cap, the size the payload's own frame header
    declares); with ``decode=True`` also decodes every image with PIL and compares its
    size (only a payload that declares exactly one frame of the header's size is decoded).
    Only regular files are opened; ``labels.bin`` is read only once ``num_samples`` is
    shown to fit in the shard files on disk.

    Returns:
        :class:`VerifyReport`; each problem names the shard or sample.

    Raises:
        FormatError: the manifest is missing or unreadable (nothing can be verified).
    """
    import numpy as np

    root = Path(path)
    m = read_manifest(root)
    stored = m.schema.stored
    field_stats = FieldStats(stored)
    boxes, num_labels = box_rules(m.schema, m.options)
    problems: list[str] = []
    labels = None
    lp = root / LABELS_NAME
    shown_lp = printable(str(lp))
    try:
        size = stat_regular(lp).st_size  # before reading: a replaced file may be huge, or a FIFO
        claimed = claimed_samples_problem(root, m) if size == 4 * m.num_samples else None
        if size != 4 * m.num_samples:
            problems.append(f"{shown_lp}: {size} bytes, expected {4 * m.num_samples}")
        elif claimed:  # num_samples is not backed by real shard bytes: do not read 4 * num_samples
            problems.append(printable(claimed))
        else:
            raw = read_regular(lp, size)
            if hashlib.sha256(raw).hexdigest() != m.labels_sha256:
                problems.append(f"{shown_lp}: SHA-256 differs from the manifest (labels altered)")
            else:
                labels = np.frombuffer(raw, dtype="<i4")
    except OSError as e:
        problems.append(f"{shown_lp}: {file_problem(e)}")

    max_pixels = m.max_pixels
    samples = 0
    for s in m.shards:
        p = root / s.file
        shown = printable(str(p))
        try:
            size = stat_regular(p, within=root).st_size  # a FIFO or a device would hang the open
        except FileNotFoundError:
            problems.append(f"bad shard {shown}: missing")
            continue
        except OSError as e:
            problems.append(f"bad shard {shown}: {file_problem(e)}")
            continue
        if size != s.bytes:
            problems.append(f"bad shard {shown}: {size} bytes, the manifest says {s.bytes} (truncated or replaced)")
            continue  # its records cannot be where the manifest's hash says they are
        try:
            digest = file_sha256(p)
        except OSError as e:
            problems.append(f"bad shard {shown}: cannot read it ({file_problem(e)})")
            continue
        if digest != s.sha256:
            problems.append(f"bad shard {shown}: SHA-256 differs from the manifest")
            damage = check_shard_structure(p, size)
            if damage:  # its records cannot be read safely: nothing more to learn from them
                problems.append(f"bad shard {shown}: damaged LMDB structure ({damage})")
                continue
        bad: list[str] = []
        expected = s.first
        scanned = False
        try:
            with open_shard_readonly(p, size) as scan:  # pread, never a map: a shard cut short meanwhile is a problem, not SIGBUS
                for i, v in iter_records(scan, shown):
                    where = f"sample {i} in {shown}"
                    if i != expected:
                        bad.append(f"{where}: unexpected key (expected sample {expected})")
                        expected = i
                    expected += 1
                    samples += 1
                    try:
                        h = decode_header(v, where=where)
                        if labels is not None and 0 <= i < len(labels) and int(labels[i]) != h.label:
                            raise CorruptDataError(f"{where}: label {h.label} differs from labels.bin ({int(labels[i])})")
                        check_stored_size(h, None, max_pixels=max_pixels, where=where)  # before any decode
                        payload = record_payload(v, h, check=True, where=where)
                        declared = payload_size(payload, h.encoding)  # a few bytes of its frame header
                        if declared is not None and declared != (h.width, h.height):
                            raise CorruptDataError(
                                f"{where}: its payload declares {declared[0]}x{declared[1]} pixels, the header says {h.width}x{h.height}"
                            )
                        values = record_field_values(v, h, stored, where=where)  # the block's check, every field
                        if stored:
                            field_stats.add(values)
                        if boxes and box_problem(values, num_labels):  # docs/detection.md
                            raise CorruptDataError(f"{where}: {box_problem(values, num_labels)}")
                        if decode:  # also what the payload's headers cannot show: that it decodes
                            why = _decode_problem(payload, h.encoding, h.width, h.height)
                            if why:
                                raise CorruptDataError(f"{where}: {why}")
                    except FastloadError as e:
                        bad.append(str(e))
            scanned = True
        except DamagedShardError as e:  # damaged, or cut short or replaced since it was hashed
            bad.append(f"bad shard {shown}: damaged LMDB structure ({printable(e.problem)})")
        except OSError as e:
            bad.append(f"bad shard {shown}: cannot open it ({file_problem(e)})")
        except FastloadError as e:
            bad.append(f"bad shard {shown}: {e}")
        if scanned and expected != s.first + s.count:
            bad.append(f"bad shard {shown}: holds samples {s.first}..{expected - 1}, the manifest says {s.first}..{s.first + s.count - 1}")
        problems.extend(bad[:MAX_PROBLEMS_PER_SHARD])
        if len(bad) > MAX_PROBLEMS_PER_SHARD:
            problems.append(f"bad shard {shown}: ... and {len(bad) - MAX_PROBLEMS_PER_SHARD} more bad samples")
    if stored and not problems and isinstance(m.stats, dict) and m.stats.get("fields") != field_stats.to_json():
        problems.append(f"{root / 'manifest.json'}: stats.fields differ from the fields in the shards (the manifest was altered)")
    return VerifyReport(root, problems, len(m.shards), samples, bool(decode))


__all__ = ["inspect", "verify", "VerifyReport", "format_inspect"]
