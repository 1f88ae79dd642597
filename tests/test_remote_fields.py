"""Typed fields through an object store: a dict-sample dataset packed into SeaweedFS and read back.

The two features meet here: the field block travels inside the shards' records, so a dataset with
typed fields uploaded to ``s3://`` must give, field for field, the batches of its local copy.
Sample ``i``'s pixels encode ``(label, i)`` and its caption names them, so a field served with
another sample's image fails.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import fastload
from fastload import FastLoader

from conftest import decode_batch, encode_color
from s3server import SeaweedServer

pytest.importorskip("obstore")

N = 30
FIELDS = ("image", "txt", "label", "tokens")


class Captioned:
    def __len__(self) -> int:
        return N

    def __getitem__(self, i: int) -> dict:
        label = i % 3
        return {
            "image": np.full((40, 48, 3), encode_color(label, i), np.uint8),
            "label": label,
            "txt": f"label {label} index {i}",
            "tokens": np.array([i, label, 7, 8][: 1 + i % 4], np.int32),
        }


def test_a_dataset_with_fields_reads_the_same_from_a_bucket(s3, tmp_path, monkeypatch):
    monkeypatch.setenv("FASTLOAD_CACHE", str(tmp_path / "cache"))
    local = tmp_path / "local"
    fastload.pack_dataset(Captioned(), local, workers=1, shard_size="16KB", progress=False)
    url = f"s3://{s3.make_bucket()}/captioned"
    fastload.pack_dataset(Captioned(), url, workers=1, shard_size="16KB", storage_options=s3.options(), progress=False)
    assert len(fastload.Dataset(local).shards) > 1  # the read crosses shards

    kw = dict(fields=FIELDS, pad_to=4, device="cpu", crop=24, seed=5, train=True, mean=None, std=None)
    with FastLoader(local, 4, **kw) as ref_loader:
        ref = list(ref_loader)
    with FastLoader(url, 4, storage_options=s3.options(), cache_dir=tmp_path / "node", **kw) as remote:
        got = list(remote)
    assert len(got) == len(ref)
    seen = []
    for a, b in zip(got, ref):
        assert torch.equal(a.image, b.image) and torch.equal(a.label, b.label) and a.txt == b.txt
        assert torch.equal(a.tokens, b.tokens) and torch.equal(a.lengths["tokens"], b.lengths["tokens"])
        for k, (label, i) in enumerate(decode_batch(a.image.float().numpy())):  # the pixels' own account
            assert a.txt[k] == f"label {label} index {i}" and int(a.label[k]) == label
            n = 1 + i % 4
            assert int(a.lengths["tokens"][k]) == n and a.tokens[k, :n].tolist() == [i, label, 7, 8][:n]
            seen.append(i)
    assert sorted(seen) == list(range(N))
