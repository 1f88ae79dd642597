"""timm 0.3.2 and 0.4.12 (pinned by DeiT, MAE, ConvNeXt) read by their own objects: erasing modes, operations, level laws.

Each version is installed once with ``pip install --no-deps --target`` under
``~/.cache/fastload-tests/timm-<version>`` (``FASTLOAD_TEST_CACHE`` moves it) and imported only in
a subprocess with that folder first on ``PYTHONPATH`` (this process keeps the current timm), which
runs ``old_timm_probe.py``. Expected values come from that version's objects: the flags its
``RandomErasing`` erases by, the names its ``AugmentOp`` s were built from, its ``LEVEL_TO_ARG``
functions, the levels its own ``AugmentOp`` draws, its own transform's batches.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torchvision")
stats = pytest.importorskip("scipy.stats")

from fastload.augment.policies import plan, timm_args  # noqa: E402
from fastload.augment.readaug import TWO_POINT_STD  # noqa: E402
from fastload.augment.settings import Op, Policy  # noqa: E402
from timm_install import install_timm as _install  # noqa: E402

VERSIONS = ("0.3.2", "0.4.12")
ROOT = Path(__file__).resolve().parent.parent
PROBE = Path(__file__).resolve().parent / "old_timm_probe.py"
def _probe(version: str, *args: str) -> dict:
    """``old_timm_probe.py args`` under timm ``version``: its JSON result."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(_install(version)), str(ROOT)]), PYTHONWARNINGS="ignore")
    r = subprocess.run([sys.executable, str(PROBE), *args], capture_output=True, text=True, timeout=300, env=env, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["version"] == version  # the version asked for, not the environment's
    return out


@pytest.fixture(scope="session", params=VERSIONS)
def read(request) -> dict:
    return _probe(request.param, "read")


def _ok(section: dict) -> dict:
    assert "error" not in section, section.get("error")
    return section


def test_erasing_mode_is_what_each_versions_flags_draw(read):
    """0.3/0.4 keep no ``mode``: pixel noise is its ``per_pixel``, per-channel noise its ``rand_color`` (the
    defect: both were read as constant erasing); area, aspect, count and probability as the object keeps them."""
    for mode, e in read["erasing"].items():
        own = e["own"]
        assert own["mode"] is None and (own["per_pixel"], own["rand_color"]) == (mode == "pixel", mode == "rand")
        want = "pixel" if own["per_pixel"] else "channel" if own["rand_color"] else None
        assert _ok(e["alone"])["noise"] == want, mode
        got = _ok(e["read"])
        assert got["noise"] == want and got["p"] == own["p"] and got["scale"] == own["scale"]
        assert got["ratio"] == pytest.approx([math.exp(v) for v in own["log_ratio"]]) and got["count"] == own["count"]


def test_deits_transform_reads_as_its_version_built_it(read):
    """DeiT's ``create_transform`` (jitter 0.3 dropped beside RandAugment, pixel erasing at 0.25, one rectangle)."""
    d = _ok(read["deit"])
    assert d["ops"] == d["own_ops"] and len(d["ops"]) == 15 and d["jitter"]
    assert (d["read"]["noise"], d["read"]["p"], d["read"]["count"]) == ("pixel", d["own"]["p"], d["own"]["count"])
    assert d["own"]["p"] == 0.25 and d["own"]["per_pixel"]


def test_randaugment_operations_are_named_by_their_functions(read):
    """Names, probabilities, magnitudes, std, translate_const, fill and filter of each of the 15 operations."""
    r = _ok(read["rand"])
    assert [row[0] for row in r["read"]] == [row[0] for row in r["own"]] == r["increasing"]
    for got, own in zip(r["read"], r["own"]):
        name, prob, magnitude, std, level_max, translate_const = got
        assert (prob, magnitude, std, translate_const) == (own[1], own[2], own[3], own[4]), name
        assert level_max == 10.0  # 0.3/0.4 clamp the level at 10
    assert r["layers"][0] == r["layers"][1] == 2
    assert r["fill"] == r["own"][0][5] and r["interp"] == ["bicubic"] and r["own"][0][6] == 3


def test_autoaugment_sub_policies_are_named_by_their_functions(read):
    a = _ok(read["auto"])
    assert len(a["read"]) == len(a["own"]) == 25
    for sub_read, sub_own in zip(a["read"], a["own"]):
        assert [(r[0], r[1], r[2], r[3]) for r in sub_read] == [(o[0], o[1], o[2], o[3]) for o in sub_own]


def test_each_level_function_of_the_version_is_timm_args(read):
    """Every ``LEVEL_TO_ARG`` entry of the version at 41 levels in [0, 10] (all its clamp lets through), both signs."""
    assert len(read["levels"]) == 24
    for name, rows in read["levels"].items():
        op = Op(name=name, translate_const=100, translate_pct=0.3)
        for level, plus, minus in rows:
            assert list(timm_args(name, level, False, op)) == pytest.approx(plus, rel=1e-12, abs=1e-12), (name, level)
            assert list(timm_args(name, level, True, op)) == pytest.approx(minus, rel=1e-12, abs=1e-12), (name, level)


def test_weights_and_a_large_std_are_the_versions_own(read):
    """``choice_weights`` as kept; ``mstd101`` stays a normal of std 101 (timm 1.x would make it uniform)."""
    h = _ok(read["hparams"])
    assert h["weights"]["read"] == pytest.approx(h["weights"]["own"])
    assert h["mstd101"]["read"] == h["mstd101"]["own"] == 101.0


def _rotations(std: float, level_max: float, n: int) -> list[float]:
    """Rotate angles FastLoader draws for a Rotate at magnitude 9 with the ``std`` and ``level_max`` read."""
    op = Op(name="Rotate", magnitude=9.0, std=std, level_max=level_max)
    steps = plan(Policy(library="timm", kind="rand", ops=(op,), num_ops=1), seed=3, epoch=0, positions=np.arange(n))
    return [s[0][1][0] for s in steps]


def test_infinite_std_follows_each_versions_law(read):
    """``magnitude_std=inf``: 0.3.2 draws ``gauss(9, inf)``, clamped: level 0 or 10 (angle 0 or +-30), half each;
    0.4.12 draws ``uniform(0, 9)``. FastLoader's draws from what it read follow the version's own draws."""
    h = _ok(read["hparams"])["inf"]
    own = np.array(h["own"])
    ours = np.array(_rotations(h["std"], h["level_max"], len(own)))
    if read["version"] == "0.3.2":
        assert h["std"] == TWO_POINT_STD and set(np.abs(own)) == set(np.abs(ours)) == {0.0, 30.0}
        table = [[(np.abs(x) == 0).sum(), (np.abs(x) == 30).sum()] for x in (own, ours)]
        assert stats.chi2_contingency(table).pvalue > 1e-3
    else:
        assert h["std"] == math.inf and np.abs(own).max() <= 27.0 + 1e-9
        assert stats.ks_2samp(np.abs(own), np.abs(ours)).pvalue > 1e-3


def test_magnitude_max_is_ignored_as_the_version_ignores_it(read):
    """0.3/0.4 clamp at 10 whatever ``hparams['magnitude_max']`` says: a magnitude of 15 rotates by 30 degrees."""
    h = _ok(read["hparams"])["mmax"]
    assert h["level_max"] == 10.0 and set(np.abs(h["own"])) == {30.0}
    op = Op(name="Rotate", magnitude=15.0, level_max=h["level_max"])
    assert abs(timm_args("Rotate", min(op.magnitude, op.level_max), False, op)[0]) == 30.0


def test_unreadable_objects_are_refused_by_name(read):
    words = {
        "no per_pixel": "per_pixel", "per_pixel 1": "per_pixel=1", "mode unknown": "'noise'",
        "mode disagrees": "per_pixel/rand_color draw 'pixel'", "no probability": "'probability'",
        "no count": "'max_count'", "aug_fn foreign": "NAME_TO_OP", "level_fn another's": "NAME_TO_OP",
        "no translate_const": "TranslateX has no translate_const", "no magnitude_std": "'magnitude_std'",
        "no kwargs": "'kwargs'", "no num_layers": "'num_layers'",
    }  # fmt: skip
    assert set(read["refusals"]) == set(words)
    for case, (kind, message) in read["refusals"].items():
        assert kind == "ConfigError" and words[case] in message, (case, kind, message)


@pytest.fixture(scope="module")
def noise_folder(tmp_path_factory) -> Path:
    """48 non-square (44 x 36) PNGs of uniform noise, fixed seed, in two classes."""
    from PIL import Image

    root = tmp_path_factory.mktemp("timm-versions")
    rng = np.random.default_rng(0)
    for c in range(2):
        for j in range(24):
            p = root / "images" / f"c{c}" / f"{j:02d}.png"
            p.parent.mkdir(parents=True, exist_ok=True)
            Image.fromarray(rng.integers(0, 256, (36, 44, 3), dtype=np.uint8)).save(p)
    return root


@pytest.mark.parametrize("version", [pytest.param("0.3.2"), pytest.param("0.4.12", marks=pytest.mark.slow)])
def test_pixel_erasing_puts_noise_in_the_batches_as_the_version_does(noise_folder, version):
    """Values outside the normalised pixel range: a share of the batch in pixel mode (N(0, 1) draws in about 18 %
    of the area), as in the version's own transform on the same images, and none in const mode."""
    out = _probe(version, "load", str(noise_folder / "images"), str(noise_folder / f"cache-{version}"), "pixel,const")
    pixel, const = out["pixel"], out["const"]
    assert pixel["timm"] > 0.002 and pixel["fastload"] > 0.002, pixel
    assert 0.6 < pixel["fastload"] / pixel["timm"] < 1.6, pixel
    assert const["timm"] == const["fastload"] == 0.0, const
