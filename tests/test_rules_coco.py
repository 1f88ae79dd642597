"""Rules of a COCO source: samples in image-id order, boxes in the file's order, instance masks past 255."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from pycocotools.coco import COCO

from fastload.packing.coco import CocoSamples


def write_coco(root: Path, ids: list[int], objects: dict[int, int], *, size=(48, 40)) -> Path:
    """Images with ``ids`` listed in that order; image i has ``objects[i]`` 2x2 square polygons on a
    grid (distinct places, so every object keeps pixels), annotations listed in a shuffled order."""
    w, h = size
    rng = np.random.default_rng(len(ids))
    images, anns = [], []
    for iid in ids:
        name = f"im{iid}.png"
        Image.fromarray(rng.integers(0, 255, (h, w, 3), dtype=np.uint8)).save(root / name)
        images.append({"id": iid, "file_name": name, "width": w, "height": h})
        for k in range(objects[iid]):
            x, y = 2 * (k % (w // 2)), 2 * (k // (w // 2))
            anns.append({"image_id": iid, "category_id": 1 + k % 3, "bbox": [x, y, 2, 2], "iscrowd": 0, "area": 4,
                         "segmentation": [[x, y, x + 2, y, x + 2, y + 2, x, y + 2]]})  # fmt: skip
    order = rng.permutation(len(anns))
    anns = [dict(anns[i], id=1000 + j) for j, i in enumerate(order)]
    cats = [{"id": c, "name": f"c{c}"} for c in (3, 1, 2)]
    path = root / "instances.json"
    path.write_text(json.dumps({"images": images, "annotations": anns, "categories": cats}))
    return path


# (image ids in the file's order, objects per image)
TABLE = [
    ([30, 4, 17, 9], {30: 3, 4: 0, 17: 2, 9: 5}),
    ([2, 1], {2: 300, 1: 256}),  # past 255 objects: instance ids 256.. must survive
    ([7, 5, 6], {7: 255, 5: 1, 6: 257}),
]


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # pycocotools on NumPy 2
@pytest.mark.parametrize("ids,objects", TABLE)
def test_samples_boxes_and_instance_masks_follow_pycocotools(tmp_path, ids, objects):
    """Rules (docs/detection.md): samples in ascending image id whatever the file's order
    (torchvision's CocoDetection: ``sorted(coco.imgs.keys())``); each image's boxes in the order
    pycocotools lists its annotations; instance mask pixel k+1 where annotation k's ``annToMask`` is
    set (a later one covering an earlier one), kept exact past 255 objects. Bugs: samples in the
    file's order; the mask always uint8 (object 256 wraps to 0, 257 to 1)."""
    path = write_coco(tmp_path, ids, objects)
    coco = COCO(str(path))
    src = CocoSamples(tmp_path, path, masks="instance")
    want_ids = sorted(coco.imgs.keys())
    assert [src[i]["image_id"] for i in range(len(src))] == want_ids
    cat_label = {c: k + 1 for k, c in enumerate(sorted(coco.getCatIds()))}
    for i, iid in enumerate(want_ids):
        item = src[i]
        anns = coco.loadAnns(coco.getAnnIds(imgIds=[iid]))
        want_boxes = np.array([[a["bbox"][0], a["bbox"][1], a["bbox"][0] + a["bbox"][2], a["bbox"][1] + a["bbox"][3]] for a in anns],
                              np.float32).reshape(-1, 4)  # fmt: skip
        np.testing.assert_array_equal(item["boxes"], want_boxes)
        assert item["labels"].tolist() == [cat_label[a["category_id"]] for a in anns]
        want_mask = np.zeros((coco.imgs[iid]["height"], coco.imgs[iid]["width"]), np.int64)
        for k, a in enumerate(anns):
            want_mask[coco.annToMask(a) == 1] = k + 1
        got = np.asarray(Image.open(io.BytesIO(item["mask"]))).astype(np.int64)
        np.testing.assert_array_equal(got, want_mask)
        assert got.max() == len(anns)
