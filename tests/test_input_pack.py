"""Careless and hostile pack input: list files, labels, special files, sizes, odd images, names.

* A list file is parsed by its rows as a whole: a row that does not parse like the
  others (an unquoted comma, a label of the other kind, a label that is not plain
  ASCII digits, a label above ``MAX_CLASSES``) is an error naming the file and line,
  or a skipped row with that reason; it never renumbers the other rows' labels.
* Labels (list files and datasets) are checked against ``MAX_CLASSES`` before anything
  is allocated for them.
* Only regular files are read: a FIFO, socket or device (or a symlink to one) in SRC,
  in a list file, or swapped in after the scan is refused, never waited on or read
  forever; a list file that is a FIFO or a device is refused too.
* A file larger than ``8 * max_pixels + 16 MiB`` is refused from its size, unread.
* Whatever goes wrong converting one image (a side above JPEG's 65,500, an odd PIL
  mode, an exception in the encoder, a task that cannot be pickled) is that image's
  skip reason, never the pack's end.
* A JPEG is stored byte for byte only if it is Huffman-coded SOF0/1/2 8-bit.
* Names from folders (non-UTF-8 bytes, control characters, ANSI escapes) round-trip
  through the manifest and records, and are printed escaped.

Anything that could hang runs in a child process with a timeout.
"""

from __future__ import annotations

import enum
import io
import json
import logging
import os
import socket
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import fastload
from conftest import encode_color, write_image
from fastload import BadImageError, ConfigError
from fastload.cli import main
from fastload.format import FLAG_CONVERTED, FLAG_RESIZED, MANIFEST_NAME
from fastload.packing.images import JPEG_MAX_SIDE, ImageOptions, fast_file, max_file_bytes, process_task
from fastload.packing.sources import MAX_CLASSES, DatasetSource, open_source, read_list, scan_folder, stored_name

REPO = Path(__file__).resolve().parent.parent


def _child(code: str, *args: str, timeout: float = 60, memory: int | None = None) -> dict:
    """Run ``code`` in a fresh interpreter (a hang fails the test, it does not hang CI; with
    ``memory``, a huge allocation is a MemoryError there, not the OOM killer here); its
    last stdout line is JSON."""

    def limit() -> None:
        if memory is not None:
            import resource

            resource.setrlimit(resource.RLIMIT_AS, (memory, memory))

    r = subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=timeout, cwd=str(REPO / "tests"),
        preexec_fn=limit,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.splitlines()[-1])


def _jpeg(size=(64, 48), seed: int = 0, **save) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(np.random.default_rng(seed).integers(0, 255, (size[1], size[0], 3), dtype=np.uint8)).save(
        buf, "JPEG", quality=90, **save
    )
    return buf.getvalue()


def _sof_offset(jpeg: bytes) -> int:
    i = 2
    while True:
        marker, length = jpeg[i + 1], (jpeg[i + 2] << 8) | jpeg[i + 3]
        if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):
            return i
        i += 2 + length


def _images(root: Path, n: int) -> list[Path]:
    return [write_image(root / f"{i}.jpg", encode_color(i % 16, i), quality=95) for i in range(n)]


# ============================================================================ 1. list files


def test_an_unquoted_comma_is_an_error_naming_the_line(tmp_path):
    lst = tmp_path / "l.csv"
    lst.write_text("path,label\nimgs/0.jpg,0\nimgs/1.jpg,1\nimgs/a,b.jpg,3\nimgs/2.jpg,2\n")
    with pytest.raises(ConfigError) as e:
        read_list(lst, on_error="fail")
    assert str(e.value) == (
        f"SRC {lst}:4: expected 'path,label', got ['imgs/a', 'b.jpg', '3'] (3 columns where the other rows have 2)"
    )
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("workers", [1, 2])
def test_an_unquoted_comma_row_is_skipped_and_no_label_changes(tmp_path, capsys, workers):
    imgs = _images(tmp_path / "imgs", 3)
    lst = tmp_path / "l.csv"
    lst.write_text(f"{imgs[0]},0\n{imgs[1]},1\nimgs/a,b.jpg,3\n{imgs[2]},2\n")
    res = fastload.pack(lst, tmp_path / "out", workers=workers, progress=False)
    assert res.skipped == [{"path": f"{lst}:3", "reason": "expected 'path,label', got ['imgs/a', 'b.jpg', '3'] (3 columns where the other rows have 2)"}]
    ds = fastload.Dataset(tmp_path / "out")
    assert ds.classes == ["0", "1", "2"] and ds.labels.tolist() == [0, 1, 2]
    assert [ds.source_path(i) for i in range(3)] == [str(p) for p in imgs]
    # --on-error fail: one line naming the file and line, exit 2, nothing written
    capsys.readouterr()
    assert main(["pack", str(lst), str(tmp_path / "out2"), "--on-error", "fail"]) == 2
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(err) == 1 and f"{lst}:3: expected 'path,label'" in err[0], err
    assert not (tmp_path / "out2").exists() and not (tmp_path / "out2.partial").exists()


@pytest.mark.parametrize("label", ["1_0", "+1", "\u0661", "1.0", "0x1", "1e3", "\u00b2", "\uff11", "1\u00a0"])
def test_only_ascii_digits_are_integer_labels(tmp_path, label):
    """``int()`` accepts several of these; a list file of integers refuses the row."""
    lst = tmp_path / "l.csv"
    lst.write_text(f"a.jpg,0\nb.jpg,1\nc.jpg,{label}\nd.jpg,2\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"l\.csv:3: label .* is not an integer, but this list file's labels are integers"):
        read_list(lst, on_error="fail")
    src = read_list(lst, on_error="skip")
    assert src.classes == ["0", "1", "2"]
    assert [(t[0], t[2]) for t in src.tasks()] == [("file", 0), ("file", 1), ("error", 0), ("file", 2)]
    assert list(src.tasks())[2][4] == f"{lst}:3"


def test_an_integer_among_class_names_is_refused_not_a_renumbering(tmp_path):
    lst = tmp_path / "l.csv"
    lst.write_text("a.jpg,cat\nb.jpg,dog\nc.jpg,7\nd.jpg,cat\n")
    with pytest.raises(ConfigError, match=r"l\.csv:3: label '7' is an integer, but this list file's labels are class names \(3 of 4 rows\)"):
        read_list(lst, on_error="fail")
    src = read_list(lst, on_error="skip")
    assert src.classes == ["cat", "dog"] and [it.label for it in src.items if it.error is None] == [0, 1, 0]


def test_the_kind_is_decided_by_most_rows_then_by_the_first(tmp_path):
    lst = tmp_path / "l.csv"
    lst.write_text("a.jpg,5\nb.jpg,cat\nc.jpg,dog\n")  # first row an integer, most rows names
    src = read_list(lst, on_error="skip")
    assert src.classes == ["cat", "dog"] and [it.error is not None for it in src.items] == [True, False, False]
    lst.write_text("a.jpg,1\nb.jpg,cat\n")  # a tie: the first data row decides
    src = read_list(lst, on_error="skip")
    assert src.classes == ["0", "1"] and [it.error is not None for it in src.items] == [False, True]


def test_leading_zeros_and_spaces_around_cells(tmp_path):
    """Documented: ``007`` is 7; spaces and tabs around a cell are ignored."""
    lst = tmp_path / "l.csv"
    lst.write_text("a.jpg,007\nb.jpg, 0\n  c.jpg ,\t3 \n")
    src = read_list(lst)
    assert [(it.name, it.label) for it in src.items] == [("a.jpg", 7), ("b.jpg", 0), ("c.jpg", 3)]
    assert src.classes == [str(i) for i in range(8)]


_READ_LIST_CHILD = r"""
import json, sys, time
from fastload import ConfigError
from fastload.packing.sources import read_list
t0 = time.monotonic()
try:
    read_list(sys.argv[1], on_error="fail")
    err = None
except ConfigError as e:
    err = str(e)
print(json.dumps({"seconds": time.monotonic() - t0, "error": err, "skip": read_list(sys.argv[1], on_error="skip").classes}))
"""


@pytest.mark.parametrize("label", ["100000000", str(MAX_CLASSES), "9" * 5000, "-0", "-12"], ids=lambda v: v[:12])
def test_labels_are_capped_before_anything_is_allocated(tmp_path, label):
    lst = tmp_path / "l.txt"
    lst.write_text(f"a.jpg 0\nb.jpg {label}\nc.jpg 1\n")
    got = _child(_READ_LIST_CHILD, str(lst), timeout=60, memory=2 << 30)
    msg = got["error"]
    assert msg is not None and msg.startswith(f"SRC {lst}:2: label ") and len(msg) < 300, msg
    if label.startswith("-"):
        assert "is negative; labels are 0, 1, 2, ... or class names" in msg
    else:
        assert f"is too large; integer labels must be below {MAX_CLASSES} (MAX_CLASSES)" in msg
    assert got["skip"] == ["0", "1"] and got["seconds"] < 2


def test_the_largest_label_is_accepted(tmp_path):
    lst = tmp_path / "l.csv"
    lst.write_text(f"a.jpg,{MAX_CLASSES - 1}\n")
    assert len(read_list(lst).classes) == MAX_CLASSES


_PACK_CHILD = r"""
import json, sys, time
import fastload
t0 = time.monotonic()
res = fastload.pack(sys.argv[1], sys.argv[2], workers=int(sys.argv[3]), progress=False)
hwm = next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM:"))
print(json.dumps({"seconds": time.monotonic() - t0, "maxrss_mb": hwm / 1024, "samples": res.num_samples,
                  "classes": res.num_classes, "skipped": res.skipped}))
"""


def test_a_huge_label_row_is_skipped_in_a_small_pack(tmp_path):
    """Before: 10**8 classes allocated, the pack OOM-killed. In a child: a regression is a failure, not a dead CI."""
    imgs = _images(tmp_path / "imgs", 2)
    lst = tmp_path / "l.csv"
    lst.write_text(f"{imgs[0]},0\n{imgs[1]},100000000\n{imgs[1]},1\n")
    got = _child(_PACK_CHILD, str(lst), str(tmp_path / "out"), "1", timeout=120, memory=4 << 30)
    assert got["samples"] == 2 and got["classes"] == 2
    assert got["skipped"] == [{"path": f"{lst}:2", "reason": f"label 100000000 is too large; integer labels must be below {MAX_CLASSES} (MAX_CLASSES)"}]
    assert got["seconds"] < 20 and got["maxrss_mb"] < 400, got


@pytest.mark.parametrize(
    "text, line, reason",
    [
        ("a.jpg,0\n,3\nb.jpg,1\n", 2, "expected 'path,label', got ['', '3']"),
        ("a.jpg,0\nb.jpg,\nc.jpg,1\n", 2, "expected 'path,label', got ['b.jpg', '']"),
        ("a.jpg,0\nb\0c.jpg,1\nc.jpg,1\n", 2, "the path contains a NUL character"),
        ('a.jpg,0\n"b.jpg,1\nc.jpg,2\n', 2, "a quoted cell runs from line 2 to line 3 (a quote left open?)"),
        ("a.jpg,0\n" + "x" * 200_000 + ",1\nc.jpg,2\n", 2, "not a valid CSV row (field larger than field limit (131072))"),
        ("a.jpg,0\nb.jpg,1,extra\nc.jpg,2\n", 2, "expected 'path,label', got ['b.jpg', '1', 'extra'] (3 columns where the other rows have 2)"),
    ],
)
def test_malformed_rows(tmp_path, text, line, reason):
    lst = tmp_path / "l.csv"
    lst.write_text(text)
    with pytest.raises(ConfigError) as e:
        read_list(lst, on_error="fail")
    assert str(e.value) == f"SRC {lst}:{line}: {reason}"
    src = read_list(lst, on_error="skip")
    assert [t[1] for t in src.tasks() if t[0] == "error"] == [reason]
    assert [t[4] for t in src.tasks() if t[0] == "error"] == [f"{lst}:{line}"]


def test_a_list_where_no_row_parses_is_an_error_even_with_skip(tmp_path):
    lst = tmp_path / "l.csv"
    lst.write_text("just-a-path.jpg\nanother.jpg\n")
    with pytest.raises(ConfigError, match=r"l\.csv:1: expected 'path,label'"):
        open_source(lst, on_error="skip")


def test_a_list_that_is_not_utf8_names_the_line(tmp_path):
    lst = tmp_path / "l.csv"
    lst.write_bytes(b"a.jpg,0\nb\xff.jpg,1\n")
    with pytest.raises(ConfigError, match=r"l\.csv:2: cannot read list file: byte 0xff is not UTF-8"):
        read_list(lst)


def test_old_mac_line_endings_still_read(tmp_path):
    lst = tmp_path / "l.csv"
    lst.write_bytes(b"a.jpg,0\rb.jpg,1\r\nc.jpg,2\r")
    assert [it.label for it in read_list(lst).items] == [0, 1, 2]


def test_on_error_is_checked(tmp_path):
    lst = tmp_path / "l.csv"
    lst.write_text("a.jpg,0\n")
    with pytest.raises(ConfigError, match="on_error \\(--on-error\\): expected 'skip' or 'fail', got 'ignore'"):
        open_source(lst, on_error="ignore")


_OPEN_LIST_CHILD = r"""
import json, sys
from fastload import ConfigError
from fastload.packing.sources import open_source, read_list
out = {}
for p in sys.argv[1:]:
    for name, f in (("open_source", lambda: open_source(p, on_error="skip")), ("read_list", lambda: read_list(p))):
        try:
            f()
            out[p + " " + name] = "no error"
        except ConfigError as e:
            out[p + " " + name] = str(e)
print(json.dumps(out))
"""


@pytest.mark.timeout(30)  # a FIFO opened without O_NONBLOCK would wait for a writer forever
def test_a_list_file_that_is_a_fifo_or_a_device_is_refused_not_waited_on(tmp_path):
    fifo = tmp_path / "fifo.csv"
    os.mkfifo(fifo)
    zero = tmp_path / "zero.txt"
    zero.symlink_to("/dev/zero")
    sock_path = tmp_path / "sock.csv"
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(sock_path))
    try:
        got = _child(_OPEN_LIST_CHILD, str(fifo), str(zero), str(sock_path), timeout=60)
    finally:
        sock.close()
    assert got[f"{fifo} open_source"].startswith(f"SRC {fifo}: not a regular file (FIFO); pass an ImageFolder directory")
    assert got[f"{fifo} read_list"] == f"SRC {fifo}: not a regular file (FIFO); a list file must be a regular file"
    assert got[f"{zero} open_source"].startswith(f"SRC {zero}: not a regular file (character device)")
    assert got[f"{zero} read_list"] == f"SRC {zero}: not a regular file (character device); a list file must be a regular file"
    assert got[f"{sock_path} open_source"].startswith(f"SRC {sock_path}: not a regular file (socket)")
    assert got[f"{sock_path} read_list"].startswith(f"SRC {sock_path}: cannot read list file")


# ============================================================================ 2. dataset labels


class _Ints(enum.IntEnum):
    ONE = 1


def _bad_labels() -> list:
    labels = [10**9, MAX_CLASSES, np.int64(10**9), np.uint64(2**63), True, np.bool_(True), 1.0, np.float32(1),
              np.array([1, 2]), "3", None, -1, np.int8(-1)]  # fmt: skip
    try:
        import torch

        labels += [torch.tensor([1, 2]), torch.tensor(1.0)]
    except ImportError:  # pragma: no cover
        pass
    return labels


@pytest.mark.parametrize("label", _bad_labels(), ids=lambda v: f"{type(v).__name__}:{str(v)[:12]}")
def test_bad_dataset_labels_are_refused(label):
    src = DatasetSource([(b"x", label)])
    with pytest.raises(ConfigError, match=r"^dataset\[0\]: label .* (is not an integer|is negative|is too large)") as e:
        list(src.tasks())
    assert "\n" not in str(e.value)


def test_good_dataset_labels_of_any_integer_type(tmp_path):
    import torch

    img = np.full((8, 8, 3), 100, np.uint8)
    labels = [np.int32(1), np.uint8(2), torch.tensor(3), np.array(4), _Ints.ONE, MAX_CLASSES - 1]
    src = DatasetSource([(img, v) for v in labels])
    assert [t[2] for t in src.tasks()] == [1, 2, 3, 4, 1, MAX_CLASSES - 1]
    assert all(type(t[2]) is int for t in src.tasks())


_DATASET_CHILD = r"""
import json, sys, time
import numpy as np
import fastload
t0 = time.monotonic()
items = [(np.full((8, 8, 3), 100, np.uint8), 0), (np.full((8, 8, 3), 100, np.uint8), 10**9)]
try:
    fastload.pack_dataset(items, sys.argv[1], workers=1, progress=False)
    err = None
except fastload.ConfigError as e:
    err = str(e)
hwm = next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM:"))
print(json.dumps({"seconds": time.monotonic() - t0, "maxrss_mb": hwm / 1024, "error": err}))
"""


def test_a_huge_dataset_label_allocates_nothing(tmp_path):
    got = _child(_DATASET_CHILD, str(tmp_path / "out"), timeout=120, memory=4 << 30)
    assert got["error"] == f"dataset[1]: label 1000000000 is too large; labels must be below {MAX_CLASSES} (MAX_CLASSES)"
    assert got["seconds"] < 20 and got["maxrss_mb"] < 400, got
    assert sorted(os.listdir(tmp_path)) == []


def test_dataset_class_names_that_are_not_utf8_round_trip(tmp_path):
    img = np.full((8, 8, 3), 100, np.uint8)
    classes = ["caf\udce9", "lone\ud800", "esc\x1b[31m"]
    fastload.pack_dataset([(img, 0), (img, 1), (img, 2)], tmp_path / "out", classes=classes, workers=1, progress=False)
    raw = (tmp_path / "out" / MANIFEST_NAME).read_bytes()
    assert json.loads(raw.decode("utf-8"))["classes"] == ["caf\\xe9", "lone\\ud800", "esc\x1b[31m"]
    assert fastload.Dataset(tmp_path / "out").classes == ["caf\\xe9", "lone\\ud800", "esc\x1b[31m"]


def test_a_bottomless_classes_iterable_is_refused():
    code = r"""
import itertools, json
from fastload import ConfigError
from fastload.packing.sources import DatasetSource
try:
    DatasetSource([(b"x", 0)], classes=itertools.count())
    print(json.dumps(None))
except ConfigError as e:
    print(json.dumps(str(e)))
"""
    assert _child(code, timeout=60, memory=2 << 30) == f"classes: more than {MAX_CLASSES} class names; at most {MAX_CLASSES} (MAX_CLASSES) are supported"


# ============================================================================ 3. only regular files


def _special_tree(root: Path) -> tuple[Path, dict[str, str], socket.socket]:
    """Good images and, named like images, every kind of file that is not a regular one."""
    a = root / "a"
    _images(a, 2)
    write_image(root / "b" / "0.png", encode_color(1, 2))
    (a / "dir.jpg").mkdir()  # a directory named like an image: walked into, like torchvision
    write_image(a / "dir.jpg" / "inner.jpg", encode_color(0, 3), quality=95)
    (root / "b" / "link_to_good.jpg").symlink_to(a / "0.jpg")
    os.mkfifo(a / "fifo.jpg")
    (a / "zero.jpg").symlink_to("/dev/zero")
    (a / "urandom.png").symlink_to("/dev/urandom")
    (root / "b" / "null.webp").symlink_to("/dev/null")
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(a / "sock.jpg"))
    reasons = {
        str(a / "fifo.jpg"): "not a regular file (FIFO)",
        str(a / "sock.jpg"): "not a regular file (socket)",
        str(a / "urandom.png"): "not a regular file (character device)",
        str(a / "zero.jpg"): "not a regular file (character device)",
        str(root / "b" / "null.webp"): "not a regular file (character device)",
    }
    return root, reasons, sock


@pytest.mark.parametrize("workers", [1, 2])
def test_special_files_in_a_folder_are_skipped_not_read(tmp_path, workers):
    src, reasons, sock = _special_tree(tmp_path / "src")
    try:
        got = _child(_PACK_CHILD, str(src), str(tmp_path / "out"), str(workers), timeout=120)
    finally:
        sock.close()
    assert {s["path"]: s["reason"] for s in got["skipped"]} == reasons
    ds = fastload.Dataset(tmp_path / "out")
    assert [ds.source_path(i) for i in range(len(ds))] == ["a/0.jpg", "a/1.jpg", "a/dir.jpg/inner.jpg", "b/0.png", "b/link_to_good.jpg"]
    assert ds.record(4)[1] == (src / "a" / "0.jpg").read_bytes()  # a symlink to a regular file is fine
    assert got["seconds"] < 30


def test_the_scan_says_what_is_not_a_regular_file(tmp_path):
    src, reasons, sock = _special_tree(tmp_path / "src")
    sock.close()
    s = scan_folder(src)
    assert {t[4]: t[1] for t in s.tasks() if t[0] == "error"} == reasons
    assert s.class_counts() == [3, 2]


@pytest.mark.timeout(30)  # a FIFO opened without O_NONBLOCK would wait for a writer forever
def test_special_files_in_a_list_are_skipped_not_read(tmp_path):
    imgs = _images(tmp_path / "imgs", 1)
    os.mkfifo(tmp_path / "fifo.jpg")
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(tmp_path / "sock.jpg"))
    lst = tmp_path / "l.csv"
    lst.write_text(f"{imgs[0]},0\nfifo.jpg,0\n/dev/zero,1\n/dev/urandom,1\nsock.jpg,0\n{tmp_path}/imgs,0\n")
    try:
        got = _child(_PACK_CHILD, str(lst), str(tmp_path / "out"), "1", timeout=120)
    finally:
        sock.close()
    assert got["samples"] == 1
    assert got["skipped"] == [
        {"path": str(tmp_path / "fifo.jpg"), "reason": "not a regular file (FIFO)"},
        {"path": "/dev/zero", "reason": "not a regular file (character device)"},
        {"path": "/dev/urandom", "reason": "not a regular file (character device)"},
        {"path": str(tmp_path / "sock.jpg"), "reason": "not a regular file (socket)"},
        {"path": f"{tmp_path}/imgs", "reason": "not a regular file (directory)"},
    ]


_SWAP_CHILD = r"""
import json, os, sys
from fastload.packing.images import ImageOptions, fast_file, process_task
from fastload.packing.sources import scan_folder
from fastload.imaging import pil_settings
src = scan_folder(sys.argv[1])
tasks = list(src.tasks())
assert [t[0] for t in tasks] == ["file", "file"]
os.remove(tasks[0][1]); os.mkfifo(tasks[0][1])            # replaced after the scan
os.remove(tasks[1][1]); os.symlink("/dev/zero", tasks[1][1])
opts = ImageOptions()
with pil_settings():
    print(json.dumps([[list(fast_file(t, opts)), list(process_task(t, opts))] for t in tasks]))
"""


def test_a_special_file_swapped_in_after_the_scan_is_refused_at_open(tmp_path):
    _images(tmp_path / "src" / "a", 2)
    got = _child(_SWAP_CHILD, str(tmp_path / "src"), timeout=60)
    a = tmp_path / "src" / "a"
    for (fast, full), name, kind in zip(got, ["0.jpg", "1.jpg"], ["FIFO", "character device"]):
        assert fast == full == ["skip", str(a / name), f"not a regular file ({kind})"]


# ============================================================================ 4. file sizes


_BIG_CHILD = r"""
import json, sys, time
import fastload
from fastload.imaging import pil_settings
from fastload.packing.images import ImageOptions, process_task
t0 = time.monotonic()
res = fastload.pack(sys.argv[1], sys.argv[2], workers=1, progress=False)
t1 = time.monotonic()
with pil_settings():
    full = [list(process_task(("file", p, 0, p, p), ImageOptions())) for p in sys.argv[3:]]
hwm = next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM:"))
print(json.dumps({"pack_s": t1 - t0, "full_s": time.monotonic() - t1, "maxrss_mb": hwm / 1024,
                  "skipped": res.skipped, "full": full, "samples": res.num_samples}))
"""


def test_a_file_larger_than_any_allowed_image_is_refused_unread(tmp_path):
    """A 6 GB sparse file that starts like a JPEG (or a PNG): refused from its size, fast and small."""
    a = tmp_path / "src" / "a"
    good = _images(a, 1)[0]
    big_jpg, big_png = a / "big.jpg", a / "big.png"
    with open(big_jpg, "wb") as f:
        f.write(good.read_bytes()[:600])
        f.truncate(6 << 30)
    with open(big_png, "wb") as f:
        f.write(b"\x89PNG\r\n\x1a\n")
        f.truncate(6 << 30)
    assert big_jpg.stat().st_blocks * 512 < 1 << 20  # the test itself stays small
    got = _child(_BIG_CHILD, str(tmp_path / "src"), str(tmp_path / "out"), str(big_jpg), str(big_png), timeout=120)
    limit = max_file_bytes(89_478_485)
    assert limit == 8 * 89_478_485 + (16 << 20)
    reason = (
        f"file too large: {6 << 30} bytes, more than the {limit} bytes an image within --max-pixels 89478485 "
        "can need (8 bytes per pixel + 16 MiB)"
    )
    assert got["samples"] == 1 and got["skipped"] == [{"path": str(big_jpg), "reason": reason}, {"path": str(big_png), "reason": reason}]
    assert got["full"] == [["skip", str(big_jpg), reason], ["skip", str(big_png), reason]]  # the worker path too
    assert got["pack_s"] < 10 and got["full_s"] < 5 and got["maxrss_mb"] < 300, got


def test_the_size_limit_follows_max_pixels(tmp_path):
    small = _jpeg((20, 20))
    big = b"\xff\xd8\xff" + bytes(max_file_bytes(1000) + 1 - 3)
    res = fastload.pack_dataset([(big, 0), (small, 0)], tmp_path / "out", max_pixels=1000, workers=1, progress=False)
    assert res.num_samples == 1
    assert res.skipped == [{"path": "dataset[0]", "reason": f"image bytes too large: {len(big)} bytes, more than the "
                            f"{max_file_bytes(1000)} bytes an image within --max-pixels 1000 can need (8 bytes per pixel + 16 MiB)"}]  # fmt: skip
    d = tmp_path / "src" / "a"
    d.mkdir(parents=True)
    (d / "big.jpg").write_bytes(big)
    (d / "ok.jpg").write_bytes(small)
    res = fastload.pack(tmp_path / "src", tmp_path / "out2", max_pixels=1000, workers=1, progress=False)
    assert [s["reason"].split(":")[0] for s in res.skipped] == ["file too large"] and res.num_samples == 1


# ============================================================================ 5. per-image failures


def _png(size) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", size, (10, 200, 30)).save(buf, "PNG")
    return buf.getvalue()


@pytest.mark.parametrize("workers", [1, 2])
def test_sides_jpeg_cannot_hold_are_refused_and_shrunk_with_max_size(tmp_path, workers):
    a = tmp_path / "src" / "a"
    a.mkdir(parents=True)
    (a / "wide.png").write_bytes(_png((65_535, 1)))
    (a / "tall.png").write_bytes(_png((1, 70_000)))
    wide_jpeg = bytearray(_jpeg())
    struct.pack_into(">HH", wide_jpeg, _sof_offset(bytes(wide_jpeg)) + 5, 1, 65_535)
    (a / "wide.jpg").write_bytes(wide_jpeg)
    _images(a, 1)
    res = fastload.pack(tmp_path / "src", tmp_path / "out", workers=workers, progress=False)
    assert res.num_samples == 1
    assert {Path(s["path"]).name: s["reason"] for s in res.skipped} == {
        "wide.png": f"65535x1 pixels: a JPEG side cannot exceed {JPEG_MAX_SIDE} pixels; shrink it with --max-size 65500 or less",
        "tall.png": f"1x70000 pixels: a JPEG side cannot exceed {JPEG_MAX_SIDE} pixels; shrink it with --max-size 65500 or less",
        "wide.jpg": f"JPEG of 65535x1 pixels: JPEG decoders (libjpeg) refuse a side above {JPEG_MAX_SIDE} pixels",
    }
    # a resume of that pack has nothing to fail on either; with --max-size the PNGs pack
    res = fastload.pack(tmp_path / "src", tmp_path / "out2", workers=workers, max_size=1000, progress=False)
    assert [Path(s["path"]).name for s in res.skipped] == ["wide.jpg"]
    ds = fastload.Dataset(tmp_path / "out2")
    sizes = {Path(ds.source_path(i)).name: (ds.header(i).width, ds.header(i).height, ds.header(i).flags & FLAG_RESIZED) for i in range(len(ds))}
    assert sizes == {"0.jpg": (64, 48, 0), "tall.png": (1, 1000, FLAG_RESIZED), "wide.png": (1000, 1, FLAG_RESIZED)}


_MODES = ["1", "L", "LA", "P", "PA", "RGBA", "RGBX", "CMYK", "YCbCr", "LAB", "HSV", "I", "I;16", "I;16B", "I;16L", "F"]


@pytest.mark.parametrize("workers", [1, 2])
def test_pil_images_in_odd_modes_pack_or_are_refused_with_a_reason(tmp_path, workers):
    items = [(Image.new(m, (16, 12)), 0) for m in _MODES]
    p = Image.new("P", (16, 12))
    p.info["transparency"] = 0
    items += [(p, 0), (Image.new("La", (16, 12)), 0)]
    res = fastload.pack_dataset(items, tmp_path / "out", workers=workers, progress=False)
    assert res.skipped == [{"path": f"dataset[{len(items) - 1}]", "reason": "cannot convert mode La to RGB (conversion from La to L not supported)"}]
    ds = fastload.Dataset(tmp_path / "out")
    assert len(ds) == len(items) - 1 and all(ds.header(i).flags & FLAG_CONVERTED for i in range(len(ds)))
    assert all(Image.open(io.BytesIO(ds[i][0])).size == (16, 12) for i in range(len(ds)))


def test_arrays_of_odd_dtypes_and_shapes_are_refused_with_a_reason(tmp_path):
    ok = np.full((6, 8, 3), 90, np.uint8)
    items = [
        (np.zeros((6, 8, 3), bool), "array dtype bool is not uint8"),
        (np.zeros((6, 8), np.float64), "array dtype float64 is not uint8"),
        (np.zeros((6, 8, 3), ">u2"), "array dtype >u2 is not uint8"),
        (np.empty((6, 8), object), "array dtype object is not uint8"),
        (np.zeros((), np.uint8), "array shape () is not HxW, HxWx1, HxWx3 or HxWx4"),
        (np.zeros((2, 6, 8, 3), np.uint8), "array shape (2, 6, 8, 3) is not HxW, HxWx1, HxWx3 or HxWx4"),
        (np.zeros((1, 70_000), np.uint8), "70000x1 pixels: a JPEG side cannot exceed 65500 pixels; shrink it with --max-size 65500 or less"),
        (ok[:, ::2], None),  # not contiguous
        (np.broadcast_to(np.uint8(7), (6, 8)), None),  # zero strides
        (ok[:, :, :1], None),
    ]
    res = fastload.pack_dataset([(a, 0) for a, _ in items], tmp_path / "out", workers=1, progress=False)
    assert [s["reason"] for s in res.skipped] == [r for _, r in items if r]
    assert res.num_samples == 3


@pytest.mark.parametrize("workers", [1, 2])
def test_an_unexpected_exception_converting_one_image_is_its_reason(tmp_path, monkeypatch, workers):
    """Anything an encoder or decoder raises for one image skips it (inline or in a worker)."""
    from fastload.packing import images

    real = images._encode_jpeg

    def encode(im, quality):
        if im.size == (13, 7):
            raise RuntimeError("encoder exploded\n\x1b[31mred")
        return real(im, quality)

    monkeypatch.setattr(images, "_encode_jpeg", encode)
    src = tmp_path / "src" / "a"
    write_image(src / "odd.png", (1, 2, 3), size=(13, 7))
    write_image(src / "ok.png", (1, 2, 3), size=(14, 7))
    res = fastload.pack(tmp_path / "src", tmp_path / "out", workers=workers, progress=False)
    assert res.num_samples == 1
    assert res.skipped == [{"path": str(src / "odd.png"), "reason": "cannot convert this image (RuntimeError: encoder exploded)"}]
    with pytest.raises(BadImageError, match=r"odd\.png: cannot convert this image \(RuntimeError: encoder exploded\)$"):
        fastload.pack(tmp_path / "src", tmp_path / "out3", workers=workers, on_error="fail", progress=False)


def test_a_task_that_cannot_travel_to_a_worker_is_converted_here(tmp_path):
    im = Image.new("RGB", (9, 9), (1, 2, 3))
    im.info["callback"] = lambda: None  # a PIL image whose info cannot be pickled
    items = [(im, 0)] + [(np.full((8, 8, 3), i, np.uint8), 0) for i in range(40)]
    res = fastload.pack_dataset(items, tmp_path / "out", workers=2, progress=False)
    assert res.skipped == [] and res.num_samples == 41
    assert fastload.Dataset(tmp_path / "out").header(0).width == 9


def test_process_task_never_raises_for_a_strange_task():
    from fastload.imaging import pil_settings

    opts = ImageOptions()

    class NotAnImage:
        size = property(lambda self: (_ for _ in ()).throw(KeyError("size")))

    with pil_settings():
        for task in [("pil", NotAnImage(), 0, "x", "x"), ("array", np.zeros((4, 4), np.uint8)[None, None], 0, "x", "x"),
                     ("file", "a\0b.jpg", 0, "x", "x"), ("bytes", b"\xff\xd8\xff", 0, "x", "x")]:  # fmt: skip
            r = process_task(task, opts)
            assert isinstance(r, tuple) and r[0] == "skip" and r[2], r
        assert fast_file(("file", "a\0b.jpg", 0, "x", "x"), opts) == ("skip", "x", "unreadable (the path contains a NUL character)")


# ============================================================================ 6. JPEG frame types


_NOT_PASSTHROUGH = [0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF]


@pytest.mark.parametrize("workers", [1, 2])
def test_only_huffman_8bit_sof0_1_2_jpegs_are_stored_byte_for_byte(tmp_path, workers):
    base = _jpeg()
    sof = _sof_offset(base)
    a = tmp_path / "src" / "a"
    a.mkdir(parents=True)
    raws = {}
    for m in [0xC1] + _NOT_PASSTHROUGH:
        b = bytearray(base)
        b[sof + 1] = m
        for tail in (b"", b"\0" * 100):  # with trailing data the PIL path decides, not the header scan
            name = f"sof{m - 0xC0:02d}{'_tail' if tail else ''}.jpg"
            raws[name] = bytes(b) + tail
            (a / name).write_bytes(raws[name])
    b = bytearray(base)
    b[sof + 4] = 12  # 12-bit precision
    (a / "bits12.jpg").write_bytes(bytes(b))
    res = fastload.pack(tmp_path / "src", tmp_path / "out", workers=workers, progress=False)
    skipped = {Path(s["path"]).name: s["reason"] for s in res.skipped}
    assert skipped.pop("bits12.jpg") == "12-bit baseline (SOF0) JPEG: only 8-bit JPEGs can be decoded and stored"
    ds = fastload.Dataset(tmp_path / "out")
    stored = {Path(ds.source_path(i)).name: ds.record(i) for i in range(len(ds))}
    assert stored["sof01.jpg"][1] == raws["sof01.jpg"] and stored["sof01.jpg"][0].flags == 0
    assert stored["sof01_tail.jpg"][1] == raws["sof01_tail.jpg"]
    for name, raw in raws.items():
        if name.startswith("sof01"):
            continue
        n = int(name[3:5])
        assert (name in stored) != (name in skipped), name
        if name in stored:  # decoded and re-encoded as baseline
            h, payload = stored[name]
            assert payload != raw and h.flags & FLAG_CONVERTED, name
            assert payload[_sof_offset(payload) + 1] == 0xC0
        else:
            assert f"(SOF{n})" in skipped[name] and "cannot be decoded" in skipped[name], skipped[name]
    assert any(k.startswith("sof03") for k in skipped)  # lossless: not decodable from Huffman data


def test_frame_type_names_in_the_reason(tmp_path):
    base = bytearray(_jpeg())
    base[_sof_offset(bytes(base)) + 1] = 0xC3
    r = process_task(("bytes", bytes(base), 0, "x", "x"), ImageOptions())
    assert r[0] == "skip" and r[2].startswith("lossless (SOF3) JPEG cannot be decoded ("), r


# ============================================================================ 7. names


def _name_tree(root: Path) -> Path:
    rb = os.fsencode(root)
    for d in (b"caf\xe9", b"\x1b[31mred", b"plain", b"\x1b]0;title\x07empty"):
        os.makedirs(rb + b"/" + d)
    Image.new("RGB", (8, 8), (1, 2, 3)).save(os.fsdecode(rb + b"/caf\xe9/\xff\xfe.jpg"), "JPEG")
    Image.new("RGB", (8, 8), (1, 2, 3)).save(os.fsdecode(rb + b"/\x1b[31mred/\x07bell\nline.jpg"), "JPEG")
    Image.new("RGB", (8, 8), (1, 2, 3)).save(os.fsdecode(rb + b"/plain/ok.jpg"), "JPEG")
    with open(rb + b"/\x1b[31mred/\x1b[2Jclear\xff.jpg", "wb"):  # refused: zero bytes (FIFOs are tested in a child)
        pass
    return root


def test_names_from_folders_round_trip_and_are_printed_escaped(tmp_path, caplog):
    src = _name_tree(tmp_path / "src")
    with caplog.at_level(logging.DEBUG, logger="fastload"):
        res = fastload.pack(src, tmp_path / "out", workers=1, progress=False)
    raw = (tmp_path / "out" / MANIFEST_NAME).read_bytes()
    m = json.loads(raw.decode("utf-8"))  # strict UTF-8 JSON
    classes = ["\x1b[31mred", "\x1b]0;title\x07empty", "caf\\xe9", "plain"]
    assert m["classes"] == classes and m["class_counts"] == [1, 0, 1, 1]
    ds = fastload.Dataset(tmp_path / "out")
    assert ds.classes == classes
    paths = [ds.source_path(i) for i in range(len(ds))]
    assert paths == ["\x1b[31mred/\x07bell\nline.jpg", "caf\udce9/\udcff\udcfe.jpg", "plain/ok.jpg"]
    assert all(os.path.isfile(os.path.join(src, p)) for p in paths)  # the stored bytes are the file's name
    assert res.skipped == [{"path": f"{src}/\\x1b[31mred/\\x1b[2Jclear\\xff.jpg", "reason": "zero-byte file"}]
    assert "\x1b" not in caplog.text and "\x07" not in caplog.text and "empty folder" not in caplog.text
    assert "\\x1b]0;title\\x07empty" in caplog.text  # the empty class folder warning, escaped
    with pytest.raises(BadImageError) as e:
        fastload.pack(src, tmp_path / "out2", workers=1, on_error="fail", progress=False)
    assert str(e.value) == f"{src}/\\x1b[31mred/\\x1b[2Jclear\\xff.jpg: zero-byte file"


def test_names_from_folders_on_the_command_line(tmp_path, capsys):
    src = _name_tree(tmp_path / "src")
    capsys.readouterr()
    assert main(["pack", str(src), str(tmp_path / "out"), "--on-error", "fail"]) == 2
    err = capsys.readouterr().err
    assert "\x1b" not in err and "\x07" not in err
    lines = err.splitlines()
    assert len(lines) == 2 and "empty class folder" in lines[0]  # the warning, then the error
    assert lines[1].startswith("fastload: error: ") and lines[1].endswith("\\x1b[2Jclear\\xff.jpg: zero-byte file")


def test_class_folders_that_would_share_a_name_are_refused(tmp_path):
    rb = os.fsencode(tmp_path / "src")
    for d in (b"a\xff", b"a\\xff"):
        os.makedirs(rb + b"/" + d)
        Image.new("RGB", (8, 8)).save(os.fsdecode(rb + b"/" + d + b"/1.jpg"), "JPEG")
    with pytest.raises(ConfigError, match=r"are both stored as class 'a\\\\xff'.*rename one of them"):
        scan_folder(tmp_path / "src")


def test_stored_name():
    assert stored_name("plain ü") == "plain ü"
    assert stored_name("caf\udce9") == "caf\\xe9"
    assert stored_name("x\ud800y") == "x\\ud800y"
    assert stored_name("\x1b[31m") == "\x1b[31m"  # valid text: JSON escapes it and reads it back


@pytest.mark.parametrize("second", [(64, 48), (32, 24)])
def test_a_jpeg_with_two_frame_headers_is_never_stored_as_is(tmp_path, second):
    """PIL sizes a JPEG by its last SOF, decoders by the first: only a single-frame JPEG passes through."""
    base = _jpeg()
    i = _sof_offset(base)
    length = (base[i + 2] << 8) | base[i + 3]
    extra = bytearray(base[i : i + 2 + length])
    struct.pack_into(">HH", extra, 5, second[1], second[0])
    raw = base[: i + 2 + length] + bytes(extra) + base[i + 2 + length :]
    a = tmp_path / "src" / "a"
    a.mkdir(parents=True)
    (a / "two.jpg").write_bytes(raw)
    _images(a, 1)
    res = fastload.pack(tmp_path / "src", tmp_path / "out", workers=1, progress=False)
    ds = fastload.Dataset(tmp_path / "out")
    stored = {Path(ds.source_path(k)).name: ds.record(k) for k in range(len(ds))}
    assert "0.jpg" in stored
    if "two.jpg" in stored:
        h, payload = stored["two.jpg"]
        assert payload != raw and h.flags & FLAG_CONVERTED
        assert struct.unpack_from(">HH", payload, _sof_offset(payload) + 5) == (h.height, h.width)
    else:
        assert [Path(s["path"]).name for s in res.skipped] == ["two.jpg"]


def test_a_jpeg_longer_than_the_readers_walk_is_converted_not_stored(tmp_path):
    """A JPEG with more marker segments before its frame header than the readers walk
    (format.MAX_JPEG_SEGMENTS) would pack byte for byte and then be refused on every read."""
    import io

    from PIL import Image

    from fastload.format import FLAG_CONVERTED, MAX_JPEG_SEGMENTS

    buf = io.BytesIO()
    Image.new("RGB", (32, 24), (200, 40, 90)).save(buf, "JPEG", quality=95)
    raw = buf.getvalue()
    comments = b"".join(b"\xff\xfe\x00\x04ab" for _ in range(MAX_JPEG_SEGMENTS + 10))
    (tmp_path / "src" / "a").mkdir(parents=True)
    (tmp_path / "src" / "a" / "long.jpg").write_bytes(raw[:2] + comments + raw[2:])
    (tmp_path / "src" / "a" / "plain.jpg").write_bytes(raw)
    fastload.pack(tmp_path / "src", tmp_path / "out", progress=False, workers=1)
    ds = fastload.Dataset(tmp_path / "out", check=True)
    flags = {ds.source_path(i).rsplit("/", 1)[1]: ds.header(i).flags for i in range(len(ds))}
    assert flags["long.jpg"] & FLAG_CONVERTED and not flags["plain.jpg"] & FLAG_CONVERTED
    for i in range(len(ds)):
        payload, _ = ds[i]  # every record reads back
        assert Image.open(io.BytesIO(payload)).size == (32, 24)
