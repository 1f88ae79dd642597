"""Samples with typed fields: the schema inferred and checked, each sample's field block made.

A :class:`FieldSource` is a source whose samples carry fields besides the image and the label
(:mod:`fastload.fields`). Its tasks are ordinary image tasks (:mod:`fastload.packing.sources`);
the field block of the task at source position ``p`` waits in :meth:`FieldSource.take_block`
until the pack loop appends it to that sample's record, so the image workers never see it.
:class:`DictDatasetSource` is ``pack_dataset`` of a dataset whose items are dicts.
"""

from __future__ import annotations

import hashlib
import json
import logging
import reprlib
from typing import Any, Iterator, Mapping, Sequence

import numpy as np

from ..errors import ConfigError, printable, short_message
from ..fields import CLASSIC, IMAGE, LABEL, Field, FieldStats, Schema, encode_block, infer_field, parse_spec
from .sources import MAX_CLASSES, Source, Task, class_names, image_task, map_style_len

log = logging.getLogger(__name__)

#: Items fetched at most to find the first one that can be read (the schema is inferred from it).
FIRST_TRIES = 8


def schema_of(sample: Mapping[str, Any], declared: Mapping[str, Any] | None, *, where: str, order: Sequence[str] | None = None) -> Schema:
    """The schema a first sample implies: the image, the label (if it has one), then its other
    keys in their order, each of the kind its value implies (:func:`fastload.fields.infer_field`)
    unless ``declared`` names it (a spec string or a :class:`~fastload.fields.Field`).

    Raises:
        ConfigError: a value of no kind, a declared field the sample lacks, a bad spec.
    """
    declared = dict(declared or {})
    names = list(order if order is not None else sample.keys())
    for name in declared:
        if name not in names:
            raise ConfigError(f"fields: {name!r} is declared but {where} has no such key (it has {', '.join(map(repr, names))})")
    fields: list[Field] = [IMAGE]
    if "label" in names:
        f = parse_spec("label", declared["label"]) if "label" in declared else infer_field("label", sample["label"], where=where)
        fields.append(f)
    for name in names:
        if name in ("image", "label"):
            continue
        if not isinstance(name, str):
            raise ConfigError(f"{where}: key {reprlib.repr(name)} is not a str; field names are str")
        fields.append(parse_spec(name, declared[name]) if name in declared else infer_field(name, sample[name], where=where))
    return Schema(fields)


def check_label(value: Any, where: str, classes: Sequence[str] | None) -> int:
    """A sample's class label as an int in ``0 .. MAX_CLASSES - 1`` (and within ``classes``).

    Raises:
        ConfigError: not an integer (a bool, a float, a string), negative, or too large.
    """
    v = value
    if not isinstance(v, (int, np.integer)) and hasattr(v, "item"):  # a 0-d array or tensor
        try:
            v = v.item()
        except Exception:  # noqa: BLE001 - a tensor of several values: not an integer, said below
            pass
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):
        raise ConfigError(f"{where}: label {printable(reprlib.repr(value))} ({type(value).__name__}) is not an integer")
    v = int(v)
    if not 0 <= v < MAX_CLASSES:
        raise ConfigError(f"{where}: label {v} is outside 0..{MAX_CLASSES - 1}; labels are class indices 0, 1, 2, ...")
    if classes is not None and v >= len(classes):
        raise ConfigError(f"{where}: label {v} is outside the {len(classes)} classes (0..{len(classes) - 1})")
    return v


def null_at(value: Any) -> str | None:
    """Where the first null (``None``) sits inside nested lists, as ``"[1]"`` or ``"[0][2]"``; None
    when there is none. Walked without recursion, so any depth is safe."""
    stack: list[tuple[str, Any]] = [("", value)]
    while stack:
        path, v = stack.pop()
        if v is None:
            return path or "the value itself"
        if isinstance(v, (list, tuple)):
            stack.extend((f"{path}[{k}]", x) for k, x in reversed(list(enumerate(v))))
    return None


def as_field_array(f: Field, value: Any) -> np.ndarray:
    """``value`` (nested lists from a converter) as ``f``'s array: a null inside it is refused, never
    made NaN or 0, and a number that does not fit ``f.dtype`` (a uint64 of 2**63 or more in
    ``int64``) is refused, never wrapped.

    Raises:
        ValueError: naming the field, and the null's place or the dtype.
    """
    at = null_at(value)
    if at is not None:
        raise ValueError(f"field {f.name!r} ({f.spec}) holds a null at {at}; a null is refused, never stored as NaN or 0")
    try:
        return np.asarray(value, dtype=f.dtype)
    except (TypeError, OverflowError, ValueError) as e:
        raise ValueError(f"field {f.name!r} ({f.spec}): a value does not fit in {f.dtype} ({short_message(e)})") from None


def reason_of(e: Exception, where: str) -> str:
    """The reason an error gives for a refused sample, without the sample's name it starts with."""
    text = str(e)
    return printable(text[len(where) + 2 :] if text.startswith(f"{where}: ") else text)


class FieldSource(Source):
    """A source whose samples carry typed fields: ``schema``, and each task's field block.

    Subclasses call :meth:`keep_block` for the task of each position they yield (a task that
    is an ``"error"`` keeps none), and the pack loop calls :meth:`take_block`.
    """

    schema: Schema = CLASSIC

    def __init__(self) -> None:
        self._blocks: dict[int, bytes] = {}
        self.field_stats = FieldStats(self.schema.stored)

    def keep_block(self, position: int, values: Mapping[str, Any], where: str) -> None:
        """Encode ``values``' block fields for the task at ``position``.

        Raises:
            ConfigError: a value is missing or does not fit its field (naming ``where`` and the field).
        """
        if not self.schema.plain:
            self._blocks[position] = encode_block(self.schema.stored, values, where=where)

    def take_block(self, position: int) -> bytes | None:
        """The field block kept for ``position`` (None for a dataset without typed fields), forgotten here."""
        return self._blocks.pop(position, None)

    def schema_json(self) -> str:
        return json.dumps(self.schema.to_json(), sort_keys=True)


class DictDatasetSource(FieldSource):
    """A map-style dataset whose items are dicts: ``{"image": ..., "label": ..., "caption": ...}``.

    The schema is inferred from the first item that can be fetched (or declared with
    ``fields``) and every item is checked against it: a missing or extra key, or a value of
    another kind, is a :class:`ConfigError` naming the item and the field. An item without
    ``"image"`` or whose fetch raised is a refused sample (skipped or failed per ``on_error``).
    """

    def __init__(self, dataset: Any, classes: Sequence[str] | None = None, fields: Mapping[str, Any] | None = None) -> None:
        n = map_style_len(dataset)
        if fields is not None and not isinstance(fields, Mapping):
            raise ConfigError(f"fields: expected a dict of field name -> kind (such as {{'tokens': 'int32[]'}}), got {type(fields).__name__}")
        first = None
        for i in range(min(n, FIRST_TRIES)):
            try:
                item = dataset[i]
            except Exception:  # noqa: BLE001 - a failing item is refused later, with its reason
                continue
            if not isinstance(item, Mapping):
                raise ConfigError(f"dataset[{i}]: expected a dict of fields (as dataset[0..] gave), got {type(item).__name__}")
            first = (i, item)
            break
        if first is None:
            raise ConfigError(f"dataset: none of its first {min(n, FIRST_TRIES)} items could be fetched; nothing to infer the fields from")
        i0, item0 = first
        if "image" not in item0:
            raise ConfigError(f"dataset[{i0}]: no 'image' key (keys: {', '.join(map(repr, item0))}); every sample has an image")
        self.schema = schema_of(item0, fields, where=f"dataset[{i0}]")
        super().__init__()
        classes = class_names(dataset, classes)
        if classes is not None and not self.schema.has_label:
            raise ConfigError("classes: given, but the samples have no 'label'")
        self.dataset, self.n, self.kind = dataset, n, "dataset"
        self.description = f"{type(dataset).__module__}.{type(dataset).__qualname__}"
        self.classes = classes if self.schema.has_label else ["0"]
        log.info("fields of %s: %s", self.description, ", ".join(f"{f.name} ({f.spec})" for f in self.schema))

    def __len__(self) -> int:
        return self.n

    def fingerprint(self) -> str:
        d = {"kind": "dataset", "type": self.description, "len": self.n, "classes": self.classes, "fields": self.schema.to_json()}
        return hashlib.sha256(json.dumps(d, ensure_ascii=True).encode()).hexdigest()

    def tasks(self, start: int = 0) -> Iterator[Task]:
        for i in range(start, self.n):
            yield self.task(i)

    def task(self, i: int) -> Task:
        where = f"dataset[{i}]"
        try:
            item = self.dataset[i]
        except Exception as e:  # a user's dataset failing on one item is a bad sample
            return ("error", f"dataset raised {type(e).__name__}: {printable(short_message(e))}", 0, where, where)
        if not isinstance(item, Mapping):
            raise ConfigError(f"{where}: expected a dict of fields, got {type(item).__name__}")
        names = set(self.schema.names)
        extra = [k for k in item if k not in names]
        if extra:
            raise ConfigError(
                f"{where}: key(s) {', '.join(map(repr, extra))} are not in the schema inferred from the first sample "
                f"({', '.join(self.schema.names)}); every sample must have the same fields"
            )
        if "image" not in item:
            return ("error", "the sample has no 'image'", 0, where, where)
        label = 0
        if self.schema.has_label:
            if "label" not in item:
                raise ConfigError(f"{where}: field 'label' is missing (every sample needs every field of the schema)")
            label = check_label(item["label"], where, self.classes)
        task = image_task(item["image"], label, where)
        if task[0] != "error":
            self.keep_block(i, item, where)
        return task


__all__ = ["FieldSource", "DictDatasetSource", "schema_of", "check_label", "reason_of"]
