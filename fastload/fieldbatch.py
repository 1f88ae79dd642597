"""The loader's batches of typed fields: which fields a loader yields, reading them, and :class:`FieldBatch`.

``FastLoader(path, batch_size, fields=("image", "txt", "label"))`` yields a
:class:`FieldBatch` per batch: a tuple of the fields in the order asked for (so
``images, txts, labels = batch`` works), indexable by name (``batch["txt"]``) and by
attribute (``batch.txt``). Int and array fields come as tensors on the loader's device,
``str``/``bytes`` as Python lists, ``ragged`` fields as a list of tensors or, with ``pad_to``,
one padded tensor (``batch.lengths[name]`` holds each sample's length).
"""

from __future__ import annotations

import reprlib
from typing import Any, Iterator, Mapping, Sequence

import numpy as np
import torch

from .errors import ConfigError, as_int
from .fields import Field, Schema

#: The most rows ``pad_to`` may ask a padded ragged field for (a batch of them is allocated at once).
MAX_PAD_ROWS = 1 << 20


class FieldBatch(tuple):
    """One batch of fields: a tuple in the order of ``fields=``, with look-up by name.

    Attributes:
        names: the field names, in order.
        lengths: for each ``ragged`` field padded with ``pad_to``, an int64 tensor of every
            sample's length (after truncation to ``pad_to``), on the loader's device.
    """

    names: tuple[str, ...]
    lengths: dict[str, torch.Tensor]

    def __new__(cls, names: Sequence[str], values: Sequence[Any], lengths: Mapping[str, torch.Tensor] | None = None) -> "FieldBatch":
        obj = super().__new__(cls, values)
        obj.names = tuple(names)
        obj.lengths = dict(lengths or {})
        return obj

    def __getitem__(self, key: Any) -> Any:  # type: ignore[override]
        if isinstance(key, str):
            try:
                return tuple.__getitem__(self, self.names.index(key))
            except ValueError:
                raise KeyError(f"{key!r} is not a field of this batch (it has {', '.join(self.names)})") from None
        return tuple.__getitem__(self, key)

    def __getattr__(self, name: str) -> Any:
        names = self.__dict__.get("names", ())
        if name in names:
            return tuple.__getitem__(self, names.index(name))
        raise AttributeError(f"FieldBatch has no field {name!r} (it has {', '.join(names)})")

    def __reduce__(self) -> tuple:
        return (FieldBatch, (self.names, tuple(self), self.lengths))

    def keys(self) -> tuple[str, ...]:
        return self.names

    def items(self) -> Iterator[tuple[str, Any]]:
        return zip(self.names, self)

    def as_dict(self) -> dict[str, Any]:
        """The fields as a dict, name -> value (a WebDataset-style sample of the whole batch)."""
        return dict(zip(self.names, self))

    def __repr__(self) -> str:
        return "FieldBatch(" + ", ".join(f"{n}={_short(v)}" for n, v in zip(self.names, self)) + ")"


def _short(v: Any) -> str:
    if isinstance(v, torch.Tensor):
        return f"tensor{list(v.shape)} {str(v.dtype).replace('torch.', '')}"
    return f"list[{len(v)}]" if isinstance(v, list) else reprlib.repr(v)


class FieldRequest:
    """What ``fields=`` and ``pad_to=`` ask of a dataset, checked against its schema.

    Args:
        schema: the dataset's fields.
        fields: field names, ``"image"`` among them, each once.
        pad_to: None (ragged fields as lists of tensors), an int (every ragged field asked for
            padded or truncated to that many rows), or a dict of ragged field name -> int.
        pad_value: what padding rows hold (default 0).

    Raises:
        ConfigError: naming the argument and the value, with the fields the dataset has.
    """

    def __init__(self, schema: Schema, fields: Any, pad_to: Any = None, pad_value: Any = 0) -> None:
        if isinstance(fields, str) or not isinstance(fields, (list, tuple)):
            raise ConfigError(f"fields must be a tuple of field names such as ('image', 'label'), got {reprlib.repr(fields)}")
        have = ", ".join(schema.names)
        names: list[str] = []
        for n in fields:
            if not isinstance(n, str) or n not in schema.names:
                raise ConfigError(f"fields: {reprlib.repr(n)} is not a field of this dataset (it has {have})")
            if n in names:
                raise ConfigError(f"fields: {n!r} is asked for twice")
            names.append(n)
        if "image" not in names:
            raise ConfigError(f"fields must include 'image' (got {tuple(names)}); the loader decodes every sample's image")
        self.names = tuple(names)
        self.schema = schema
        ragged = [n for n in names if schema[n].kind == "ragged"]
        self.pad_to: dict[str, int] = {}
        if isinstance(pad_to, Mapping):
            for n, v in pad_to.items():
                if n not in ragged:
                    raise ConfigError(f"pad_to: {reprlib.repr(n)} is not a ragged field asked for in fields= (those are: {', '.join(ragged) or 'none'})")
                self.pad_to[n] = as_int(f"pad_to[{n!r}]", v, lo=1, hi=MAX_PAD_ROWS, hint=" (rows a padded ragged field has)")
        elif pad_to is not None:
            if not ragged:
                raise ConfigError(f"pad_to={reprlib.repr(pad_to)} is given but fields= asks for no ragged field")
            n_rows = as_int("pad_to", pad_to, lo=1, hi=MAX_PAD_ROWS, hint=" (rows a padded ragged field has)")
            self.pad_to = {n: n_rows for n in ragged}
        if isinstance(pad_value, bool) or not isinstance(pad_value, (int, float)):
            raise ConfigError(f"pad_value must be a number, got {reprlib.repr(pad_value)}")
        self.pad_value = pad_value
        #: the block fields to read for each batch
        self.stored = tuple(schema[n] for n in names if schema[n].stored)

    @property
    def classic(self) -> bool:
        """Exactly the image and the label, in that order (what the loader yields without ``fields``)."""
        return self.names == ("image", "label")

    def collate(self, images: torch.Tensor, labels: torch.Tensor, values: list[dict[str, Any]], device: torch.device) -> FieldBatch:
        """The batch of ``images``, ``labels`` (already on ``device``) and the samples' field ``values``."""
        out: list[Any] = []
        lengths: dict[str, torch.Tensor] = {}
        for n in self.names:
            if n == "image":
                out.append(images)
            elif n == "label":
                out.append(labels)
            else:
                f = self.schema[n]
                out.append(self._column(f, [v[n] for v in values], device, lengths))
        return FieldBatch(self.names, out, lengths)

    def _column(self, f: Field, vals: list[Any], device: torch.device, lengths: dict[str, torch.Tensor]) -> Any:
        if f.kind in ("str", "bytes"):
            return vals
        if f.kind == "int":
            return _to(torch.from_numpy(np.asarray(vals, dtype=np.int64)), device)
        if f.kind == "array":
            return _to(torch.from_numpy(np.stack(vals) if vals else np.empty((0, *f.shape), f.dtype)), device)
        if f.name not in self.pad_to:  # ragged, as a list
            return [_to(torch.from_numpy(a), device) for a in vals]
        rows = self.pad_to[f.name]
        padded = np.full((len(vals), rows, *f.shape), self.pad_value, dtype=f.dtype)
        kept = np.zeros(len(vals), dtype=np.int64)
        for k, a in enumerate(vals):
            m = min(rows, a.shape[0])
            padded[k, :m] = a[:m]
            kept[k] = m
        lengths[f.name] = _to(torch.from_numpy(kept), device)
        return _to(torch.from_numpy(padded), device)


def _to(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    if device.type == "cpu":
        return t
    return t.pin_memory().to(device, non_blocking=True)



__all__ = ["FieldBatch", "FieldRequest"]
