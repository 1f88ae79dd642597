"""Sources: ImageFolder order exactly as torchvision's, list files, datasets."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from conftest import encode_color, write_image
from fastload.errors import ConfigError
from fastload.packing.sources import IMG_EXTENSIONS, DatasetSource, open_source, read_list, scan_folder


def _tree(root: Path) -> Path:
    """A tree with everything torchvision's ordering has to get right."""
    files = [
        "b/z.jpg", "b/a.JPG", "b/sub/x.png", "b/sub dir/y.jpeg", "b/sub/deeper/w.webp", "b/.hidden.jpg",
        "a/ü ñí cødé.jpg", "a/with space.PNG", "a/10.jpg", "a/9.jpg", "a/Upper.Tif", "a/m.bmp", "a/p.ppm",
        "a/g.pgm", "a/t.tiff", "c c/only.jpg",
    ]  # fmt: skip
    for i, f in enumerate(files):
        p = root / f
        fmt = {".jpg": "JPEG", ".jpeg": "JPEG", ".png": "PNG", ".webp": "WEBP", ".tif": "TIFF", ".tiff": "TIFF",
               ".bmp": "BMP", ".ppm": "PPM", ".pgm": "PPM"}[p.suffix.lower()]  # fmt: skip
        mode = "L" if p.suffix.lower() == ".pgm" else "RGB"
        write_image(p, encode_color(0, i), fmt=fmt, mode=mode)
    (root / "a" / "notes.txt").write_text("not an image")
    (root / "a" / "labels.csv").write_text("x,1\n")
    (root / "b" / "sub" / "README").write_text("x")
    (root / "stray.jpg").write_bytes(b"top-level files are not classes")
    return root


def test_folder_order_matches_torchvision(tmp_path):
    tv = pytest.importorskip("torchvision.datasets")
    root = _tree(tmp_path / "tree")
    # symlinked file and symlinked directory are followed, like os.walk(followlinks=True)
    os.symlink(root / "a" / "9.jpg", root / "c c" / "linked.jpg")
    os.symlink(root / "b" / "sub", root / "c c" / "linked_dir")
    src = scan_folder(root)
    ref = tv.ImageFolder(str(root))
    assert src.classes == ref.classes == ["a", "b", "c c"]
    assert [(it.path, it.label) for it in src.items] == [(p, t) for p, t in ref.samples]
    assert all(it.name == os.path.relpath(it.path, root) for it in src.items)
    assert not any(it.path.endswith((".txt", ".csv", "README")) for it in src.items)
    assert src.class_counts() == [sum(1 for _p, t in ref.samples if t == k) for k in range(3)]


def test_extensions_are_torchvision_s():
    from torchvision.datasets.folder import IMG_EXTENSIONS as TV

    assert tuple(IMG_EXTENSIONS) == tuple(TV)


def test_empty_class_folder_is_kept_with_a_warning(tmp_path, caplog):
    root = tmp_path / "t"
    write_image(root / "a" / "1.jpg", (1, 2, 3))
    (root / "b_empty" / "nested").mkdir(parents=True)
    write_image(root / "c" / "1.jpg", (1, 2, 3))
    with caplog.at_level(logging.WARNING, logger="fastload"):
        src = scan_folder(root)
    assert src.classes == ["a", "b_empty", "c"]
    assert [it.label for it in src.items] == [0, 2]
    assert src.class_counts() == [1, 0, 1]
    assert "b_empty" in caplog.text


def test_symlink_loop_terminates(tmp_path, caplog):
    root = tmp_path / "t"
    write_image(root / "a" / "1.jpg", (1, 2, 3))
    os.symlink(root / "a", root / "a" / "loop")
    with caplog.at_level(logging.WARNING, logger="fastload"):
        src = scan_folder(root)
    assert [it.name for it in src.items] == ["a/1.jpg"]
    assert "loop" in caplog.text


@pytest.mark.parametrize(
    "setup, message",
    [
        (lambda r: None, "no such file or directory"),
        (lambda r: r.mkdir(), "no class folders"),
        (lambda r: (r.mkdir(), (r / "x.jpg").write_bytes(b"")), "no class folders"),
        (lambda r: ((r / "a").mkdir(parents=True), (r / "a" / "x.txt").write_text("x")), "found no images"),
    ],
)
def test_folder_errors(tmp_path, setup, message):
    root = tmp_path / "src"
    setup(root)
    with pytest.raises(ConfigError, match=message):
        open_source(root)


def test_non_list_file_is_refused(tmp_path):
    p = write_image(tmp_path / "one.jpg", (1, 2, 3))
    with pytest.raises(ConfigError, match="not a list file"):
        open_source(p)


def test_csv_with_header_and_class_names(tmp_path):
    (tmp_path / "imgs").mkdir()
    lst = tmp_path / "train.csv"
    lst.write_text('path,label\nimgs/b.jpg,dog\n"imgs/with, comma.jpg",cat\n/abs/c.jpg,dog\n\n')
    src = read_list(lst)
    assert src.kind == "list"
    assert src.classes == ["cat", "dog"]
    assert [(it.path, it.name, it.label) for it in src.items] == [
        (str(tmp_path / "imgs/b.jpg"), "imgs/b.jpg", 1),
        (str(tmp_path / "imgs/with, comma.jpg"), "imgs/with, comma.jpg", 0),
        ("/abs/c.jpg", "/abs/c.jpg", 1),
    ]


def test_tsv_and_txt_with_int_labels(tmp_path):
    tsv = tmp_path / "l.tsv"
    tsv.write_text("a b.jpg\t2\n# comment\nc.jpg\t0\n")
    src = read_list(tsv)
    assert src.classes == ["0", "1", "2"]
    assert [(it.name, it.label) for it in src.items] == [("a b.jpg", 2), ("c.jpg", 0)]
    txt = tmp_path / "l.txt"
    txt.write_text("dir with space/a.jpg 1\nb.jpg 0\n")
    assert [(it.name, it.label) for it in read_list(txt).items] == [("dir with space/a.jpg", 1), ("b.jpg", 0)]


@pytest.mark.parametrize(
    "text, message",
    [
        ("", "no 'path,label' rows"),
        ("path,label\n", "no 'path,label' rows"),
        ("a.jpg,1\nb.jpg\n", r"l\.csv:2: expected 'path,label'"),
        ("a.jpg,-3\n", "label -3 is negative"),
    ],
)
def test_list_file_errors(tmp_path, text, message):
    p = tmp_path / "l.csv"
    p.write_text(text)
    with pytest.raises(ConfigError, match=message):
        read_list(p)


def test_fingerprint_changes_with_the_list(tmp_path):
    p = tmp_path / "l.csv"
    p.write_text("a.jpg,0\nb.jpg,1\n")
    f1 = read_list(p).fingerprint()
    assert read_list(p).fingerprint() == f1
    p.write_text("a.jpg,0\nb.jpg,0\n")
    assert read_list(p).fingerprint() != f1


class _DS:
    classes = ["x", "y"]

    def __init__(self, items):
        self.items = items

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        if self.items[i] is None:
            raise OSError("broken item")
        return self.items[i]


def test_dataset_tasks():
    img = Image.new("RGB", (4, 4))
    ds = _DS([(img, 1), (np.zeros((4, 4, 3), np.uint8), np.int64(0)), (b"bytes", 1), None, ("nonsense", 0)])
    src = DatasetSource(ds)
    assert src.classes == ["x", "y"] and len(src) == 5
    kinds = [t[0] for t in src.tasks()]
    assert kinds == ["pil", "array", "bytes", "error", "error"]
    assert "dataset raised OSError: broken item" in list(src.tasks(3))[0][1]


@pytest.mark.parametrize(
    "items, classes, message",
    [
        ([(b"x", -1)], None, "label -1 is negative"),
        ([(b"x", "cat")], None, "is not an integer"),
        ([(b"x", 5)], ["a", "b"], "outside the 2 classes"),
        ([b"x"], None, r"expected an \(image, label\) pair"),
    ],
)
def test_dataset_label_errors(items, classes, message):
    class D(list):
        pass

    src = DatasetSource(D(items), classes)
    with pytest.raises(ConfigError, match=message):
        list(src.tasks())


def test_dataset_without_len_or_empty():
    with pytest.raises(ConfigError, match="no len"):
        DatasetSource(iter([]))
    with pytest.raises(ConfigError, match="empty"):
        DatasetSource([])
