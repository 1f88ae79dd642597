"""``labels.bin`` read against its documented layout (docs/format.md: one little-endian int32 per sample,
its SHA-256 in the manifest), with every refusal's message checked whole.

The labels files here are written by the test with NumPy and their hash with ``hashlib``, a second way from
the reader's own decoding; the images' pixels encode (label, index), so a label the reader got wrong shows
against the pixels too.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

import fastload
from fastload.errors import CorruptDataError, FormatError

from conftest import paint_folder


@pytest.fixture(scope="module")
def packed(tmp_path_factory) -> Path:
    """Two classes of three images (labels 0,0,0,1,1,1), packed."""
    root = tmp_path_factory.mktemp("labels")
    paint_folder(root / "images", 2, 3)
    fastload.pack(root / "images", root / "ds", progress=False)
    return root / "ds"


@pytest.fixture
def copy(packed, tmp_path) -> Path:
    shutil.copytree(packed, tmp_path / "ds")
    return tmp_path / "ds"


def relabel(ds: Path, values: list[int], dtype: str = "<i4") -> None:
    """Write ``values`` as labels.bin and its SHA-256 into the manifest, as a packer of this layout would."""
    raw = np.asarray(values, dtype=dtype).tobytes()
    (ds / "labels.bin").write_bytes(raw)
    m = json.loads((ds / "manifest.json").read_text())
    m["labels"]["sha256"] = hashlib.sha256(raw).hexdigest()
    (ds / "manifest.json").write_text(json.dumps(m))


def test_labels_are_the_little_endian_int32s_of_the_file_read_only_int64(copy):
    """Written for labels decoded in the wrong byte order or width, or handed out writable: they are
    the file's little-endian int32 values, as int64, read-only; and a record whose header disagrees
    with them is named with both labels."""
    relabel(copy, [0, 1, 0, 1, 1, 0])
    ds = fastload.Dataset(copy)
    assert ds.labels.tolist() == [0, 1, 0, 1, 1, 0]
    assert ds.labels.dtype == np.int64 and not ds.labels.flags.writeable
    assert ds[0][1] == 0 and ds[2][1] == 0  # the stored headers say 0 there too
    with pytest.raises(CorruptDataError) as e:
        ds[1]  # its header says 0 (the image of class_0), labels.bin says 1
    assert str(e.value) == f"{copy}/shard-00000.lmdb sample 1: label 0 differs from labels.bin (1)"


@pytest.mark.parametrize("values, why", [
    ([0, 0, 0, 1, 1, 2], "a label equal to the number of classes"),
    ([0, 0, 0, 1, 1, -1], "a negative label"),
    ([0, 0, 0, 1, 1, 2**31 - 1], "the largest int32"),
])  # fmt: skip
def test_labels_outside_the_classes_are_refused_naming_the_range(copy, values, why):
    """Written for a bound read as ``>`` or ``<=``, or one end left unchecked: every label must be in
    0..classes-1 (two classes here), whatever its hash says."""
    relabel(copy, values)
    with pytest.raises(CorruptDataError) as e:
        fastload.Dataset(copy).labels
    assert str(e.value) == f"{copy}/labels.bin: labels outside 0..1", why


def test_labels_on_both_edges_of_the_range_are_accepted(copy):
    """Written for a bound one off: 0 and classes-1 are labels, and a file of only those reads back."""
    relabel(copy, [1, 1, 1, 0, 0, 0])
    assert fastload.Dataset(copy).labels.tolist() == [1, 1, 1, 0, 0, 0]


@pytest.mark.parametrize("size", [0, 20, 23, 25, 28, 48])
def test_a_labels_file_of_another_size_is_refused_with_both_sizes(copy, size):
    """Written for a size check off by a byte or a sample: 4 bytes a sample, exactly (6 samples: 24)."""
    (copy / "labels.bin").write_bytes(b"\0" * size)
    with pytest.raises(CorruptDataError) as e:
        fastload.Dataset(copy).labels
    assert str(e.value) == f"{copy}/labels.bin: {size} bytes, expected 24 for 6 samples; pack the dataset again"


def test_altered_labels_of_the_right_size_are_refused_by_their_hash(copy):
    """Written for labels used without their SHA-256 checked: one bit changed is refused."""
    raw = bytearray((copy / "labels.bin").read_bytes())
    raw[4] ^= 1  # sample 1's label 0 -> 1: still a valid class
    (copy / "labels.bin").write_bytes(bytes(raw))
    with pytest.raises(CorruptDataError) as e:
        fastload.Dataset(copy).labels
    assert str(e.value) == f"{copy}/labels.bin: SHA-256 differs from the manifest; the labels were altered"


def test_a_labels_path_that_is_not_a_regular_file_is_a_format_error(copy):
    """Written for a directory in place of labels.bin read as if a file: refused, saying what it is."""
    (copy / "labels.bin").unlink()
    (copy / "labels.bin").mkdir()
    with pytest.raises(FormatError) as e:
        fastload.Dataset(copy).labels
    assert str(e.value) == f"{copy}/labels.bin: cannot read labels: it is a directory, not a regular file"
