"""Big images: crop windows far larger than the output are decoded at reduced scale on the CPU path,
and ``pack`` / ``inspect`` say when a dataset's images are far larger than training needs."""

from __future__ import annotations

import io
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import fastload
import fastload.host
from fastload import FastLoader
from fastload.augment import train_params
from fastload.errors import LoaderError
from fastload.sampler import EpochSampler

from reference import as_hwc255, decode, difference, train_image

CROP = 64
BATCH = 4
#: 1600x1200 photos (their windows are 4 to 8+ times CROP), 400x300 ones (1 to 4 times: scales 2 and
#: 4, and full scale), and small ones that always decode at full scale: batches mix both paths.
SIZES = [(1600, 1200), (1200, 1600), (400, 300), (300, 400), (1600, 1200), (120, 90), (400, 300), (400, 300), (100, 100), (300, 400)]

#: Reduced-scale output against the full-scale path, per image: PSNR, and (max |diff|, worst channel's
#: mean |diff|) in 0..255 units. Measured on these images over 12 seeds (86 reduced crops at 1/2, 1/4
#: and 1/8): PSNR >= 49.5 dB, max 4, mean <= 0.62. libjpeg's scaled IDCT averages each 2x2..8x8 block
#: like an area filter before PIL's bilinear filter shrinks the rest of the way; the full-scale path
#: applies the bilinear (triangle) filter alone: both low-pass the window, a little differently. A
#: window moved by 3/4 of an output pixel measured PSNR <= 44.1, max >= 6, mean >= 1.37: outside.
MIN_PSNR = 45.0
REDUCED = (5.0, 1.0)


def _photo(w: int, h: int, seed: int) -> np.ndarray:
    """An HWC uint8 image: colour gradients, a few soft waves, and pixel noise (JPEG has detail to keep)."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
    img = np.empty((h, w, 3), dtype=np.float32)
    img[..., 0] = 40 + 170 * xx / w
    img[..., 1] = 40 + 170 * yy / h
    img[..., 2] = 128 + 50 * np.sin(xx / 37.0 + seed) * np.cos(yy / 53.0)
    img += rng.normal(0.0, 6.0, img.shape).astype(np.float32)
    return np.clip(img, 0, 255).astype(np.uint8)


def _jpeg(image: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(image).save(buf, "JPEG", quality=95)
    return buf.getvalue()


@pytest.fixture(scope="module")
def big(tmp_path_factory) -> Path:
    base = tmp_path_factory.mktemp("big")
    for i, (w, h) in enumerate(SIZES):
        path = base / "src" / f"class_{i % 2}" / f"{i:02d}.jpg"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(_jpeg(_photo(w, h, i)))
    fastload.pack(base / "src", base / "packed", workers=1, progress=False)
    return base / "packed"


def _scale_for(w: float, h: float) -> int:
    """The reduced scale this test expects for a window: the largest 1/d keeping both sides >= CROP."""
    if min(w, h) < 2 * CROP:
        return 1
    return max(d for d in (2, 4, 8) if min(w, h) / d >= CROP)


def _reduced_reference(payload: bytes, box, d: int) -> np.ndarray:
    """Decode at 1/d with PIL's draft, then resize the window's exact place at that scale (unflipped)."""
    x, y, w, h = (float(v) for v in box)
    with Image.open(io.BytesIO(payload)) as im:
        full = im.size
        im.draft("RGB", (full[0] // d, full[1] // d))
        assert im.size == (math.ceil(full[0] / d), math.ceil(full[1] / d))  # libjpeg's scaled size
        return np.asarray(im.resize((CROP, CROP), Image.BILINEAR, box=(x / d, y / d, (x + w) / d, (y + h) / d)))


def _flipped(image: np.ndarray, flip: bool) -> np.ndarray:
    return np.ascontiguousarray(image[:, ::-1]) if flip else image


def _expected(packed: Path, *, seed: int, epoch: int = 0) -> list[dict]:
    """Every sample of an epoch, in order: its index, box, flip, size, scale, and both references (HWC uint8)."""
    ds = fastload.Dataset(packed)
    sampler = EpochSampler(num_samples=len(ds), batch_size=BATCH, shuffle=True, drop_last=False, seed=seed, rank=0, world_size=1)
    out = []
    for b in sampler.batches(epoch, 0):
        idx = [int(i) for i in b.indices]
        payloads = [ds[i][0] for i in idx]
        images = [decode(p) for p in payloads]
        w = np.array([im.shape[1] for im in images])
        h = np.array([im.shape[0] for im in images])
        boxes, flips = train_params(w, h, seed=seed, epoch=epoch, positions=b.positions, scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3), flip=0.5)
        for k, i in enumerate(idx):
            d = _scale_for(boxes[k][2], boxes[k][3])
            full = train_image(images[k], boxes[k], bool(flips[k]), crop=CROP)
            reduced = _flipped(_reduced_reference(payloads[k], boxes[k], d), bool(flips[k])) if d > 1 else None
            out.append({
                "index": i, "box": boxes[k], "flip": bool(flips[k]), "size": (int(w[k]), int(h[k])), "scale": d,
                "full": full, "reduced": reduced, "payload": payloads[k],
            })  # fmt: skip
    return out


def _loader(packed: Path, **kw) -> FastLoader:
    kw = {"device": "cpu", "crop": CROP, "num_threads": 2, "mean": None, "std": None, **kw}
    return FastLoader(packed, BATCH, **kw)


def _images(loader: FastLoader) -> tuple[list[np.ndarray], list[int]]:
    images, labels = [], []
    for x, y in loader:
        images += [as_hwc255(im).astype(np.uint8) for im in x]
        labels += y.tolist()
    return images, labels


def _psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    return math.inf if mse == 0 else 10 * math.log10(255.0**2 / mse)


def test_big_windows_are_decoded_at_reduced_scale_and_match_pil_draft(big, monkeypatch):
    calls: list[int] = []
    real = fastload.host.reduced_crop

    def spy(payload, box, *, scale, crop):
        calls.append(scale)
        return real(payload, box, scale=scale, crop=crop)

    monkeypatch.setattr(fastload.host, "reduced_crop", spy)
    expected = _expected(big, seed=3)
    scales = [e["scale"] for e in expected]
    assert {1, 2, 4, 8} <= set(scales)  # every scale, and full-scale samples in the same batches
    with _loader(big, seed=3) as loader:
        images, _ = _images(loader)
    assert sorted(calls) == sorted(s for s in scales if s > 1)
    assert len(images) == len(expected)
    for got, e in zip(images, expected):
        want = e["reduced"] if e["scale"] > 1 else e["full"]
        if e["scale"] > 1:  # same decoder, same filter, same box: exactly PIL's draft + resize
            np.testing.assert_array_equal(got, want, err_msg=f"sample {e['index']} at 1/{e['scale']}")
        else:  # DALI's full-scale ROI decode + the host resize, as before
            assert np.abs(got.astype(int) - want).max() <= 2, f"sample {e['index']} at full scale"


def test_reduced_scale_is_close_to_full_scale_and_not_to_a_shifted_window(big):
    expected = [e for e in _expected(big, seed=3) if e["scale"] > 1]
    assert {2, 4, 8} <= {e["scale"] for e in expected}
    worst_psnr, worst_mean = math.inf, 0.0
    for e in expected:
        psnr, d = _psnr(e["reduced"], e["full"]), difference(e["reduced"], e["full"])
        worst_psnr, worst_mean = min(worst_psnr, psnr), max(worst_mean, d.mean)
        assert psnr >= MIN_PSNR and d.within(*REDUCED), f"sample {e['index']} at 1/{e['scale']}: {psnr:.1f} dB, {d}"
    assert math.isfinite(worst_psnr) and worst_mean > 0  # the two paths do differ: real outputs compared
    # the bound tells a mistake apart: each window moved by 3/4 of an output pixel is outside it
    for e in expected:
        x, y, w, h = (float(v) for v in e["box"])
        dx = 0.75 * w / CROP
        dx = dx if x + dx + w <= e["size"][0] else -dx
        if x + dx < 0:
            continue  # the window spans the image: nowhere to move it
        moved = _flipped(fastload.host.reduced_crop(e["payload"], (x + dx, y, w, h), scale=e["scale"], crop=CROP), e["flip"])
        d = difference(moved, e["full"])
        assert _psnr(moved, e["full"]) < MIN_PSNR or not d.within(*REDUCED), f"sample {e['index']}: a moved window passes"


def test_the_full_scale_path_is_what_it_was_when_reduced_scale_is_off(big, monkeypatch):
    monkeypatch.setattr(fastload.host, "REDUCED_SCALE_RATIO", math.inf)
    expected = _expected(big, seed=3)
    with _loader(big, seed=3) as loader:
        images, _ = _images(loader)
    for got, e in zip(images, expected):
        assert np.abs(got.astype(int) - e["full"]).max() <= 2, f"sample {e['index']}"


def test_same_seed_same_pixels_another_seed_other_pixels(big):
    runs = []
    for seed in (5, 5, 6):
        with _loader(big, seed=seed, mean=fastload.IMAGENET_MEAN, std=fastload.IMAGENET_STD) as loader:
            runs.append([x for x, _ in loader])
    assert all(torch.equal(a, b) for a, b in zip(runs[0], runs[1]))
    assert not all(torch.equal(a, b) for a, b in zip(runs[0], runs[2]))


def test_decode_threads_only_for_datasets_with_big_enough_images_and_gone_after_close(big, tmp_path):
    import threading

    def decode_threads() -> list[str]:
        return [t.name for t in threading.enumerate() if t.name.startswith("fastload-decode")]

    with _loader(big, seed=1) as loader:
        next(iter(loader))
        assert len(decode_threads()) == 2  # one per DALI CPU thread
    assert decode_threads() == []
    src = tmp_path / "src"
    for i in range(4):
        path = src / "c" / f"{i}.jpg"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(_jpeg(_photo(120, 100, i)))  # no window can be 2 x CROP tall
    fastload.pack(src, tmp_path / "p", workers=1, progress=False)
    with _loader(tmp_path / "p", seed=1) as loader:
        assert len(list(loader)) == 1 and decode_threads() == []


def test_an_undecodable_big_payload_is_named_at_its_batchs_turn(tmp_path, monkeypatch):
    src = tmp_path / "src"
    for i in range(8):
        path = src / "c" / f"{i}.jpg"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(_jpeg(_photo(1200, 900, i)))
    out = tmp_path / "p"
    fastload.pack(src, out, workers=1, progress=False)
    ds = fastload.Dataset(out)
    bad = 6  # in the second batch of an unshuffled epoch
    header, value, _ = ds.raw(bad)
    payload, _ = ds[bad]
    sos = payload.index(b"\xff\xda")
    broken = payload[:sos] + b"\xff\xc4" + bytes(64) + payload[sos + 66 :]  # a Huffman table of zeros: PIL and DALI refuse it
    with pytest.raises(OSError), Image.open(io.BytesIO(broken)) as im:  # PIL's UnidentifiedImageError
        im.draft("RGB", (300, 225))
        im.load()
    from fastload.format import ENC_JPEG, encode_record

    new = encode_record(
        broken, label=0, encoding=ENC_JPEG, width=header.width, height=header.height,
        orig_width=header.orig_width, orig_height=header.orig_height, path=ds.source_path(bad),
    )  # fmt: skip
    shard = out / ds.shards[0].file
    shard.write_bytes(shard.read_bytes().replace(bytes(value), new))
    for ratio in (2.0, math.inf):  # reduced scale (the windows are >= 13 x CROP), then DALI at full scale
        monkeypatch.setattr(fastload.host, "REDUCED_SCALE_RATIO", ratio)
        with FastLoader(out, 4, device="cpu", crop=CROP, shuffle=False, scale=(0.9, 1.0), num_threads=1) as loader:
            it = iter(loader)
            x, _ = next(it)  # the batch before is delivered
            assert x.shape == (4, 3, CROP, CROP)
            with pytest.raises(LoaderError, match=rf"sample {bad} \(.*{bad}\.jpg\).*failed to decode") as info:
                next(it)
        from_pil = type(info.value.__cause__).__name__ == "UnidentifiedImageError"
        assert from_pil == (ratio == 2.0), info.value.__cause__


# ----------------------------------------------------------------------------- pack / inspect advice


def _cli(capsys, *argv) -> tuple[int, str]:
    from fastload.cli import main

    code = main([str(a) for a in argv])
    return code, capsys.readouterr().out


def test_pack_and_inspect_suggest_max_size_for_images_far_larger_than_training_needs(tmp_path, capsys):
    src = tmp_path / "src"
    for i, (w, h) in enumerate([(1500, 1100), (1100, 1500), (1500, 1100), (300, 200), (1500, 1100)]):
        path = src / "c" / f"{i}.jpg"
        path.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(_photo(w, h, i)).save(path, "JPEG", quality=80)
    note = "note: images are a median 1500x1100; training crops of 224 need about 256-512"
    code, out = _cli(capsys, "pack", src, tmp_path / "big", "--workers", "1", "--no-progress")
    assert code == 0 and f"{note}: pack with --max-size 512 to read and decode faster" in out, out
    code, out = _cli(capsys, "inspect", tmp_path / "big")
    assert code == 0 and f"{note}: pack the source again with --max-size 512" in out, out
    code, out = _cli(capsys, "inspect", tmp_path / "big", "--json")
    assert code == 0 and "note:" not in out  # the JSON stays JSON
    # packed small enough, or small to begin with: nothing to suggest
    code, out = _cli(capsys, "pack", src, tmp_path / "small", "--workers", "1", "--no-progress", "--max-size", "512")
    assert code == 0 and "packed 5 images" in out and "note:" not in out, out
    code, out = _cli(capsys, "inspect", tmp_path / "small")
    assert code == 0 and "median 512" in out.replace("  ", " ") and "note:" not in out, out
