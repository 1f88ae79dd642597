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
import math
import os
import reprlib
import stat
import warnings
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ConfigError, DependencyError, printable
from ..format import DEFAULT_MAX_PIXELS
from .images import read_image_file
from .sources import file_kind

log = logging.getLogger(__name__)

#: The fields a COCO pack has, in order (kinds as ``docs/fields.md`` writes them).
COCO_FIELDS = {"image_id": "int", "boxes": "float32[][4]", "labels": "int64[]", "iscrowd": "uint8[]"}


#: The largest coordinate of a ``bbox`` (in pixels, either sign): more than any image's side.
MAX_COORD = 1 << 20

#: What ``masks=`` takes: no mask, one instance label image, one semantic label image per sample.
MASK_MODES = (None, "instance", "semantic")


def _mask_api() -> Any:
    try:
        from pycocotools import mask
    except ImportError:
        raise DependencyError("masks need pycocotools: pip install 'fastload[detection]' (or pycocotools)") from None
    return mask


def _read_regular(p: Path) -> bytes:
    """The bytes of ``p``, a regular file: a FIFO or a device is refused from ``fstat``, never waited on."""
    fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    with open(fd, "rb", buffering=0) as f:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise ConfigError(f"annotations: {printable(str(p))} is not a regular file ({file_kind(mode)}); a COCO instances file is JSON")
        os.set_blocking(fd, True)
        return f.read()


def _load(annotations: str | os.PathLike) -> dict[str, Any]:
    p = Path(annotations)
    try:
        data = json.loads(_read_regular(p))
    except ConfigError:
        raise
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


def _rle_string_counts(counts: str | bytes) -> list[int]:
    """The run lengths of a compressed COCO RLE string (6-bit groups from ``'0'``, 5 bits of value
    each, bit 5 set while more follow, bit 4 of the last the sign; from the third run on, each
    adds the run two before it).

    Raises:
        ValueError: a character outside ``'0'..'o'`` or a run that ends unfinished.
    """
    b = counts.encode("ascii", "replace") if isinstance(counts, str) else bytes(counts)
    runs: list[int] = []
    p = 0
    while p < len(b):
        x = k = 0
        while True:
            if p >= len(b):
                raise ValueError("the counts string ends inside a run")
            c = b[p] - 48
            if not 0 <= c < 64:
                raise ValueError(f"character {chr(b[p])!r} is not a counts character ('0'..'o')")
            x |= (c & 0x1F) << (5 * k)
            p, k = p + 1, k + 1
            if not c & 0x20:
                if c & 0x10:
                    x |= -1 << (5 * k)
                break
        if len(runs) > 2:
            x += runs[-2]
        runs.append(x)
    return runs


def checked_segmentation(seg: Any, h: int, w: int, where: str) -> Any:
    """``seg`` once checked to be what pycocotools decodes safely for an ``h`` x ``w`` image: polygons
    (lists of at least three finite x, y pairs within the image give or take its own size) or an
    RLE whose ``size`` is ``[h, w]`` and whose runs are non-negative and cover ``h * w`` pixels
    exactly (pycocotools writes past its buffer otherwise).

    Raises:
        ConfigError: naming ``where`` and what is wrong.
    """
    if isinstance(seg, list):
        for poly in seg:
            if not (isinstance(poly, list) and len(poly) >= 6 and len(poly) % 2 == 0):
                raise ConfigError(f"{where}: a polygon must be a list of at least 3 x, y pairs, got {printable(reprlib.repr(poly))}")
            for j, v in enumerate(poly):
                side = w if j % 2 == 0 else h
                if type(v) not in (int, float) or not (math.isfinite(v) and -side <= v <= 2 * side):
                    raise ConfigError(f"{where}: polygon coordinate {printable(reprlib.repr(v))} is not a finite number within "
                                      f"{-side}..{2 * side} (the image, give or take its size)")  # fmt: skip
        return seg
    if not isinstance(seg, dict) or "counts" not in seg:
        raise ConfigError(f"{where}: segmentation {printable(reprlib.repr(seg))} is neither polygons nor an RLE")
    if seg.get("size") != [h, w]:
        raise ConfigError(f"{where}: RLE size {printable(reprlib.repr(seg.get('size')))} is not the image's [{h}, {w}]")
    counts = seg["counts"]
    if isinstance(counts, list):
        if not all(type(c) is int and c >= 0 for c in counts):
            raise ConfigError(f"{where}: RLE counts must be non-negative integers")
        runs = counts
    elif isinstance(counts, (str, bytes)):
        try:
            runs = _rle_string_counts(counts)
        except ValueError as e:
            raise ConfigError(f"{where}: RLE counts: {e}") from None
        if any(c < 0 or c >= 1 << 32 for c in runs):
            raise ConfigError(f"{where}: RLE counts decode to a negative or too long run")
    else:
        raise ConfigError(f"{where}: RLE counts must be a list of integers or a string, got {type(counts).__name__}")
    if sum(runs) != h * w:
        raise ConfigError(f"{where}: RLE runs cover {sum(runs)} pixels, the image has {h * w} ({h}x{w})")
    return seg


def _exif_orientation(pim: Any) -> int:
    """A PIL image's EXIF orientation (1..8; 1 where it has none or it is malformed), as the pack reads it."""
    try:
        o = pim.getexif().get(0x0112, 1)  # the Orientation tag
    except Exception:  # noqa: BLE001 - malformed EXIF: the pack ignores it as well
        return 1
    return o if isinstance(o, int) and 1 <= o <= 8 else 1


class CocoSamples:
    """The images of a COCO annotations file as a map-style dataset of field dicts.

    Args:
        images: the directory the ``file_name`` of each image is relative to.
        annotations: the ``instances_*.json`` path.
        skip_empty: leave out images without a (valid) annotation.
        masks: None (no mask field), ``"instance"`` (a ``mask`` PNG whose pixel ``k`` is box
            ``k - 1``'s object, 0 the background; uint16 when an image has over 255 boxes) or
            ``"semantic"`` (pixel = the object's contiguous label). Needs pycocotools.
        max_pixels: the most pixels an image may have (the pack's ``--max-pixels``); its file
            is refused from its size before it is read (:func:`~fastload.packing.images.max_file_bytes`).

    Raises:
        ConfigError: a missing or malformed annotations file, an annotation naming an unknown
            image or category, a ``bbox`` that is not four numbers.
    """

    def __init__(self, images: str | os.PathLike, annotations: str | os.PathLike, *, skip_empty: bool = False, masks: str | None = None,
                 max_pixels: int = DEFAULT_MAX_PIXELS) -> None:  # fmt: skip
        self.max_pixels = max_pixels
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
        if not all(math.isfinite(v) and abs(v) <= MAX_COORD for v in box):  # json reads NaN and Infinity
            raise ConfigError(
                f"{where}: annotation {a.get('id')!r}: bbox {reprlib.repr(box)} has a value that is not a finite number "
                f"within +-{MAX_COORD} pixels"
            )
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
        # a regular file within the size --max-pixels allows, never a FIFO or a device (a missing,
        # special or too large file is a refused sample); ``file_name`` is joined to the image
        # directory as torchvision's CocoDetection joins it (``../`` and absolute names followed)
        payload = read_image_file(self.root / im["file_name"], self.max_pixels)
        h, w = self._checked_size(im, payload)
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
            item["mask"] = self._mask_png(im, anns, h, w)
        return item

    def _checked_size(self, im: dict[str, Any], payload: bytes) -> tuple[int, int]:
        """The image's ``(height, width)`` as packed (its header's, turned by an EXIF orientation 5..8,
        which the pack applies), within ``max_pixels`` and equal to the entry's ``height``/``width``
        where it has them (a mismatch would misplace every box and mask and fail the sample at
        each epoch). The annotations are taken in the frame of the image as packed, upright.

        Raises:
            ConfigError: an unreadable header, too many pixels, or sizes that disagree.
        """
        from PIL import Image

        name = printable(str(im["file_name"]))
        try:
            with Image.open(io.BytesIO(payload)) as pim:
                w, h = pim.size
                orientation = _exif_orientation(pim)
        except Exception as e:  # noqa: BLE001 - PIL raises many kinds for a file it cannot identify
            raise ConfigError(f"image {im['id']} ({name}): not an image PIL can read ({type(e).__name__})") from None
        if w * h > self.max_pixels:
            raise ConfigError(f"image {im['id']} ({name}): {w}x{h} is more than --max-pixels {self.max_pixels}")
        fh, fw = h, w
        if orientation in (5, 6, 7, 8):  # a quarter turn: the packed image is w high, h wide
            h, w = w, h
        claimed = (im.get("height"), im.get("width"))
        if claimed != (None, None) and claimed != (h, w):
            turned = f", {h} high and {w} wide once its EXIF orientation {orientation} is applied as packed" if (h, w) != (fh, fw) else ""
            raise ConfigError(
                f"image {im['id']} ({name}): the annotations say height {printable(reprlib.repr(claimed[0]))}, width "
                f"{printable(reprlib.repr(claimed[1]))}, the file is {fh} high, {fw} wide{turned}"
            )
        return h, w

    def _mask_png(self, im: dict[str, Any], anns: list[tuple[list[float], int, int, Any]], h: int, w: int) -> bytes:
        """One label image of every annotation's segmentation (polygons or RLE), as PNG bytes."""
        from PIL import Image

        api = _mask_api()
        if type(im.get("height")) is not int or type(im.get("width")) is not int:
            raise ConfigError(f"image {im['id']} ({printable(str(im['file_name']))}): masks need its integer 'height' and 'width'")
        out = np.zeros((h, w), np.uint16 if len(anns) > 255 else np.uint8)
        for k, (_, label, _, seg) in enumerate(anns):
            if not seg:
                continue
            seg = checked_segmentation(seg, h, w, f"image {im['id']}: box {k}")  # pycocotools crashes on what it refuses
            if isinstance(seg, list):  # polygons
                rle = api.merge(api.frPyObjects(seg, h, w))
            elif isinstance(seg.get("counts"), list):  # uncompressed RLE
                rle = api.frPyObjects(seg, h, w)
            else:  # compressed RLE
                rle = seg
            with warnings.catch_warnings():  # pycocotools' own NumPy 2 copy= deprecation
                warnings.simplefilter("ignore", DeprecationWarning)
                m = api.decode(rle).astype(bool)
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


__all__ = ["CocoSamples", "category_map", "checked_segmentation", "MAX_COORD", "COCO_FIELDS", "MASK_MODES"]
