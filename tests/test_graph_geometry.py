"""The geometric graph operations against torchvision's and timm's own functions on the PIL image, same draw."""

from __future__ import annotations

import functools
import math

import numpy as np
import pytest
from PIL import Image

pytest.importorskip("nvidia.dali")

from fastload.augment.graphop import identity  # noqa: E402
from fastload.augment.rounds import apply_once  # noqa: E402
from fastload.augment.ops_geometry import GEOMETRY_NAMES, geometry_op  # noqa: E402

#: A magnitude per operation, each used with both signs (torchvision's translation is cast by int(): 7).
MAGNITUDES = {
    ("torchvision", "ShearX"): 0.33, ("torchvision", "ShearY"): 0.33, ("torchvision", "TranslateX"): 7.6,
    ("torchvision", "TranslateY"): 7.6, ("torchvision", "Rotate"): 22.5, ("timm", "Rotate"): 17.3,
    ("timm", "ShearX"): 0.21, ("timm", "ShearY"): 0.21, ("timm", "TranslateX"): 9.0, ("timm", "TranslateY"): 9.0,
    ("timm", "TranslateXRel"): 0.27, ("timm", "TranslateYRel"): 0.27,
}  # fmt: skip
#: timm's default fill (grey: one warp with DALI's fill); torchvision's with a colour (the warped mask).
FILLS = {"timm": (128, 128, 128), "torchvision": (10, 200, 77)}
SIZES = {"37x53": (53, 37), "40x40": (40, 40)}
PIL_FILTERS = {"nearest": Image.NEAREST, "bilinear": Image.BILINEAR, "bicubic": Image.BICUBIC}
#: Whole-pixel translations: every interpolation samples pixel centres, so all three are exact.
WHOLE_PIXELS = {("torchvision", "TranslateX"), ("torchvision", "TranslateY"), ("timm", "TranslateX"), ("timm", "TranslateY")}
#: On DALI's road (a GPU's) bicubic is carried out as bilinear: (max, mean) absolute difference in levels measured on
#: uniform noise (the worst case; benchmarks/results/graph-ops-geometry.md), with a margin of a few levels.
BICUBIC_NOISE = {"Rotate": (80, 16.0), "ShearX": (55, 11.0), "ShearY": (55, 11.0), "TranslateXRel": (45, 11.0), "TranslateYRel": (45, 11.0)}


def noise_image(h: int, w: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)


def gradient_image(h: int, w: int) -> np.ndarray:
    y, x = np.mgrid[0:h, 0:w].astype(np.float64)
    return np.stack([x * 255 / (w - 1), y * 255 / (h - 1), (x + y) * 255 / (w + h - 2)], -1).round().astype(np.uint8)


def library_output(img: np.ndarray, library: str, name: str, m: float, interpolation: str, fill: tuple) -> np.ndarray:
    """The library's own function on the PIL image: timm's NAME_TO_OP, torchvision's F.affine/F.rotate as _apply_op."""
    pil = Image.fromarray(img)
    if library == "timm":
        from timm.data.auto_augment import NAME_TO_OP

        return np.asarray(NAME_TO_OP[name](pil, m, fillcolor=fill, resample=PIL_FILTERS[interpolation]))
    import torchvision.transforms.functional as F
    from torchvision.transforms import InterpolationMode

    mode, f = InterpolationMode(interpolation), list(fill)
    if name == "Rotate":
        return np.asarray(F.rotate(pil, m, interpolation=mode, fill=f))
    shear = math.degrees(math.atan(m))
    kw = {"ShearX": dict(translate=[0, 0], shear=[shear, 0.0], center=[0, 0]),
          "ShearY": dict(translate=[0, 0], shear=[0.0, shear], center=[0, 0]),
          "TranslateX": dict(translate=[int(m), 0], shear=[0.0, 0.0]),
          "TranslateY": dict(translate=[0, int(m)], shear=[0.0, 0.0])}[name]  # fmt: skip
    return np.asarray(F.affine(pil, angle=0.0, scale=1.0, interpolation=mode, fill=f, **kw))


@functools.lru_cache(maxsize=None)
def _table_run(library: str, name: str, interpolation: str, cpu_warp: str) -> dict:
    """Every (sign, size) of one operation in one batch: ``{(sign, size): (ours, theirs)}``."""
    fill = FILLS[library]
    op = geometry_op(library, name, interpolation, fill, cpu_warp=cpu_warp)
    keys = [(s, z) for s in (1, -1) for z in SIZES]
    imgs = [noise_image(*SIZES[z], seed=7 + i) for i, (_, z) in enumerate(keys)]
    args = [(s * MAGNITUDES[(library, name)],) for s, _ in keys]
    ours = apply_once(op, imgs, args)
    return {k: (o, library_output(i, library, name, a[0], interpolation, fill)) for k, i, a, o in zip(keys, imgs, args, ours)}


#: A CPU graph's two roads: PIL's filter compiled (the CPU's) and DALI's warp_affine (the GPU's, run on the CPU).
TABLE = [
    (lib, name, interp, warp, sign, size)
    for lib, names in GEOMETRY_NAMES.items() for name in names
    for interp in PIL_FILTERS for warp in ("pil", "dali")
    for sign in (1, -1) for size in SIZES
]  # fmt: skip


@pytest.mark.parametrize("library,name,interpolation,cpu_warp,sign,size", TABLE)
def test_matches_library(library: str, name: str, interpolation: str, cpu_warp: str, sign: int, size: str) -> None:
    ours, theirs = _table_run(library, name, interpolation, cpu_warp)[(sign, size)]
    assert ours.shape == theirs.shape == (*SIZES[size], 3) and ours.dtype == np.uint8
    d = np.abs(ours.astype(np.int16) - theirs.astype(np.int16))
    if interpolation == "nearest" or cpu_warp == "pil" or (library, name) in WHOLE_PIXELS:
        assert d.max() == 0, f"{d.max()} levels off at {np.argwhere(d)[:3].tolist()}"
        assert len(np.unique(ours)) > 50  # noise in, noise out: not a blank image equal to a blank image
    elif interpolation == "bilinear":  # float32 weights against PIL's doubles: a truncation one level off at most
        assert d.max() <= 1 and d.mean() < 0.1
    else:
        bound_max, bound_mean = BICUBIC_NOISE[name]
        assert d.max() <= bound_max and d.mean() <= bound_mean
        assert (d > 1).mean() > 0.05  # noise tells bicubic from bilinear: the comparison has teeth


@pytest.mark.parametrize("library,name", [("timm", "Rotate"), ("torchvision", "ShearX"), ("timm", "TranslateYRel")])
def test_bicubic_on_a_smooth_image(library: str, name: str) -> None:
    """On a gradient (natural images are closer to it than to noise) a GPU's bilinear for bicubic is a few levels off."""
    img = gradient_image(53, 37)
    m = MAGNITUDES[(library, name)]
    (ours,) = apply_once(geometry_op(library, name, "bicubic", FILLS[library], cpu_warp="dali"), [img], [(m,)])
    d = np.abs(ours.astype(np.int16) - library_output(img, library, name, m, "bicubic", FILLS[library]))
    assert d.max() <= 3 and (d > 1).mean() < 0.01


@pytest.mark.parametrize("library,degrees", [("torchvision", 90.0), ("torchvision", -135.0), ("timm", 30.0), ("timm", 0.0)])
@pytest.mark.parametrize("size", list(SIZES))
def test_rotation_at_nearest_is_pils_to_the_pixel(library: str, degrees: float, size: str) -> None:
    """PIL's 16.16 fixed point, its transposes at 90 degrees and its copy at 0, matched exactly (a centre column
    falling on whole pixels at 30 degrees is where float32 arithmetic alone goes wrong)."""
    img = noise_image(*SIZES[size], seed=3)
    (ours,) = apply_once(geometry_op(library, "Rotate", "nearest", FILLS[library]), [img], [(degrees,)])
    np.testing.assert_array_equal(ours, library_output(img, library, "Rotate", degrees, "nearest", FILLS[library]))


@pytest.mark.parametrize("interpolation,cpu_warp", [("nearest", "pil"), ("bilinear", "pil"), ("bicubic", "pil"), ("bilinear", "dali")])
def test_out_of_range_translation_is_all_fill(interpolation: str, cpu_warp: str) -> None:
    img = noise_image(53, 37, seed=5)
    (ours,) = apply_once(geometry_op("timm", "TranslateX", interpolation, (1, 2, 3), cpu_warp=cpu_warp), [img], [(250.0,)])
    assert (ours == np.array([1, 2, 3], np.uint8)).all()


@pytest.mark.parametrize("interpolation", ["bilinear", "bicubic"])
def test_compiled_filter_on_odd_sizes_and_a_large_image(interpolation: str) -> None:
    """PIL's filter compiled, on shapes the table does not have: one pixel wide, one row, a full 224x224 crop, a
    rotation by an angle whose sample points land near pixel edges."""
    imgs = [noise_image(31, 1, seed=1), noise_image(1, 29, seed=2), noise_image(224, 224, seed=3), gradient_image(224, 224)]
    args = [(23.0,), (-17.0,), (29.9,), (45.0,)]
    ours = apply_once(geometry_op("timm", "Rotate", interpolation, (124, 116, 104)), imgs, args)
    for img, (deg,), o in zip(imgs, args, ours):
        np.testing.assert_array_equal(o, library_output(img, "timm", "Rotate", deg, interpolation, (124, 116, 104)))


def test_ops_as_branches_of_a_conditional_select() -> None:
    """The graphs as ``auto_aug``'s ``select`` runs them: each sample takes its own operation, in one batch."""
    from nvidia.dali.auto_aug.core import select

    from fastload.pipeline import import_dali

    dali, fn, types = import_dali()
    fills = [(128, 128, 128), (128, 128, 128), (128, 128, 128), (0, 50, 100), (9, 8, 7), (1, 2, 3)]
    chosen = [identity("timm"), geometry_op("timm", "Rotate", "bilinear", fills[1]),
              geometry_op("timm", "TranslateXRel", "nearest", fills[2]), geometry_op("timm", "ShearY", "nearest", fills[3]),
              geometry_op("timm", "ShearX", "bicubic", fills[4]),
              geometry_op("timm", "Rotate", "bicubic", fills[5])]  # fmt: skip  (the last is picked by no sample)
    imgs = [noise_image(53, 37, seed=11), noise_image(40, 40, seed=12), noise_image(53, 37, seed=13), noise_image(40, 40, seed=14),
            noise_image(40, 40, seed=15), noise_image(53, 37, seed=16)]  # fmt: skip
    picks = [1, 2, 3, 0, 1, 4]
    args = [(12.0,), (-0.31,), (0.17,), (), (-25.0,), (0.2,)]
    params = [chosen[k].params(a) for k, a in zip(picks, args)]

    @dali.pipeline_def(batch_size=len(imgs), num_threads=1, device_id=None, exec_dynamic=True, enable_conditionals=True)
    def pipe():
        img = fn.external_source(source=lambda: imgs, batch=True, layout="HWC", dtype=types.UINT8, ndim=3)
        p = fn.external_source(source=lambda: params, batch=True, dtype=types.FLOAT, ndim=1)
        idx = fn.external_source(source=lambda: [np.int32(k) for k in picks], batch=True, dtype=types.INT32, ndim=0)
        return select([op.graph for op in chosen], idx, img, p)

    pp = pipe()
    pp.build()
    (out,) = pp.run()
    for i, (k, a) in enumerate(zip(picks, args)):
        op = chosen[k]
        want = imgs[i] if k == 0 else library_output(imgs[i], "timm", op.name, a[0], op.interpolation, fills[k])
        np.testing.assert_array_equal(np.array(out[i]), want, err_msg=f"sample {i}: {op.name} at {op.interpolation}")


def test_names_and_refusals() -> None:
    assert set(GEOMETRY_NAMES) == {"torchvision", "timm"}
    assert geometry_op("torchvision", "TranslateXRel", "nearest", (0, 0, 0)) is None  # timm's only
    assert geometry_op("timm", "Brightness", "nearest", (0, 0, 0)) is None
    with pytest.raises(ValueError):
        geometry_op("timm", "Rotate", "lanczos", (0, 0, 0))
    with pytest.raises(ValueError):
        geometry_op("timm", "Rotate", "nearest", (0, 0))
    with pytest.raises(ValueError, match="cpu_warp"):
        geometry_op("timm", "Rotate", "bilinear", (0, 0, 0), cpu_warp="opencv")


def test_without_numba_a_cpu_warp_is_refused_naming_it_and_works_once_installed(monkeypatch, make_folder, tmp_path):
    """numba missing: building the CPU graph's bicubic warp, alone or in a loader with DeiT's transform, raises a
    DependencyError that names numba and what needs it; with numba importable again (the advice followed) the same
    operation builds and matches PIL, and the loader gives its batch."""
    import sys

    import torchvision
    from timm.data import create_transform

    import fastload
    from fastload.augment import compiled
    from fastload.errors import DependencyError

    img = noise_image(40, 40, seed=21)
    deit = create_transform(32, is_training=True, auto_augment="rand-m9-mstd0.5-inc1", interpolation="bicubic")
    ds = torchvision.datasets.ImageFolder(str(make_folder(classes=2, per_class=3, size=(48, 40))), transform=deit)
    advice = r"numba is not importable .*pip install 'numba>=0\.57'"
    with monkeypatch.context() as m:
        m.setattr(compiled, "_BUILT", {})
        for name in [n for n in sys.modules if n.startswith("fastload.augment.kernels.")]:
            m.delitem(sys.modules, name)
        m.setitem(sys.modules, "numba", None)
        with pytest.raises(DependencyError, match=advice):
            apply_once(geometry_op("timm", "Rotate", "bicubic", FILLS["timm"]), [img], [(9.0,)])
        with pytest.raises(DependencyError, match=advice):
            with fastload.FastLoader(ds, 4, device="cpu", progress=False, cache_dir=tmp_path / "c") as loader:
                next(iter(loader))
    (ours,) = apply_once(geometry_op("timm", "Rotate", "bicubic", FILLS["timm"]), [img], [(9.0,)])
    np.testing.assert_array_equal(ours, library_output(img, "timm", "Rotate", 9.0, "bicubic", FILLS["timm"]))
    with fastload.FastLoader(ds, 4, device="cpu", progress=False, cache_dir=tmp_path / "c") as loader:
        x, y = next(iter(loader))
    assert x.shape == (4, 3, 32, 32) and len(y) == 4
