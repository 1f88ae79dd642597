"""The DALI graph's settings: decoder buffers sized from the dataset, GPU threads capped, no EXIF turns."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import fastload
import fastload.core as core_mod
from fastload import FastLoader, LoaderError
from fastload.pipeline import (
    DALI_DEVICE_PADDING,
    DALI_HOST_PADDING,
    GPU_THREADS,
    SCRATCH_BYTES_PER_PIXEL,
    DecoderSizing,
    GraphSpec,
    decoder_sizing,
    find_dali,
    graph_threads,
    memory_estimate,
)

from conftest import write_image

MIB = 1 << 20


def _spec(**kw) -> GraphSpec:
    base = dict(
        batch_size=64, num_threads=16, device_id=0, train=True, crop=224, resize=256, mean=None, std=None,
        out_dtype="float32", channels_last=False, prefetch=2, hw_decoder_load=None,
    )  # fmt: skip
    base.update(kw)
    return GraphSpec(**base)


# ----------------------------------------------------------------------------- finding DALI


def test_a_missing_dali_is_refused_before_the_dataset_is_opened(monkeypatch, tmp_path):
    """The loader looks for DALI first (without importing it): no DALI is a DependencyError with the
    install hint, even for a dataset that would itself be refused."""
    import sys

    from fastload.errors import DependencyError

    monkeypatch.setitem(sys.modules, "nvidia.dali", None)  # what `import nvidia.dali` then fails on
    with pytest.raises(DependencyError, match=r"^NVIDIA DALI is not importable .*pip install"):
        find_dali()
    with pytest.raises(DependencyError, match="NVIDIA DALI is not importable"):
        FastLoader(tmp_path / "missing", 4, device="cpu")


def test_finding_dali_does_not_import_it():
    import subprocess
    import sys

    code = "import sys; from fastload.pipeline import find_dali; find_dali(); print('nvidia.dali' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


# ----------------------------------------------------------------------------- sizing


def test_sizing_of_big_images_covers_the_largest_image_and_hints_the_median():
    stats = {"width": {"min": 300, "median": 500, "max": 4000}, "height": {"min": 200, "median": 375, "max": 3000}}
    s = decoder_sizing(stats)
    need = SCRATCH_BYTES_PER_PIXEL * 4000 * 3000
    for pad in (s.device_memory_padding, s.host_memory_padding):
        assert need <= pad < need + MIB and pad % MIB == 0
    assert (s.preallocate_width_hint, s.preallocate_height_hint) == (500, 375)
    # the pack's pixel limit bounds the largest image more tightly than max width x max height
    capped = decoder_sizing(stats, max_pixels=1_000_000)
    assert SCRATCH_BYTES_PER_PIXEL * 1_000_000 <= capped.device_memory_padding < s.device_memory_padding
    assert capped.device_memory_padding == max(DALI_DEVICE_PADDING, capped.device_memory_padding)


def test_sizing_of_small_images_keeps_dalis_defaults_as_the_floor():
    s = decoder_sizing({"width": {"min": 32, "median": 64, "max": 96}, "height": {"min": 32, "median": 48, "max": 80}})
    assert (s.device_memory_padding, s.host_memory_padding) == (DALI_DEVICE_PADDING, DALI_HOST_PADDING)
    assert (s.preallocate_width_hint, s.preallocate_height_hint) == (64, 48)


@pytest.mark.parametrize(
    "stats",
    [None, {}, {"width": {"max": 0}, "height": {"max": 0}}, {"width": {"max": "4000"}, "height": {"max": 3000}},
     {"width": {"max": True}, "height": {"max": 10}}, {"width": [1, 2], "height": 3}],
)  # fmt: skip
def test_sizing_without_usable_recorded_sizes_is_dalis_default(stats):
    assert decoder_sizing(stats) == DecoderSizing()


def test_loader_builds_its_graph_with_the_sizing_of_its_datasets_recorded_sizes(tmp_path, monkeypatch):
    src = tmp_path / "src"
    sizes = [(40, 30), (64, 48), (200, 150), (96, 80), (120, 60)]
    for i, size in enumerate(sizes):
        write_image(src / "c" / f"{i}.jpg", (10 * i, 90, 200), size=size, quality=90)
    out = tmp_path / "packed"
    fastload.pack(src, out, workers=1, progress=False)
    stats = fastload.Dataset(out).manifest.stats
    assert stats["width"]["max"] == 200 and stats["height"]["median"] == 60  # what pack recorded
    specs: list[GraphSpec] = []
    real = core_mod.build_pipeline

    def spy(spec, source):
        specs.append(spec)
        return real(spec, source)

    monkeypatch.setattr(core_mod, "build_pipeline", spy)
    with FastLoader(out, 5, device="cpu", crop=16, shuffle=False) as loader:
        x, _ = next(iter(loader))
    assert x.shape == (5, 3, 16, 16)
    (spec,) = specs
    assert (spec.preallocate_width_hint, spec.preallocate_height_hint) == (96, 60)  # medians of the widths, heights
    assert spec.device_memory_padding == decoder_sizing(stats).device_memory_padding


# ----------------------------------------------------------------------------- threads and memory


def test_gpu_graph_threads_are_capped_and_cpu_graph_threads_are_not():
    assert graph_threads(_spec(num_threads=64)) == GPU_THREADS
    assert graph_threads(_spec(num_threads=2)) == 2
    assert graph_threads(_spec(num_threads=64, device_id=None)) == 64


def test_memory_estimate_stops_growing_with_threads_past_the_cap():
    sizing = decoder_sizing({"width": {"median": 500, "max": 4000}, "height": {"median": 375, "max": 3000}}).fields()
    few, many, more = (memory_estimate(_spec(num_threads=n, **sizing)) for n in (1, GPU_THREADS, 128))
    assert few["device"] < many["device"] == more["device"]
    assert many["pinned"] == more["pinned"] == 2 * GPU_THREADS * sizing["host_memory_padding"]
    assert memory_estimate(_spec(device_id=None, **sizing))["device"] == 0


# ----------------------------------------------------------------------------- EXIF orientation


def _set_orientation(payload: bytes, value: int) -> bytes:
    """``payload`` with its EXIF orientation entry (now 1) set to ``value``: same length."""
    for entry, new in (
        (b"\x12\x01\x03\x00\x01\x00\x00\x00\x01\x00", bytes([value, 0])),  # little-endian TIFF
        (b"\x01\x12\x00\x03\x00\x00\x00\x01\x00\x01", bytes([0, value])),  # big-endian TIFF
    ):
        at = payload.find(entry)
        if at >= 0:
            return payload[: at + 8] + new + payload[at + 10 :]
    raise AssertionError("no EXIF orientation entry in the payload")


@pytest.fixture
def exif_tagged(tmp_path) -> Path:
    """A packed dataset whose one 96x48 payload (left half red, right half blue) carries EXIF
    orientation 6 (turn 90 degrees), its checksum right: what pack never writes, and what a
    loader must still decode as stored."""
    from fastload.format import encode_record

    a = np.zeros((48, 96, 3), np.uint8)
    a[:, :48] = (230, 20, 20)
    a[:, 48:] = (20, 20, 230)
    exif = Image.Exif()
    exif[0x0112] = 1  # upright: pack stores the file byte for byte
    src = tmp_path / "src" / "c"
    src.mkdir(parents=True)
    Image.fromarray(a).save(src / "0.jpg", quality=95, exif=exif.tobytes())
    out = tmp_path / "packed"
    fastload.pack(tmp_path / "src", out, workers=1, progress=False)
    ds = fastload.Dataset(out)
    header, value, _ = ds.raw(0)
    payload, _ = ds[0]
    assert payload == (src / "0.jpg").read_bytes()
    rotated = _set_orientation(payload, 6)
    with Image.open(io.BytesIO(rotated)) as im:
        assert im.getexif()[0x0112] == 6
    new = encode_record(
        rotated, label=header.label, encoding=header.encoding, width=header.width, height=header.height,
        orig_width=header.orig_width, orig_height=header.orig_height, flags=header.flags, path=ds.source_path(0),
    )  # fmt: skip
    assert len(new) == len(value)
    shard = out / ds.shards[0].file
    raw = shard.read_bytes()
    assert raw.count(bytes(value)) == 1
    shard.write_bytes(raw.replace(bytes(value), new))
    fastload.store.close_shared()
    return out


def _halves(x) -> tuple[np.ndarray, np.ndarray]:
    img = x[0].float().numpy()  # CHW, uint8 values
    w = img.shape[2]
    return img[:, :, : w // 3].mean(axis=(1, 2)), img[:, :, -(w // 3) :].mean(axis=(1, 2))


@pytest.mark.parametrize("train", [True, False])
def test_exif_orientation_in_a_payload_is_not_applied(exif_tagged, train):
    # Rotated by its EXIF tag, the 96x48 image would be 48x96: the training crop box (computed
    # from the header's 96x48) would fall outside it, and the eval crop would show red above blue.
    kw = dict(scale=(1.0, 1.0), ratio=(2.0, 2.0), flip=0.0) if train else {}
    try:
        with FastLoader(exif_tagged, 1, device="cpu", crop=32, resize=32, shuffle=False, train=train, mean=None, std=None, **kw) as loader:
            x, _ = next(iter(loader))
    except LoaderError as e:  # the failure this test exists to catch
        pytest.fail(f"the EXIF-tagged payload was turned before cropping: {e}")
    assert x.shape == (1, 3, 32, 32)
    left, right = _halves(x)
    assert left[0] > 150 and left[2] < 100, f"left third is not red: {left}"
    assert right[2] > 150 and right[0] < 100, f"right third is not blue: {right}"


# ---- handing batches to DALI and taking them back without copies


def test_encoded_batch_feeds_dali_the_same_bytes_as_a_list():
    from nvidia.dali import fn, pipeline_def, types

    from fastload.pipeline import encoded_batch

    jpegs = []
    for k, side in enumerate((9, 17, 30)):
        buf = io.BytesIO()
        Image.new("RGB", (side, side + k), (10 * k, 200, 30)).save(buf, "JPEG", quality=95)
        jpegs.append(np.frombuffer(buf.getvalue(), dtype=np.uint8))
    arena = np.concatenate(jpegs + [np.zeros(5, np.uint8)])  # the payloads as views of one buffer, as read_batch gives them
    bounds = np.cumsum([0] + [len(j) for j in jpegs])
    views = [arena[a:b] for a, b in zip(bounds[:-1], bounds[1:])]
    outs = {}
    for name, batch in (("list", lambda: views), ("tensorlist", lambda: encoded_batch(views))):

        @pipeline_def(batch_size=3, num_threads=1, device_id=None)
        def graph():
            enc = fn.external_source(source=batch, batch=True, dtype=types.UINT8, ndim=1)
            return enc, fn.decoders.image(enc, device="cpu", output_type=types.RGB)

        pipe = graph()
        pipe.build()
        enc, img = pipe.run()
        outs[name] = ([np.array(enc[i]) for i in range(3)], [np.array(img[i]) for i in range(3)])
    for i in range(3):
        np.testing.assert_array_equal(outs["tensorlist"][0][i], jpegs[i])
        np.testing.assert_array_equal(outs["tensorlist"][1][i], outs["list"][1][i])
        side = (9, 17, 30)[i]
        assert outs["tensorlist"][1][i].shape == (side + i, side, 3)


def test_cpu_samples_are_views_of_a_contiguous_batch_and_copies_of_a_scattered_one():
    from nvidia.dali.tensors import TensorCPU, TensorListCPU

    from fastload.pipeline import cpu_samples

    arrays = [np.arange(k * 6, dtype=np.uint8).reshape(k, 2, 3) for k in (1, 4, 2)]
    for contiguous in (True, False):
        batch = TensorListCPU([TensorCPU(a) for a in arrays], None, contiguous)
        got = cpu_samples(batch)
        assert [g.shape for g in got] == [a.shape for a in arrays]
        for g, a in zip(got, arrays):
            np.testing.assert_array_equal(g, a)
    # contiguous: one buffer, the samples back to back in it
    got = cpu_samples(TensorListCPU([TensorCPU(a) for a in arrays], None, True))
    base = got[0].ctypes.data
    assert [g.ctypes.data - base for g in got] == [0, 6, 30]
