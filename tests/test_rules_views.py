"""Rules of dataset views: a concatenation's errors named at the sample's place, its stats from every part."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch.utils.data as tud

import fastload
from fastload.composite import concat, subset
from conftest import paint_folder

# (images per class and size of each part): parts of different sizes, the largest image in a part
# that is not the one the view reads most
PARTS = [(6, (40, 30)), (1, (200, 90)), (3, (64, 160))]


@pytest.fixture(scope="module")
def parts(tmp_path_factory) -> list[Path]:
    base = tmp_path_factory.mktemp("rules_views")
    out = []
    for k, (per, size) in enumerate(PARTS):
        src = paint_folder(base / f"src{k}", classes=2, per_class=per, size=size)
        fastload.pack(src, base / f"ds{k}", workers=1, progress=False)
        out.append(base / f"ds{k}")
    return out


def corrupt(ds_path: Path, ds: fastload.Dataset, j: int) -> None:
    """Flip one byte in the middle of sample ``j``'s stored payload (its checksum then fails)."""
    payload = ds[j][0]
    for shard in sorted(ds_path.glob("shard-*.lmdb")):
        data = bytearray(shard.read_bytes())
        at = data.find(payload)
        if at >= 0:
            data[at + len(payload) // 2] ^= 0xFF
            shard.write_bytes(bytes(data))
            return
    raise AssertionError("payload not found")


def test_a_concatenations_stats_bound_every_parts_images(parts):
    """Rule: the loader sizes its decoder from the dataset's largest image (manifest stats' max); a
    view's max is the largest over every part, its min the smallest, its median the one of the part
    it reads most. Bug: the stats of the part read most taken whole (the 200-px images of a small
    part then overflow a decoder sized for 40 px). Expected: the sizes of the images the test wrote."""
    dss = [fastload.Dataset(p) for p in parts]
    view = concat(dss)
    st = view.manifest.stats
    assert st["width"]["max"] == max(s[0] for _, s in PARTS) and st["height"]["max"] == max(s[1] for _, s in PARTS)
    assert st["width"]["min"] == min(s[0] for _, s in PARTS) and st["height"]["min"] == min(s[1] for _, s in PARTS)
    assert (st["width"]["median"], st["height"]["median"]) == PARTS[0][1]  # the part with the most samples
    sub = subset(view, [len(dss[0]) + 1, 0, 0, 1])  # one sample of the 200-px part, three of the first
    assert sub.manifest.stats["width"]["max"] >= 200


def test_errors_in_a_concatenation_are_named_at_the_samples_place(parts, tmp_path):
    """Scenario: a concatenation of three parts, one sample of the last part damaged, read in
    batches that mix parts. Rule: a batch's error is keyed by the sample's place in the batch and
    names the sample by its position in the view (``ConcatDataset``'s numbering: the part's
    offset plus its index), as ``sample P of ...``. Bugs: the error keyed by the place among the
    part's own samples of the batch, or named by the part's index."""
    copies = []
    for k, p in enumerate(parts):
        copies.append(tmp_path / f"ds{k}")
        shutil.copytree(p, copies[-1])
    bad_part, bad_j = 2, 3
    corrupt(copies[bad_part], fastload.Dataset(copies[bad_part]), bad_j)
    dss = [fastload.Dataset(c, check=True) for c in copies]
    view = concat(dss)
    offsets = np.cumsum([0] + [len(d) for d in dss])
    torch_concat = tud.ConcatDataset([list(range(len(d))) for d in dss])
    bad_p = int(offsets[bad_part] + bad_j)
    assert torch_concat[bad_p] == bad_j and tud.ConcatDataset([list(range(len(d))) for d in dss]).cumulative_sizes[-1] == len(view)
    rng = np.random.default_rng(1)
    for batch in (
        [0, bad_p, len(dss[0]) + 1],  # the bad one second, from the third part after the first
        [bad_p - 1, bad_p, bad_p + 1],  # one part only
        [len(dss[0]), 2, bad_p, 5],  # the bad one third, the second part's sample first
        list(rng.permutation(len(view))[:9]) + [bad_p],
    ):
        rb = view.read_batch(np.array(batch))
        want = [q for q, p in enumerate(batch) if p == bad_p]
        assert sorted(rb.errors) == want
        for q in want:
            assert str(rb.errors[q]).startswith(f"sample {bad_p} of ")
        for q, p in enumerate(batch):
            if p != bad_p:  # the others read from ConcatDataset's place of them
                k = int(np.searchsorted(offsets, p, side="right") - 1)
                assert bytes(rb.payloads[q]) == dss[k][int(p - offsets[k])][0]
    with pytest.raises(fastload.errors.CorruptDataError, match=f"^sample {bad_p} of "):
        view[bad_p]
