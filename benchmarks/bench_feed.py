"""Feeding DALI: records/s into ``pipe.run`` without decoding, and FastLoader(cpu) on tiny JPEGs.

    .venv/bin/python benchmarks/bench_feed.py [--compare-with OLD_SRC] [--repeats 5] [--quick]

Both parts run under three conditions of the rest of the process, because a training loop
is a Python thread that wants the GIL too:

- ``none``: nothing else runs;
- ``train``: a thread that runs Python bytecode for 1 ms, then sleeps 1 ms (GIL released),
  over and over: a training step that launches kernels from Python, then waits on the GPU;
- ``busy``: a thread that runs Python bytecode without pause (the worst case: any thread that
  releases the GIL waits up to the 5 ms switch interval to take it back).

1. **Feeding**, no decoding: a DALI CPU graph whose only operator is the source, batch 64 and
   256, ~100 KB JPEG records (``--images``, made here: noise JPEGs, 340x340, quality 90):

   - ``per-record``: the callback FastLoader used until this change, one ``Dataset.record``
     per sample (two ``pread`` each, the GIL released in both) and a copy into DALI;
   - ``read_batch list``: as ``read_batch`` below, the payloads handed over as a list of views
     (DALI checks and converts each in Python): FastLoader's callback before small crops;
   - ``read_batch``: ``Dataset.read_batch`` into one reused buffer (cached records copied
     without releasing the GIL), the payloads handed to DALI as one ``TensorListCPU`` of views
     of it (``fastload.pipeline.encoded_batch``), which DALI copies: what FastLoader's
     callback does now;
   - ``readers.file``: DALI's own C++ file reader on the same JPEGs (random shuffle).

   Each measurement runs batches for at least ``--seconds`` (and at least one pass over the
   dataset); the payload checksum is checked (``check=True``, as FastLoader reads).
2. **FastLoader(cpu) against DALI's ``readers.file`` pipeline** on 64-px JPEGs (decoding
   nearly free, so feeding costs show; ``--loader-images DIR --crop 224`` runs it on a
   folder of ordinary photos instead): the same random-resized crops, flips and
   normalisation (``decoders.image_random_crop`` -> ``resize`` -> ``crop_mirror_normalize``
   with a coin-flip mirror), 56x56 float32 output, batch 256, ``num_threads`` = cores. Each
   measurement is a fresh process (one warm-up epoch, then ``--epochs`` epochs, median);
   the rows are interleaved repeat by repeat, each loader first in turn. With ``--compare-with DIR`` the ``fastload``
   package in ``DIR`` (e.g. ``git archive <old commit> fastload | tar -x -C DIR``) is measured
   too, on a dataset it packs itself: the loader before this change, in the same run.

Writes ``benchmarks/results/feed-<machine>.json`` (every run) and ``.md`` (medians, spread
min-max). Data under ``data/feed/`` (``--data``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if "--child" not in sys.argv:  # a child imports the fastload its PYTHONPATH names (this tree, or --compare-with)
    sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

CONDITIONS = ("none", "train", "busy")
FEEDERS = ("per-record", "read_batch list", "read_batch", "readers.file")
FEED_TARGET = 40_000  # records/s into DALI with the training-loop thread running
LOADER_TARGETS = {"none": 1.1, "train": 1.0}  # FastLoader / readers.file


# ============================================================================ the competing thread


class GilThread:
    """A Python thread that wants the GIL: ``train`` (1 ms busy, 1 ms asleep) or ``busy`` (always)."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.slices = 0

    def _run(self) -> None:
        sleep = self.kind == "train"
        clock = time.perf_counter
        while not self._stop.is_set():
            t = clock()
            x = 0
            while clock() - t < 0.001:
                x += 1  # bytecode: holds the GIL
            self.slices += 1
            if sleep:
                time.sleep(0.001)

    def __enter__(self) -> "GilThread":
        if self.kind != "none":
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()


# ============================================================================ data


def make_jpegs(folder: Path, n: int, side: int, quality: int, seed: int = 0) -> list[str]:
    """``n`` noise JPEGs of ``side`` px in ``folder/c0``, ``folder/c1`` (made once)."""
    from PIL import Image

    files = [folder / f"c{i % 2}" / f"{i:06d}.jpg" for i in range(n)]
    if all(f.exists() for f in files):
        return [str(f) for f in files]
    rng = np.random.default_rng(seed)
    for f in files:
        f.parent.mkdir(parents=True, exist_ok=True)
        base = rng.integers(0, 256, (side // 5 + 1, side // 5 + 1, 3), dtype=np.uint8)
        a = np.kron(base, np.ones((5, 5, 1), dtype=np.uint8))[:side, :side]
        a = (a.astype(np.int16) + rng.integers(-40, 40, a.shape)).clip(0, 255).astype(np.uint8)
        Image.fromarray(a).save(f, quality=quality)
    return [str(f) for f in files]


def pack_with(pythonpath: str, src: Path, out: Path) -> None:
    """Pack ``src`` into ``out`` with the fastload found on ``pythonpath`` (once)."""
    if (out / "manifest.json").exists():
        return
    env = dict(os.environ, PYTHONPATH=pythonpath)
    subprocess.run([sys.executable, "-m", "fastload", "pack", str(src), str(out)], check=True, env=env,
                   cwd=pythonpath, stdout=subprocess.DEVNULL)  # fmt: skip  (cwd: -m must not find ./fastload)


# ============================================================================ part 1: feeding


def _source_graph(dali, fn, types, source, batch: int):
    @dali.pipeline_def(batch_size=batch, num_threads=1, device_id=None, prefetch_queue_depth=2, seed=0)
    def graph():
        return fn.external_source(source=source, batch=True, dtype=types.UINT8, ndim=1)

    pipe = graph()
    pipe.build()
    return pipe


def _file_graph(dali, fn, files: list[str], batch: int):
    @dali.pipeline_def(batch_size=batch, num_threads=1, device_id=None, prefetch_queue_depth=2, seed=0)
    def graph():
        enc, _ = fn.readers.file(files=files, labels=list(range(len(files))), random_shuffle=True, name="r")
        return enc

    pipe = graph()
    pipe.build()
    return pipe


def feed_rate(kind: str, packed: Path, files: list[str], batch: int, condition: str, seconds: float) -> float:
    """Records/s through ``pipe.run`` for one feeder under one condition."""
    from nvidia import dali
    from nvidia.dali import fn, types

    import fastload

    ds = fastload.Dataset(packed, check=True)
    n = len(ds)
    rng = np.random.default_rng(0)
    order = rng.permutation(n)
    state = {"pos": 0, "buffer": None}

    def next_indices() -> np.ndarray:
        p = state["pos"]
        if p + batch > n:
            p = 0
        state["pos"] = p + batch
        return order[p : p + batch]

    def per_record():
        return [np.frombuffer(ds.record(int(i))[1], dtype=np.uint8) for i in next_indices()]

    from fastload.pipeline import encoded_batch

    def read_batch():
        rb = ds.read_batch(next_indices(), buffer=state["buffer"])
        state["buffer"] = rb.buffer  # DALI copies the views before it calls again: reuse it
        return rb.payloads if kind == "read_batch list" else encoded_batch(rb.payloads)

    if kind == "readers.file":
        pipe = _file_graph(dali, fn, files, batch)
    else:
        pipe = _source_graph(dali, fn, types, per_record if kind == "per-record" else read_batch, batch)

    def run_one() -> None:
        pipe.run()

    for _ in range(3):
        run_one()  # warm: buffers, the page cache, DALI's pools
    with GilThread(condition):
        t0 = time.perf_counter()
        runs = 0
        while True:
            run_one()
            runs += 1
            dt = time.perf_counter() - t0
            if dt >= seconds and runs * batch >= n:
                break
    del pipe
    return runs * batch / dt


# ============================================================================ part 2: loaders (children)


def child_loader(args) -> dict:
    """One measurement in this fresh process: images/s of one loader, median of ``epochs``."""
    import torch  # noqa: F401  (import before DALI's plugin, as a training script does)

    rates = []
    if args.child == "fastload":
        import fastload

        loader = fastload.FastLoader(args.packed, batch_size=args.batch, device="cpu", crop=args.crop, shuffle=True,
                                     num_threads=args.threads, seed=0)  # fmt: skip
        n = len(fastload.Dataset(args.packed))

        def epoch() -> int:
            k = 0
            for x, y in loader:
                k += x.shape[0]
            return k

        where = fastload.__file__
    else:
        from nvidia import dali
        from nvidia.dali import fn, types
        from nvidia.dali.plugin.pytorch import DALIGenericIterator, LastBatchPolicy

        files = [str(p) for p in sorted(Path(args.image_dir).rglob("*.jpg"))]
        n = len(files)
        mean = [0.485 * 255, 0.456 * 255, 0.406 * 255]
        std = [0.229 * 255, 0.224 * 255, 0.225 * 255]

        @dali.pipeline_def(batch_size=args.batch, num_threads=args.threads, device_id=None, seed=0)
        def graph():
            enc, label = fn.readers.file(files=files, labels=[i % 2 for i in range(n)], random_shuffle=True, name="r")
            img = fn.decoders.image_random_crop(enc, device="cpu", output_type=types.RGB,
                                                random_area=[0.08, 1.0], random_aspect_ratio=[3 / 4, 4 / 3])  # fmt: skip
            img = fn.resize(img, size=[args.crop, args.crop], antialias=True)
            img = fn.crop_mirror_normalize(img, mean=mean, std=std, dtype=types.FLOAT, output_layout="CHW",
                                           mirror=fn.random.coin_flip())  # fmt: skip
            return img, label

        pipe = graph()
        pipe.build()
        it = DALIGenericIterator([pipe], ["x", "y"], reader_name="r", last_batch_policy=LastBatchPolicy.PARTIAL,
                                 auto_reset=True)  # fmt: skip

        def epoch() -> int:
            k = 0
            for out in it:
                k += out[0]["x"].shape[0]
            return k

        where = "nvidia.dali"
    epoch()  # warm-up
    with GilThread(args.condition):
        for _ in range(args.epochs):
            t = time.perf_counter()
            k = epoch()
            rates.append(k / (time.perf_counter() - t))
    return {"images_per_s": statistics.median(rates), "epochs": rates, "samples": n, "package": where}


def run_child(kind: str, pythonpath: str, condition: str, args, packed: Path, images: Path) -> dict:
    cmd = [sys.executable, __file__, "--child", kind, "--condition", condition, "--packed", str(packed),
           "--image-dir", str(images), "--batch", str(args.loader_batch), "--crop", str(args.crop),
           "--threads", str(args.threads), "--epochs", str(args.epochs)]  # fmt: skip
    env = dict(os.environ, PYTHONPATH=pythonpath)
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
    if r.returncode:
        raise RuntimeError(f"child {kind} failed: {r.stderr[-2000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


# ============================================================================ report


def machine() -> dict:
    cpu = platform.processor()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    import nvidia.dali

    return {"cpu": cpu, "cores": os.cpu_count(), "python": platform.python_version(), "kernel": platform.release(),
            "dali": nvidia.dali.__version__, "numpy": np.__version__}  # fmt: skip


def _spread(v: list[float]) -> str:
    return f"{min(v):,.0f}–{max(v):,.0f}"


def report(res: dict) -> str:
    lines = [
        "# Feeding DALI: records/s into `pipe.run`, and FastLoader(cpu) on 64-px JPEGs",
        "",
        f"Machine: {res['machine']['cpu']}, {res['machine']['cores']} cores, Linux {res['machine']['kernel']}, "
        f"Python {res['machine']['python']}, DALI {res['machine']['dali']}. Page cache warm. "
        f"Conditions: `none` (nothing else runs), `train` (a Python thread: 1 ms of bytecode, 1 ms asleep, "
        f"like a training loop), `busy` (a Python thread that never pauses). Median of {res['repeats']} "
        "interleaved repeats, spread min–max; every run is in the JSON file.",
    ]
    rows = res["feed"]["rows"] if "feed" in res else {}
    if rows:
        lines += [
            "",
            f"## 1. Feeding, no decoding ({res['feed']['records']} JPEG records of {res['feed']['mean_kb']:.0f} KB, "
            "payload checksum checked)",
            "",
            "| batch | condition | feeder | records/s (median) | spread | vs per-record |",
            "|---:|---|---|---:|---|---:|",
        ]
    for b in res["feed"]["batches"] if rows else []:
        for c in CONDITIONS:
            base = statistics.median(rows[f"{b}/{c}/per-record"])
            for k in FEEDERS:
                if f"{b}/{c}/{k}" not in rows:  # a run made before this feeder was measured
                    continue
                v = rows[f"{b}/{c}/{k}"]
                m = statistics.median(v)
                lines.append(f"| {b} | {c} | {k} | {m:,.0f} | {_spread(v)} | {m / base:.2f}× |")
    if rows:
        lines += ["", f"Target: ≥ {FEED_TARGET:,} records/s with the `train` thread running (`read_batch`)."]
        ok = []
        for b in res["feed"]["batches"]:
            m = statistics.median(rows[f"{b}/train/read_batch"])
            ok.append(f"batch {b}: {m:,.0f} ({'met' if m >= FEED_TARGET else 'missed'})")
        lines += ["", "Result: " + "; ".join(ok) + "."]
    if "loaders" in res:
        L = res["loaders"]
        lines += [
            "",
            f"## 2. FastLoader(cpu) against DALI's `readers.file` pipeline ({L.get('what', str(L['images']) + ' JPEGs of 64 px')}, "
            f"batch {L['batch']}, {L['crop']}x{L['crop']} float32, {L['threads']} threads)",
            "",
            "| condition | loader | images/s (median) | spread | vs readers.file |",
            "|---|---|---:|---|---:|",
        ]
        for c in L["conditions"]:
            base = statistics.median(L["rows"][f"{c}/readers.file"])
            for k in L["kinds"]:
                v = L["rows"][f"{c}/{k}"]
                m = statistics.median(v)
                lines.append(f"| {c} | {k} | {m:,.0f} | {_spread(v)} | {m / base:.2f}× |")
        lines += ["", "Targets: FastLoader ≥ " + ", ".join(f"{t}× with `{c}`" for c, t in LOADER_TARGETS.items())
                  + " of `readers.file`."]  # fmt: skip
    return "\n".join(lines) + "\n"


# ============================================================================ main


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", default=str(ROOT / "data" / "feed"))
    p.add_argument("--images", type=int, default=2000, help="feeding records (~100 KB JPEGs)")
    p.add_argument("--small-images", type=int, default=4000, help="64-px JPEGs for the loader part")
    p.add_argument("--loader-images", default=None,
                   help="a folder of JPEGs for the loader part instead of the 64-px set (e.g. data/sample-images with --crop 224)")  # fmt: skip
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--seconds", type=float, default=1.0)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--loader-batch", type=int, default=256)
    p.add_argument("--crop", type=int, default=56)
    p.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    p.add_argument("--compare-with", default=None, help="directory holding an older fastload package")
    p.add_argument("--skip-loaders", action="store_true")
    p.add_argument("--skip-feed", action="store_true")
    p.add_argument("--quick", action="store_true", help="1 repeat, fewer images: a smoke run")
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    p.add_argument("--machine", default=None)
    # child mode
    p.add_argument("--child", default=None)
    p.add_argument("--condition", default="none")
    p.add_argument("--packed", default=None)
    p.add_argument("--image-dir", default=None)
    p.add_argument("--batch", type=int, default=256)
    args = p.parse_args(argv)
    if args.child:
        print(json.dumps(child_loader(args)))
        return 0
    if args.quick:
        args.repeats, args.images, args.small_images, args.seconds, args.epochs = 1, 300, 600, 0.3, 1
    data = Path(args.data)
    big = data / f"jpeg340-{args.images}"
    small = data / f"jpeg64-{args.small_images}"
    files = make_jpegs(big, args.images, 340, 90)
    make_jpegs(small, args.small_images, 64, 90)
    here = str(ROOT)
    pack_with(here, big, data / f"packed340-{args.images}")
    pack_with(here, small, data / f"packed64-{args.small_images}")
    packed_big = data / f"packed340-{args.images}"
    res: dict = {"machine": machine(), "repeats": args.repeats, "argv": sys.argv[1:]}
    sizes = [os.path.getsize(f) for f in files]
    batches = (64, 256)
    rows: dict[str, list[float]] = {}
    for r in range(0 if args.skip_feed else args.repeats):
        for c in CONDITIONS:
            for b in batches:
                for k in FEEDERS:
                    v = feed_rate(k, packed_big, files, b, c, args.seconds)
                    rows.setdefault(f"{b}/{c}/{k}", []).append(v)
                    print(f"repeat {r} feed batch {b} {c:5} {k:12} {v:10,.0f} records/s", flush=True)
    if rows:
        res["feed"] = {"records": len(files), "mean_kb": statistics.mean(sizes) / 1000, "batches": list(batches), "rows": rows}
    if not args.skip_loaders:
        what = f"{args.small_images} JPEGs of 64 px"
        packed_name = f"packed64-{args.small_images}"
        if args.loader_images:  # an existing folder of JPEGs instead of the 64-px set
            small = Path(args.loader_images).resolve()
            packed_name = f"packed-{small.name}"
            what = f"{sum(1 for _ in small.rglob('*.jpg'))} JPEGs of {small.name}"
            pack_with(here, small, data / packed_name)
        kinds = {"readers.file": here, "FastLoader(cpu)": here}
        packed_small = {"FastLoader(cpu)": data / packed_name}
        if args.compare_with:
            old = str(Path(args.compare_with).resolve())
            out = data / f"{packed_name}-before"
            pack_with(old, small, out)
            kinds["FastLoader(cpu) before"] = old
            packed_small["FastLoader(cpu) before"] = out
        conds = ("none", "train")
        lrows: dict[str, list[float]] = {}
        for r in range(args.repeats):
            for c in conds:
                order = list(kinds.items())
                order = order[r % len(order) :] + order[: r % len(order)]  # each loader first in turn: no place favoured
                for k, path in order:
                    child = "readers.file" if k == "readers.file" else "fastload"
                    out = run_child(child, path, c, args, packed_small.get(k, small), small)
                    lrows.setdefault(f"{c}/{k}", []).append(out["images_per_s"])
                    print(f"repeat {r} loader {c:5} {k:24} {out['images_per_s']:10,.0f} images/s", flush=True)
        res["loaders"] = {"images": args.small_images, "what": what, "batch": args.loader_batch, "crop": args.crop,
                          "threads": args.threads, "conditions": list(conds), "kinds": list(kinds), "rows": lrows}  # fmt: skip
    name = args.machine or f"{os.cpu_count()}cpu-{'-'.join(res['machine']['cpu'].split()[:2]).lower()}"
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"feed-{name}.json").write_text(json.dumps(res, indent=1) + "\n")
    md = report(res)
    (out / f"feed-{name}.md").write_text(md)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
