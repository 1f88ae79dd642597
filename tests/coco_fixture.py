"""A small COCO dataset written by the tests: images where every box is painted in its own colour.

Each annotation's box is filled with a colour no other box has, over a dark grey
background, so a box's place in any transformed image can be read back from the pixels.
Category ids are deliberately not contiguous (3, 7, 11) and listed out of order.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from PIL import Image

#: (height, width) of each image and its boxes as (x, y, w, h, category_id, iscrowd)
IMAGES = [
    ((90, 120), [(10, 8, 30, 20, 7, 0), (60, 40, 40, 30, 3, 0)]),
    ((100, 100), [(5, 50, 20, 40, 11, 1), (50, 5, 40, 30, 7, 0), (70, 60, 25, 30, 3, 0)]),
    ((160, 64), [(8, 10, 40, 50, 3, 0)]),
    ((72, 150), [(100, 10, 40, 50, 11, 0), (20, 30, 30, 30, 11, 0)]),
    ((90, 120), [(40, 30, 50, 40, 7, 0)]),
    ((80, 80), []),  # no annotation
]
CATEGORIES = [{"id": 11, "name": "bird"}, {"id": 3, "name": "cat"}, {"id": 7, "name": "dog"}]
PALETTE = [(255, 0, 0), (0, 255, 0), (0, 0, 255), (255, 255, 0), (255, 0, 255), (0, 255, 255), (255, 128, 0), (128, 0, 255), (255, 255, 255)]
BACKGROUND = (30, 30, 30)


def write_coco(root: Path) -> tuple[Path, Path, dict[int, list[tuple[int, int, int]]]]:
    """Write ``root/images/*.jpg`` and ``root/instances.json``; return their paths and, per image id,
    each box's colour (in the order of its annotations)."""
    img_dir = root / "images"
    img_dir.mkdir(parents=True)
    images, anns, colours = [], [], {}
    k = 0
    for n, ((h, w), boxes) in enumerate(IMAGES):
        iid = 100 + 7 * n  # ids neither contiguous nor from 0
        px = np.empty((h, w, 3), np.uint8)
        px[:] = BACKGROUND
        colours[iid] = []
        for x, y, bw, bh, cat, crowd in boxes:
            colour = PALETTE[k]
            px[y : y + bh, x : x + bw] = colour
            colours[iid].append(colour)
            if crowd:  # crowds are RLE in COCO: uncompressed counts, column-major runs from a 0 run
                inside = np.zeros((h, w), bool)
                inside[y : y + bh, x : x + bw] = True
                seg = {"size": [h, w], "counts": _runs(inside.flatten(order="F"))}
            else:
                seg = [[x, y, x + bw, y, x + bw, y + bh, x, y + bh]]
            anns.append({"id": 1000 + k, "image_id": iid, "category_id": cat, "bbox": [x, y, bw, bh],
                         "area": bw * bh, "iscrowd": crowd, "segmentation": seg})  # fmt: skip
            k += 1
        name = f"img_{n:03d}.jpg"
        Image.fromarray(px).save(img_dir / name, quality=98, subsampling=0)
        images.append({"id": iid, "file_name": name, "height": h, "width": w})
    # a degenerate annotation (zero width): dropped, as torchvision's COCO reference drops it
    anns.append({"id": 9999, "image_id": images[0]["id"], "category_id": 3, "bbox": [1, 1, 0, 5], "area": 0, "iscrowd": 0, "segmentation": []})
    ann_file = root / "instances.json"
    ann_file.write_text(json.dumps({"images": images, "annotations": anns, "categories": CATEGORIES}))
    return img_dir, ann_file, colours


def _runs(bits: np.ndarray) -> list[int]:
    """Run lengths of a flat bool array, the first run counting zeros (COCO's uncompressed RLE)."""
    edges = np.flatnonzero(np.diff(bits.astype(np.int8))) + 1
    bounds = np.concatenate([[0], edges, [len(bits)]])
    runs = np.diff(bounds).tolist()
    return ([0] + runs) if bits[0] else runs


def colour_mask(image_chw: np.ndarray, colour: tuple[int, int, int], tol: float = 60.0) -> np.ndarray:
    """The pixels within ``tol`` of ``colour`` in a 0..1 float CHW image, as an HxW bool array."""
    hwc = np.moveaxis(image_chw, 0, -1) * 255.0
    return np.linalg.norm(hwc - np.asarray(colour, np.float64), axis=-1) < tol


def colour_box(image_chw: np.ndarray, colour: tuple[int, int, int], tol: float = 60.0) -> tuple[float, float, float, float] | None:
    """The XYXY extent (pixel edges) of the pixels within ``tol`` of ``colour`` in a 0..1 float CHW image."""
    hwc = np.moveaxis(image_chw, 0, -1) * 255.0
    near = np.linalg.norm(hwc - np.asarray(colour, np.float64), axis=-1) < tol
    ys, xs = np.nonzero(near)
    if len(xs) == 0:
        return None
    return float(xs.min()), float(ys.min()), float(xs.max() + 1), float(ys.max() + 1)


def pack_painted(root: Path, out: Path, *, masks: str | None = "instance") -> dict[int, list[tuple[int, int, int]]]:
    """:func:`write_coco` under ``root``, packed into ``out`` by ``fastload.pack_coco``; the colours of each image's boxes."""
    import fastload

    img_dir, ann, colours = write_coco(root)
    fastload.pack_coco(img_dir, out, annotations=ann, masks=masks, workers=1, progress=False)
    return colours
