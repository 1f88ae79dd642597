"""How far the geometric graph operations are from torchvision's and timm's own PIL functions, per operation and
interpolation: writes the markdown table of ``benchmarks/results/graph-ops-geometry.md``.

Usage: ``.venv/bin/python benchmarks/fidelity_graph_geometry.py [--out FILE]`` (CPU pipelines; about a minute).

Images: uniform noise (the worst case for interpolation) and a smooth RGB gradient, each at 37x53, 40x40 and
224x224; magnitudes: each operation's table value of ``tests/test_graph_geometry.py`` and the largest the
policies draw (torchvision's TrivialAugmentWide: shear 0.99, translation 32, rotation 135; timm: rotation 30,
shear 0.3, translation 100 pixels or 0.45 of the side), both signs. Cost: each operation at its table magnitude
on 32 noise crops of 224x224 with a colour fill (timm's DeiT fill, the ImageNet mean), CPU milliseconds per image
over all threads (another process's load does not count): the graph on DALI's CPU backend (2 threads, best of 3
runs of 3 batches) and the library's own PIL function (one thread, best of 3).

Each interpolation has two rows: the CPU graph's road (``cpu_warp="pil"``: PIL's ``Geometry.c`` compiled, in DALI's
threads) and a GPU graph's (``"dali"``: DALI's ``warp_affine``), the latter run on DALI's CPU backend.
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
from fastload.augment.ops_geometry import GEOMETRY_NAMES, geometry_op  # noqa: E402
from test_graph_geometry import FILLS, MAGNITUDES, gradient_image, library_output, noise_image  # noqa: E402

LARGEST = {
    ("torchvision", "ShearX"): 0.99, ("torchvision", "ShearY"): 0.99, ("torchvision", "TranslateX"): 32.0,
    ("torchvision", "TranslateY"): 32.0, ("torchvision", "Rotate"): 135.0, ("timm", "Rotate"): 30.0,
    ("timm", "ShearX"): 0.3, ("timm", "ShearY"): 0.3, ("timm", "TranslateX"): 100.0, ("timm", "TranslateY"): 100.0,
    ("timm", "TranslateXRel"): 0.45, ("timm", "TranslateYRel"): 0.45,
}  # fmt: skip
SIZES = [(53, 37), (40, 40), (224, 224)]


def measure(library: str, name: str, interpolation: str, kind: str, road: str) -> tuple[int, float, float]:
    """(max, mean, fraction > 1 level) of |ours - library| over every size, magnitude and sign, on ``kind`` images."""
    fill = FILLS[library]
    cases = [(h, w, s * m) for h, w in SIZES for m in (MAGNITUDES[(library, name)], LARGEST[(library, name)]) for s in (1, -1)]
    imgs = [noise_image(h, w, seed=i) if kind == "noise" else gradient_image(h, w) for i, (h, w, _) in enumerate(cases)]
    outs = apply_once(geometry_op(library, name, interpolation, fill, cpu_warp=road), imgs, [(m,) for _, _, m in cases])
    diffs = [np.abs(o.astype(np.int16) - library_output(i, library, name, m, interpolation, fill)).ravel() for i, o, (_, _, m) in zip(imgs, outs, cases)]
    d = np.concatenate(diffs)
    return int(d.max()), float(d.mean()), float((d > 1).mean())


COST_FILL = (124, 116, 104)


def cost(library: str, name: str, interpolation: str, road: str, crops: list[np.ndarray]) -> tuple[float, float]:
    """(graph, PIL) CPU milliseconds per image of the operation on ``crops`` (see the module's docstring)."""
    from fastload.pipeline import import_dali

    dali, fn, types = import_dali()
    m = MAGNITUDES[(library, name)]
    op = geometry_op(library, name, interpolation, COST_FILL, cpu_warp=road)
    par = [op.params((m,))] * len(crops)

    @dali.pipeline_def(batch_size=len(crops), num_threads=2, device_id=None)
    def pipe():
        img = fn.external_source(source=lambda: crops, batch=True, layout="HWC", dtype=types.UINT8, ndim=3)
        return op.graph(img, fn.external_source(source=lambda: par, batch=True, dtype=types.FLOAT, ndim=1))

    pp = pipe()
    pp.build()
    pp.run()
    graph = pil = float("inf")
    for _ in range(3):
        t = time.process_time()
        for _ in range(3):
            pp.run()
        graph = min(graph, (time.process_time() - t) / 3 / len(crops) * 1000)
        t = time.process_time()
        for c in crops:
            library_output(c, library, name, m, interpolation, COST_FILL)
        pil = min(pil, (time.process_time() - t) / len(crops) * 1000)
    return graph, pil


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=None, help="write the table here (default: log it)")
    a = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    crops = [noise_image(224, 224, seed=i) for i in range(32)]
    rows = [f"Machine: {platform.processor() or platform.machine()}, python {platform.python_version()}; "
            f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}.", "",
            "| library | operation | interpolation | road | noise: max | mean | > 1 level | gradient: max | mean | > 1 level "
            "| graph CPU ms / image | PIL CPU ms / image |",
            "|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
    for library, names in GEOMETRY_NAMES.items():
        for name in names:
            for interp, road in ((i, r) for i in ("nearest", "bilinear", "bicubic") for r in ("pil", "dali")):
                n, g = measure(library, name, interp, "noise", road), measure(library, name, interp, "gradient", road)
                ms = cost(library, name, interp, road, crops)
                shown = "DALI warp_affine" if road == "dali" else "PIL's Geometry.c compiled"
                rows.append(f"| {library} | {name} | {interp} | {shown} | {n[0]} | {n[1]:.3f} | {n[2]:.3%} | {g[0]} | {g[1]:.3f} "
                            f"| {g[2]:.3%} | {ms[0]:.2f} | {ms[1]:.2f} |")
                logging.info(rows[-1])
    if a.out:
        a.out.write_text("\n".join(rows) + "\n")


if __name__ == "__main__":
    main()
