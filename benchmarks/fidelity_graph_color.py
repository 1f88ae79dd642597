"""How far the colour/pixel graph operations are from torchvision's and timm's own PIL functions, and what each
costs on DALI's CPU: writes the markdown of ``benchmarks/results/graph-ops-color.md``.

Usage: ``.venv/bin/python benchmarks/fidelity_graph_color.py [--photos DIR] [--out FILE]`` (CPU pipelines; a
minute or two).

Fidelity: every operation of ``tests/test_graph_color.py`` over its images and argument table (extremes
included), in both forms where the operation has two (``arguments``: the CPU's, PIL's own arithmetic compiled; ``arithmetic``:
the GPU's, DALI's operators). Cost: each operation alone on 32 crops of 224x224 (photos when ``--photos`` is given, else noise), CPU
milliseconds per image over all threads (so another process's load does not count), the graph's on DALI's CPU
backend (2 threads, best of 3 runs of 3 batches) beside the library's own PIL function (one thread, best of 3). Hue:
ColorJitter's hue part in both forms against torchvision's ``adjust_hue`` on the photos (the GPU's YIQ turn is the
one operation whose pixels differ visibly).
"""

from __future__ import annotations

import argparse
import logging
import platform
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from fastload.augment.rounds import apply_once  # noqa: E402
from fastload.augment.ops_color import color_op, statistics_form  # noqa: E402
from test_graph_color import CASES, IMAGES, TWO_FORMS, _timm, _tv  # noqa: E402

log = logging.getLogger("fidelity_graph_color")
NAN = float("nan")


def differences(library: str, name: str, args: list[tuple], form: str) -> np.ndarray:
    """|ours - library| over every fixture and argument tuple, in levels."""
    from PIL import Image

    op = color_op(library, name, "bilinear", (128, 128, 128))
    if form == "arithmetic" and name == "ColorJitter":  # the GPU's hue is a YIQ turn: the hue rows
        args = [a for a in args if a[7] != a[7] or a[7] is None]
    images = [im for im in IMAGES for _ in args]
    every = [a for _ in IMAGES for a in args]
    with statistics_form(form):
        outs = apply_once(op, images, every)
    ref = _timm if library == "timm" else _tv
    return np.concatenate([
        np.abs(o.astype(np.int16) - np.asarray(ref(name, a, Image.fromarray(im)), dtype=np.int16)).ravel()
        for im, a, o in zip(images, every, outs)
    ])  # fmt: skip


def cost(library: str, name: str, args: tuple, crops: list[np.ndarray]) -> float:
    """CPU milliseconds per image (all of the process's threads) of the graph operation alone on ``crops`` (2 DALI
    threads, best of 3 x 3 batches): what it costs the machine, whatever else runs beside it."""
    from fastload.pipeline import import_dali

    dali, fn, types = import_dali()
    op = color_op(library, name, "bilinear", (128, 128, 128))
    par = [op.params(args)] * len(crops)

    @dali.pipeline_def(batch_size=len(crops), num_threads=2, device_id=None, enable_conditionals=True)
    def pipe():
        img = fn.external_source(source=lambda: crops, batch=True, layout="HWC", dtype=types.UINT8, ndim=3)
        p = fn.external_source(source=lambda: par, batch=True, dtype=types.FLOAT, ndim=1)
        return op.graph(img, p)

    pp = pipe()
    pp.build()
    pp.run()
    best = float("inf")
    for _ in range(3):
        t = time.process_time()
        for _ in range(3):
            pp.run()
        best = min(best, (time.process_time() - t) / 3 / len(crops) * 1000)
    return best


def library_cost(library: str, name: str, args: tuple, crops: list[np.ndarray]) -> float:
    """CPU milliseconds per image of the library's own function on the PIL crops (one thread, as in a DataLoader
    worker; best of 3)."""
    from PIL import Image

    ref = _timm if library == "timm" else _tv
    pils = [Image.fromarray(c) for c in crops]
    best = float("inf")
    for _ in range(3):
        t = time.process_time()
        for im in pils:
            ref(name, args, im)
        best = min(best, (time.process_time() - t) / len(pils) * 1000)
    return best


def load_crops(photos: str | None, n: int = 32) -> list[np.ndarray]:
    from PIL import Image

    if photos:
        files = sorted(p for p in Path(photos).rglob("*") if p.suffix.lower() in (".jpg", ".jpeg", ".png"))[:n]
        return [np.asarray(Image.open(f).convert("RGB").resize((224, 224))) for f in files]
    rng = np.random.default_rng(0)
    return [rng.integers(0, 256, (224, 224, 3), dtype=np.uint8) for _ in range(n)]


def hue_rows(crops: list[np.ndarray]) -> list[str]:
    import torchvision.transforms.functional as F
    from PIL import Image

    op = color_op("torchvision", "ColorJitter", "bilinear", (0, 0, 0))
    rows = []
    for form, h in [(f, h) for f in ("arguments", "arithmetic") for h in (0.02, 0.05, 0.1, 0.2)]:
        with statistics_form(form):
            outs = apply_once(op, crops, [(0, 1, 2, 3, NAN, NAN, NAN, h)] * len(crops))
        d = np.concatenate([np.abs(o.astype(int) - np.asarray(F.adjust_hue(Image.fromarray(c), h), dtype=int)).ravel()
                            for o, c in zip(outs, crops)])  # fmt: skip
        rows.append(f"| {form} | {h} | {d.max()} | {d.mean():.2f} | {(d > 8).mean():.3f} |")
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--photos", help="a folder of photos for the cost and the hue rows (else noise, and no hue rows)")
    ap.add_argument("--out", help="write the markdown here (else stdout)")
    a = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    crops = load_crops(a.photos)
    lines = [
        "# Colour/pixel graph operations against the libraries' own functions, and their cost",
        "",
        f"Machine: {platform.processor() or platform.machine()}, python {platform.python_version()}; "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}. Command: `benchmarks/fidelity_graph_color.py"
        + (f" --photos {a.photos}`." if a.photos else "`."),
        "Fidelity over the images and argument tables of `tests/test_graph_color.py`, uint8 levels over all values;",
        "cost: the operation alone on 32 crops of 224x224 " + ("photos" if a.photos else "noise")
        + ": CPU ms per image (all threads), the graph's on DALI's CPU backend (2 threads) and the library's own PIL",
        "function (one thread), best of 3. Forms: `arguments` is the CPU graph's (PIL's own arithmetic, compiled: every",
        "operation but torchvision's GaussianBlur, which is DALI's on both), `arithmetic` a GPU graph's (DALI's operators),",
        "here run on DALI's CPU backend.",
        "",
        "| library | op | form | max | mean abs | fraction > 1 level | graph CPU ms / image | PIL CPU ms / image |",
        "|---|---|---|---:|---:|---:|---:|---:|",
    ]
    for library, name, args in CASES:
        ms, pil_ms = cost(library, name, args[0], crops), library_cost(library, name, args[0], crops)
        for form in ("arguments", "arithmetic") if name in TWO_FORMS else ("arguments",):
            d = differences(library, name, args, form)
            lines.append(f"| {library} | {name} | {form} | {d.max()} | {d.mean():.4f} | {(d > 1).mean():.4f} | "
                         f"{ms:.2f} | {pil_ms:.2f} |" if form == "arguments" else
                         f"| {library} | {name} | {form} | {d.max()} | {d.mean():.4f} | {(d > 1).mean():.4f} | (GPU form) | |")  # fmt: skip
            log.info(lines[-1])
    if a.photos:
        lines += ["", "ColorJitter's hue part against torchvision's `adjust_hue` (PIL's HSV) on the photos: the CPU's form"
                  " (PIL's round trip, compiled), the GPU's (a YIQ turn):",
                  "", "| form | hue factor | max | mean abs | fraction > 8 levels |", "|---|---:|---:|---:|---:|", *hue_rows(crops)]
    text = "\n".join(lines) + "\n"
    if a.out:
        Path(a.out).write_text(text)
    else:
        sys.stdout.write(text)


if __name__ == "__main__":
    main()
