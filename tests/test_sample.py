"""The built-in sample dataset: structure, image properties, reproducibility, errors, CLI."""

from __future__ import annotations

import hashlib
import io
import json
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import fastload
from fastload.cli import main
from fastload.errors import ConfigError, DependencyError
from fastload.sample import SAMPLE_MARKER, make_sample

N, K = 40, 4


def _files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file() and p.name != SAMPLE_MARKER)


def _digest(root: Path) -> str:
    h = hashlib.sha256()
    for p in _files(root):
        h.update(str(p.relative_to(root)).encode())
        h.update(p.read_bytes())
    return h.hexdigest()


def _q90_tables(subsampling: int) -> dict:
    buf = io.BytesIO()
    Image.new("RGB", (32, 32), (120, 60, 30)).save(buf, "JPEG", quality=90, subsampling=subsampling)
    return Image.open(io.BytesIO(buf.getvalue())).quantization


@pytest.fixture(scope="module")
def sample(tmp_path_factory) -> Path:
    return make_sample(tmp_path_factory.mktemp("s") / "sample", num_images=N, num_classes=K, seed=3)


def test_exported():
    assert fastload.make_sample is make_sample
    assert "make_sample" in fastload.__all__


def test_structure_matches_imagefolder(sample):
    classes = sorted(d.name for d in sample.iterdir() if d.is_dir())
    assert classes == ["00_astronaut", "01_cat", "02_coffee", "03_rocket"]
    files = _files(sample)
    assert len(files) == N
    assert all(p.suffix == ".jpg" and p.parent.parent == sample for p in files)
    counts = [len(list((sample / c).iterdir())) for c in classes]
    assert counts == [N // K] * K
    # torchvision's ImageFolder sees the same tree (the marker file at the root is ignored)
    from torchvision.datasets import ImageFolder

    ds = ImageFolder(str(sample))
    assert ds.classes == classes and len(ds) == N
    assert [label for _, label in ds.samples] == sorted(label for _, label in ds.samples)


def test_images_are_imagenet_like_jpegs(sample):
    sizes, nbytes, baseline = [], [], 0
    q420, q444 = _q90_tables(2), _q90_tables(0)
    for p in _files(sample):
        with Image.open(p) as im:
            assert im.format == "JPEG" and im.mode == "RGB"
            assert im.quantization in (q420, q444), f"{p} is not quality 90"
            baseline += not im.info.get("progressive")
            sizes.append(im.size)
            im.load()  # decodes fully: not truncated
        nbytes.append(p.stat().st_size)
    w, h = np.array(sizes).T
    assert w.min() >= 400 and w.max() <= 560 and h.min() >= 300 and h.max() <= 420
    assert len(set(sizes)) > N // 2  # sizes are jittered
    assert 60_000 < np.mean(nbytes) < 140_000
    assert baseline >= 0.8 * N


def test_classes_differ_in_content(sample):
    # mean colour of the coffee class (warm) vs the rocket class (blue sky)
    def mean_rgb(cls):
        return np.mean([np.asarray(Image.open(p)).mean(axis=(0, 1)) for p in _files(sample / cls)], axis=0)

    coffee, rocket = mean_rgb("02_coffee"), mean_rgb("03_rocket")
    assert coffee[0] > coffee[2] and rocket[2] > rocket[0]


def test_reproducible_and_seed_dependent(sample, tmp_path):
    again = make_sample(tmp_path / "again", num_images=N, num_classes=K, seed=3, workers=2)
    assert _digest(again) == _digest(sample)  # same bytes whatever the number of workers
    other = make_sample(tmp_path / "other", num_images=N, num_classes=K, seed=4)
    assert _digest(other) != _digest(sample)
    assert [p.relative_to(other) for p in _files(other)] == [p.relative_to(sample) for p in _files(sample)]


def test_uneven_split_and_size(tmp_path):
    out = make_sample(tmp_path / "s", num_images=7, num_classes=3, size=(120, 90), quality=75)
    counts = [len(list(d.iterdir())) for d in sorted(out.iterdir()) if d.is_dir()]
    assert counts == [3, 2, 2]
    for p in _files(out):
        w, h = Image.open(p).size
        assert 96 <= w <= 134 and 72 <= h <= 100


def test_reuse_overwrite_and_refusals(tmp_path):
    out = make_sample(tmp_path / "s", num_images=6, num_classes=2)
    first = {p: p.stat().st_mtime_ns for p in _files(out)}
    marker = json.loads((out / SAMPLE_MARKER).read_text())
    assert marker["params"]["num_images"] == 6 and marker["bytes"] == sum(p.stat().st_size for p in first)
    time.sleep(0.01)
    # same parameters: reused untouched
    assert make_sample(out, num_images=6, num_classes=2) == out
    assert {p: p.stat().st_mtime_ns for p in _files(out)} == first
    # other parameters: refused without overwrite, nothing changed
    with pytest.raises(ConfigError, match="already exists.*overwrite"):
        make_sample(out, num_images=8, num_classes=2)
    assert len(_files(out)) == 6
    # overwrite replaces it
    make_sample(out, num_images=8, num_classes=2, overwrite=True)
    assert len(_files(out)) == 8
    # a foreign non-empty directory is never deleted, even with overwrite
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "precious.txt").write_text("keep")
    with pytest.raises(ConfigError, match="not made by make_sample"):
        make_sample(foreign, num_images=4, num_classes=2, overwrite=True)
    assert (foreign / "precious.txt").read_text() == "keep"
    # an empty directory may be filled with overwrite
    empty = tmp_path / "empty"
    empty.mkdir()
    make_sample(empty, num_images=2, num_classes=1, overwrite=True)
    assert len(_files(empty)) == 2
    # a file is refused
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(ConfigError, match="not a directory"):
        make_sample(f, num_images=2, num_classes=1, overwrite=True)
    # no temporary directories left behind
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"num_images": 0}, r"num_images must be an int in \[1, "),
        ({"num_images": 2.5}, "num_images must be an int"),
        ({"num_classes": 0}, r"num_classes must be an int in \[1, "),
        ({"num_classes": True}, "num_classes must be an int"),
        ({"num_images": 3, "num_classes": 4}, r"num_images \(3\) must be at least num_classes \(4\)"),
        ({"seed": -1}, r"seed must be an int in \[0, "),
        ({"size": (500,)}, r"size must be \(width, height\)"),
        ({"size": (8, 375)}, r"size must be \(width, height\)"),
        ({"quality": 101}, r"quality must be an int in \[1, 100\], got 101"),
        ({"workers": 0}, r"workers must be an int in \[1, 256\], got 0"),
    ],
)
def test_bad_arguments(tmp_path, kwargs, match):
    with pytest.raises(ConfigError, match=match):
        make_sample(tmp_path / "s", **kwargs)
    assert not (tmp_path / "s").exists()


def test_missing_scikit_image(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "skimage", None)  # makes the package unimportable and unfindable
    with pytest.raises(DependencyError, match=r"pip install 'fastload\[sample\]'"):
        make_sample(tmp_path / "s", num_images=2, num_classes=1)
    assert not (tmp_path / "s").exists()


def test_sample_module_does_not_import_skimage():
    import subprocess

    code = "import sys, fastload, fastload.sample; sys.exit('skimage' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def test_cli(tmp_path, capsys):
    out = tmp_path / "cli"
    assert main(["sample", str(out), "--images", "6", "--classes", "3", "--seed", "1"]) == 0
    assert "sample: 6 images, 3 classes" in capsys.readouterr().out
    assert len(_files(out)) == 6
    assert main(["sample", str(out), "--images", "9", "--classes", "3"]) == 2
    assert "fastload: error: out" in capsys.readouterr().err
    assert main(["sample", str(out), "--images", "9", "--classes", "3", "--overwrite"]) == 0
    assert len(_files(out)) == 9
    assert main(["sample", str(out), "--images", "0"]) == 2
    assert "num_images must be an int in [1, " in capsys.readouterr().err


@pytest.mark.slow
def test_full_sample_is_3000_images_of_about_100_kb(tmp_path):
    # what the README and the benchmarks describe the sample as (its speed is not a test's business)
    out = make_sample(tmp_path / "full")
    files = _files(out)
    assert len(files) == 3000
    mean_kb = np.mean([p.stat().st_size for p in files]) / 1e3
    assert 80 < mean_kb < 120


def test_crop_plans_fit_their_photo_for_any_number_of_images():
    """``fastload sample DIR --images 20000`` crashed on a window that rounding made a hair
    wider than its photo (``high - low < 0``); every plan of a 20,000-image sample fits."""
    from fastload import sample as s

    photo_dir = s.photo_dir()
    sizes = {}
    for _name, photos in s.CLASS_PHOTOS:
        for ph in photos:
            with Image.open(photo_dir / ph) as im:
                sizes[ph] = im.size
    num_classes, num_images, size = 10, 20_000, (500, 375)
    per_class = num_images // num_classes
    tight = 0
    for label in range(num_classes):
        photos = s.CLASS_PHOTOS[label % len(s.CLASS_PHOTOS)][1]
        for j in range(per_class):
            rng = np.random.default_rng([0, label, j])
            sw, sh = sizes[photos[int(rng.integers(len(photos)))]]
            w, h, (x0, y0, x1, y1) = s.crop_plan(rng, (sw, sh), size)
            assert w > 0 and h > 0
            assert 0 <= x0 <= x1 <= sw and 0 <= y0 <= y1 <= sh, (label, j, (sw, sh), (x0, y0, x1, y1))
            tight += x1 == sw or y1 == sh
    assert tight > 0  # the rounding case is among them
