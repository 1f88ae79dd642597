"""The environment the set-up promises: pillow-simd as PIL, with its codecs; no DALI for packing."""

from __future__ import annotations

import importlib.metadata as md
import io
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from PIL import Image


def test_active_pil_is_pillow_simd():
    import PIL

    assert ".post" in PIL.__version__, f"PIL {PIL.__version__} is not pillow-simd (run scripts/setup.sh)"
    try:
        dist = md.distribution("pillow-simd")
    except md.PackageNotFoundError:
        pytest.fail("the pillow-simd distribution is not installed (run scripts/setup.sh)")
    assert dist.version == PIL.__version__
    # the PIL that imports is the one pillow-simd installed
    owned = [f for f in dist.files or [] if str(f).replace("\\", "/") == "PIL/__init__.py"]
    assert owned, "pillow-simd does not own PIL/__init__.py"
    assert Path(dist.locate_file(owned[0])).resolve() == Path(PIL.__file__).resolve()
    # and pillow (which would overwrite PIL/) is not installed beside it
    with pytest.raises(md.PackageNotFoundError):
        md.distribution("pillow")


@pytest.mark.parametrize("feature", ["jpg", "zlib", "webp", "libtiff"])
def test_pil_has_codec(feature):
    from PIL import features

    assert features.check(feature), f"pillow-simd was built without {feature}; install its -dev package and rerun setup"


@pytest.mark.parametrize("fmt", ["JPEG", "PNG", "WEBP", "TIFF"])
def test_pil_round_trips(fmt):
    img = Image.new("RGB", (32, 24), (200, 40, 90))
    buf = io.BytesIO()
    img.save(buf, fmt, **({"compression": "tiff_deflate"} if fmt == "TIFF" else {}))
    back = Image.open(io.BytesIO(buf.getvalue()))
    assert back.format == fmt and back.size == (32, 24)
    r, g, b = back.convert("RGB").getpixel((16, 12))
    assert abs(r - 200) < 8 and abs(g - 40) < 8 and abs(b - 90) < 8


def _run(code: str, cwd: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=cwd, env=env, capture_output=True, text=True)


_CHECK_NO_DALI = """
    dali = sorted(m for m in sys.modules if m == "nvidia.dali" or m.startswith("nvidia.dali."))
    if dali:
        sys.exit("imported " + ", ".join(dali[:5]))
"""


def test_import_does_not_load_dali(tmp_path):
    code = """
    import importlib, importlib.util, sys
    import fastload, fastload.cli
    for m in ("fastload.packing", "fastload.packing.run", "fastload.packing.sources", "fastload.store", "fastload.reader", "fastload.format", "fastload.sample"):
        if importlib.util.find_spec(m) is not None:
            importlib.import_module(m)
    fastload.cli.build_parser()
    """ + _CHECK_NO_DALI
    r = _run(code, tmp_path)
    assert r.returncode == 0, r.stderr


def test_pack_inspect_verify_do_not_load_dali(tmp_path, make_folder):
    from fastload.cli import build_parser

    commands = build_parser()._subparsers._group_actions[0].choices  # type: ignore[union-attr]
    assert {"pack", "inspect", "verify"} <= set(commands)
    src = make_folder(classes=2, per_class=3)
    out = tmp_path / "packed"
    steps = [["pack", str(src), str(out), "--workers", "1"], ["inspect", str(out)], ["verify", str(out)]]
    code = f"""
    import sys
    from fastload.cli import main
    for argv in {steps!r}:
        rc = main(argv)
        if rc != 0:
            sys.exit(f"{{argv[0]}} exited {{rc}}")
    import fastload
    ds = fastload.Dataset({str(out)!r})
    assert len(ds) == 6 and ds[5][1] == 1
    """ + _CHECK_NO_DALI
    r = _run(code, tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
