"""``fastload pack IMAGES OUT --annotations instances.json``: boxes, labels, iscrowd against pycocotools' own reading."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
from PIL import Image

import fastload
from fastload.cli import main
from fastload.errors import ConfigError

from coco_fixture import write_coco

pycocotools_coco = pytest.importorskip("pycocotools.coco")


@pytest.fixture(scope="module")
def coco(tmp_path_factory):
    root = tmp_path_factory.mktemp("coco")
    img_dir, ann, colours = write_coco(root)
    out = root / "packed"
    assert main(["pack", str(img_dir), str(out), "--annotations", str(ann), "--workers", "1", "--no-progress"]) == 0
    return img_dir, ann, out, colours


def test_boxes_labels_iscrowd_are_pycocotools_annotations(coco):
    """Kills: XYWH stored as is (x2 = width), labels not sorted by category id, iscrowd lost, images out of order."""
    img_dir, ann, out, _ = coco
    api = pycocotools_coco.COCO(str(ann))
    cat_ids = sorted(api.getCatIds())  # contiguous labels 1..K, in category-id order
    ds = fastload.Dataset(out)
    assert len(ds) == len(api.getImgIds())  # the image without annotations is kept by default
    for i, image_id in enumerate(sorted(api.getImgIds())):
        v = ds.fields(i, ["image", "image_id", "boxes", "labels", "iscrowd"])
        assert v["image_id"] == image_id
        anns = [a for a in api.loadAnns(api.getAnnIds(imgIds=[image_id])) if a["bbox"][2] > 0 and a["bbox"][3] > 0]
        want = np.array([[x, y, x + w, y + h] for x, y, w, h in (a["bbox"] for a in anns)], np.float32).reshape(-1, 4)
        assert v["boxes"].dtype == np.float32 and v["boxes"].shape == want.shape
        np.testing.assert_array_equal(v["boxes"], want)
        np.testing.assert_array_equal(v["labels"], [cat_ids.index(a["category_id"]) + 1 for a in anns])
        np.testing.assert_array_equal(v["iscrowd"], [a["iscrowd"] for a in anns])
        info = api.loadImgs([image_id])[0]
        stored = np.asarray(Image.open(io.BytesIO(v["image"])).convert("RGB"))
        original = np.asarray(Image.open(img_dir / info["file_name"]).convert("RGB"))
        np.testing.assert_array_equal(stored, original)  # a JPEG is stored byte for byte: the boxes' pixels
    m = json.loads((out / "manifest.json").read_text())["options"]["coco"]
    assert m["categories"] == [{"id": c, "name": api.loadCats([c])[0]["name"], "label": k + 1} for k, c in enumerate(cat_ids)]
    assert m["dropped_annotations"] == 1 and m["skipped_empty"] == 0


def test_inspect_shows_the_category_mapping_and_box_counts(coco, capsys):
    _, _, out, _ = coco
    assert main(["inspect", str(out)]) == 0
    text = capsys.readouterr().out
    assert "categories (instances.json; label  COCO id  name):" in text
    for label, cid, name in ((1, 3, "cat"), (2, 7, "dog"), (3, 11, "bird")):
        assert f"  {label:>5}  {cid:>7}  {name}" in text
    boxes_line = next(line for line in text.splitlines() if line.strip().startswith("boxes"))
    assert "length min 0" in boxes_line and "max 3" in boxes_line  # the empty image, the image with 3 boxes


def test_skip_empty_leaves_out_images_without_annotations(tmp_path):
    """Kills: --skip-empty ignored."""
    img_dir, ann, _ = write_coco(tmp_path / "src")
    out = tmp_path / "packed"
    res = fastload.pack_coco(img_dir, out, annotations=ann, skip_empty=True, workers=1, progress=False)
    ids = [fastload.Dataset(out).fields(i, ["image_id"])["image_id"] for i in range(res.num_samples)]
    api = pycocotools_coco.COCO(str(ann))
    assert ids == sorted(i for i in api.getImgIds() if api.getAnnIds(imgIds=[i]))
    assert json.loads((out / "manifest.json").read_text())["options"]["coco"]["skipped_empty"] == 1


def test_bad_annotations_are_one_readable_error(tmp_path, capsys):
    img_dir, ann, _ = write_coco(tmp_path / "src")
    out = tmp_path / "packed"
    assert main(["pack", str(img_dir), str(out), "--annotations", str(tmp_path / "nope.json")]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "nope.json does not exist" in err[0]
    data = json.loads(ann.read_text())
    data["annotations"][0]["category_id"] = 99
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(data))
    with pytest.raises(ConfigError, match="category_id 99, which is not in 'categories'"):
        fastload.pack_coco(img_dir, out, annotations=bad, progress=False)
    data["annotations"][0]["category_id"] = 3
    data["annotations"][0]["bbox"] = [1, 2, 3]
    bad.write_text(json.dumps(data))
    with pytest.raises(ConfigError, match=r"bbox must be four numbers"):
        fastload.pack_coco(img_dir, out, annotations=bad, progress=False)
    with pytest.raises(ConfigError, match="max_size=64"):
        fastload.pack_coco(img_dir, out, annotations=ann, max_size=64, progress=False)
    assert main(["pack", str(img_dir), str(out), "--annotations", str(ann), "--from", "parquet"]) != 0
    assert "--annotations packs a folder of COCO images" in capsys.readouterr().err
    assert main(["pack", str(img_dir), str(out), "--skip-empty"]) != 0
    assert "--skip-empty applies with --annotations" in capsys.readouterr().err
    assert not out.exists() and ann.exists()  # nothing written, the user's file untouched


@pytest.mark.parametrize("mode", ["instance", "semantic"])
def test_masks_are_pycocotools_decoding_of_polygons_and_rle(tmp_path, mode, capsys):
    """The mask PNG against pycocotools' annToMask (polygons, and the crowd's RLE). Kills: masks offset,
    instance ids not in box order, labels instead of instance ids (or the other way)."""
    img_dir, ann, _ = write_coco(tmp_path / "src")
    out = tmp_path / "packed"
    fastload.pack_coco(img_dir, out, annotations=ann, masks=mode, workers=1, progress=False)
    api = pycocotools_coco.COCO(str(ann))
    cat_ids = sorted(api.getCatIds())
    ds = fastload.Dataset(out)
    assert ds.schema["mask"].kind == "bytes"
    rle_seen = 0
    for i, image_id in enumerate(sorted(api.getImgIds())):
        v = ds.fields(i, ["mask", "boxes"])
        lab = np.asarray(Image.open(io.BytesIO(v["mask"])))
        info = api.loadImgs([image_id])[0]
        want = np.zeros((info["height"], info["width"]), np.int64)
        anns = [a for a in api.loadAnns(api.getAnnIds(imgIds=[image_id])) if a["bbox"][2] > 0 and a["bbox"][3] > 0]
        for k, a in enumerate(anns):
            rle_seen += isinstance(a["segmentation"], dict)
            want[api.annToMask(a).astype(bool)] = k + 1 if mode == "instance" else cat_ids.index(a["category_id"]) + 1
        np.testing.assert_array_equal(lab, want)
    assert rle_seen == 1
    coco_opts = json.loads((out / "manifest.json").read_text())["options"]["coco"]
    assert coco_opts["masks"] == mode
    labels_with_masks = sorted({cat_ids.index(a["category_id"]) + 1 for a in api.loadAnns(api.getAnnIds()) if a["segmentation"]})
    assert coco_opts["mask_labels"] == labels_with_masks
    assert main(["inspect", str(out)]) == 0
    assert f"masks        {mode}, of labels {', '.join(map(str, labels_with_masks))}" in capsys.readouterr().out


def test_masks_flag_needs_annotations(tmp_path, capsys):
    img_dir, ann, _ = write_coco(tmp_path / "src")
    assert main(["pack", str(img_dir), str(tmp_path / "o"), "--masks", "instance"]) != 0
    assert "--masks applies with --annotations" in capsys.readouterr().err
    with pytest.raises(ConfigError, match="masks must be one of None, 'instance', 'semantic', got 'panoptic'"):
        fastload.pack_coco(img_dir, tmp_path / "o", annotations=ann, masks="panoptic", progress=False)


def test_verify_checks_the_boxes(coco, tmp_path, capsys):
    """A clean COCO pack verifies; inverted, non-finite boxes and a label count that is not the box
    count are problems naming the sample and the box. Kills: verify not looking at boxes."""
    _, _, out, _ = coco
    assert main(["verify", str(out)]) == 0
    capsys.readouterr()
    img = np.zeros((16, 16, 3), np.uint8)
    kinds = {"boxes": "float32[][4]", "labels": "int64[]"}
    samples = [
        {"image": img, "boxes": np.array([[1, 1, 4, 4]], np.float32), "labels": np.array([1])},
        {"image": img, "boxes": np.array([[1, 1, 4, 4], [9, 2, 5, 6]], np.float32), "labels": np.array([1, 2])},
        {"image": img, "boxes": np.array([[np.nan, 1, 4, 4]], np.float32), "labels": np.array([1])},
        {"image": img, "boxes": np.array([[1, 1, 4, 4]], np.float32), "labels": np.array([1, 2])},
    ]
    bad = tmp_path / "bad"
    fastload.pack_dataset(samples, bad, fields=kinds, workers=1, progress=False)
    rep = fastload.verify(bad)
    assert len(rep.problems) == 3, rep.problems
    assert "sample 1 " in rep.problems[0] and "box 1: x2 5.0 < x1 9.0" in rep.problems[0]
    assert "sample 2 " in rep.problems[1] and "box 0 is not finite" in rep.problems[1]
    assert "sample 3 " in rep.problems[2] and "2 labels for 1 boxes" in rep.problems[2]
    assert main(["verify", str(bad)]) == 1


def test_labels_outside_the_categories_are_a_box_problem():
    from fastload.boxes import box_problem

    boxes = np.array([[0, 0, 2, 2], [1, 1, 3, 3]], np.float32)
    assert box_problem({"boxes": boxes, "labels": np.array([1, 3])}, 3) is None
    assert box_problem({"boxes": boxes, "labels": np.array([1, 4])}, 3) == "box 1: label 4 is outside 1..3 (the categories)"
    assert box_problem({"boxes": boxes, "labels": np.array([0, 1])}, 3) == "box 0: label 0 is outside 1..3 (the categories)"
    assert box_problem({"boxes": boxes, "labels": np.array([0, 9])}) is None  # no categories known: not checked
