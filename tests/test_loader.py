"""FastLoader: DataLoader semantics, augmentation, determinism, resume, errors.

The CPU tests run everywhere; the same checks run on CUDA where a GPU is present
(``gpu`` marker). Images are solid colours encoding (label, index): any crop, flip
or resize of one still tells which sample it is.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import fastload
from fastload import ConfigError, FastLoader, FormatError, IMAGENET_MEAN, IMAGENET_STD, LoaderError
from fastload.augment import random_resized_crop, train_params, uniforms
from fastload.sampler import EpochSampler

from conftest import decode_batch, encode_color, write_image

N_CLASSES, PER_CLASS = 3, 14  # 42 samples
N = N_CLASSES * PER_CLASS

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


def _make_tree(root: Path) -> Path:
    index = 0
    for label in range(N_CLASSES):
        for j in range(PER_CLASS):
            size = (96, 64) if j % 2 else (56, 88)  # landscape and portrait
            write_image(root / f"c{label}" / f"{j:03d}.jpg", encode_color(label, index), size=size, quality=95)
            index += 1
    return root


@pytest.fixture(scope="module")
def packed(tmp_path_factory) -> Path:
    base = tmp_path_factory.mktemp("loader")
    src = _make_tree(base / "src")
    out = base / "packed"
    fastload.pack(src, out, workers=1, progress=False)
    return out


def _epoch(loader) -> list[tuple[int, int, int]]:
    """[(label read from pixels, index read from pixels, label tensor)] for one epoch."""
    got = []
    for x, y in loader:
        x = x.float().cpu().numpy()
        dec = decode_batch(x) if loader.mean is None else decode_batch(x, IMAGENET_MEAN, IMAGENET_STD)
        got += [(lab, idx, int(t)) for (lab, idx), t in zip(dec, y.cpu())]
    return got


# ----------------------------------------------------------------------------- outputs


@pytest.mark.parametrize("device", DEVICES)
def test_shapes_dtypes_ranges(packed, device):
    with FastLoader(packed, 8, device=device, crop=32, shuffle=False) as loader:
        x, y = next(iter(loader))
        assert x.shape == (8, 3, 32, 32) and x.dtype == torch.float32 and x.is_contiguous()
        assert y.shape == (8,) and y.dtype == torch.int64
        assert x.device.type == device and y.device.type == device
        assert torch.isfinite(x).all()
        lo = (0 - np.array(IMAGENET_MEAN)) / np.array(IMAGENET_STD)
        hi = (1 - np.array(IMAGENET_MEAN)) / np.array(IMAGENET_STD)
        assert x.min() >= lo.min() - 1e-4 and x.max() <= hi.max() + 1e-4
    with FastLoader(packed, 8, device=device, crop=32, mean=None, std=None, channels_last=True) as loader:
        x, _ = next(iter(loader))
        assert x.dtype == torch.uint8 and x.shape == (8, 3, 32, 32)
        assert x.is_contiguous(memory_format=torch.channels_last) and not x.is_contiguous()
    for dt in (torch.float16, torch.bfloat16):
        with FastLoader(packed, 4, device=device, crop=16, dtype=dt) as loader:
            x, _ = next(iter(loader))
            assert x.dtype == dt and x.shape == (4, 3, 16, 16)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("train", [True, False])
def test_labels_match_pixels_and_each_sample_once_per_epoch(packed, device, train):
    with FastLoader(packed, 5, device=device, crop=24, train=train) as loader:
        assert len(loader) == -(-N // 5)
        for _ in range(2):
            got = _epoch(loader)
            assert [lab for lab, _, _ in got] == [t for _, _, t in got]  # label tensor == pixel label
            assert sorted(idx for _, idx, _ in got) == list(range(N))  # every sample exactly once
            assert all(idx // PER_CLASS == lab for lab, idx, _ in got)
        assert loader.classes == ["c0", "c1", "c2"]
        assert len(loader.dataset) == N


def test_loader_accepts_an_open_dataset(packed):
    ds = fastload.Dataset(packed)
    with FastLoader(ds, 7, device="cpu", crop=16) as loader:
        assert loader.packed is ds  # loader.dataset is the ImageFolder-like view over it
        assert sorted(idx for _, idx, _ in _epoch(loader)) == list(range(N))


# ----------------------------------------------------------------------------- order


def test_shuffle_is_a_seeded_global_permutation(packed):
    def order(**kw):
        with FastLoader(packed, 6, device="cpu", crop=16, **kw) as loader:
            return [idx for _, idx, _ in _epoch(loader)]

    a, b, c = order(seed=1), order(seed=1), order(seed=2)
    assert a == b and a != c
    assert order(shuffle=False) == list(range(N))
    # a global shuffle reaches far: the first batch draws from the whole dataset
    assert max(a[:6]) - min(a[:6]) > N // 3


def test_epochs_differ_and_set_epoch_selects(packed):
    with FastLoader(packed, 6, device="cpu", crop=16, seed=3) as loader:
        e0 = [idx for _, idx, _ in _epoch(loader)]
        e1 = [idx for _, idx, _ in _epoch(loader)]
        assert e0 != e1 and loader.epoch == 2
        loader.set_epoch(0)
        assert [idx for _, idx, _ in _epoch(loader)] == e0
        loader.set_epoch(1)
        assert [idx for _, idx, _ in _epoch(loader)] == e1


@pytest.mark.parametrize("device", DEVICES)
def test_same_seed_same_tensors(packed, device):
    outs = []
    for _ in range(2):
        with FastLoader(packed, 8, device=device, crop=32, seed=11) as loader:
            outs.append([x.clone() for x, _ in loader])
    assert all(torch.equal(a, b) for a, b in zip(*outs))
    with FastLoader(packed, 8, device=device, crop=32, seed=12) as loader:
        other = [x for x, _ in loader]
    assert not all(torch.equal(a, b) for a, b in zip(outs[0], other))


@pytest.mark.parametrize("world_size", [1, 2, 3, 4, 5])
@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("batch_size", [1, 4, 5, 7])
@pytest.mark.parametrize("n", [1, 13, 42])
def test_sampler_batch_counts_and_shares(n, batch_size, drop_last, world_size):
    samplers = [
        EpochSampler(num_samples=n, batch_size=batch_size, drop_last=drop_last, world_size=world_size, rank=r, seed=5)
        for r in range(world_size)
    ]
    per_rank = n // world_size if drop_last else -(-n // world_size)
    expect = per_rank // batch_size if drop_last else -(-per_rank // batch_size)
    shares = []
    for s in samplers:
        batches = list(s.batches(epoch=2))
        assert len(s) == expect == len(batches)  # equal counts on every rank: DDP never waits
        assert all(len(b.indices) == batch_size for b in batches[:-1])
        if drop_last:
            assert all(len(b.indices) == batch_size for b in batches)
        shares.append(np.concatenate([b.indices for b in batches]) if batches else np.array([], dtype=int))
    allidx = np.concatenate(shares)
    if drop_last:
        assert len(set(allidx.tolist())) == len(allidx)  # disjoint
    else:
        assert set(allidx.tolist()) == set(range(n))  # complete
        assert len(allidx) == per_rank * world_size  # padded like DistributedSampler
        # padding repeats as few samples as possible
        assert len(allidx) - len(set(allidx.tolist())) == per_rank * world_size - n
        # without padding duplicates, shares are disjoint
        pos = [s.rank_positions() for s in samplers]
        assert len(set(np.concatenate(pos).tolist())) == per_rank * world_size


@pytest.mark.parametrize("drop_last", [False, True])
def test_rank_shares_through_the_loader(packed, drop_last):
    seen = []
    for rank in range(4):
        with FastLoader(packed, 4, device="cpu", crop=16, rank=rank, world_size=4, drop_last=drop_last, seed=9) as loader:
            got = [idx for _, idx, _ in _epoch(loader)]
            # 42 samples on 4 ranks: drop_last cuts to 10 each, 2 full batches of 4; else padded
            # to 11 each (DistributedSampler), 2 batches of 4 and a last one of 3
            per_rank = N // 4 if drop_last else -(-N // 4)
            assert len(loader) == (per_rank // 4 if drop_last else -(-per_rank // 4))
            assert len(got) == (len(loader) * 4 if drop_last else per_rank)
            seen.append(got)
    counts = {len(s) for s in seen}
    assert len(counts) == 1  # every rank the same number of samples
    flat = [i for s in seen for i in s]
    if drop_last:
        assert len(flat) == len(set(flat)) == (N // 4) // 4 * 4 * 4
    else:
        assert set(flat) == set(range(N))


# ----------------------------------------------------------------------------- augmentation


def test_random_resized_crop_semantics():
    n = 20000
    w = np.full(n, 500)
    h = np.full(n, 375)
    u = uniforms(0, 0, np.arange(n), 40)
    box = random_resized_crop(w, h, u, scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3))
    x, y, bw, bh = box.T
    assert (x >= 0).all() and (y >= 0).all() and (x + bw <= 500).all() and (y + bh <= 375).all()
    frac = bw * bh / (500 * 375)
    assert frac.min() >= 0.07 and frac.max() <= 1.0
    # torchvision draws the area uniformly in scale: accepted draws stay close to that
    assert 0.4 < frac.mean() < 0.56
    ar = bw / bh
    assert np.quantile(ar, 0.02) > 0.7 and np.quantile(ar, 0.98) < 1.4
    # crops are spread over the image, not centred
    assert np.std(x + bw / 2) > 40 and np.std(y + bh / 2) > 30


def test_random_resized_crop_fallback_for_extreme_shapes():
    u = np.full((2, 40), 0.999)  # every attempt asks for too large a crop
    box = random_resized_crop(np.array([1000, 10]), np.array([10, 1000]), u, scale=(0.99, 1.0), ratio=(3 / 4, 4 / 3))
    x, y, bw, bh = box.T
    # torchvision's fallback: centre crop with the ratio clamped into range
    assert (bw[0], bh[0]) == (13, 10) and x[0] == (1000 - 13) // 2
    assert (bw[1], bh[1]) == (10, 13) and y[1] == (1000 - 13) // 2


def test_params_depend_only_on_seed_epoch_position():
    kw = dict(scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3), flip=0.5)
    w, h = np.array([300, 400, 500]), np.array([200, 300, 400])
    b1, f1 = train_params(w, h, seed=1, epoch=2, positions=np.array([7, 8, 9]), **kw)
    b2, f2 = train_params(w[1:], h[1:], seed=1, epoch=2, positions=np.array([8, 9]), **kw)
    assert np.array_equal(b1[1:], b2) and np.array_equal(f1[1:], f2)
    b3, _ = train_params(w, h, seed=1, epoch=3, positions=np.array([7, 8, 9]), **kw)
    assert not np.array_equal(b1, b3)


def test_flip_statistics(tmp_path):
    # left half red, right half blue: a flipped crop has blue on the left
    src = tmp_path / "src" / "only"
    src.mkdir(parents=True)
    for i in range(40):
        a = np.zeros((64, 64, 3), np.uint8)
        a[:, :32] = (250, 0, 0)
        a[:, 32:] = (0, 0, 250)
        Image.fromarray(a).save(src / f"{i:02d}.png")
    out = tmp_path / "packed"
    fastload.pack(tmp_path / "src", out, workers=1, progress=False)
    flips = []
    for flip in (0.0, 0.5, 1.0):
        with FastLoader(out, 40, device="cpu", crop=32, scale=(1.0, 1.0), ratio=(1.0, 1.0), flip=flip, mean=None, std=None) as loader:
            got = []
            for _ in range(5):
                x, _ = next(iter(loader))
                left = x[:, :, :, :8].float().mean(dim=(2, 3))
                got += (left[:, 2] > left[:, 0]).tolist()  # blue on the left: flipped
            flips.append(np.mean(got))
    assert flips[0] == 0.0 and flips[2] == 1.0
    assert 0.35 < flips[1] < 0.65


def test_eval_matches_pil_reference(tmp_path):
    # a smooth photo-like image: resize + centre crop must match PIL within a small tolerance
    yy, xx = np.mgrid[0:150, 0:200]
    a = np.stack([xx * 255 / 199, yy * 255 / 149, (xx + yy) * 255 / 348], axis=-1).astype(np.uint8)
    src = tmp_path / "src" / "c"
    src.mkdir(parents=True)
    Image.fromarray(a).save(src / "g.png")
    out = tmp_path / "p"
    fastload.pack(tmp_path / "src", out, workers=1, progress=False)
    with FastLoader(out, 1, device="cpu", train=False, crop=112, resize=128, mean=None, std=None) as loader:
        x, _ = next(iter(loader))
    got = x[0].permute(1, 2, 0).numpy().astype(np.float64)
    # the PIL reference: the stored image (converted at pack time) -> Resize(128) -> CenterCrop(112)
    payload, _ = fastload.Dataset(out)[0]
    im = Image.open(io.BytesIO(payload)).convert("RGB")
    w, h = im.size
    im = im.resize((int(128 * w / h), 128), Image.BILINEAR)
    left, top = int(round((im.width - 112) / 2)), int(round((im.height - 112) / 2))
    ref = np.asarray(im.crop((left, top, left + 112, top + 112)), dtype=np.float64)
    diff = np.abs(got - ref)
    assert diff.mean() < 2.0 and np.quantile(diff, 0.99) < 8


# ----------------------------------------------------------------------------- resume


@pytest.mark.parametrize("device", DEVICES)
def test_state_dict_resume_yields_exactly_the_rest(packed, device):
    with FastLoader(packed, 5, device=device, crop=24, seed=4) as full:
        full.set_epoch(1)
        ref = [(x.clone(), y.clone()) for x, y in full]
    with FastLoader(packed, 5, device=device, crop=24, seed=4) as a:
        a.set_epoch(1)
        it = iter(a)
        first = [next(it) for _ in range(3)]
        state = json.loads(json.dumps(a.state_dict()))  # JSON-safe
    assert state["epoch"] == 1 and state["batches_done"] == 3
    with FastLoader(packed, 5, device=device, crop=24, seed=4) as b:
        b.load_state_dict(state)
        rest = list(b)
        assert b.epoch == 2
    got = [(x, y) for x, y in first] + rest
    assert len(got) == len(ref)
    for (x1, y1), (x2, y2) in zip(got, ref):
        assert torch.equal(y1, y2) and torch.equal(x1, x2)


def test_load_state_dict_refuses_mismatch(packed):
    with FastLoader(packed, 5, device="cpu", crop=16) as a:
        state = a.state_dict()
    with FastLoader(packed, 6, device="cpu", crop=16, seed=1) as b:  # another batch size resumes; another seed not
        with pytest.raises(ConfigError, match="seed"):
            b.load_state_dict(state)
        with pytest.raises(ConfigError, match="state_dict"):
            b.load_state_dict({"epoch": 1})


# ----------------------------------------------------------------------------- lifecycle


def _fastload_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("fastload")]


@pytest.mark.parametrize("device", DEVICES)
def test_break_restart_and_close_leave_nothing(packed, device):
    loader = FastLoader(packed, 4, device=device, crop=16)
    it = iter(loader)
    next(it)
    assert _fastload_threads()
    # a new iteration restarts cleanly after an abandoned one (DataLoader semantics)
    assert sorted(idx for _, idx, _ in _epoch(loader)) == list(range(N))
    for i, _ in enumerate(loader):
        if i == 2:
            break
    loader.close()
    assert _fastload_threads() == []
    with pytest.raises(LoaderError, match="closed"):
        iter(loader)
    loader.close()  # idempotent


# ----------------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"batch_size": 0}, "batch_size"),
        ({"batch_size": "8"}, "batch_size"),
        ({"crop": -1}, "crop"),
        ({"resize": 10}, "resize"),
        ({"scale": (0.5, 0.1)}, "scale"),
        ({"ratio": (0, 1)}, "ratio"),
        ({"flip": 1.5}, "flip"),
        ({"mean": None}, "mean"),
        ({"std": (0.2, 0.2, 0.0)}, "std"),
        ({"mean": (0.5, 0.5)}, "mean"),
        ({"dtype": torch.int32}, "dtype"),
        ({"prefetch": 0}, "prefetch"),
        ({"num_threads": 0}, "num_threads"),
        ({"device": "tpu"}, "device"),
        ({"rank": 2, "world_size": 2}, "rank"),
        ({"rank": 0}, "rank and world_size"),
        ({"world_size": 0, "rank": 0}, "world_size"),
        ({"hw_decoder_load": 2}, "hw_decoder_load"),
        ({"seed": 1.5}, "seed"),
        ({"batch_size": 64, "drop_last": True}, "leaves no batch"),
    ],
)
def test_bad_arguments_name_the_argument_and_value(packed, kwargs, match):
    kw = {"batch_size": 4, **kwargs}
    bs = kw.pop("batch_size")
    with pytest.raises(ConfigError, match=match) as e:
        FastLoader(packed, bs, **kw)
    assert isinstance(e.value, ValueError)
    assert _fastload_threads() == []


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU message")
def test_cuda_without_gpu_is_a_clear_error(packed):
    with pytest.raises(ConfigError, match="no CUDA device"):
        FastLoader(packed, 4, device="cuda")


def test_missing_or_foreign_dataset(tmp_path):
    with pytest.raises(FormatError, match="no such dataset"):
        FastLoader(tmp_path / "nope", 4, device="cpu")
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "manifest.json").write_text('{"format": "webdataset"}')
    with pytest.raises(FormatError, match="not a fastload manifest"):
        FastLoader(tmp_path / "d", 4, device="cpu")


def _flip_payload_byte(root: Path, index: int) -> str:
    ds = fastload.Dataset(root)
    header, value, _ = ds.raw(index)
    shard = root / ds.shards[0].file
    raw = bytearray(shard.read_bytes())
    pos = raw.find(bytes(value))
    assert pos >= 0
    raw[pos + len(value) - 40] ^= 0xFF
    shard.write_bytes(bytes(raw))
    return ds.source_path(index)


@pytest.mark.parametrize("device", DEVICES)
def test_corrupt_record_is_raised_from_next_with_sample_and_path(packed, tmp_path, device):
    bad = tmp_path / "bad"
    shutil.copytree(packed, bad)
    src = _flip_payload_byte(bad, 17)
    with FastLoader(bad, 4, device=device, crop=16, shuffle=False) as loader:
        with pytest.raises(LoaderError) as e:
            for _ in loader:
                pass
        msg = str(e.value)
        assert "sample 17" in msg and src in msg and "checksum mismatch" in msg
        # the loader stays usable for the next epoch and fails the same way, without hanging
        with pytest.raises(LoaderError, match="sample 17"):
            for _ in loader:
                pass
    assert _fastload_threads() == []


def test_undecodable_image_is_named(tmp_path):
    # bytes that pass the CRC but are not a decodable JPEG: DALI fails, the loader names the sample
    from fastload.format import ENC_JPEG, encode_record

    src = tmp_path / "src"
    for i in range(6):
        write_image(src / "c" / f"{i}.jpg", encode_color(0, i), size=(40, 40), quality=90)
    out = tmp_path / "p"
    fastload.pack(src, out, workers=1, progress=False)
    ds = fastload.Dataset(out)
    header, value, _ = ds.raw(3)
    payload, _ = ds[3]
    broken = payload[:300] + bytes(200) + payload[500:]
    new = encode_record(
        broken, label=0, encoding=ENC_JPEG, width=header.width, height=header.height,
        orig_width=header.orig_width, orig_height=header.orig_height, path=ds.source_path(3),
    )
    assert len(new) == len(value)
    shard = out / ds.shards[0].file
    raw = shard.read_bytes()
    shard.write_bytes(raw.replace(bytes(value), new))
    # the shard hash now differs, but the loader reads records, not hashes
    with FastLoader(out, 6, device="cpu", crop=16, shuffle=False) as loader:
        with pytest.raises(LoaderError, match=r"sample 3 \(.*3\.jpg\).*failed to decode"):
            next(iter(loader))


# ----------------------------------------------------------------------------- torchrun


def test_torchrun_two_ranks_equal_disjoint_complete(packed, tmp_path):
    worker = Path(__file__).with_name("dist_worker.py")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[1]), str(Path(__file__).parent)])}
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
        str(worker), str(packed), str(tmp_path),
    ]
    # own process group: a hang (the failure this test exists to catch) is killed whole, workers included
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        _, err = proc.communicate(timeout=180)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        pytest.fail("torchrun ranks hung: unequal batch counts would block the all_reduce")
    assert proc.returncode == 0, err[-3000:]
    shares = [json.loads((tmp_path / f"rank{k}.json").read_text()) for k in range(2)]
    for epoch in ("0", "1"):
        a, b = shares[0][epoch], shares[1][epoch]
        assert len(a) == len(b) == N // 2  # equal
        assert not set(a) & set(b)  # disjoint
        assert set(a) | set(b) == set(range(N))  # complete
    assert shares[0]["0"] != shares[0]["1"]  # set_epoch reshuffles
    assert shares[0]["batches"] == shares[1]["batches"]
