"""Typed per-sample fields: their kinds, the schema, and the bytes of a record's field block.

Pure data, no I/O (``docs/format.md``, "Fields", is its human-readable twin). A dataset of
format 3 declares, besides the image and the class label, named fields of these kinds:

========== ===================================================== ==============================
kind       value                                                 stored as (little-endian)
========== ===================================================== ==============================
``image``  the encoded image (the record's payload)              the payload, as in format 2
``label``  the class index (the header's ``label``, labels.bin)  the header, as in format 2
``int``    one signed 64-bit integer                             ``<i8``
``array``  a fixed-shape array of ``dtype`` (``shape``)          ``prod(shape)`` items
``ragged`` ``n`` rows of ``dtype`` of a fixed trailing ``shape`` ``<u4`` n, then the rows
``bytes``  variable-length bytes                                 ``<u4`` length, then the bytes
``str``    variable-length UTF-8 text                            ``<u4`` length, then the UTF-8
========== ===================================================== ==============================

A token-id list is ``ragged`` int32 with shape ``()``; N x 4 float32 boxes are ``ragged``
float32 with shape ``(4,)``; a PNG mask is ``bytes``: all fit without another format change.

The field block follows a record's payload: a ``<u4`` check (the low 32 bits of XXH3-64, seed
0, of the rest of the block), then each field of the schema other than ``image`` and
``label``, in schema order. Nothing is pickled.

Users write kinds as spec strings: ``"int"``, ``"str"``, ``"bytes"``, ``"float32[512]"``
(an array), ``"float32"`` (a scalar), ``"int32[]"`` (ragged), ``"float32[][4]"`` (ragged rows of 4).
"""

from __future__ import annotations

import dataclasses
import math
import operator
import re
import reprlib
import struct
from typing import Any, Iterable, Sequence

import numpy as np
import xxhash

from .errors import ConfigError, CorruptDataError, FormatError

#: The kinds a field may have.
KINDS = ("image", "label", "int", "array", "ragged", "bytes", "str")
#: Element types of ``array`` and ``ragged`` fields, stored little-endian.
DTYPES = ("float32", "float64", "int64", "int32", "int16", "uint8")
#: What a field name may be: WebDataset's extensions (``txt``, ``seg.png``) and column names.
NAME_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]{0,127}\Z")
#: Most fields one dataset may declare.
MAX_FIELDS = 256
#: Most dimensions of an array's shape.
MAX_DIMS = 8
#: Largest stored value of one field, bytes (a ``<u4`` length).
MAX_VALUE_BYTES = 2**32 - 1

_U32 = struct.Struct("<I")
_I64 = struct.Struct("<q")
_SPEC_RE = re.compile(r"([a-z0-9]+)((?:\[[0-9]*\])*)\Z")


@dataclasses.dataclass(frozen=True)
class Field:
    """One field of a schema: its name, kind and (for ``array``/``ragged``) element type and shape.

    For ``array`` the shape is the whole value's; for ``ragged`` it is the shape of one row.
    """

    name: str
    kind: str
    dtype: str | None = None
    shape: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not NAME_RE.match(self.name):
            raise ConfigError(
                f"field name {reprlib.repr(self.name)} is not usable: 1-128 ASCII letters, digits, '_', '.', '-' "
                "(not starting with '.' or '-')"
            )
        if self.kind not in KINDS:
            raise ConfigError(f"field {self.name!r}: kind {reprlib.repr(self.kind)} is not one of {', '.join(KINDS)}")
        if self.kind in ("array", "ragged"):
            if self.dtype not in DTYPES:
                raise ConfigError(f"field {self.name!r}: dtype {reprlib.repr(self.dtype)} is not one of {', '.join(DTYPES)}")
            shape = tuple(self.shape)
            if len(shape) > MAX_DIMS or any(type(d) is not int or d < 1 for d in shape):
                raise ConfigError(f"field {self.name!r}: shape {reprlib.repr(self.shape)} must be at most {MAX_DIMS} positive ints")
            if self.kind == "array" and math.prod(shape) * self.itemsize > MAX_VALUE_BYTES:
                raise ConfigError(f"field {self.name!r}: shape {shape} is larger than a value may be ({MAX_VALUE_BYTES} bytes)")
            object.__setattr__(self, "shape", shape)
        elif self.dtype is not None or tuple(self.shape):
            raise ConfigError(f"field {self.name!r}: a {self.kind} field has no dtype or shape")
        if self.kind == "image" and self.name != "image":
            raise ConfigError(f"field {self.name!r}: the image field is always named 'image'")
        if self.kind == "label" and self.name != "label":
            raise ConfigError(f"field {self.name!r}: the class-label field is always named 'label'")

    @property
    def itemsize(self) -> int:
        return np.dtype(self.dtype).itemsize if self.dtype else 0

    @property
    def stored(self) -> bool:
        """Whether the value lives in the record's field block (not the payload or the header)."""
        return self.kind not in ("image", "label")

    @property
    def spec(self) -> str:
        """The spec string of this kind (``"float32[512]"``, ``"int32[]"``, ``"str"``)."""
        if self.kind == "array":
            return self.dtype + "".join(f"[{d}]" for d in self.shape)  # type: ignore[operator]
        if self.kind == "ragged":
            return f"{self.dtype}[]" + "".join(f"[{d}]" for d in self.shape)
        return self.kind

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {"name": self.name, "kind": self.kind}
        if self.kind in ("array", "ragged"):
            d["dtype"] = self.dtype
            d["shape"] = list(self.shape)
        return d

    @classmethod
    def from_json(cls, d: Any, *, where: str) -> "Field":
        if not isinstance(d, dict) or not isinstance(d.get("name"), str) or not isinstance(d.get("kind"), str):
            raise FormatError(f"{where}: malformed field entry {reprlib.repr(d)}")
        shape = d.get("shape", [])
        if not isinstance(shape, list):
            raise FormatError(f"{where}: field {reprlib.repr(d.get('name'))}: shape is not a list")
        try:
            return cls(d["name"], d["kind"], d.get("dtype"), tuple(shape))
        except ConfigError as e:
            raise FormatError(f"{where}: {e}") from None


def parse_spec(name: str, spec: Any) -> Field:
    """A :class:`Field` from a spec string (``"int"``, ``"str"``, ``"bytes"``, ``"float32[512]"``,
    ``"int32[]"``, ``"float32[][4]"``) or a :class:`Field` (its name must be ``name``).

    Raises:
        ConfigError: naming the field and the spec, with the forms accepted.
    """
    if isinstance(spec, Field):
        if spec.name != name:
            raise ConfigError(f"field {name!r}: a Field named {spec.name!r} was given for it")
        return spec
    hint = "use int, str, bytes, label, DTYPE (a scalar), DTYPE[N] (a fixed array), DTYPE[] or DTYPE[][N] (variable rows), DTYPE one of " + ", ".join(DTYPES)
    m = _SPEC_RE.match(spec) if isinstance(spec, str) else None
    if m is None:
        raise ConfigError(f"field {name!r}: cannot read the kind {reprlib.repr(spec)}; {hint}")
    base, dims = m.group(1), re.findall(r"\[([0-9]*)\]", m.group(2))
    if not dims:
        if base in DTYPES:  # a scalar of that type
            return Field(name, "array", base, ())
        if base not in ("int", "str", "bytes", "label", "image"):
            raise ConfigError(f"field {name!r}: cannot read the kind {spec!r}; {hint}")
        return Field(name, base)
    if base not in DTYPES:
        raise ConfigError(f"field {name!r}: element type {base!r} in {spec!r}; {hint}")
    if dims[0] == "":
        if "" in dims[1:]:
            raise ConfigError(f"field {name!r}: only the first dimension of {spec!r} may be variable; {hint}")
        return Field(name, "ragged", base, tuple(int(d) for d in dims[1:]))
    if "" in dims:
        raise ConfigError(f"field {name!r}: only the first dimension of {spec!r} may be variable; {hint}")
    return Field(name, "array", base, tuple(int(d) for d in dims))


IMAGE = Field("image", "image")
LABEL = Field("label", "label")


class Schema(tuple):
    """The fields of a dataset, ``image`` first: a tuple of :class:`Field` with look-up by name."""

    def __new__(cls, fields: Iterable[Field]) -> "Schema":
        fields = tuple(fields)
        names = [f.name for f in fields]
        if len(set(names)) != len(names):
            dup = sorted({n for n in names if names.count(n) > 1})
            raise ConfigError(f"fields: {', '.join(map(repr, dup))} declared twice")
        if not fields or fields[0] != IMAGE:
            raise ConfigError("fields: the first field must be the image")
        if any(f.kind == "image" for f in fields[1:]):
            raise ConfigError("fields: a dataset has one image field")
        if len(fields) > MAX_FIELDS:
            raise ConfigError(f"fields: {len(fields)} fields, more than the {MAX_FIELDS} a dataset may have")
        for f in fields:
            if f.name == "label" and f.kind != "label":  # it would read back as class 0 for every sample
                raise ConfigError(
                    f"fields: 'label' is a {f.spec} field, but a field named 'label' is the class index (an int 0, 1, 2, ...) "
                    "the loader returns: rename it (the column, the WebDataset member's extension or the dict key), "
                    "e.g. to 'label_text', or store class indices"
                )
        return super().__new__(cls, fields)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(f.name for f in self)

    @property
    def stored(self) -> tuple[Field, ...]:
        """The fields kept in each record's field block, in block order."""
        return tuple(f for f in self if f.stored)

    @property
    def has_label(self) -> bool:
        return any(f.kind == "label" for f in self)

    @property
    def plain(self) -> bool:
        """Only the image and (maybe) the label: stored exactly as a format-2 dataset."""
        return not self.stored

    def __getitem__(self, key: Any) -> Any:  # type: ignore[override]
        if isinstance(key, str):
            for f in self:
                if f.name == key:
                    return f
            raise KeyError(key)
        return super().__getitem__(key)

    def to_json(self) -> list[dict[str, Any]]:
        return [f.to_json() for f in self]

    @classmethod
    def from_json(cls, items: Any, *, where: str) -> "Schema":
        if not isinstance(items, list):
            raise FormatError(f"{where}: fields is a {type(items).__name__}, not a list")
        if len(items) > MAX_FIELDS:
            raise FormatError(f"{where}: {len(items)} fields, more than the {MAX_FIELDS} a dataset may have")
        try:
            return cls(Field.from_json(d, where=where) for d in items)
        except ConfigError as e:
            raise FormatError(f"{where}: {e}") from None


#: The schema of a dataset packed before fields existed (format 1.x and 2.x).
CLASSIC = Schema((IMAGE, LABEL))


# ----------------------------------------------------------------------------- values in


def _is_bool(v: Any) -> bool:
    return isinstance(v, (bool, np.bool_)) or str(getattr(v, "dtype", "")) in ("bool", "torch.bool")


def _as_array(value: Any) -> np.ndarray | None:
    """``value`` as a NumPy array (a torch tensor, a list of numbers), or None if it is none of those."""
    if isinstance(value, np.ndarray):
        return value
    if isinstance(value, (int, float, np.number)) and not _is_bool(value):
        return np.asarray(value)
    if hasattr(value, "detach") and hasattr(value, "numpy"):  # a torch tensor
        return value.detach().cpu().numpy()
    if isinstance(value, (list, tuple)):
        try:
            a = np.asarray(value)
        except ValueError:  # ragged nested lists
            return None
        return a if a.dtype.kind in "iuf" else None
    return None


def infer_field(name: str, value: Any, *, where: str) -> Field:
    """The field kind a first sample's value implies.

    ``int`` for an integer (``label`` when the name is ``label``), ``str``, ``bytes``; an int32
    array (a token list) is ``ragged`` over its first dimension; any other numeric array or list
    is an ``array`` of its shape (a list of floats becomes float32, of ints int64; a float
    scalar a float64 array of shape ``()``).

    Raises:
        ConfigError: a value of no kind (``where`` names the sample and the field).
    """
    if name == "image":
        return IMAGE
    if _is_bool(value):
        raise ConfigError(f"{where}: field {name!r} is a bool; store it as an int (0/1)")
    if isinstance(value, (int, np.integer)):
        return LABEL if name == "label" else Field(name, "int")
    if isinstance(value, str):
        return Field(name, "str")
    if isinstance(value, (bytes, bytearray, memoryview)):
        return Field(name, "bytes")
    if isinstance(value, (float, np.floating)):
        return Field(name, "array", "float64", ())
    a = _as_array(value)
    if a is not None and a.dtype.kind in "iuf":
        if isinstance(value, (list, tuple)):
            a = a.astype(np.float32 if a.dtype.kind == "f" else np.int64)
        dtype = a.dtype.newbyteorder("=").name
        if dtype not in DTYPES:
            raise ConfigError(f"{where}: field {name!r} is an array of {a.dtype}; use one of {', '.join(DTYPES)}")
        if dtype == "int32" and a.ndim >= 1:
            return Field(name, "ragged", dtype, tuple(a.shape[1:]))
        if a.ndim == 0 and dtype.startswith("int"):
            return Field(name, "int")
        if a.size == 0:
            raise ConfigError(f"{where}: field {name!r} is an empty array; declare its kind with fields=")
        return Field(name, "array", dtype, tuple(a.shape))
    raise ConfigError(
        f"{where}: field {name!r} is a {type(value).__name__}, which has no field kind (int, str, bytes, a numeric "
        "array or list); declare it with fields= or leave it out"
    )


def _int_value(field: Field, value: Any, where: str) -> int:
    v = value
    if not isinstance(v, (int, np.integer)) and hasattr(v, "item") and not _is_bool(v):
        try:
            v = v.item()
        except Exception:  # a tensor of several values
            pass
    if _is_bool(v) or not isinstance(v, (int, np.integer)):
        raise ConfigError(f"{where}: field {field.name!r} must be an integer, got {printable_value(value)}")
    v = operator.index(v)
    if not -(2**63) <= v < 2**63:
        raise ConfigError(f"{where}: field {field.name!r}: {v} does not fit in int64")
    return v


def printable_value(value: Any) -> str:
    """A short description of a value for messages: its type and a cut ``repr``."""
    return f"{type(value).__name__} {reprlib.repr(value)}"


def _array_value(field: Field, value: Any, where: str) -> np.ndarray:
    a = _as_array(value)
    if a is None or a.dtype.kind not in "iuf":
        raise ConfigError(f"{where}: field {field.name!r} ({field.spec}) must be a numeric array, got {printable_value(value)}")
    if a.size == 0:  # an empty list is float64 to NumPy: any element type fits it
        a = a.astype(field.dtype)
    if a.dtype.kind == "f" and np.dtype(field.dtype).kind in "iu":
        raise ConfigError(f"{where}: field {field.name!r} ({field.spec}) holds integers, got an array of {a.dtype}")
    want = field.shape if field.kind == "array" else None
    if want is not None and tuple(a.shape) != want:
        raise ConfigError(f"{where}: field {field.name!r} ({field.spec}) must have shape {want}, got {tuple(a.shape)}")
    if field.kind == "ragged" and (a.ndim != 1 + len(field.shape) or tuple(a.shape[1:]) != field.shape):
        if not (a.size == 0 and a.ndim == 1):
            raise ConfigError(
                f"{where}: field {field.name!r} ({field.spec}) must have shape (n, {', '.join(map(str, field.shape))})"
                if field.shape else f"{where}: field {field.name!r} ({field.spec}) must be one-dimensional, got shape {tuple(a.shape)}"
            )
        a = a.reshape((0, *field.shape))
    out = a.astype(np.dtype(field.dtype).newbyteorder("<"), copy=False)
    if out.dtype.kind in "iu" and a.dtype.kind in "iu" and not np.array_equal(out, a):
        raise ConfigError(f"{where}: field {field.name!r} ({field.spec}): a value does not fit in {field.dtype}")
    return out


def encode_value(field: Field, value: Any, *, where: str) -> bytes:
    """The stored bytes of one value of a block field.

    Raises:
        ConfigError: the value does not fit the field's kind (``where`` names the sample).
    """
    kind = field.kind
    if kind == "int":
        return _I64.pack(_int_value(field, value, where))
    if kind == "str":
        if not isinstance(value, str):
            raise ConfigError(f"{where}: field {field.name!r} (str) must be a str, got {printable_value(value)}")
        try:
            b = value.encode("utf-8")
        except UnicodeEncodeError:
            raise ConfigError(f"{where}: field {field.name!r} holds text that is not valid Unicode (a lone surrogate)") from None
    elif kind == "bytes":
        if not isinstance(value, (bytes, bytearray, memoryview)):
            raise ConfigError(f"{where}: field {field.name!r} (bytes) must be bytes, got {printable_value(value)}")
        b = bytes(value)
    elif kind == "array":
        return _array_value(field, value, where).tobytes()
    elif kind == "ragged":
        a = _array_value(field, value, where)
        b = a.tobytes()
        if len(b) > MAX_VALUE_BYTES:
            raise ConfigError(f"{where}: field {field.name!r}: {len(b)} bytes, more than a value may have")
        return _U32.pack(a.shape[0]) + b
    else:
        raise ConfigError(f"field {field.name!r}: a {kind} field is not stored in the field block")
    if len(b) > MAX_VALUE_BYTES:
        raise ConfigError(f"{where}: field {field.name!r}: {len(b)} bytes, more than a value may have")
    return _U32.pack(len(b)) + b


def block_checksum(body: bytes | memoryview) -> int:
    """The check a field block stores for the bytes after it: low 32 bits of XXH3-64 (seed 0)."""
    return xxhash.xxh3_64_intdigest(body) & 0xFFFFFFFF


def encode_block(fields: Sequence[Field], values: dict[str, Any], *, where: str) -> bytes:
    """A record's field block: the check, then each of ``fields`` (the block fields, in order).

    Raises:
        ConfigError: a value is missing or does not fit its field (naming ``where`` and the field).
    """
    parts = []
    for f in fields:
        if f.name not in values:
            raise ConfigError(f"{where}: field {f.name!r} is missing (every sample needs every field of the schema)")
        parts.append(encode_value(f, values[f.name], where=where))
    body = b"".join(parts)
    return _U32.pack(block_checksum(body)) + body


# ----------------------------------------------------------------------------- values out


def decode_block(fields: Sequence[Field], block: bytes | memoryview, *, check: bool = True, where: str = "record") -> dict[str, Any]:
    """The values of a record's field block: ints, NumPy arrays (copies, in native byte order),
    bytes and str.

    Raises:
        CorruptDataError: the block is short, has bytes left over, fails its check, or holds
            text that is not UTF-8.
    """
    mv = memoryview(block)
    n = len(mv)
    if n < 4:
        raise CorruptDataError(f"{where}: field block of {n} bytes, shorter than its 4-byte check")
    if check and block_checksum(mv[4:]) != _U32.unpack_from(mv, 0)[0]:
        raise CorruptDataError(f"{where}: field block checksum mismatch (the field bytes were altered)")
    out: dict[str, Any] = {}
    pos = 4
    try:
        for f in fields:
            k = f.kind
            if k == "int":
                out[f.name] = _I64.unpack_from(mv, pos)[0]
                pos += 8
                continue
            if k == "array":
                count = math.prod(f.shape)
                rows: tuple[int, ...] = f.shape
            else:
                (count,) = _U32.unpack_from(mv, pos)
                pos += 4
                if k == "ragged":
                    rows = (count, *f.shape)
                    count *= math.prod(f.shape)
            if k in ("array", "ragged"):
                size = count * f.itemsize
                if pos + size > n:
                    raise struct.error
                a = np.frombuffer(mv[pos : pos + size], dtype=np.dtype(f.dtype).newbyteorder("<")).reshape(rows)
                a = a.astype(np.dtype(f.dtype), copy=True)  # native order, and no view of the record
                out[f.name] = a
                pos += size
                continue
            if pos + count > n:
                raise struct.error
            raw = bytes(mv[pos : pos + count])
            pos += count
            if k == "str":
                try:
                    out[f.name] = raw.decode("utf-8")
                except UnicodeDecodeError:
                    raise CorruptDataError(f"{where}: field {f.name!r} is not valid UTF-8") from None
            else:
                out[f.name] = raw
    except struct.error:
        raise CorruptDataError(f"{where}: field block of {n} bytes ends inside field {f.name!r}") from None
    if pos != n:
        raise CorruptDataError(f"{where}: field block has {n - pos} bytes after its last field")
    return out


# ----------------------------------------------------------------------------- statistics


class FieldStats:
    """Per-field statistics of the values packed (the manifest's ``stats.fields``, ``inspect``):
    lengths (min/median/max) of variable-length fields, value ranges (min/max) of numbers."""

    def __init__(self, fields: Sequence[Field]) -> None:
        self.fields = tuple(fields)
        self.lengths: dict[str, list[int]] = {f.name: [] for f in self.fields if f.kind in ("ragged", "bytes", "str")}
        self.lo: dict[str, float] = {}
        self.hi: dict[str, float] = {}

    def add(self, values: dict[str, Any]) -> None:
        for f in self.fields:
            v = values[f.name]
            if f.kind in ("bytes", "str"):
                self.lengths[f.name].append(len(v))
                continue
            if f.kind == "ragged":
                self.lengths[f.name].append(int(np.shape(v)[0]))
            if f.kind == "int":
                lo = hi = int(v)
            else:
                a = np.asarray(v)
                if a.size == 0:
                    continue
                lo, hi = a.min().item(), a.max().item()
                if f.dtype in ("float32", "float64"):
                    lo, hi = float(lo), float(hi)
            self.lo[f.name] = min(self.lo.get(f.name, lo), lo)
            self.hi[f.name] = max(self.hi.get(f.name, hi), hi)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in self.fields:
            d: dict[str, Any] = {"kind": f.spec}
            if f.name in self.lengths:
                x = np.asarray(self.lengths[f.name], dtype=np.int64)
                d["length"] = {"min": int(x.min()), "median": float(np.median(x)), "max": int(x.max())} if x.size else None
            if f.kind in ("int", "array", "ragged"):
                d["min"] = _json_number(self.lo.get(f.name))
                d["max"] = _json_number(self.hi.get(f.name))
            out[f.name] = d
        return out


def _json_number(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)  # JSON has no NaN or infinity
    return v


__all__ = [
    "Field",
    "Schema",
    "FieldStats",
    "CLASSIC",
    "IMAGE",
    "LABEL",
    "KINDS",
    "DTYPES",
    "parse_spec",
    "infer_field",
    "encode_value",
    "encode_block",
    "decode_block",
    "block_checksum",
]
