"""Careless and hostile input, round four (issue 38), class 2 and COCO's class 3: COCO packing.

Every annotation value is checked before pycocotools, NumPy or ``open`` sees it: polygons
(finite, near the image), RLEs (``size`` the image's, runs covering it exactly), ``bbox``
(finite, bounded), the image's ``height``/``width`` (its file's own), and ``file_name`` (a
regular file, within the size ``--max-pixels`` allows, checked before it is read). Each pack
runs in a child process under a timeout: on the old code these cases killed it with SIGSEGV,
hung, or read a device whole, and a regression must fail here, not take the test run with it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
H, W = 30, 40  # the hostile image: not square

RUN = textwrap.dedent(
    """
    import json, sys
    import fastload
    from fastload.errors import FastloadError
    src, ann, out, masks, max_pixels = sys.argv[1:6]
    try:
        res = fastload.pack_coco(src, out, annotations=ann, masks=None if masks == "-" else masks,
                                 max_pixels=int(max_pixels), workers=1, progress=False)
    except FastloadError as e:
        print(json.dumps({"error": type(e).__name__, "message": str(e)}))
    else:
        print(json.dumps({"n": res.num_samples, "skipped": [s["reason"] for s in res.skipped]}))
    """
)


def _gradient(h: int, w: int) -> np.ndarray:
    y, x = np.mgrid[0:h, 0:w]
    return np.stack([x * 255 // max(w - 1, 1), y * 255 // max(h - 1, 1), (x + y) % 256], -1).astype(np.uint8)


def _coco(tmp_path: Path) -> tuple[Path, dict]:
    """Two PNG images (good.png 24x36, bad.png 30x40), one polygon each; the annotations as a dict."""
    src = tmp_path / "images"
    src.mkdir()
    Image.fromarray(_gradient(24, 36)).save(src / "good.png")
    Image.fromarray(_gradient(H, W)).save(src / "bad.png")
    poly = [[2.0, 2.0, 20.0, 2.0, 20.0, 15.0, 2.0, 15.0]]
    ann = {
        "images": [{"id": 1, "file_name": "good.png", "height": 24, "width": 36}, {"id": 2, "file_name": "bad.png", "height": H, "width": W}],
        "categories": [{"id": 5, "name": "thing"}],
        "annotations": [
            {"id": 10, "image_id": 1, "category_id": 5, "bbox": [2, 2, 18, 13], "iscrowd": 0, "segmentation": poly},
            {"id": 7, "image_id": 2, "category_id": 5, "bbox": [2, 2, 18, 13], "iscrowd": 0, "segmentation": poly},
        ],
    }
    return src, ann


def _pack(tmp_path: Path, src: Path, ann: dict | None, *, masks: str = "instance", max_pixels: int = 89_478_485, ann_path: Path | None = None) -> dict:
    if ann_path is None:
        ann_path = tmp_path / "instances.json"
        ann_path.write_text(json.dumps(ann))  # NaN and Infinity are written as JSON's extension, as json reads them
    p = subprocess.run(
        [sys.executable, "-c", RUN, str(src), str(ann_path), str(tmp_path / "out"), masks, str(max_pixels)],
        capture_output=True, text=True, timeout=120, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    assert p.returncode == 0, f"the pack died (rc {p.returncode}): {p.stderr[-2000:]}"
    return json.loads(p.stdout.strip().splitlines()[-1])


def _rle_bytes(mask: np.ndarray) -> dict:
    from pycocotools import mask as api

    rle = api.encode(np.asfortranarray(mask.astype(np.uint8)))
    return {"size": [int(v) for v in rle["size"]], "counts": rle["counts"].decode("ascii")}


def _seg(value):
    def plant(ann: dict, src: Path) -> None:
        ann["annotations"][1]["segmentation"] = value

    return plant


def _image(**kw):
    def plant(ann: dict, src: Path) -> None:
        ann["images"][1].update(kw)

    return plant


def _file(make):
    def plant(ann: dict, src: Path) -> None:
        (src / "bad.png").unlink()
        make(src / "bad.png")

    return plant


def _sparse(path: Path) -> None:
    with open(path, "wb") as f:
        f.truncate(64 << 20)  # 64 MiB of holes, more than max_pixels=100000 allows (16.8 MB)


_BIG_RUNS = {"size": [H, W], "counts": [0, H * W * 10]}  # runs past the image: pycocotools writes past its buffer
_BAD_STRING = dict(_rle_bytes(np.ones((H * 2, W), bool)), size=[H, W])  # a real encoding, of twice the pixels


@pytest.mark.parametrize(
    "plant, masks, reason",
    [
        (_seg([[2.0, 2.0, float("nan"), 2.0, 20.0, 15.0]]), "instance", "polygon coordinate nan"),
        (_seg([[2.0, 2.0, 1e30, 2.0, 20.0, 15.0]]), "instance", "polygon coordinate 1e+30"),
        (_seg([[2.0, 2.0, 20.0]]), "instance", "at least 3 x, y pairs"),
        (_seg({"size": [100000, 100000], "counts": [0, 10**10]}), "instance", "RLE size [100000, 100000] is not the image's [30, 40]"),
        (_seg(_BIG_RUNS), "instance", f"RLE runs cover {H * W * 10} pixels, the image has {H * W}"),
        (_seg(_BAD_STRING), "instance", f"RLE runs cover {2 * H * W} pixels"),
        (_seg({"size": [H, W], "counts": "0\x7f"}), "instance", "not a counts character"),
        (_seg({"size": [H, W], "counts": [-5, H * W + 5]}), "instance", "non-negative"),
        # the image entry claims a size its file does not have: 100000x100000 would be a 9 GiB mask
        (_image(height=100000, width=100000), "instance", "the annotations say height 100000, width 100000, the file is 30 high, 40 wide"),
        # ... and without masks, a mismatch that would fail the sample every epoch is caught at pack
        (_image(height=W, width=H), "-", "the annotations say height 40, width 30, the file is 30 high, 40 wide"),
        (_file(lambda p: os.mkfifo(p)), "-", "not a regular file (FIFO)"),
        (_file(lambda p: p.symlink_to("/dev/zero")), "-", "not a regular file (character device)"),
        (_file(_sparse), "-", "file too large: 67108864 bytes"),
    ],
    ids=["poly-nan", "poly-1e30", "poly-short", "rle-size-huge", "rle-runs-long", "rle-string-long", "rle-bad-char",
         "rle-negative", "image-claims-huge", "image-hw-swapped", "fifo", "dev-zero", "sparse-1.2GB-like"],  # fmt: skip
)
def test_hostile_coco_image_is_one_refused_sample_never_a_crash_or_hang(tmp_path, plant, masks, reason):
    src, ann = _coco(tmp_path)
    plant(ann, src)
    got = _pack(tmp_path, src, ann, masks=masks, max_pixels=100_000)
    assert got.get("n") == 1, got  # good.png packed, the hostile one refused
    assert len(got["skipped"]) == 1 and reason in got["skipped"][0], got


@pytest.mark.parametrize(
    "bbox, shown",
    [([float("nan"), 2, 18, 13], "nan"), ([2, 2, float("inf"), 13], "inf"), ([2, float("-inf"), 18, 13], "-inf"), ([1e30, 2, 18, 13], "1e+30")],
)
def test_a_nan_infinite_or_huge_bbox_is_refused_with_its_annotation(tmp_path, bbox, shown):
    src, ann = _coco(tmp_path)
    ann["annotations"][1]["bbox"] = bbox
    got = _pack(tmp_path, src, ann, masks="-")
    assert got.get("error") == "ConfigError", got
    assert "annotation 7: bbox" in got["message"] and shown in got["message"] and "finite" in got["message"]
    assert not (tmp_path / "out").exists()


def test_an_annotations_file_that_is_a_fifo_is_refused_not_waited_on(tmp_path):
    src, _ = _coco(tmp_path)
    fifo = tmp_path / "instances.json"
    os.mkfifo(fifo)
    got = _pack(tmp_path, src, None, masks="-", ann_path=fifo)
    assert got == {"error": "ConfigError", "message": f"annotations: {fifo} is not a regular file (FIFO); a COCO instances file is JSON"}


def test_valid_segmentations_still_decode_as_pycocotools_decodes_them(tmp_path):
    """The checks refuse only what pycocotools cannot decode safely: a real compressed RLE (pycocotools'
    own encoding), an uncompressed one and polygons reaching a little past the edge all pack."""
    from pycocotools import mask as api

    import fastload

    src, ann = _coco(tmp_path)
    inside = np.zeros((H, W), bool)
    inside[5:25, 3:31] = True
    inside[10:12, :] = True  # runs of many lengths, to exercise the delta coding
    ann["annotations"][1]["segmentation"] = _rle_bytes(inside)
    ann["annotations"][0]["segmentation"] = [[-3.0, -2.0, 40.0, -2.0, 40.0, 30.0]]  # past the 36x24 image's edges
    got = _pack(tmp_path, src, ann)
    assert got == {"n": 2, "skipped": []}
    ds = fastload.Dataset(tmp_path / "out")
    by_id = {int(ds.fields(i)["image_id"]): ds.fields(i) for i in range(len(ds))}
    import io

    got_mask = np.asarray(Image.open(io.BytesIO(by_id[2]["mask"])))
    np.testing.assert_array_equal(got_mask == 1, inside)
    want0 = api.decode(api.merge(api.frPyObjects(ann["annotations"][0]["segmentation"], 24, 36))).astype(bool)
    np.testing.assert_array_equal(np.asarray(Image.open(io.BytesIO(by_id[1]["mask"]))) == 1, want0)


def test_a_file_name_with_dotdot_is_followed_as_torchvision_follows_it(tmp_path):
    """Policy: ``file_name`` is joined to the image directory as torchvision's ``CocoDetection`` joins
    it (``os.path.join``): ``../`` and absolute names are followed; what they name must still be a
    regular image file within the size limit."""
    src, ann = _coco(tmp_path)
    (tmp_path / "elsewhere").mkdir()
    os.replace(src / "bad.png", tmp_path / "elsewhere" / "bad.png")
    ann["images"][1]["file_name"] = "../elsewhere/bad.png"
    assert _pack(tmp_path, src, ann, masks="-") == {"n": 2, "skipped": []}
