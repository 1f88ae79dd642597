"""fastload.cache: a replaced image file is noticed however it was replaced, its modification time kept or not.

``cp -p``, ``rsync -t`` and ``tar x`` all set the new file's modification time to the old file's;
BMP files of one size have one file size, so a BMP replaced by another image of the same size with
its mtime kept differs in nothing but its content, inode and status-change time. The expected
pixels come from the colour each image was written with (``encode_color``: the pixels carry their
label and index), read back from the entry the cache returns.
"""

from __future__ import annotations

import io
import os
import shutil
import tarfile
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import fastload
from fastload.cache import cached_pack

from conftest import decode_color, encode_color, write_image

torchvision = pytest.importorskip("torchvision")
from torchvision.datasets import ImageFolder  # noqa: E402


def colours(entry: Path) -> list[tuple[int, int]]:
    ds = fastload.Dataset(entry)
    out = []
    for i in range(len(ds)):
        payload, _ = ds[i]
        with Image.open(io.BytesIO(payload)) as im:
            out.append(decode_color(np.asarray(im.convert("RGB"), dtype=np.float64).reshape(-1, 3).mean(axis=0)))
    return out


def cp_p(new: Path, victim: Path) -> None:
    """``cp -p NEW VICTIM``: the content written over the same file, then NEW's times copied."""
    shutil.copy2(new, victim)


def keep_mtime_write(new: Path, victim: Path) -> None:
    """``rsync -t`` (by default: a temporary file renamed over the old one) with the old mtime kept."""
    st = victim.stat()
    tmp = victim.with_name(".victim.tmp")
    shutil.copyfile(new, tmp)
    os.replace(tmp, victim)
    os.utime(victim, ns=(st.st_atime_ns, st.st_mtime_ns))


def tar_x(new: Path, victim: Path) -> None:
    """``tar x`` of an archive holding the new image under the old name and the old mtime."""
    st = victim.stat()
    archive = victim.parent / "a.tar"
    with tarfile.open(archive, "w") as t:
        info = t.gettarinfo(str(new), arcname=victim.name)
        info.mtime = st.st_mtime
        with open(new, "rb") as f:
            t.addfile(info, f)
    victim.unlink()
    with tarfile.open(archive) as t:
        t.extractall(victim.parent, filter="data")
    archive.unlink()
    os.utime(victim, ns=(st.st_atime_ns, st.st_mtime_ns))  # tar keeps whole seconds: put the ns back too


def in_place(new: Path, victim: Path) -> None:
    """The same inode rewritten in place, its mtime put back (an editor, ``dd conv=notrunc``)."""
    st = victim.stat()
    victim.write_bytes(new.read_bytes())
    os.utime(victim, ns=(st.st_atime_ns, st.st_mtime_ns))


@pytest.mark.parametrize("replace", [cp_p, keep_mtime_write, tar_x, in_place], ids=lambda f: f.__name__)
def test_a_replaced_file_with_the_same_size_and_mtime_repacks(make_folder, tmp_path, replace):
    """Kills: a key of size and mtime alone (every replacement here keeps both), which reuses the old
    entry and trains on the old image."""
    root = make_folder(classes=2, per_class=2, size=(20, 12), ext=".bmp")
    folder = ImageFolder(str(root))
    entry = cached_pack(folder, cache_dir=tmp_path / "c", progress=False)
    assert colours(entry) == [(0, 0), (0, 1), (1, 2), (1, 3)]
    victim = Path(folder.samples[1][0])
    new = tmp_path / "new.bmp"
    write_image(new, encode_color(0, 77), size=(20, 12))
    before = victim.stat()
    assert new.stat().st_size == before.st_size  # nothing but the content differs...
    if replace is cp_p:
        os.utime(new, ns=(before.st_atime_ns, before.st_mtime_ns))  # ...cp -p copies these times
    replace(new, victim)
    after = victim.stat()
    assert (after.st_size, after.st_mtime_ns) == (before.st_size, before.st_mtime_ns)
    again = cached_pack(ImageFolder(str(root)), cache_dir=tmp_path / "c", progress=False)
    assert again != entry
    assert colours(again) == [(0, 0), (0, 77), (1, 2), (1, 3)]
    assert colours(entry) == [(0, 0), (0, 1), (1, 2), (1, 3)]  # the old entry is left as it was


def test_an_untouched_folder_reuses_its_entry(make_folder, tmp_path):
    root = make_folder(classes=2, per_class=2, size=(20, 12), ext=".bmp")
    entry = cached_pack(ImageFolder(str(root)), cache_dir=tmp_path / "c", progress=False)
    for p in sorted(root.rglob("*.bmp")):
        p.read_bytes()  # reading changes no status time
    assert cached_pack(ImageFolder(str(root)), cache_dir=tmp_path / "c", progress=False) == entry


@pytest.mark.parametrize(
    "root, slug",
    [
        (None, "dataset"),  # a dataset with no root
        ("/data/imagenet/train/", "train"),
        ("/data/My Photos (2024)!", "My_Photos_2024"),  # runs of other characters -> one "_", ends stripped
        ("/data/.../", "dataset"),  # nothing left after stripping dots
        ("/d/" + "a" * 50, "a" * 40),
        ("/d/\u00e9t\u00e9", "t"),  # ASCII only
        ("/d/-_.x.-_", "x"),
        ("/d/Xray-X", "Xray-X"),  # only "._-" stripped
    ],
)
def test_the_entry_name_starts_with_the_roots_name_made_safe(root, slug):
    """The rule by hand: the root's last component, runs of characters outside ``[A-Za-z0-9._-]`` as one
    ``_``, ``._-`` stripped at both ends, at most 40 characters, ``dataset`` when nothing is left or there is
    no root. Kills: a root of None read as a path, the cut, the stripping, the fallback name."""
    from fastload.cache import _slug

    assert _slug(root) == slug
