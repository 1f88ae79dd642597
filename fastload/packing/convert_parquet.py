"""Parquet files and Hugging Face ``datasets`` directories as a pack source: a column of images, the others fields.

The source is one ``.parquet`` file, a directory of them (sorted by path, sub-directories
included), or a directory written by ``datasets.Dataset.save_to_disk`` (``state.json`` and
Arrow ``.arrow`` files). Rows are samples, in file order.

The image column is ``image_column`` if given, else the column named ``image``, ``img``,
``jpg``, ``jpeg``, ``png`` or ``webp`` (case-insensitive), else the one binary column. It
holds encoded bytes, a path (a string, relative to the file's directory), or a Hugging Face
``Image`` struct ``{bytes, path}``. The other columns become fields of the same names by
their Arrow types (:func:`field_of`): integers ``int`` (the column ``label``: the class label,
with a ``ClassLabel``'s names as the classes), floats a float array of shape ``()``, strings
``str``, binaries ``bytes``, a fixed-size list of numbers an ``array``, a list of numbers (or
of fixed-size lists) ``ragged``. A column of another type is left out, with a warning naming
it. A row with a null field (or a null inside a list), a negative label, a number that does not
fit its field's dtype (a uint64 of 2**63 or more) or no image is a refused sample (``skipped``).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from ..errors import ConfigError, DependencyError, printable, short_message
from ..fields import DTYPES, IMAGE, LABEL, Field, Schema
from .samples import FieldSource, as_field_array, check_label, reason_of
from .sources import Task

log = logging.getLogger(__name__)

#: Column names taken for the image column, compared lower-cased.
IMAGE_COLUMNS = ("image", "img", "jpg", "jpeg", "png", "webp")
#: Rows read at once.
BATCH_ROWS = 256


def _pyarrow() -> Any:
    try:
        import pyarrow
        import pyarrow.ipc  # noqa: F401
        import pyarrow.parquet  # noqa: F401
    except ImportError:
        raise DependencyError("packing Parquet needs pyarrow: pip install 'fastload[fields]'") from None
    return pyarrow


def _numeric(t: Any) -> str | None:
    """The fastload dtype of an Arrow numeric type, or None."""
    pa = _pyarrow()
    if pa.types.is_floating(t):
        return "float64" if pa.types.is_float64(t) else "float32"
    if pa.types.is_integer(t):
        return {8: "int64", 16: "int16", 32: "int32", 64: "int64"}[t.bit_width] if pa.types.is_signed_integer(t) else (
            "uint8" if t.bit_width == 8 else "int64")  # fmt: skip
    return None


def field_of(name: str, t: Any) -> Field | None:
    """The field an Arrow column type maps to, or None (a type with no field kind)."""
    pa = _pyarrow()
    if pa.types.is_integer(t) or pa.types.is_boolean(t):
        return LABEL if name == "label" else Field(name, "int")
    if pa.types.is_floating(t):
        return Field(name, "array", _numeric(t), ())
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return Field(name, "str")
    if pa.types.is_binary(t) or pa.types.is_large_binary(t):
        return Field(name, "bytes")
    if pa.types.is_fixed_size_list(t):
        inner, shape = t, []
        while pa.types.is_fixed_size_list(inner):
            shape.append(inner.list_size)
            inner = inner.value_type
        dt = _numeric(inner)
        return Field(name, "array", dt, tuple(shape)) if dt in DTYPES else None
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        inner, shape = t.value_type, []
        while pa.types.is_fixed_size_list(inner):
            shape.append(inner.list_size)
            inner = inner.value_type
        dt = _numeric(inner)
        return Field(name, "ragged", dt, tuple(shape)) if dt in DTYPES else None
    return None


class _Part:
    """One file of the source: Parquet, or an Arrow stream of a ``save_to_disk`` directory."""

    def __init__(self, path: str, kind: str) -> None:
        self.path, self.kind = path, kind
        pa = _pyarrow()
        try:
            if kind == "parquet":
                pf = pa.parquet.ParquetFile(path)
                self.schema, self.rows = pf.schema_arrow, pf.metadata.num_rows
            else:
                with pa.memory_map(path) as src:
                    table = pa.ipc.open_stream(src).read_all()
                self.schema, self.rows = table.schema, table.num_rows
        except (OSError, pa.ArrowException) as e:
            raise ConfigError(f"{printable(path)}: not a readable {kind} file ({short_message(e)})") from None

    def batches(self, columns: list[str], skip: int) -> Iterator[tuple[int, Any]]:
        """``(first row, RecordBatch)`` of the rows from ``skip`` on."""
        pa = _pyarrow()
        if self.kind == "parquet":
            it = pa.parquet.ParquetFile(self.path).iter_batches(batch_size=BATCH_ROWS, columns=columns)
        else:
            src = pa.memory_map(self.path)
            it = (b.select(columns) for b in pa.ipc.open_stream(src))
        row = 0
        for b in it:
            if row + b.num_rows > skip:
                lo = max(0, skip - row)
                yield row + lo, b.slice(lo)
            row += b.num_rows


def _parts(src: str) -> tuple[list[_Part], dict[str, Any]]:
    """The files of a source, and the ``features`` of a ``save_to_disk`` directory (else {})."""
    p = Path(src)
    if p.is_dir() and (p / "state.json").is_file():
        try:
            state = json.loads((p / "state.json").read_text())
            files = [str(p / f["filename"]) for f in state["_data_files"]]
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise ConfigError(f"SRC {printable(src)}: unreadable state.json of a datasets directory ({short_message(e)})") from None
        features: dict[str, Any] = {}
        info = p / "dataset_info.json"
        if info.is_file():
            try:
                features = json.loads(info.read_text()).get("features") or {}
            except (OSError, ValueError):
                features = {}
        return [_Part(f, "arrow") for f in files], features if isinstance(features, dict) else {}
    if p.is_dir():
        files = sorted(str(f) for f in p.rglob("*.parquet") if f.is_file())
        if not files:
            raise ConfigError(f"SRC {printable(src)}: no .parquet files in this directory, and no state.json of a datasets directory")
        return [_Part(f, "parquet") for f in files], {}
    if p.is_file():
        return [_Part(str(p), "parquet")], {}
    raise ConfigError(f"SRC {printable(src)}: no such file or directory")


class ParquetSource(FieldSource):
    """Parquet files or a ``save_to_disk`` directory (see the module's docstring).

    Args:
        src: a ``.parquet`` file, a directory of them, or a ``datasets`` directory.
        image_column: the column holding the images (default: found by name or type).
    """

    def __init__(self, src: str | os.PathLike, *, image_column: str | None = None) -> None:
        pa = _pyarrow()
        self.src = os.fspath(src)
        self.parts, features = _parts(self.src)
        schema = self.parts[0].schema
        for part in self.parts[1:]:
            if not part.schema.equals(schema):
                raise ConfigError(f"{printable(part.path)}: its columns differ from {printable(self.parts[0].path)}'s; every file of SRC needs the same columns")
        names = list(schema.names)
        if image_column is not None and image_column not in names:
            raise ConfigError(f"image_column (--image-column): {image_column!r} is not a column (columns: {', '.join(names)})")
        if image_column is None:
            by_name = [n for n in names if n.lower() in IMAGE_COLUMNS]
            binary = [n for n in names if pa.types.is_binary(schema.field(n).type) or pa.types.is_large_binary(schema.field(n).type)]
            if by_name:
                image_column = by_name[0]
            elif len(binary) == 1:
                image_column = binary[0]
            else:
                raise ConfigError(f"SRC {printable(self.src)}: which column holds the images? name it with --image-column (columns: {', '.join(names)})")
        self.image_column = image_column
        self.image_kind = self._image_kind(schema.field(image_column).type)
        fields, ignored = [IMAGE], []
        for n in names:
            if n == image_column:
                continue
            f = field_of(n, schema.field(n).type)
            if f is None:
                ignored.append(f"{n} ({schema.field(n).type})")
            else:
                fields.append(f)
        if ignored:
            log.warning("parquet %s: column(s) with no field kind left out: %s", printable(self.src), ", ".join(ignored))
        self.ignored = ignored
        self.schema = Schema(fields)
        super().__init__()
        self.columns = [image_column] + [f.name for f in self.schema if f.kind != "image"]
        self.kind, self.description = "parquet", printable(self.src)
        label_info = features.get("label") if isinstance(features, dict) else None
        names_ = label_info.get("names") if isinstance(label_info, dict) and label_info.get("_type") == "ClassLabel" else None
        self.classes = [str(c) for c in names_] if names_ and self.schema.has_label else (None if self.schema.has_label else ["0"])
        self.n = sum(p.rows for p in self.parts)
        if self.n == 0:
            raise ConfigError(f"SRC {printable(self.src)}: no rows; nothing to pack")
        log.info("parquet %s: %d rows in %d files; image column %r; fields %s", self.description, self.n, len(self.parts),
                 image_column, ", ".join(f"{f.name} ({f.spec})" for f in self.schema))  # fmt: skip

    def _image_kind(self, t: Any) -> str:
        pa = _pyarrow()
        if pa.types.is_binary(t) or pa.types.is_large_binary(t):
            return "bytes"
        if pa.types.is_string(t) or pa.types.is_large_string(t):
            return "path"
        if pa.types.is_struct(t) and t.get_field_index("bytes") >= 0:
            return "struct"
        raise ConfigError(f"image column {self.image_column!r} is of type {t}; it must hold encoded bytes, paths, or {{bytes, path}} structs")

    def __len__(self) -> int:
        return self.n

    def fingerprint(self) -> str:
        h = hashlib.sha256()
        h.update(json.dumps({"kind": self.kind, "image": self.image_column, "fields": self.schema.to_json(), "classes": self.classes}).encode())
        for p in self.parts:
            st = os.stat(p.path)
            h.update(f"{p.path}\0{st.st_size}\0{st.st_mtime_ns}\n".encode("utf-8", "surrogateescape"))
        return h.hexdigest()

    def tasks(self, start: int = 0) -> Iterator[Task]:
        pos = 0
        for part in self.parts:
            if pos + part.rows <= start:
                pos += part.rows
                continue
            for first, batch in part.batches(self.columns, max(0, start - pos)):
                cols = {n: batch.column(n).to_pylist() for n in self.columns}
                for r in range(batch.num_rows):
                    yield self._task(pos + first + r, part, first + r, {n: cols[n][r] for n in self.columns})
            pos += part.rows

    def _task(self, i: int, part: _Part, row: int, values: dict[str, Any]) -> Task:
        name = f"{os.path.basename(part.path)}:{row}"
        where = f"{printable(part.path)} row {row}"
        img = values.pop(self.image_column)
        if isinstance(img, dict):  # a datasets Image: {bytes, path}
            img = img.get("bytes") if img.get("bytes") is not None else img.get("path")
        if img is None:
            return ("error", f"no image (column {self.image_column!r} is null)", 0, name, where)
        nulls = [n for n, v in values.items() if v is None]
        if nulls:
            return ("error", f"column(s) {', '.join(map(repr, nulls))} are null", 0, name, where)
        try:
            label = 0
            if self.schema.has_label:
                label = check_label(values["label"], where, self.classes)
            for f in self.schema.stored:
                if f.kind in ("array", "ragged"):
                    values[f.name] = as_field_array(f, values[f.name])
                elif f.kind == "int" and isinstance(values[f.name], bool):
                    values[f.name] = int(values[f.name])
            self.keep_block(i, values, where)
        except (ConfigError, ValueError) as e:
            return ("error", reason_of(e, where), 0, name, where)
        if isinstance(img, str):
            path = img if os.path.isabs(img) else os.path.join(os.path.dirname(part.path), img)
            return ("file", path, label, name, where)
        return ("bytes", bytes(img), label, name, where)


__all__ = ["ParquetSource", "field_of", "IMAGE_COLUMNS"]
