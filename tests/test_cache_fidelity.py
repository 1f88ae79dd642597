"""The ImageFolder cache stores exactly the pixels the ImageFolder's own loader gives (issue 24, class 4).

``FastLoader(ImageFolder(...))`` packs the folder into a cache (:func:`fastload.cache.cached_pack`).
torchvision's ``default_loader`` is ``Image.open(f).convert("RGB")``: no EXIF orientation,
16-bit samples clipped, alpha dropped. ``fastload pack`` does otherwise (turns images
upright, scales 16-bit samples, re-encodes as JPEG); the cache must not:

* On every kind of image the pack side converts (EXIF orientations 1-8, on baseline,
  progressive, 4:2:0 and grayscale JPEGs; 16-bit grayscale and RGB PNG; RGBA, LA, palette,
  palette with transparency, 1-bit PNG; a PNG with an EXIF orientation; grayscale and CMYK
  JPEG; lossy, lossless, RGBA and EXIF-rotated WebP; BMP, palette BMP; TIFF RGB, rotated,
  16-bit, 32-bit integer, CMYK; GIF and an animated GIF; PPM, 16-bit PGM) the cached record's
  payload, decoded by PIL, is ``default_loader``'s pixels **exactly** (the store is lossless:
  plain JPEGs keep their bytes, an orientation tag set to 1; everything else is a PNG).
* Through ``FastLoader`` (DALI's decoders and resize), within the tolerance the drop-in
  already documents for DALI against PIL (at most one level per pixel, mean below 0.25:
  ``tests/test_dropin.py::test_evaluation_output_is_torchvisions_resize_and_center_crop``);
  the old cache was off by a mean of 163 levels on a rotated JPEG and 252 on a 16-bit PNG.
* Datasets whose items the cache cannot reproduce are refused by
  :func:`fastload.cache.check_reproducible` with a ConfigError naming the class and the method
  (or the loader) and what to do: another loader, accimage, ``__getitem__`` /
  ``__getitems__`` overrides, a ``__len__`` that is not ``len(samples)``. Overriding
  ``find_classes`` / ``make_dataset`` is reproducible (the cache reads ``samples``).
"""

from __future__ import annotations

import io
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import fastload
from fastload.cache import cached_pack, check_reproducible
from fastload.errors import ConfigError, FormatError
from fastload.format import ENC_JPEG, ENC_PNG, FLAG_CONVERTED, FLAG_ORIENTED

from conftest import position_pattern

tv = pytest.importorskip("torchvision")
import torchvision.transforms as T  # noqa: E402
from torchvision.datasets import ImageFolder  # noqa: E402
from torchvision.datasets.folder import accimage_loader, default_loader, pil_loader  # noqa: E402

W, H = 80, 56  # not square: a turn by 90 degrees changes the size
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def _rgb(label: int = 1) -> np.ndarray:
    """A gradient with no symmetry (R = x, G = y, B = x*y): any turn or mirror shows."""
    a = position_pattern(W, H, label, checker=False)
    yy, xx = np.mgrid[0:H, 0:W]
    a[..., 2] = np.rint(xx * yy * 255.0 / ((W - 1) * (H - 1))).astype(np.uint8)
    return a


def _exif(orientation: int) -> bytes:
    e = Image.Exif()
    e[0x0112] = orientation
    return e.tobytes()


def _u16() -> np.ndarray:
    yy, xx = np.mgrid[0:H, 0:W]
    return ((xx * 811 + yy * 53) % 65536).astype(np.uint16)  # most values above 255: clipped by convert


def _png_rgb16(path: Path, a: np.ndarray) -> None:
    """A 48-bit RGB PNG (PIL writes none), written chunk by chunk."""
    h, w, _ = a.shape
    raw = b"".join(b"\x00" + a[y].astype(">u2").tobytes() for y in range(h))

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    ihdr = struct.pack(">IIBBBBB", w, h, 16, 2, 0, 0, 0)
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))


def _save(im: Image.Image, path: Path, fmt: str, **kw) -> None:
    im.save(path, fmt, **kw)


def _writers() -> dict[str, callable]:
    a = _rgb()
    rgb = Image.fromarray(a)
    w: dict[str, callable] = {}
    for o in range(1, 9):
        w[f"exif{o}.jpg"] = lambda p, o=o: _save(rgb, p, "JPEG", quality=95, exif=_exif(o))
    w["exif6_progressive.jpg"] = lambda p: _save(rgb, p, "JPEG", quality=90, progressive=True, exif=_exif(6))
    w["exif8_420.jpg"] = lambda p: _save(rgb, p, "JPEG", quality=80, subsampling=2, exif=_exif(8))
    w["exif5_gray.jpg"] = lambda p: _save(rgb.convert("L"), p, "JPEG", quality=90, exif=_exif(5))
    w["gray.jpg"] = lambda p: _save(rgb.convert("L"), p, "JPEG", quality=90)
    w["cmyk.jpg"] = lambda p: _save(rgb.convert("CMYK"), p, "JPEG", quality=90)
    w["gray16.png"] = lambda p: _save(Image.fromarray(_u16()), p, "PNG")
    w["rgb16.png"] = lambda p: _png_rgb16(p, np.stack([_u16(), _u16()[::-1], _u16()[:, ::-1]], -1))
    w["rgba.png"] = lambda p: _save(Image.fromarray(np.dstack([a, a[..., :1]])), p, "PNG")
    w["la.png"] = lambda p: _save(rgb.convert("LA"), p, "PNG")
    w["palette.png"] = lambda p: _save(rgb.convert("P", palette=Image.Palette.ADAPTIVE, colors=64), p, "PNG")
    w["palette_transparent.png"] = lambda p: _save(rgb.convert("P", palette=Image.Palette.ADAPTIVE, colors=64), p, "PNG", transparency=3)
    w["bilevel.png"] = lambda p: _save(rgb.convert("1"), p, "PNG")
    w["exif6.png"] = lambda p: _save(rgb, p, "PNG", exif=_exif(6))
    w["lossy.webp"] = lambda p: _save(rgb, p, "WEBP", quality=80)
    w["lossless.webp"] = lambda p: _save(rgb, p, "WEBP", lossless=True)
    w["rgba.webp"] = lambda p: _save(Image.fromarray(np.dstack([a, a[..., 1:2]])), p, "WEBP", lossless=True)
    w["exif3.webp"] = lambda p: _save(rgb, p, "WEBP", lossless=True, exif=_exif(3))
    w["rgb.bmp"] = lambda p: _save(rgb, p, "BMP")
    w["palette.bmp"] = lambda p: _save(rgb.convert("P", palette=Image.Palette.ADAPTIVE, colors=32), p, "BMP")
    w["rgb.tiff"] = lambda p: _save(rgb, p, "TIFF")
    w["exif7.tiff"] = lambda p: _save(rgb, p, "TIFF", tiffinfo={0x0112: 7})
    w["gray16.tiff"] = lambda p: _save(Image.fromarray(_u16()), p, "TIFF")
    w["int32.tiff"] = lambda p: _save(Image.fromarray(_u16().astype(np.int32) * 3 - 1000), p, "TIFF")
    w["cmyk.tiff"] = lambda p: _save(rgb.convert("CMYK"), p, "TIFF")
    w["still.gif"] = lambda p: _save(rgb.convert("P", palette=Image.Palette.ADAPTIVE, colors=64), p, "GIF")
    w["animated.gif"] = lambda p: rgb.convert("P").save(p, "GIF", save_all=True, append_images=[Image.fromarray(a[::-1].copy()).convert("P")])
    w["rgb.ppm"] = lambda p: _save(rgb, p, "PPM")
    w["gray16.pgm"] = lambda p: _save(Image.fromarray(_u16()), p, "PPM")
    return w


KINDS = sorted(_writers())


@pytest.fixture(scope="module")
def fidelity(tmp_path_factory) -> tuple[ImageFolder, fastload.Dataset, dict[str, int]]:
    """One ImageFolder of every kind (one class per kind), cached once: (folder, cached dataset, kind -> index)."""
    base = tmp_path_factory.mktemp("fidelity")
    for kind, write in _writers().items():
        d = base / "src" / kind.replace(".", "_")
        d.mkdir(parents=True)
        write(d / kind)
    folder = ImageFolder(str(base / "src"), is_valid_file=lambda p: True)  # GIFs too (not among ImageFolder's extensions)
    entry = cached_pack(folder, cache_dir=base / "cache", progress=False)
    ds = fastload.Dataset(entry)
    index = {Path(p).name: i for i, (p, _) in enumerate(folder.samples)}
    assert sorted(index) == KINDS and len(ds) == len(KINDS)
    return folder, ds, index


def _record_pixels(ds: fastload.Dataset, i: int) -> np.ndarray:
    payload, _ = ds[i]
    with Image.open(io.BytesIO(payload)) as im:
        return np.asarray(im.convert("RGB"))


# every kind but the plain upright JPEG, which the old cache stored byte for byte as well (checked with exif 2-8 below)
@pytest.mark.parametrize("kind", [k for k in KINDS if k != "exif1.jpg"])
def test_the_cached_record_is_default_loaders_pixels_exactly(fidelity, kind):
    folder, ds, index = fidelity
    i = index[kind]
    want = np.asarray(default_loader(folder.samples[i][0]))
    got = _record_pixels(ds, i)
    assert got.shape == want.shape, f"{kind}: stored {got.shape[1]}x{got.shape[0]}, default_loader {want.shape[1]}x{want.shape[0]}"
    diff = np.abs(got.astype(int) - want.astype(int))
    assert diff.max() == 0, f"{kind}: max |difference| {diff.max()}, mean {diff.mean():.3f}"
    h = ds.header(i)
    assert (h.width, h.height) == (want.shape[1], want.shape[0]) and not h.flags & FLAG_ORIENTED


def test_an_exif_rotated_plain_jpeg_keeps_its_bytes_with_an_upright_tag(fidelity):
    """Orientations 1-8: default_loader does not turn them, nor does the cache: the same image
    data, byte for byte, the orientation tag set to 1 (so no decoder turns it either)."""
    folder, ds, index = fidelity
    for o in range(1, 9):
        i = index[f"exif{o}.jpg"]
        src = Path(folder.samples[i][0]).read_bytes()
        payload, _ = ds[i]
        h = ds.header(i)
        assert h.encoding == ENC_JPEG and h.flags == 0 and (h.width, h.height) == (W, H), (o, h)
        assert len(payload) == len(src) and sum(x != y for x, y in zip(payload, src)) == (0 if o == 1 else 1), o
        with Image.open(io.BytesIO(payload)) as im:
            assert im.getexif().get(0x0112) == 1
            assert np.array_equal(np.asarray(im.convert("RGB")), np.asarray(default_loader(folder.samples[i][0])))


def test_converted_images_are_stored_as_lossless_png(fidelity):
    folder, ds, index = fidelity
    for kind in ("gray16.png", "rgba.png", "cmyk.jpg", "gray.jpg", "lossy.webp", "rgb.bmp", "rgb.tiff", "animated.gif"):
        h = ds.header(index[kind])
        assert h.encoding == ENC_PNG and h.flags & FLAG_CONVERTED, (kind, h)
    assert ds.manifest.options["pixels"] == "torchvision pil_loader"
    # what the old cache did to them, for the record: 16-bit scaled (3 where default_loader gives 255)
    i = index["gray16.png"]
    assert int(np.asarray(default_loader(folder.samples[i][0])).max()) == 255 == int(_record_pixels(ds, i).max())


def test_through_fastloader_on_the_cpu_within_dalis_documented_resampling_tolerance(fidelity, tmp_path):
    """DALI decodes the stored payloads and resizes: at most one level per pixel from the
    ImageFolder's own items, mean below 0.25 (the drop-in's documented DALI-vs-PIL bound)."""
    from fastload import FastLoader

    folder, _, _ = fidelity
    tf = T.Compose([T.Resize(64), T.CenterCrop(48), T.ToTensor(), T.Normalize(MEAN, STD)])
    ds = ImageFolder(folder.root, transform=tf, is_valid_file=lambda p: True)
    loader = FastLoader(ds, 8, shuffle=False, device="cpu", cache_dir=Path(folder.root).parent / "cache")
    scale = np.asarray(STD).reshape(3, 1, 1) * 255
    k = 0
    worst = []
    for images, labels in loader:
        for x, y in zip(images.numpy(), labels.tolist()):
            ref, target = ds[k]
            assert y == target
            d = np.abs((x - ref.numpy()) * scale)
            worst.append((float(d.max()), float(d.mean()), Path(ds.samples[k][0]).name))
            k += 1
    loader.close()
    assert k == len(ds)
    bad = [w for w in worst if not (w[0] <= 1.0 + 1e-3 and w[1] < 0.25)]
    assert not bad, bad


# ----------------------------------------------------------------------------- refusals


def _folder(tmp_path: Path) -> Path:
    root = tmp_path / "src"
    for c in range(2):
        (root / f"c{c}").mkdir(parents=True)
        Image.fromarray(_rgb(c)).save(root / f"c{c}" / "x.jpg", quality=90, exif=_exif(6 if c else 1))  # c1: EXIF-rotated
    return root


class Augmented(ImageFolder):
    def __getitem__(self, i):  # the override the old cache ignored
        img, target = super().__getitem__(i)
        return img.rotate(90), target


class Batched(ImageFolder):
    def __getitems__(self, indices):
        return [self[i] for i in indices[::-1]]


class Shorter(ImageFolder):
    def __len__(self):
        return 1


class SameLength(ImageFolder):
    def __len__(self):
        return len(self.samples)


class Filtered(ImageFolder):
    @staticmethod
    def make_dataset(directory, class_to_idx, extensions=None, is_valid_file=None, allow_empty=False):
        items = ImageFolder.make_dataset(directory, class_to_idx, extensions, is_valid_file, allow_empty=allow_empty)
        return items[1:]


class Files:
    """Duck-typed: samples, and a __getitem__ of its own."""

    classes = ["c0", "c1"]

    def __init__(self, root: Path) -> None:
        self.root = str(root)
        self.samples = [(str(root / f"c{c}" / "x.jpg"), c) for c in range(2)]

    def __getitem__(self, i):
        return Image.open(self.samples[i][0]).convert("L"), self.samples[i][1]


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda r: Augmented(str(r)), r"Augmented\(.*\): Augmented\.__getitem__ overrides what dataset\[i\] gives.*fastload\.pack_dataset"),
        (lambda r: Batched(str(r)), r"Batched\.__getitems__ overrides what dataset\[i\] gives.*pack_dataset"),
        (lambda r: Shorter(str(r)), r"Shorter\.__len__ gives 1, not the 2 `samples`.*pack_dataset"),
        (lambda r: Files(r), r"Files\(.*\): Files\.__getitem__ overrides.*pack_dataset"),
        (lambda r: ImageFolder(str(r), loader=accimage_loader), r"accimage_loader, whose pixels the cache does not reproduce.*pack_dataset"),
        # (a custom loader function: tests/test_cache.py::test_a_custom_loader_is_refused)
    ],
)
def test_datasets_the_cache_cannot_reproduce_are_refused_naming_class_and_method(tmp_path, make, match):
    ds = make(_folder(tmp_path))
    with pytest.raises(ConfigError, match=match):
        check_reproducible(ds)
    with pytest.raises(ConfigError, match=match):
        cached_pack(ds, cache_dir=tmp_path / "cache", progress=False)
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").iterdir())  # refused before packing


def test_default_loader_under_the_accimage_backend_is_refused(tmp_path):
    ds = ImageFolder(str(_folder(tmp_path)))
    before = tv.get_image_backend()
    tv.set_image_backend("accimage")
    try:
        with pytest.raises(ConfigError, match=r"image backend is 'accimage'.*set_image_backend\('PIL'\).*pack_dataset"):
            check_reproducible(ds)
    finally:
        tv.set_image_backend(before)
    check_reproducible(ds)


def test_what_the_cache_does_reproduce_is_accepted_and_packed_as_the_dataset_says(tmp_path):
    root = _folder(tmp_path)
    for ds in (ImageFolder(str(root)), ImageFolder(str(root), loader=pil_loader), SameLength(str(root))):
        check_reproducible(ds)
    filtered = Filtered(str(root))  # make_dataset overridden: its choice is in samples, which the cache packs
    check_reproducible(filtered)
    entry = cached_pack(filtered, cache_dir=tmp_path / "cache", progress=False)
    got = fastload.Dataset(entry)
    assert len(got) == len(filtered) == 1 and [int(x) for x in got.labels] == filtered.targets == [1]
    assert np.array_equal(_record_pixels(got, 0), np.asarray(filtered[0][0]))  # the EXIF-rotated one, not turned


def test_an_entry_packed_with_packs_own_conversions_is_not_used(tmp_path):
    """An entry whose manifest does not say pil_loader's pixels (pack's own conversions, as
    the old cache made them) is reported, never read."""
    from fastload.cache import cache_entry

    root = _folder(tmp_path)
    folder = ImageFolder(str(root))
    entry = cache_entry(folder, cache_dir=tmp_path / "cache")
    fastload.pack(root, entry, workers=1, progress=False)
    with pytest.raises(FormatError, match="not packed with the pixels of torchvision's pil_loader.*remove it"):
        cached_pack(folder, cache_dir=tmp_path / "cache", progress=False)
