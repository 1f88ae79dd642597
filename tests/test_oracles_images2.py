"""fastload.packing.images, the paths ``test_oracles_images.py`` leaves: in-memory images (arrays and PIL
images), the RGB conversion of every mode, the Exif Orientation entry read and rewritten in place
(``upright_tag``, the ImageFolder cache's JPEGs), and ``process_task``'s refusals.

Oracles: pixels that encode their coordinates stored losslessly (``pil_loader`` stores PNG) and compared
exactly; 16-bit samples scaled by ``v >> 8`` written out; TIFF 6.0 / ITU T.81 structures built by hand,
whose byte offsets are known; PIL's own ``ImageOps.exif_transpose`` and ``getexif``.
"""

from __future__ import annotations

import io
import pickle
import struct

import numpy as np
import pytest
from PIL import Image, ImageOps

from fastload.format import (
    ENC_JPEG,
    ENC_PNG,
    FLAG_CONVERTED,
    FLAG_ORIENTED,
    FLAG_RESIZED,
    decode_header,
    record_path,
    record_payload,
)
from fastload.packing.images import (
    ImageOptions,
    _exif_orientation,
    _ifd0_orientation,
    _orientation_entry,
    _to_rgb,
    process_task,
    upright_tag,
)


def coords(h: int, w: int) -> np.ndarray:
    """R = x, G = y, B = 7x + 3y (mod 256): every pixel says where it is, no two orientations agree."""
    yy, xx = np.mgrid[0:h, 0:w]
    return np.stack([xx % 256, yy % 256, (7 * xx + 3 * yy) % 256], axis=-1).astype(np.uint8)


def smooth(h: int, w: int) -> np.ndarray:
    """R = 4x, G = 6y, B = 2x + 3y: no wrap-around, so a JPEG of it stays close to it."""
    yy, xx = np.mgrid[0:h, 0:w]
    return np.stack([4 * xx, 6 * yy, 2 * xx + 3 * yy], axis=-1).astype(np.uint8)


def packed(task, **opts):
    """``(header, path, pixels)`` of the record ``process_task`` makes (asserted to be a record)."""
    out = process_task(task, ImageOptions(**opts))
    assert isinstance(out, bytes), out
    header = decode_header(out)
    with Image.open(io.BytesIO(record_payload(out, header))) as im:
        return header, record_path(out, header), np.asarray(im.convert("RGB"))


# ----------------------------------------------------------------------------- arrays


#: an array as a dataset gives it -> the RGB pixels stored (by hand: grey replicated, alpha dropped)
def _arrays():
    rgb = coords(5, 9)
    grey = rgb[:, :, 0]
    rgba = np.concatenate([rgb, np.full((5, 9, 1), 17, np.uint8)], axis=-1)
    return [
        ("HxW", grey, np.repeat(grey[:, :, None], 3, axis=-1)),
        ("HxWx1", grey[:, :, None], np.repeat(grey[:, :, None], 3, axis=-1)),
        ("HxWx3", rgb, rgb),
        ("HxWx4", rgba, rgb),
        ("HxWx3 not contiguous", coords(5, 18)[:, ::2], coords(5, 18)[:, ::2]),
    ]


@pytest.mark.parametrize("k", range(5), ids=[a[0] for a in _arrays()])
def test_an_array_is_stored_pixel_for_pixel_as_its_rgb(k):
    """Arrays of every accepted shape, stored losslessly (``pil_loader``): the pixels exactly the array's,
    grey replicated and alpha dropped; height and width from ``shape[0]`` and ``shape[1]``; flags exactly
    ``FLAG_CONVERTED`` (not turned, not resized); label and path kept. Written for: HxWx1 not squeezed or
    its other channel taken, a shape's mode chosen wrongly (RGBA read as RGB), the sides swapped, an array
    taken as turned by an Exif orientation."""
    _, a, want = _arrays()[k]
    header, path, got = packed(("array", a, 5, "d/7", "d/7"), pil_loader=True)
    assert (header.encoding, header.flags, header.label, path) == (ENC_PNG, FLAG_CONVERTED, 5, "d/7")
    assert (header.width, header.height, header.orig_width, header.orig_height) == (9, 5, 9, 5)
    np.testing.assert_array_equal(got, want)


def test_an_array_shrunk_by_max_size_is_stored_as_jpeg_of_the_target_size():
    """A 40x64 (HxW) array with ``--max-size 32``: a 32x20 JPEG, flags converted and resized, the original
    size 64x40; its pixels those of PIL's LANCZOS resize of the array. Written for: the resize flag or
    the target size lost for in-memory images, a JPEG taken for a PNG."""
    a = smooth(40, 64)
    header, _, got = packed(("array", a, 0, "a", "a"), max_size=32)
    assert header.encoding == ENC_JPEG and header.flags == FLAG_CONVERTED | FLAG_RESIZED
    assert (header.width, header.height, header.orig_width, header.orig_height) == (32, 20, 64, 40)
    want = np.asarray(Image.fromarray(a).resize((32, 20), Image.Resampling.LANCZOS)).astype(int)
    assert np.abs(got.astype(int) - want).mean() < 3


def test_a_wide_array_is_not_held_to_the_jpeg_decoders_side_limit():
    """A 2x65501 array (wider than libjpeg reads, so a *JPEG* of it is refused) is no JPEG: shrunk by
    ``--max-size 100`` it is stored 100x1. Written for: the JPEG-source side check applied to arrays."""
    header, _, _ = packed(("array", np.zeros((2, 65501), np.uint8), 0, "a", "a"), max_size=100)
    assert (header.width, header.height, header.orig_width, header.orig_height) == (100, 1, 65501, 2)


@pytest.mark.parametrize(
    "a, reason",
    [
        (np.zeros((4, 4, 3), np.uint16), "array dtype uint16 is not uint8"),
        (np.zeros((4, 4, 3), np.float32), "array dtype float32 is not uint8"),
        (np.zeros((4, 4, 2), np.uint8), "array shape (4, 4, 2) is not HxW, HxWx1, HxWx3 or HxWx4"),
        (np.zeros((4, 4, 5), np.uint8), "array shape (4, 4, 5) is not HxW, HxWx1, HxWx3 or HxWx4"),
        (np.zeros((4,), np.uint8), "array shape (4,) is not HxW, HxWx1, HxWx3 or HxWx4"),
        (np.zeros((2, 4, 4, 3), np.uint8), "array shape (2, 4, 4, 3) is not HxW, HxWx1, HxWx3 or HxWx4"),
        (np.zeros((0, 4, 3), np.uint8), "invalid image size 4x0"),
        (np.zeros((3, 4), np.uint8), "decompression bomb: 4x3 pixels exceeds --max-pixels 11"),
    ],
)
def test_an_array_that_is_no_image_is_refused_saying_why(a, reason):
    """Each refused array with its reason, exactly (``--max-pixels 11``: 12 pixels is a bomb). Written for:
    the dtype test inverted, a shape of 2 or 5 channels or 1 or 4 dimensions accepted, the sides of a
    size message swapped, the messages changed."""
    assert process_task(("array", a, 0, "n", "w"), ImageOptions(max_pixels=11)) == ("skip", "w", reason)


# ----------------------------------------------------------------------------- PIL images


def _jpeg_with_orientation(a: np.ndarray, orientation: int) -> bytes:
    e = Image.Exif()
    e[0x0112] = orientation
    b = io.BytesIO()
    Image.fromarray(a).save(b, "JPEG", quality=100, subsampling=0, exif=e.tobytes())
    return b.getvalue()


@pytest.mark.parametrize("orientation", [1, 3, 6, 8])
def test_a_pil_image_is_turned_by_its_exif_orientation(orientation):
    """A PIL image opened from a JPEG whose Exif says ``orientation``: stored upright as PIL's
    ``ImageOps.exif_transpose`` turns it (flags converted, oriented unless 1; the original size 64x40).
    Written for: a PIL image's orientation ignored or taken as another, its flags."""
    raw = _jpeg_with_orientation(smooth(40, 64), orientation)
    with Image.open(io.BytesIO(raw)) as im:
        want = np.asarray(ImageOps.exif_transpose(im).convert("RGB")).astype(int)
    im = Image.open(io.BytesIO(raw))
    header, _, got = packed(("pil", im, 1, "p", "p"))
    size = (40, 64) if orientation in (6, 8) else (64, 40)
    assert (header.width, header.height, header.orig_width, header.orig_height) == (*size, 64, 40)
    assert header.flags == FLAG_CONVERTED | (FLAG_ORIENTED if orientation != 1 else 0)
    assert got.shape == want.shape and np.abs(got.astype(int) - want).mean() < 2


def test_a_pil_image_is_stored_pixel_for_pixel_under_pil_loader():
    """An RGB PIL image under ``pil_loader``: a PNG of exactly its pixels, flags converted. Written for:
    an in-memory PIL image given an orientation or converted wrongly."""
    a = coords(6, 11)
    header, _, got = packed(("pil", Image.fromarray(a), 2, "p", "p"), pil_loader=True)
    assert (header.encoding, header.flags, header.width, header.height) == (ENC_PNG, FLAG_CONVERTED, 11, 6)
    np.testing.assert_array_equal(got, a)


def test_a_pil_image_that_cannot_load_is_refused_with_the_decoders_words():
    """A lazily opened PNG cut short: refused as ``cannot load PIL image (<PIL's message>)``; one over
    ``--max-pixels`` before it is loaded. Written for: the load error's message, the size checks skipped."""
    b = io.BytesIO()
    Image.fromarray(coords(50, 60)).save(b, "PNG")
    im = Image.open(io.BytesIO(b.getvalue()[:120]))
    assert process_task(("pil", im, 0, "n", "w"), ImageOptions()) == (
        "skip", "w", "cannot load PIL image (image file is truncated)")  # fmt: skip
    big = Image.new("RGB", (60, 50))
    assert process_task(("pil", big, 0, "n", "w"), ImageOptions(max_pixels=2999)) == (
        "skip", "w", "decompression bomb: 60x50 pixels exceeds --max-pixels 2999")  # fmt: skip


# ----------------------------------------------------------------------------- conversion to RGB


def _grey(values) -> np.ndarray:
    return np.repeat(np.asarray(values, np.uint8)[:, :, None], 3, axis=-1)


def test_16_bit_samples_are_scaled_by_a_shift_of_8_not_clipped():
    """I;16 (either byte order) and I samples: ``v >> 8`` (negative ones 0, above 255 after the shift
    255), grey; PIL's own ``convert`` would clip 256 to 255. Written for: the shift's direction or width,
    the clip's bounds, I;16B/L or I not taken as 16-bit."""
    v16 = [[0, 255, 256, 511], [4095, 32768, 65280, 65535]]
    want16 = _grey([[v >> 8 for v in row] for row in v16])
    for mode, dt in (("I;16", "<u2"), ("I;16B", ">u2"), ("I;16L", "<u2")):
        im = Image.frombytes(mode, (4, 2), np.array(v16, dt).tobytes())
        got = _to_rgb(im)
        assert got.mode == "RGB"
        np.testing.assert_array_equal(np.asarray(got), want16, err_msg=mode)
    vi = [[-300, -1, 0, 255], [256, 1000, 65535, 70000]]
    want_i = _grey([[0, 0, 0, 0], [1, 3, 255, 255]])
    np.testing.assert_array_equal(np.asarray(_to_rgb(Image.frombytes("I", (4, 2), np.array(vi, "<i4").tobytes()))), want_i)


def test_every_other_mode_converts_as_pil_converts_it():
    """RGB is returned itself; L, LA, RGBA, P, PA, CMYK, YCbCr, 1, F and I;16's neighbours as PIL's own
    ``convert("RGB")`` (F through L) gives them. Written for: RGB copied or converted, a mode's branch
    taken for another."""
    rgb = Image.fromarray(coords(4, 6))
    assert _to_rgb(rgb) is rgb
    for mode in ("L", "LA", "RGBA", "P", "PA", "CMYK", "YCbCr", "1"):
        im = rgb.convert(mode)
        np.testing.assert_array_equal(np.asarray(_to_rgb(im)), np.asarray(im.convert("RGB")), err_msg=mode)
    f = Image.fromarray(np.array([[0, 1.4, 1.6, -3], [255.4, 300, 127.5, 128.5]], np.float32), "F")
    np.testing.assert_array_equal(np.asarray(_to_rgb(f)), _grey([[0, 1, 1, 0], [255, 255, 127, 128]]))


def test_a_palette_lost_in_pickling_is_an_empty_one():
    """A P or PA image that lost its palette in a worker's pickle (``palette`` None) converts as one with
    an empty palette, all black, not an error; a palette kept survives (index 1 -> its colour). Written
    for: the lost palette not restored, or restored over a kept one."""
    for mode in ("P", "PA"):
        lost = pickle.loads(pickle.dumps(Image.new(mode, (3, 2))))
        assert lost.palette is None
        np.testing.assert_array_equal(np.asarray(_to_rgb(lost)), np.zeros((2, 3, 3), np.uint8))
    kept = Image.fromarray(np.array([[0, 1, 2]], np.uint8), "L").convert("P")
    kept.putpalette(bytes([0, 0, 0, 10, 20, 30, 40, 50, 60]))
    kept = pickle.loads(pickle.dumps(kept))
    np.testing.assert_array_equal(np.asarray(_to_rgb(kept)), [[[0, 0, 0], [10, 20, 30], [40, 50, 60]]])


def test_a_mode_pil_cannot_convert_is_refused_naming_it():
    """``La`` has no conversion to RGB in PIL: the image is refused naming the mode and PIL's words.
    Written for: the refusal's message."""
    r = process_task(("pil", Image.new("La", (3, 2)), 0, "n", "w"), ImageOptions())
    assert r == ("skip", "w", "cannot convert mode La to RGB (conversion from La to L not supported)")


# ----------------------------------------------------------------------------- the Exif Orientation entry


def tiff_ifd(order: bytes, entries, *, ifd: int = 8) -> bytes:
    """TIFF 6.0 section 2: header, IFD0 at ``ifd``, its entries ``(tag, type, count, 4 value bytes)``."""
    e = "<" if order == b"II" else ">"
    out = order + struct.pack(e + "HI", 42, ifd) + b"\0" * (ifd - 8) + struct.pack(e + "H", len(entries))
    for tag, typ, count, value in entries:
        out += struct.pack(e + "HHI", tag, typ, count) + value
    return out + struct.pack(e + "I", 0)


def _short(order: bytes, v: int) -> bytes:
    return struct.pack(("<" if order == b"II" else ">") + "H", v) + b"\0\0"


@pytest.mark.parametrize("order", [b"II", b"MM"])
@pytest.mark.parametrize("prefix", [0, 5])
def test_the_ifd0_orientation_entry_is_found_at_its_offset(order, prefix):
    """The TIFF structure at ``t`` = 0 or 5 of a buffer: IFD0's Orientation entry as (its offset in the
    buffer, type, count, byte order), by hand: ``t + 8 + 2 + 12 * index``; 1 with none; None when the
    structure is shorter than a header, the byte order unknown, IFD0 inside the header or past the end,
    or its entries past the end. Written for: offsets taken from the structure rather than the buffer,
    the bounds off by one, the entry stride, the tag compared wrongly."""
    e = "<" if order == b"II" else ">"
    pre = b"\xaa" * prefix
    make = (0x010F, 2, 4, b"abcd")
    tiff = tiff_ifd(order, [make, (0x0112, 3, 1, _short(order, 6))])
    b = pre + tiff
    t = prefix
    assert _ifd0_orientation(b, t, len(b)) == (t + 10 + 12, 3, 1, e)
    assert _exif_orientation(memoryview(b), t, len(b)) == 6
    assert _orientation_entry(b, t, len(b)) == (t + 10 + 12 + 8, e)
    # the entries end exactly at end (no next-IFD offset): still found; one byte less: unreadable
    end = t + 10 + 24
    assert _ifd0_orientation(b, t, end) == (t + 22, 3, 1, e)
    assert _ifd0_orientation(b, t, end - 1) is None
    none = pre + tiff_ifd(order, [make])
    assert _ifd0_orientation(none, t, len(none)) == 1 and _exif_orientation(memoryview(none), t, len(none)) == 1
    assert _orientation_entry(none, t, len(none)) is None
    empty = pre + order + struct.pack(e + "HI", 42, 8) + struct.pack(e + "H", 0)  # 10 bytes: IFD0 of no entry
    assert _ifd0_orientation(empty, t, t + 10) == 1
    assert _ifd0_orientation(empty, t, t + 9) is None  # IFD0's count cut short
    assert _ifd0_orientation(empty, t, t + 7) is None  # not even a header
    at9 = pre + order + struct.pack(e + "HI", 42, 9) + b"\0" + struct.pack(e + "H", 0)
    assert _ifd0_orientation(at9, t, len(at9)) == 1  # IFD0 at an odd offset past the header: still read
    at7 = pre + order + struct.pack(e + "HI", 42, 7) + b"\0" * 4
    assert _ifd0_orientation(at7, t, len(at7)) is None  # IFD0 inside the header
    other = (b"MM" if order == b"II" else b"II") + tiff[2:]
    assert _ifd0_orientation(pre + b"XY" + tiff[2:], t, t + len(tiff)) is None
    assert _ifd0_orientation(pre + other, t, t + len(tiff)) in (None, 1)  # the other order: offsets misread


@pytest.mark.parametrize("order", [b"II", b"MM"])
def test_an_orientation_that_is_not_one_short_is_not_read(order):
    """An Orientation entry of type LONG reads as unreadable (None); one SHORT of count 2 is read but has
    no single value to rewrite. Written for: the type test inverted, the count test dropped."""
    e = "<" if order == b"II" else ">"
    long_ = tiff_ifd(order, [(0x0112, 4, 1, struct.pack(e + "I", 6))])
    assert _exif_orientation(memoryview(long_), 0, len(long_)) is None
    assert _orientation_entry(long_, 0, len(long_)) is None
    two = tiff_ifd(order, [(0x0112, 3, 2, _short(order, 6)[:2] + _short(order, 6)[:2])])
    assert _exif_orientation(memoryview(two), 0, len(two)) == 6
    assert _orientation_entry(two, 0, len(two)) is None


def _seg(marker: int, body: bytes) -> bytes:
    """ITU T.81 B.1.1.4: FF, the marker, a big-endian length counting itself, the body."""
    return bytes([0xFF, marker]) + struct.pack(">H", 2 + len(body)) + body


def _jpeg(a: np.ndarray) -> bytes:
    b = io.BytesIO()
    Image.fromarray(a).save(b, "JPEG", quality=90)
    return b.getvalue()


@pytest.mark.parametrize("order", [b"II", b"MM"])
@pytest.mark.parametrize("v", [6, 3, 8, 1])
def test_upright_tag_sets_only_the_orientation_value_to_1(order, v):
    """A JPEG with, before its Exif, fill bytes, a parameterless marker, a JFIF APP0 and an XMP APP1 over
    255 bytes long: ``upright_tag`` changes exactly the two bytes of the Orientation value (their offset
    written out) to 1 in the byte order, nothing else; PIL then reads orientation 1 and decodes the same
    pixels. A second Exif segment is left alone (PIL reads the first). Written for: the segment walk
    (fill bytes, parameterless markers, the length's bytes), the Exif signature's place, the value's
    offset or byte order, another value written, a segment skipped."""
    jpg = _jpeg(coords(16, 24))
    e = "<" if order == b"II" else ">"
    tiff = tiff_ifd(order, [(0x010F, 2, 4, b"abcd"), (0x0112, 3, 1, _short(order, v))])
    exif = _seg(0xE1, b"Exif\0\0" + tiff)
    second = _seg(0xE1, b"Exif\0\0" + tiff_ifd(order, [(0x0112, 3, 1, _short(order, 8))]))
    lead = b"\xff\xff\xff\xd0" + _seg(0xE0, b"JFIF\0\1\1\0\0\1\0\1\0\0") + _seg(0xE1, b"http://ns.adobe.com/xap/1.0/\0" + b"x" * 300)
    raw = jpg[:2] + lead + exif + second + jpg[2:]
    at = 2 + len(lead) + 4 + 6 + 10 + 12 + 8  # SOI, lead, FFE1 + length, "Exif\0\0", TIFF header + count, entry 0
    assert raw[at : at + 2] == struct.pack(e + "H", v)
    out = upright_tag(raw)
    assert out == raw[:at] + struct.pack(e + "H", 1) + raw[at + 2 :]
    with Image.open(io.BytesIO(out)) as a, Image.open(io.BytesIO(raw)) as b:
        assert a.getexif()[0x0112] == 1
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_upright_tag_leaves_a_jpeg_without_a_single_short_orientation_unchanged():
    """No Exif; an Exif with no orientation; a LONG orientation; an Exif segment cut short by the end of
    the file (its declared length past it); an Exif after the scan: each returned byte for byte (and no
    error). Written for: the segment's end not bounded by the file's, the walk going on past the scan,
    a missing entry written anyway."""
    jpg = _jpeg(coords(16, 24))
    assert upright_tag(jpg) == jpg
    no = jpg[:2] + _seg(0xE1, b"Exif\0\0" + tiff_ifd(b"MM", [(0x010F, 2, 4, b"abcd")])) + jpg[2:]
    assert upright_tag(no) == no
    long_ = jpg[:2] + _seg(0xE1, b"Exif\0\0" + tiff_ifd(b"MM", [(0x0112, 4, 1, struct.pack(">I", 6))])) + jpg[2:]
    assert upright_tag(long_) == long_
    seg = _seg(0xE1, b"Exif\0\0" + tiff_ifd(b"II", [(0x010F, 2, 4, b"abcd"), (0x0112, 3, 1, _short(b"II", 6))]))
    cut = jpg[:2] + seg[:-10]  # the file ends inside the second entry
    assert upright_tag(cut) == cut
    i = jpg.index(b"\xff\xda")
    after = jpg[:i] + b"\xff\xda" + _seg(0xE1, b"Exif\0\0" + tiff_ifd(b"II", [(0x0112, 3, 1, _short(b"II", 6))]))[2:]
    assert upright_tag(after) == after


def test_pil_loader_keeps_a_turned_jpegs_bytes_but_its_orientation_tag():
    """Under ``pil_loader`` a plain JPEG with orientation 6 is stored as its own bytes with only the tag
    set to 1 (torchvision's ``pil_loader`` does not turn it), flags 0, the source size. Written for: the
    tag left at 6 (every reader would then turn it), the image re-encoded or turned."""
    raw = _jpeg_with_orientation(coords(40, 64), 6)
    out = process_task(("bytes", raw, 0, "n", "w"), ImageOptions(pil_loader=True))
    header = decode_header(out)
    payload = record_payload(out, header)
    assert (header.encoding, header.flags, header.width, header.height) == (ENC_JPEG, 0, 64, 40)
    diff = [k for k in range(len(raw)) if raw[k] != payload[k]]
    assert len(payload) == len(raw) and len(diff) == 1 and payload[diff[0]] == 1
    with Image.open(io.BytesIO(payload)) as im:
        assert im.getexif()[0x0112] == 1


# ----------------------------------------------------------------------------- process_task's refusals


def test_process_task_refusals_name_the_item_where_it_is():
    """An item that could not be fetched (``error``: its message is the reason), image bytes over
    ``max_file_bytes`` (``--max-pixels 1``: 8 + 16 MiB), a 12-bit JPEG header, a JPEG whose header claims
    far more pixels than its bytes can hold, a file that is not there; each as ``("skip", where, reason)``
    with ``where`` (not the name). Written for: the kinds' dispatch, the size limit's bound and message,
    the 12-bit and forged-JPEG messages, the file path's reading."""
    opts = ImageOptions(max_pixels=1)
    assert process_task(("error", "fetch failed: 404", 0, "n", "w"), opts) == ("skip", "w", "fetch failed: 404")
    limit = 8 + (16 << 20)
    over = b"\x89PNG\r\n\x1a\n" + b"\0" * (limit - 7)
    assert process_task(("bytes", over, 0, "n", "w"), opts) == (
        "skip", "w", f"image bytes too large: {limit + 1} bytes, more than the {limit} bytes an image within "
        "--max-pixels 1 can need (8 bytes per pixel + 16 MiB)")  # fmt: skip
    r = process_task(("bytes", over[:limit], 0, "n", "w"), opts)  # at the limit: read (and not an image)
    assert r == ("skip", "w", "corrupt PNG (cannot identify image file)")
    sof12 = _seg(0xC1, struct.pack(">BHHB", 12, 8, 8, 3) + bytes([1, 0x11, 0, 2, 0x11, 0, 3, 0x11, 0]))
    raw12 = b"\xff\xd8" + sof12 + _seg(0xDA, bytes([3, 1, 0, 2, 0, 3, 0, 0, 63, 0])) + b"\0" * 8 + b"\xff\xd9"
    assert process_task(("bytes", raw12, 0, "n", "w"), ImageOptions()) == (
        "skip", "w", "12-bit extended sequential (SOF1) JPEG: only 8-bit JPEGs can be decoded and stored")  # fmt: skip
    jpg = _jpeg(coords(16, 24))
    i = jpg.index(b"\xff\xc0")
    forged = jpg[: i + 5] + struct.pack(">HH", 4000, 4000) + jpg[i + 9 :]  # 250,000 blocks in ~1 kB
    r = process_task(("bytes", forged, 0, "n", "w"), ImageOptions())
    assert r == ("skip", "w", f"JPEG header claims 4000x4000 pixels but the file has only {len(forged)} bytes "
                 "(at least 31250 needed): forged or truncated")  # fmt: skip
    r = process_task(("file", "/nonexistent/dir/x.jpg", 0, "n", "w"), ImageOptions())
    assert r == ("skip", "w", "unreadable (No such file or directory)")


def test_process_task_reads_a_file_and_names_the_record(tmp_path):
    """A plain JPEG file: the record holds its bytes, its label and the task's name. Written for: the
    file kind's dispatch, the label or name lost."""
    raw = _jpeg(coords(16, 24))
    p = tmp_path / "a.jpg"
    p.write_bytes(raw)
    out = process_task(("file", str(p), 9, "cls/a.jpg", "where"), ImageOptions())
    header = decode_header(out)
    assert (header.label, record_path(out, header), record_payload(out, header)) == (9, "cls/a.jpg", raw)


def test_an_unexpected_error_is_the_items_reason_with_its_type():
    """Something that is no array given as one: refused as ``cannot convert this image (<type>: <message>)``,
    never raised. Written for: the catch-all's message."""
    r = process_task(("array", [[1, 2]], 0, "n", "w"), ImageOptions())
    assert r == ("skip", "w", "cannot convert this image (AttributeError: 'list' object has no attribute 'dtype')")


# ----------------------------------------------------------------------------- JPEG paths and header walks


def test_plain_jpegs_flags_are_exactly_progressive_or_none():
    """A plain baseline JPEG is stored as its bytes with flags 0, a progressive one with exactly
    ``FLAG_PROGRESSIVE``. Written for: a non-progressive plain JPEG given a flag."""
    from fastload.format import FLAG_PROGRESSIVE

    for progressive, flags in ((False, 0), (True, FLAG_PROGRESSIVE)):
        b = io.BytesIO()
        Image.fromarray(smooth(40, 64)).save(b, "JPEG", progressive=progressive)
        out = process_task(("bytes", b.getvalue(), 0, "n", "w"), ImageOptions())
        header = decode_header(out)
        assert (header.flags, record_payload(out, header)) == (flags, b.getvalue())


def test_pil_loader_shrinks_a_turned_jpeg_without_turning_it():
    """Under ``pil_loader`` with ``--max-size 32`` a 64x40 JPEG with orientation 6 is re-encoded as a
    32x20 PNG, not turned (``pil_loader`` ignores the tag), flags resized only. Written for: the tag
    rewrite taken for a JPEG that must shrink."""
    raw = _jpeg_with_orientation(smooth(40, 64), 6)
    out = process_task(("bytes", raw, 0, "n", "w"), ImageOptions(pil_loader=True, max_size=32))
    header = decode_header(out)
    assert (header.encoding, header.flags, header.width, header.height) == (ENC_PNG, FLAG_RESIZED, 32, 20)


def test_a_shrunk_jpeg_goes_through_pils_dct_draft():
    """A 1001x1001 JPEG with ``--max-size 250``: the stored JPEG is exactly PIL's documented fast path,
    ``draft`` to at least 250x250 (a 1/4 scale), then LANCZOS into 250x250 from the draft's box, encoded
    at quality 95. Written for: the draft skipped for a JPEG read whole (a full-scale decode instead)."""
    raw = _jpeg(smooth(1001, 1001) // 2 + 60)
    with Image.open(io.BytesIO(raw)) as im:
        _, box = im.draft(None, (250, 250))
        want = io.BytesIO()
        im.convert("RGB").resize((250, 250), Image.Resampling.LANCZOS, box=box).save(want, "JPEG", quality=95)
    out = process_task(("bytes", raw, 0, "n", "w"), ImageOptions(max_size=250))
    assert record_payload(out, decode_header(out)) == want.getvalue()


def test_a_jpeg_cut_in_its_scan_is_refused_as_truncated():
    """A JPEG cut at four fifths (inside its scan, no end-of-image marker): ``truncated JPEG (no
    end-of-image marker)``. Written for: the message."""
    rng = np.random.default_rng(0)
    raw = _jpeg(rng.integers(0, 256, (128, 128, 3), np.uint8))
    r = process_task(("bytes", raw[: len(raw) * 4 // 5], 0, "n", "w"), ImageOptions())
    assert r == ("skip", "w", "truncated JPEG (no end-of-image marker)")


def _sof1_12bit() -> bytes:
    return _seg(0xC1, struct.pack(">BHHB", 12, 8, 8, 3) + bytes([1, 0x11, 0, 2, 0x11, 0, 3, 0x11, 0]))


@pytest.mark.parametrize(
    "lead, found",
    [
        (b"", True),
        (b"\xff\xff\xff", True),  # fill bytes (T.81 B.1.1.2)
        (b"\xff\xd0\xff\xd7", True),  # RST0, RST7: no length
        (b"\xff\x01", True),  # TEM: no length
        (_seg(0xE0, b"JFIF\0") + b"\x00\x00\x00\x02", False),  # not a marker: the walk stops there
    ],
)
def test_the_frame_of_a_12_bit_jpeg_is_found_past_what_precedes_it(lead, found):
    """A 12-bit SOF1 header after fill bytes and parameterless markers is found (the 12-bit message);
    after a byte that is no marker it is not (the walk stops: a corrupt header). Written for: fill bytes
    or parameterless markers taken for segments, the walk going on past a non-marker."""
    raw = b"\xff\xd8" + _seg(0xE0, b"JFIF\0") + lead + _sof1_12bit() + _seg(0xDA, bytes([3, 1, 0, 2, 0, 3, 0, 0, 63, 0]))
    r = process_task(("bytes", raw + b"\0" * 8 + b"\xff\xd9", 0, "n", "w"), ImageOptions())
    reason = "12-bit extended sequential (SOF1) JPEG: only 8-bit JPEGs can be decoded and stored"
    assert r == ("skip", "w", reason if found else "truncated or corrupt JPEG (cannot parse its header)")


def test_scan_jpeg_steps_over_a_stray_soi():
    """An SOI marker (FFD8, no length) inside the header is stepped over like RSTn. Written for: D8 left
    out of the parameterless range."""
    from fastload.packing.images import scan_jpeg

    sof = _seg(0xC0, struct.pack(">BHHB", 8, 30, 40, 3) + bytes([1, 0x11, 0, 2, 0x11, 1, 3, 0x11, 1]))
    sos = _seg(0xDA, bytes([3, 1, 0, 2, 0x11, 3, 0x11, 0, 63, 0]))
    assert scan_jpeg(memoryview(b"\xff\xd8\xff\xd8" + sof + sos)) == (40, 30, False)


def test_upright_tag_walks_lengths_of_both_bytes_and_stops_at_a_non_marker():
    """An APP segment whose length's two bytes differ (0x0134) before the Exif is stepped over whole; a
    byte that is no marker ends the walk (an Exif after it is not rewritten). Written for: the length's
    high byte misread, the walk going on past a non-marker, a segment stepped backwards."""
    jpg = _jpeg(coords(16, 24))
    exif = _seg(0xE1, b"Exif\0\0" + tiff_ifd(b"II", [(0x0112, 3, 1, _short(b"II", 6))]))
    raw = jpg[:2] + _seg(0xE2, b"y" * 306) + exif + jpg[2:]
    out = upright_tag(raw)
    at = 2 + 310 + 4 + 6 + 10 + 8
    assert out == raw[:at] + b"\x01\x00" + raw[at + 2 :]
    stray = jpg[:2] + b"\x00\x00\x00\x02" + exif + jpg[2:]
    assert upright_tag(stray) == stray


def test_pil_loader_refuses_a_mode_torchvision_cannot_convert():
    """Under ``pil_loader`` an ``La`` image is refused as torchvision's ``pil_loader`` would fail on it,
    saying so. Written for: the message, the conversion dropped."""
    r = process_task(("pil", Image.new("La", (3, 2)), 0, "n", "w"), ImageOptions(pil_loader=True))
    assert r == ("skip", "w", "cannot convert mode La to RGB (conversion from La to L not supported), "
                 "nor can torchvision's pil_loader")  # fmt: skip


def test_a_pil_image_whose_exif_cannot_be_read_is_taken_as_upright():
    """A PIL image whose ``getexif`` raises (malformed Exif) is stored unturned, flags converted only, as
    decoders ignore such Exif. Written for: another orientation assumed."""
    im = Image.fromarray(smooth(40, 64))

    def broken():
        raise SyntaxError("bad Exif")

    im.getexif = broken
    header, _, _ = packed(("pil", im, 0, "p", "p"))
    assert (header.flags, header.width, header.height) == (FLAG_CONVERTED, 64, 40)


def test_out_of_memory_is_the_items_reason():
    """A MemoryError while converting one item skips it with advice, never ends the pack. Written for:
    the message."""

    class Huge:
        @property
        def dtype(self):
            raise MemoryError

    assert process_task(("array", Huge(), 0, "n", "w"), ImageOptions()) == (
        "skip", "w", "out of memory while decoding (lower --max-pixels?)")  # fmt: skip


def test_a_file_of_exactly_the_size_limit_is_read_whole(tmp_path):
    """A JPEG padded with zeros to exactly ``max_file_bytes`` (``--max-pixels 1``: 16 MiB + 8) ending in an
    EOI: every byte is read and stored. Written for: the read's bound one short of the limit (the last
    byte dropped)."""
    jpg = _jpeg(coords(1, 1))
    limit = 8 + (16 << 20)
    raw = jpg + b"\0" * (limit - len(jpg) - 2) + b"\xff\xd9"
    p = tmp_path / "a.jpg"
    p.write_bytes(raw)
    out = process_task(("file", str(p), 0, "n", "w"), ImageOptions(max_pixels=1))
    assert isinstance(out, bytes), out
    assert record_payload(out, decode_header(out)) == raw


def test_upright_tag_reads_the_exif_only_within_its_segments_length():
    """An Exif segment whose declared length ends one byte before its Orientation entry does: the entry
    is past the segment, so nothing is rewritten (the bytes after the segment are not the Exif's).
    Written for: the segment's end taken one byte too far."""
    jpg = _jpeg(coords(16, 24))
    tiff = tiff_ifd(b"II", [(0x0112, 3, 1, _short(b"II", 6))])[:-4]  # no next-IFD offset: the entry ends the body
    body = b"Exif\0\0" + tiff
    raw = jpg[:2] + b"\xff\xe1" + struct.pack(">H", 2 + len(body) - 1) + body + jpg[2:]
    assert upright_tag(raw) == raw
    whole = jpg[:2] + b"\xff\xe1" + struct.pack(">H", 2 + len(body)) + body + jpg[2:]
    at = 2 + 4 + 6 + 10 + 8
    assert upright_tag(whole) == whole[:at] + b"\x01\x00" + whole[at + 2 :]


# ----------------------------------------------------------------------------- held-out sample [5]


def _pil_open_error(raw: bytes) -> BaseException:
    """What ``Image.open`` itself raises for ``raw`` (inside the packer's PIL settings)."""
    from fastload.imaging import pil_settings

    with pil_settings():
        try:
            Image.open(io.BytesIO(raw))
        except Exception as e:  # noqa: BLE001 - the oracle is whatever PIL raises
            return e
    raise AssertionError("PIL opened it")


@pytest.mark.parametrize("fmt", ["PNG", "WEBP"])
def test_a_header_pil_fails_on_is_refused_as_corrupt_with_pils_words(fmt):
    """The first 16 bytes of a PNG or a WebP: ``Image.open`` raises an error of its own (not "cannot
    identify"), a PNG's saying "Truncated", a WebP's not: neither is a JPEG, so both are a corrupt image
    header with PIL's words. Written for: the truncated-JPEG reason given to any file whose error says
    "truncated" (``or`` for ``and``), the reason dropped."""
    from PIL import UnidentifiedImageError

    from fastload.imaging import pil_settings

    b = io.BytesIO()
    Image.fromarray(coords(8, 8)).save(b, fmt)
    raw = b.getvalue()[:16]
    err = _pil_open_error(raw)
    assert not isinstance(err, UnidentifiedImageError) and ("truncated" in str(err).lower()) == (fmt == "PNG")
    with pil_settings():
        got = process_task(("bytes", raw, 0, "n", "w"), ImageOptions())
    assert got == ("skip", "w", f"corrupt image header ({err})")


def test_an_mpo_is_a_jpeg_stored_byte_for_byte():
    """A two-frame MPO (PIL's format "MPO", a JPEG whose first frame the readers decode) is taken as the
    JPEG it is: stored byte for byte, flags 0, its first frame's size. Written for: "MPO" not matched."""
    b = io.BytesIO()
    a = coords(24, 32)
    Image.fromarray(a).save(b, "MPO", save_all=True, append_images=[Image.fromarray(a[::-1].copy())], quality=90)
    raw = b.getvalue()
    assert Image.open(io.BytesIO(raw)).format == "MPO"
    out = process_task(("bytes", raw, 3, "m", "w"), ImageOptions())
    assert isinstance(out, bytes), out
    header = decode_header(out)
    assert (header.encoding, header.flags, header.width, header.height, header.label) == (ENC_JPEG, 0, 32, 24, 3)
    assert record_payload(out, header) == raw


def _without_segment(raw: bytes, marker: int) -> bytes:
    """``raw`` (a JPEG) without its segments of ``marker`` (walked by their lengths, ITU T.81 B.1.1.4)."""
    out, i = bytearray(raw[:2]), 2
    while raw[i + 1] != 0xDA:
        n = 2 + ((raw[i + 2] << 8) | raw[i + 3])
        if raw[i + 1] != marker:
            out += raw[i : i + n]
        i += n
    return bytes(out + raw[i:])


def test_a_jpeg_whose_decoding_fails_is_refused_as_corrupt_with_the_decoders_words():
    """A greyscale baseline JPEG (not stored as it is: it is converted) without its quantization table
    (DQT): PIL opens it, libjpeg fails to decode it. Written for: the decoder's error replaced in the
    reason."""
    b = io.BytesIO()
    Image.fromarray(coords(16, 16)[:, :, 0]).save(b, "JPEG", quality=90)
    raw = _without_segment(b.getvalue(), 0xDB)
    assert raw[-2:] == b"\xff\xd9" and b"\xff\xdb" not in raw[: raw.index(b"\xff\xda")]
    with Image.open(io.BytesIO(raw)) as im:
        with pytest.raises(OSError) as e:
            im.load()
    assert process_task(("bytes", raw, 0, "n", "w"), ImageOptions()) == ("skip", "w", f"corrupt JPEG ({e.value})")


def grows_after_fstat(monkeypatch, more: bytes) -> None:
    """The file being read grows by ``more`` right after its ``fstat`` (made to happen then, by a write
    from inside the open: anywhere else it is a race)."""
    import fastload.packing.images as images

    real = images._open_image_file

    def opened(path, opts):
        fd, size = real(path, opts)
        with open(path, "ab") as f:
            f.write(more)
        return fd, size

    monkeypatch.setattr(images, "_open_image_file", opened)


def test_a_file_that_grew_after_its_fstat_is_read_whole(tmp_path, monkeypatch):
    """A JPEG file holding the first half of its bytes when ``fstat`` sees it, the rest appended then: the
    read asks for the half, then reads on to the end, and the record holds the whole JPEG, every byte in
    its place. Written for: the parts joined with something between them."""
    raw = _jpeg(coords(16, 24))
    p = tmp_path / "a.jpg"
    p.write_bytes(raw[: len(raw) // 2])
    grows_after_fstat(monkeypatch, raw[len(raw) // 2 :])
    out = process_task(("file", str(p), 0, "n", "w"), ImageOptions())
    assert isinstance(out, bytes), out
    assert record_payload(out, decode_header(out)) == raw


def test_a_file_that_grew_past_the_limit_is_refused_with_the_bytes_read(tmp_path, monkeypatch):
    """``--max-pixels 1``: at most 8 + 16 MiB = 16777224 bytes are read. A file of 100 bytes when ``fstat``
    sees it that then grows to 16777224 + 1000 is read up to one byte past the limit, 16777225, and
    refused with that count. Written for: the count left out of the reason."""
    p = tmp_path / "a.jpg"
    p.write_bytes(b"\xff" * 100)
    grows_after_fstat(monkeypatch, b"\0" * (16777224 + 1000 - 100))
    assert process_task(("file", str(p), 0, "n", "w"), ImageOptions(max_pixels=1)) == ("skip", "w", (
        "file too large: 16777225 bytes, more than the 16777224 bytes an image within --max-pixels 1 can need "
        "(8 bytes per pixel + 16 MiB)"))  # fmt: skip


@pytest.mark.timeout(30)  # a FIFO opened without O_NONBLOCK would wait for a writer forever
def test_what_opens_but_is_not_a_regular_file_is_refused_saying_what_it_is(tmp_path):
    """A FIFO (opened without blocking), a directory and /dev/null all open; ``fstat`` then says what they
    are. Written for: the kind looked up from something other than the mode."""
    import os

    fifo = tmp_path / "f.jpg"
    os.mkfifo(fifo)
    (tmp_path / "d.jpg").mkdir()
    for path, kind in ((fifo, "FIFO"), (tmp_path / "d.jpg", "directory"), ("/dev/null", "character device")):
        assert process_task(("file", str(path), 0, "n", "w"), ImageOptions()) == ("skip", "w", f"not a regular file ({kind})")


def test_sof_offsets_finds_a_frame_header_that_ends_the_bytes():
    """An SOFn marker and its length as the last four bytes still start a segment there (its offset),
    after SOI, or after an APP0 of length 2. Written for: the walk stopping one byte early."""
    from fastload.packing.images import _sof_offsets

    assert _sof_offsets(b"\xff\xd8\xff\xc0\x00\x11") == [2]
    assert _sof_offsets(b"\xff\xd8\xff\xe0\x00\x02\xff\xc2\x00\x11") == [6]
    assert _sof_offsets(b"\xff\xd8\xff\xe0\x00\x02\xff") == []
