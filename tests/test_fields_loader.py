"""FastLoader(fields=...): batches of typed fields aligned with their images, and training loops on them.

Pixel-encoded: sample ``i``'s image is the solid colour ``encode_color(label, i)`` and its
caption, token ids and multi-hot vector are functions of ``(label, i)``; every batch's fields
are compared with what its decoded pixels say, so a field of another sample fails.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import fastload
from fastload import ConfigError, FastLoader
from fastload.fieldbatch import FieldBatch

from conftest import decode_batch, encode_color

N, K = 36, 6  # samples, bits of the multi-hot vector
RAW = dict(mean=None, std=None)  # uint8 images, whose pixels decode_batch reads


def bits(i: int) -> list[float]:
    return [float((i >> b) & 1) for b in range(K)]


class Captioned:
    def __len__(self) -> int:
        return N

    def __getitem__(self, i: int) -> dict:
        label = i % 3
        return {
            "image": np.full((40 + 8 * (i % 3), 48, 3), encode_color(label, i), np.uint8),
            "label": label,
            "txt": f"label {label} index {i}",
            "tokens": np.array([i, label, 7, 8, 9][: 1 + i % 5], np.int32),
            "targets": np.array(bits(i), np.float32),
            "id": 1000 + i,
        }


@pytest.fixture(scope="module")
def captioned(tmp_path_factory):
    out = tmp_path_factory.mktemp("fields") / "packed"
    fastload.pack_dataset(Captioned(), out, workers=1, progress=False)
    return out


def check_batch(b: FieldBatch, seen: list[int]) -> None:
    """Every field of ``b`` agrees with what its images' pixels say."""
    decoded = decode_batch(b["image"].float().numpy())
    for k, (label, i) in enumerate(decoded):
        assert b.txt[k] == f"label {label} index {i}"
        assert int(b.label[k]) == label and int(b["id"][k]) == 1000 + i
        assert b.targets[k].tolist() == bits(i)
        seen.append(i)


def test_every_field_travels_with_its_image(captioned):
    with FastLoader(captioned, 5, fields=("image", "txt", "label", "tokens", "targets", "id"), device="cpu", crop=24, seed=3, **RAW) as L:
        seen: list[int] = []
        for b in L:
            assert isinstance(b, FieldBatch) and b.names == ("image", "txt", "label", "tokens", "targets", "id")
            images, txt, labels, tokens, targets, ids = b  # unpacks in the order asked for
            assert images.shape[1:] == (3, 24, 24) and labels.dtype == torch.int64 and targets.dtype == torch.float32
            assert isinstance(txt, list) and isinstance(tokens, list) and ids.dtype == torch.int64
            check_batch(b, seen)
            for k, i in enumerate(seen[-len(txt):]):
                assert tokens[k].dtype == torch.int32 and tokens[k].tolist() == [i, i % 3, 7, 8, 9][: 1 + i % 5]
    assert sorted(seen) == list(range(N))


def test_same_order_as_the_classic_loader_and_resume(captioned):
    kw = dict(device="cpu", crop=24, seed=7, **RAW)
    with FastLoader(captioned, 4, **kw) as classic:
        classic.set_epoch(2)
        ref = [(x.clone(), y.clone()) for x, y in classic]  # images, labels = batch still works
    with FastLoader(captioned, 4, fields=("image", "label", "txt"), **kw) as L:
        L.set_epoch(2)
        it = iter(L)
        first = [next(it) for _ in range(3)]
        state = json.loads(json.dumps(L.state_dict()))
    with FastLoader(captioned, 4, fields=("image", "label", "txt"), **kw) as L2:
        L2.load_state_dict(state)
        got = first + list(L2)
    assert len(got) == len(ref)
    for b, (x, y) in zip(got, ref):
        assert torch.equal(b.image, x) and torch.equal(b.label, y)
        assert [int(t.split()[3]) for t in b.txt] == [i for _, i in decode_batch(x.float().numpy())]


def test_ranks_read_disjoint_shares_with_their_fields(captioned):
    seen: list[int] = []
    for rank in range(2):
        with FastLoader(captioned, 4, fields=("image", "txt", "label", "targets", "id"), device="cpu", crop=24,
                        rank=rank, world_size=2, pad=False, **RAW) as L:  # fmt: skip
            for b in L:
                check_batch(b, seen)
    assert sorted(seen) == list(range(N))


def test_pad_to_gives_one_tensor_and_lengths(captioned):
    with FastLoader(captioned, 6, fields=("image", "tokens"), pad_to=3, device="cpu", crop=24, shuffle=False, train=False) as L:
        b = next(iter(L))
    want_len = [min(3, 1 + i % 5) for i in range(6)]
    assert b.tokens.shape == (6, 3) and b.tokens.dtype == torch.int32
    assert b.lengths["tokens"].tolist() == want_len
    for i in range(6):
        row = [i, i % 3, 7, 8, 9][: want_len[i]]
        assert b.tokens[i].tolist() == row + [0] * (3 - len(row))
    with FastLoader(captioned, 6, fields=("image", "tokens"), pad_to={"tokens": 8}, device="cpu", crop=24, shuffle=False, train=False) as L:
        assert next(iter(L)).tokens.shape == (6, 8)


@pytest.mark.parametrize(
    "kw, match",
    [
        (dict(fields="image"), r"fields must be a tuple of field names"),
        (dict(fields=("image", "caption")), r"fields: 'caption' is not a field of this dataset \(it has image, label, txt, tokens, targets, id\)"),
        (dict(fields=("txt",)), r"fields must include 'image'"),
        (dict(fields=("image", "txt", "txt")), r"'txt' is asked for twice"),
        (dict(fields=("image", "txt"), pad_to=4), r"pad_to=4 is given but fields= asks for no ragged field"),
        (dict(fields=("image", "tokens"), pad_to=0), r"pad_to must be an int in \[1, 1048576\] \(rows a padded ragged field has\), got 0"),
        (dict(fields=("image", "tokens"), pad_to={"txt": 3}), r"pad_to: 'txt' is not a ragged field"),
        (dict(pad_to=4), r"pad_to=4 is given without fields="),
        (dict(fields=("image", "txt"), collate_fn=lambda b: b), r"fields= and collate_fn cannot be combined"),
    ],
)
def test_bad_field_arguments_are_refused_up_front(captioned, kw, match):
    with pytest.raises(ConfigError, match=match):
        FastLoader(captioned, 4, device="cpu", **kw)


def test_field_batch_reads_by_name():
    b = FieldBatch(("image", "txt"), [torch.zeros(2, 3), ["a", "b"]])
    assert b["txt"] == b.txt == b[1] == ["a", "b"] and b.as_dict()["image"].shape == (2, 3)
    x, t = b
    assert t == ["a", "b"] and list(b.keys()) == ["image", "txt"]
    import pickle

    c = pickle.loads(pickle.dumps(b))
    assert c.names == b.names and c.txt == ["a", "b"] and torch.equal(c.image, b.image)
    with pytest.raises(KeyError, match="'nope' is not a field of this batch"):
        b["nope"]
    with pytest.raises(AttributeError, match="has no field 'nope'"):
        b.nope


# ----------------------------------------------------------------------------- training loops


def test_open_clip_style_contrastive_loop(captioned):
    """An image tower and a text tower over padded token ids, CLIP's symmetric contrastive loss."""
    torch.manual_seed(0)
    image_tower = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, stride=2), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1),
                                      torch.nn.Flatten(), torch.nn.Linear(8, 16))  # fmt: skip
    text_tower = torch.nn.EmbeddingBag(64, 16, mode="mean", padding_idx=0)
    scale = torch.nn.Parameter(torch.tensor(2.0))
    params = [*image_tower.parameters(), *text_tower.parameters(), scale]
    opt = torch.optim.Adam(params, lr=2e-2)
    loader = FastLoader(captioned, 12, fields=("image", "tokens", "txt"), pad_to=5, device="cpu", crop=24,
                        mean=fastload.IMAGENET_MEAN, std=fastload.IMAGENET_STD, seed=1, drop_last=True)  # fmt: skip
    losses = []
    with loader:
        for epoch in range(4):
            loader.set_epoch(epoch)
            for images, tokens, txt in loader:
                assert [int(t.split()[3]) for t in txt] == (tokens[:, 0]).tolist()  # captions and tokens of one sample
                img = torch.nn.functional.normalize(image_tower(images), dim=-1)
                txt_emb = torch.nn.functional.normalize(text_tower((tokens + 1) % 64), dim=-1)
                logits = scale.exp() * img @ txt_emb.T
                target = torch.arange(len(images))
                loss = (torch.nn.functional.cross_entropy(logits, target) + torch.nn.functional.cross_entropy(logits.T, target)) / 2
                opt.zero_grad()
                loss.backward()
                opt.step()
                losses.append(loss.item())
    assert len(losses) == 4 * (N // 12) and all(np.isfinite(losses))
    assert np.mean(losses[-3:]) < np.mean(losses[:3])


def test_multi_label_bce_loop_on_a_vector_field(captioned):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(3, 32), torch.nn.ReLU(), torch.nn.Linear(32, K))
    opt = torch.optim.Adam(model.parameters(), lr=3e-2)
    crit = torch.nn.BCEWithLogitsLoss()
    losses = []
    with FastLoader(captioned, 12, fields=("image", "targets"), device="cpu", crop=24, train=False,
                    mean=fastload.IMAGENET_MEAN, std=fastload.IMAGENET_STD) as loader:  # fmt: skip
        for epoch in range(6):
            for images, targets in loader:
                assert targets.shape == (len(images), K)
                loss = crit(model(images), targets)
                opt.zero_grad()
                loss.backward()
                opt.step()
                losses.append(loss.item())
    assert np.mean(losses[-3:]) < np.mean(losses[:3])


def test_an_altered_field_is_a_loader_error_naming_the_sample(tmp_path):
    out = tmp_path / "o"
    fastload.pack_dataset(Captioned(), out, workers=1, progress=False)
    p = out / "shard-00000.lmdb"
    data = bytearray(p.read_bytes())
    k = data.find(b"label 2 index 17")
    assert k > 0
    data[k] ^= 1
    p.write_bytes(bytes(data))
    with FastLoader(out, 6, fields=("image", "txt"), device="cpu", crop=24, shuffle=False) as L:
        with pytest.raises(fastload.LoaderError, match=r"sample 17: field block checksum mismatch"):
            for _ in L:
                pass
