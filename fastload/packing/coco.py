"""COCO ``instances_*.json`` annotations over an image directory as a source of detection samples.

Each COCO image becomes one sample with the fields (``docs/detection.md``):

* ``image``: the image file's bytes;
* ``image_id``: the COCO image id (``int``);
* ``boxes``: ``float32[][4]``, one row per annotation, ``x1, y1, x2, y2`` in pixels of the
  stored image (COCO's ``bbox`` is ``x, y, width, height``: ``x2 = x + width``);
* ``labels``: ``int64[]``, each box's contiguous label: the categories sorted by id get
  ``1, 2, ... K`` (0 is the background of torchvision's detection models);
* ``iscrowd``: ``uint8[]``, COCO's ``iscrowd`` flag of each box (0 if absent);
* ``mask`` (with ``masks=``): ``bytes``, one PNG label image of the polygons and RLEs
  (pycocotools' decoding): instance (pixel ``k`` = box ``k - 1``) or semantic (the label).

The category mapping is stored in the manifest (``options.coco.categories``: id, name,
label) and shown by ``fastload inspect``. Annotations with a width or height <= 0 are
dropped (as torchvision's COCO reference does) and counted; images left without any
annotation are kept (``skip_empty=False``, default) or not packed (``skip_empty=True``).
"""

from __future__ import annotations

import io
import json
import logging
import os
import reprlib
import warnings
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ConfigError, DependencyError

log = logging.getLogger(__name__)

#: The fields a COCO pack has, in order (kinds as ``docs/fields.md`` writes them).
COCO_FIELDS = {"image_id": "int", "boxes": "float32[][4]", "labels": "int64[]", "iscrowd": "uint8[]"}


#: What ``masks=`` takes: no mask, one instance label image, one semantic label image per sample.
MASK_MODES = (None, "instance", "semantic")


def _mask_api() -> Any:
    try:
        from pycocotools import mask
    except ImportError:
        raise DependencyError("masks need pycocotools: pip install 'fastload[detection]' (or pycocotools)") from None
    return mask


def _load(annotations: str | os.PathLike) -> dict[str, Any]:
    p = Path(annotations)
    try:
        with open(p, "rb") as f:
            data = json.load(f)
    except FileNotFoundError:
        raise ConfigError(f"annotations: {p} does not exist (a COCO instances_*.json)") from None
    except (OSError, ValueError) as e:
        raise ConfigError(f"annotations: {p} is not a readable JSON file ({e})") from None
    if not isinstance(data, dict) or not isinstance(data.get("images"), list) or not isinstance(data.get("categories"), list):
        raise ConfigError(f"annotations: {p} is not a COCO instances file (it needs 'images' and 'categories' lists)")
    if not isinstance(data.get("annotations", []), list):
        raise ConfigError(f"annotations: {p}: 'annotations' must be a list")
    return data


def category_map(categories: list[Any], where: str) -> list[dict[str, Any]]:
    """The categories sorted by id, each with its contiguous label ``1 .. K``.

    Raises:
        ConfigError: a category without an integer ``id``, or an id given twice.
    """
    seen: dict[int, str] = {}
    for c in categories:
        cid = c.get("id") if isinstance(c, dict) else None
        if type(cid) is not int:
            raise ConfigError(f"{where}: category {reprlib.repr(c)} has no integer 'id'")
        if cid in seen:
            raise ConfigError(f"{where}: category id {cid} is given twice")
        seen[cid] = str(c.get("name", cid))
    return [{"id": cid, "name": seen[cid], "label": k + 1} for k, cid in enumerate(sorted(seen))]


class CocoSamples:
    """The images of a COCO annotations file as a map-style dataset of field dicts.

    Args:
        images: the directory the ``file_name`` of each image is relative to.
        annotations: the ``instances_*.json`` path.
        skip_empty: leave out images without a (valid) annotation.
        masks: None (no mask field), ``"instance"`` (a ``mask`` PNG whose pixel ``k`` is box
            ``k - 1``'s object, 0 the background; uint16 when an image has over 255 boxes) or
            ``"semantic"`` (pixel = the object's contiguous label). Needs pycocotools.

    Raises:
        ConfigError: a missing or malformed annotations file, an annotation naming an unknown
            image or category, a ``bbox`` that is not four numbers.
    """

    def __init__(self, images: str | os.PathLike, annotations: str | os.PathLike, *, skip_empty: bool = False, masks: str | None = None) -> None:
        if masks not in MASK_MODES:
            raise ConfigError(f"masks must be one of {', '.join(map(repr, MASK_MODES))}, got {reprlib.repr(masks)}")
        self.masks = masks
        if masks is not None:
            _mask_api()  # DependencyError with the install hint, before any work
        if not isinstance(skip_empty, bool):
            raise ConfigError(f"skip_empty must be True or False, got {reprlib.repr(skip_empty)}")
        self.root = Path(images)
        if not self.root.is_dir():
            raise ConfigError(f"IMAGES: {self.root} is not a directory (the COCO images the annotations name)")
        data = _load(annotations)
        where = str(annotations)
        self.categories = category_map(data["categories"], where)
        label_of = {c["id"]: c["label"] for c in self.categories}
        per_image: dict[int, list[tuple[list[float], int, int, Any]]] = {}
        images_by_id: dict[int, dict[str, Any]] = {}
        for im in data["images"]:
            if not isinstance(im, dict) or type(im.get("id")) is not int or not isinstance(im.get("file_name"), str):
                raise ConfigError(f"{where}: image {reprlib.repr(im)} needs an integer 'id' and a 'file_name'")
            if im["id"] in images_by_id:
                raise ConfigError(f"{where}: image id {im['id']} is given twice")
            images_by_id[im["id"]] = im
            per_image[im["id"]] = []
        self.dropped = 0
        for a in data.get("annotations", []):
            self._add(a, where, images_by_id, label_of, per_image)
        order = sorted(images_by_id)
        self.skipped_empty = [i for i in order if not per_image[i]] if skip_empty else []
        keep = [i for i in order if per_image[i] or not skip_empty]
        if not keep:
            raise ConfigError(f"{where}: no image to pack ({len(order)} images, none with an annotation)")
        self.items = [(images_by_id[i], per_image[i]) for i in keep]

    def _add(self, a: Any, where: str, images_by_id: dict, label_of: dict, per_image: dict) -> None:
        if not isinstance(a, dict):
            raise ConfigError(f"{where}: annotation {reprlib.repr(a)} is not an object")
        iid, cid, box = a.get("image_id"), a.get("category_id"), a.get("bbox")
        if iid not in images_by_id:
            raise ConfigError(f"{where}: annotation {a.get('id')!r} names image_id {iid!r}, which is not in 'images'")
        if cid not in label_of:
            raise ConfigError(f"{where}: annotation {a.get('id')!r} names category_id {cid!r}, which is not in 'categories'")
        if not (isinstance(box, list) and len(box) == 4 and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in box)):
            raise ConfigError(f"{where}: annotation {a.get('id')!r}: bbox must be four numbers [x, y, width, height], got {reprlib.repr(box)}")
        if box[2] <= 0 or box[3] <= 0:  # degenerate: torchvision's COCO reference drops them too
            self.dropped += 1
            return
        per_image[iid].append((box, label_of[cid], 1 if a.get("iscrowd") else 0, a.get("segmentation")))

    @property
    def classes(self) -> None:
        """No per-sample class label: the boxes carry ``labels``."""
        return None

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> dict[str, Any]:
        im, anns = self.items[i]
        with open(self.root / im["file_name"], "rb") as f:  # a missing file is a refused sample
            payload = f.read()
        xywh = np.array([a[0] for a in anns], dtype=np.float64).reshape(-1, 4)
        xyxy = np.concatenate([xywh[:, :2], xywh[:, :2] + xywh[:, 2:]], axis=1).astype(np.float32)
        item = {
            "image": payload,
            "image_id": int(im["id"]),
            "boxes": xyxy,
            "labels": np.array([a[1] for a in anns], dtype=np.int64),
            "iscrowd": np.array([a[2] for a in anns], dtype=np.uint8),
        }
        if self.masks is not None:
            item["mask"] = self._mask_png(im, anns)
        return item

    def _mask_png(self, im: dict[str, Any], anns: list[tuple[list[float], int, int, Any]]) -> bytes:
        """One label image of every annotation's segmentation (polygons or RLE), as PNG bytes."""
        from PIL import Image

        api = _mask_api()
        h, w = im.get("height"), im.get("width")
        if type(h) is not int or type(w) is not int or h < 1 or w < 1:
            raise ConfigError(f"image {im['id']} ({im['file_name']}): masks need its integer 'height' and 'width'")
        out = np.zeros((h, w), np.uint16 if len(anns) > 255 else np.uint8)
        for k, (_, label, _, seg) in enumerate(anns):
            if not seg:
                continue
            if isinstance(seg, list):  # polygons
                rle = api.merge(api.frPyObjects(seg, h, w))
            elif isinstance(seg, dict) and isinstance(seg.get("counts"), list):  # uncompressed RLE
                rle = api.frPyObjects(seg, h, w)
            else:  # compressed RLE
                rle = seg
            with warnings.catch_warnings():  # pycocotools' own NumPy 2 copy= deprecation
                warnings.simplefilter("ignore", DeprecationWarning)
                m = api.decode(rle).astype(bool)
            if m.shape != (h, w):
                raise ConfigError(f"image {im['id']} ({im['file_name']}): a segmentation of size {m.shape} for an image of {(h, w)}")
            out[m] = k + 1 if self.masks == "instance" else label  # a later object covers an earlier one
        buf = io.BytesIO()
        Image.fromarray(out).save(buf, format="PNG")
        return buf.getvalue()

    def manifest_options(self, annotations: str | os.PathLike) -> dict[str, Any]:
        """What the manifest's ``options.coco`` records: the file, the categories, the masks, what was left out."""
        with_segmentation = sorted({a[1] for _, anns in self.items for a in anns if a[3]}) if self.masks else []
        return {
            "masks": self.masks,
            "mask_labels": with_segmentation,
            "annotations": os.path.basename(os.fspath(annotations)),
            "categories": self.categories,
            "dropped_annotations": self.dropped,
            "skipped_empty": len(self.skipped_empty),
        }


__all__ = ["CocoSamples", "category_map", "COCO_FIELDS", "MASK_MODES"]
