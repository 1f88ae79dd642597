"""The ``fastload`` command line: ``main(argv) -> int``.

Every :class:`~fastload.errors.FastloadError` (and any other failure) becomes one
readable line on stderr and exit code 2 (``--debug`` shows the traceback). Ctrl-C
exits with 130.

Each subcommand lives in its own ``_add_<name>(sub)`` function that registers the
parser and sets ``func`` to a handler ``(args) -> int``.
"""

from __future__ import annotations

import argparse
import logging
import os
import select
import sys
from typing import Sequence

from .version import __version__
from .errors import ConfigError, FastloadError, printable

log = logging.getLogger("fastload")


class _Parser(argparse.ArgumentParser):
    """argparse that reports usage errors as one line and exit code 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise _UsageError(f"{self.prog}: {message}")


class _UsageError(Exception):
    pass


# ----------------------------------------------------------------------------- subcommands
# (pack / inspect / verify, bench / doctor are registered below; keep one function each)


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="fastload", description="Feed the GPU: pack image folders into LMDB shards, load them with DALI.")
    p.add_argument("--version", action="version", version=f"fastload {__version__}")
    p.add_argument("--debug", action="store_true", help="show tracebacks and debug logs")
    p.add_argument("-q", "--quiet", action="store_true", help="only warnings and errors")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for add in _COMMANDS:
        add(sub)
    p.commands = sorted(sub.choices)  # type: ignore[attr-defined]
    return p


_COMMANDS: list = []


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever ``sys.stderr`` is at the time of each record (not at set-up)."""

    @property  # type: ignore[override]
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, value) -> None:
        pass


def _setup_logging(debug: bool, quiet: bool) -> None:
    level = logging.DEBUG if debug else logging.WARNING if quiet else logging.INFO
    root = logging.getLogger("fastload")
    if not any(isinstance(h, _StderrHandler) for h in root.handlers):
        h = _StderrHandler()
        h.setFormatter(logging.Formatter("%(message)s"))
        root.addHandler(h)
    root.setLevel(level)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI with ``argv`` (default ``sys.argv[1:]``); return the exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv
    try:
        parser = build_parser()
        args = parser.parse_args(argv)
        _setup_logging(args.debug, args.quiet)
        if not getattr(args, "func", None):
            names = ", ".join(getattr(parser, "commands", []))
            print(f"fastload: error: no command given; choose one of: {names} (see fastload --help)", file=sys.stderr)
            return 2
        return int(args.func(args) or 0)
    except _UsageError as e:
        print(f"{e} (see fastload --help)", file=sys.stderr)
        return 2
    except FastloadError as e:
        if debug:
            if e.details != str(e):  # the line was cut: the whole message first
                print(f"fastload: error (whole message): {printable(e.details)}", file=sys.stderr)
            raise
        print(f"fastload: error: {printable(str(e))}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("fastload: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        if _stdout_gone():  # `fastload inspect OUT | head`: the reader left early; nothing to report
            return 141
        if debug:
            raise
        print("fastload: error: broken pipe", file=sys.stderr)
        return 2
    except OSError as e:
        if debug:
            raise
        where = f"{e.filename}: " if getattr(e, "filename", None) else ""
        print(printable(f"fastload: error: {where}{e.strerror or e}"), file=sys.stderr)
        return 2
    except Exception as e:  # a bug, or a failure nobody anticipated: still one line
        if debug:
            raise
        msg = str(e).strip().splitlines()[0] if str(e).strip() else ""
        print(printable(f"fastload: error: unexpected {type(e).__name__}: {msg[:300]} (rerun with --debug for the traceback)"), file=sys.stderr)
        return 2


def _stdout_gone() -> bool:
    """True when stdout is a pipe whose reader has left; later writes then go to /dev/null."""
    try:
        fd = sys.stdout.fileno()
        poller = select.poll()
        poller.register(fd, select.POLLOUT)
        gone = any(ev & select.POLLERR for _, ev in poller.poll(0))
        if gone:  # not even Python's own flush at exit may write to it
            os.dup2(os.open(os.devnull, os.O_WRONLY), fd)
        return gone
    except (OSError, ValueError, AttributeError):  # not a real file (captured output), or no poll()
        return False


def main_entry() -> None:
    """Console-script entry point."""
    code = main()
    if _stdout_gone():
        code = code or 141
    sys.exit(code)


def _add_sample(sub) -> None:
    """``fastload sample OUT``: write the built-in ImageNet-like sample dataset."""
    p = sub.add_parser(
        "sample",
        help="make the built-in sample dataset (ImageNet-like JPEGs from scikit-image's photos)",
        description="Write an ImageFolder tree of JPEGs (about 500x375, quality 90, about 100 KB each) "
        "made from the photos bundled with scikit-image. An existing sample made with the same "
        "options is reused.",
    )
    p.add_argument("out", metavar="OUT", help="directory to create, or s3://bucket/prefix to upload to")
    p.add_argument("--images", type=int, default=3000, metavar="N", help="number of images (default 3000)")
    p.add_argument("--classes", type=int, default=10, metavar="K", help="number of classes (default 10)")
    p.add_argument("--seed", type=int, default=0, metavar="S", help="random seed (default 0)")
    p.add_argument("--workers", type=int, default=None, metavar="N", help="processes (default: up to 2)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing sample at OUT")

    def run(args) -> int:
        import time

        from .sample import read_marker, make_sample

        t0 = time.perf_counter()
        out = make_sample(
            args.out, num_images=args.images, num_classes=args.classes, seed=args.seed,
            overwrite=args.overwrite, workers=args.workers,
        )
        info = read_marker(out) or {}
        mb = info.get("bytes", 0) / 1e6
        print(f"sample: {args.images} images, {args.classes} classes, {mb:.1f} MB in {out} ({time.perf_counter() - t0:.1f} s)")
        return 0

    p.set_defaults(func=run)


_COMMANDS.append(_add_sample)


# ----------------------------------------------------------------------------- pack / inspect / verify


def _add_pack(sub) -> None:
    """``fastload pack SRC OUT``: pack an ImageFolder tree or a list file into LMDB shards."""
    p = sub.add_parser(
        "pack",
        help="pack an ImageFolder tree (or a path,label list file) into LMDB shards",
        description="Pack SRC (an ImageFolder tree: one folder per class, or a .csv/.tsv/.txt list of "
        "'path,label' rows) into the directory OUT: LMDB shards, labels.bin and manifest.json. "
        "JPEGs are stored byte for byte; other images become RGB JPEGs.",
    )
    p.add_argument("src", metavar="SRC", help="ImageFolder directory or list file; WebDataset .tar shards (a directory, "
                   "a .tar, a brace pattern); Parquet files or a datasets save_to_disk directory")
    p.add_argument("out", metavar="OUT", help="directory to create, or s3://bucket/prefix to upload to")
    p.add_argument("--workers", type=int, default=None, metavar="N", help="processes (default: all cores)")
    p.add_argument("--shard-size", default="1GB", metavar="SIZE", help="largest shard, like 1GB, 512MB, 64KiB (default 1GB)")
    p.add_argument("--on-error", choices=("skip", "fail"), default="skip", help="skip bad images (default) or stop at the first")
    p.add_argument(
        "--overwrite", action="store_true",
        help=(
            "replace OUT (and an unfinished OUT.partial) if it is a fastload dataset or unfinished pack holding "
            "only fastload's files, or an empty directory; never SRC or a directory inside or holding it "
            "(anything else is refused)"
        ),
    )
    p.add_argument("--resume", action="store_true", help="continue an interrupted pack, reusing its finished shards")
    p.add_argument("--max-size", type=int, default=None, metavar="PX", help="shrink images whose longer side exceeds PX")
    p.add_argument("--quality", type=int, default=95, metavar="Q", help="JPEG quality of re-encoded images (default 95)")
    p.add_argument("--baseline", action="store_true", help="re-encode progressive JPEGs as baseline (for GPU hardware decoders)")
    p.add_argument("--max-pixels", type=int, default=89_478_485, metavar="N", help="refuse images with more pixels (default 89478485)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--from", dest="source_kind", choices=("folder", "webdataset", "parquet"), default=None,
                   help="what SRC is (default: recognised from SRC; docs/fields.md)")
    p.add_argument("--json-fields", default=None, metavar="A,B",
                   help="webdataset: keys of each .json stored as typed fields (a,b or a:int,b:float32[3]) instead of the json text")
    p.add_argument("--image-column", default=None, metavar="NAME", help="parquet: the column holding the images")
    p.add_argument("--annotations", default=None, metavar="JSON",
                   help="COCO instances_*.json: pack SRC's images with their boxes, labels and iscrowd (docs/detection.md)")
    p.add_argument("--skip-empty", action="store_true", help="with --annotations: leave out images without an annotation")
    p.add_argument("--masks", choices=("instance", "semantic"), default=None,
                   help="with --annotations: also store each image's segmentations as one PNG label image (pycocotools)")

    def run(args) -> int:
        from .packing import detect_source, pack, pack_coco, pack_parquet, pack_webdataset

        kind = args.source_kind or detect_source(args.src)
        if args.json_fields is not None and kind != "webdataset":
            raise ConfigError(f"--json-fields applies to a webdataset source; SRC {args.src} is read as {kind}")
        if args.image_column is not None and kind != "parquet":
            raise ConfigError(f"--image-column applies to a parquet source; SRC {args.src} is read as {kind}")
        options = dict(
            workers=args.workers, shard_size=args.shard_size, on_error=args.on_error,
            overwrite=args.overwrite, resume=args.resume, max_size=args.max_size, quality=args.quality,
            baseline=args.baseline, max_pixels=args.max_pixels, progress=not (args.no_progress or args.quiet),
        )  # fmt: skip
        if args.annotations is not None and (args.source_kind not in (None, "folder") or args.json_fields or args.image_column):
            raise ConfigError("--annotations packs a folder of COCO images; it cannot be combined with --from webdataset|parquet, --json-fields or --image-column")
        if (args.skip_empty or args.masks) and args.annotations is None:
            raise ConfigError(f"{'--skip-empty' if args.skip_empty else '--masks'} applies with --annotations (a COCO instances file)")
        if args.annotations is not None:
            res = pack_coco(args.src, args.out, annotations=args.annotations, skip_empty=args.skip_empty, masks=args.masks, **options)
        elif kind == "webdataset":
            res = pack_webdataset(args.src, args.out, json_fields=args.json_fields, **options)
        elif kind == "parquet":
            res = pack_parquet(args.src, args.out, image_column=args.image_column, **options)
        else:
            res = pack(args.src, args.out, **options)
        print(res.summary())
        from .reader import read_manifest

        stats = read_manifest(res.path).stats if res.url is None else {}  # an upload's staging copy is gone
        advice = size_advice(stats.get("width", {}), stats.get("height", {}), repack=False)
        if advice:
            print(advice)
        for s in res.skipped[:20]:
            print(f"  skipped {s['path']}: {s['reason']}")
        if len(res.skipped) > 20:
            print(f"  ... and {len(res.skipped) - 20} more (listed in {res.path}/manifest.json)")
        return 0

    p.set_defaults(func=run)


def _add_inspect(sub) -> None:
    """``fastload inspect OUT [--json]``: describe a packed dataset."""
    p = sub.add_parser("inspect", help="describe a packed dataset (samples, classes, shards, encodings, sizes)")
    p.add_argument("path", metavar="OUT", help="packed dataset directory or s3://bucket/prefix")
    p.add_argument("--json", action="store_true", help="print JSON")

    def run(args) -> int:
        import json

        from .checks import format_inspect, inspect
        from .remote.url import is_url

        if is_url(args.path):  # s3://...: fetched whole into a temporary directory
            from .remote.mirror import inspect_url as inspect
        info = inspect(args.path)
        print(json.dumps(info, indent=1, ensure_ascii=True) if args.json else format_inspect(info))
        advice = None if args.json else size_advice(info["width"], info["height"], repack=True)
        if advice:
            print(advice)
        return 0

    p.set_defaults(func=run)


def _add_verify(sub) -> None:
    """``fastload verify OUT [--decode]``: check hashes, records and (optionally) decoding."""
    p = sub.add_parser("verify", help="check every shard's hash and every record (exit 1 naming what is bad)")
    p.add_argument("path", metavar="OUT", help="packed dataset directory or s3://bucket/prefix")
    p.add_argument("--decode", action="store_true", help="also decode every image with PIL")

    def run(args) -> int:
        from .checks import verify
        from .remote.url import is_url

        if is_url(args.path):  # s3://...: fetched whole into a temporary directory, every hash checked
            from .remote.mirror import verify_url as verify
        rep = verify(args.path, decode=args.decode)
        what = f"{rep.shards_checked} shards, {rep.samples_checked} samples" + (" decoded" if rep.decoded else "")
        if rep.ok:
            print(f"ok: {rep.path}: {what}")
            return 0
        for line in rep.problems:
            print(line, file=sys.stderr)
        print(f"fastload verify: {len(rep.problems)} problem(s) in {rep.path} ({what} checked)", file=sys.stderr)
        return 1

    p.set_defaults(func=run)


_COMMANDS.extend([_add_pack, _add_inspect, _add_verify])

#: A median stored image whose longer side is above this is far larger than training needs:
#: ImageNet-style training decodes a crop and resizes it to 224 (from windows of about 256-512 px
#: for most crops), so most of each decode is thrown away. On 3000x2000 photos a pack with
#: ``--max-size 512`` loads about 10x faster on the CPU (benchmarks/results/big-images-*.md).
BIG_IMAGE_SIDE = 1024


def size_advice(width: dict, height: dict, *, repack: bool) -> str | None:
    """A line suggesting ``--max-size`` when the median image is far larger than training needs, else None.

    ``width`` and ``height`` are the manifest's distributions (``{"median": ...}``); the longer
    median stands for the longer side.
    """
    w, h = int(width.get("median", 0) or 0), int(height.get("median", 0) or 0)
    if max(w, h) <= BIG_IMAGE_SIDE:
        return None
    how = "pack the source again with --max-size 512" if repack else "pack with --max-size 512"
    return (
        f"note: images are a median {w}x{h}; training crops of 224 need about 256-512: "
        f"{how} to read and decode faster"
    )


# ----------------------------------------------------------------------------- bench / doctor


def _parse_workers(text: str) -> list[int]:
    from .errors import ConfigError

    try:
        values = [int(v) for v in text.replace(" ", "").split(",") if v != ""]
    except ValueError:
        values = []
    if not values or any(v < 0 for v in values):
        raise ConfigError(f"--workers {text!r}: expected comma-separated integers >= 0, like 1,2,4")
    return values


def _add_bench(sub) -> None:
    """``fastload bench DATASET``: FastLoader against DataLoader baselines; writes report.md/.json/.png."""
    p = sub.add_parser(
        "bench",
        help="benchmark FastLoader against torch DataLoader baselines on the same images",
        description="Measure, side by side on the same images: torchvision ImageFolder in a DataLoader "
        "(num_workers swept), a DataLoader over the packed shards decoding with PIL, and FastLoader; "
        "loader-only images/s and a real training loop (waiting share, GPU/CPU utilisation). "
        "Writes report.md, report.json and report.png under --out.",
    )
    from .bench.runner import BenchConfig  # light: torch and DALI load only when the command runs

    d = BenchConfig()
    p.add_argument("dataset", metavar="DATASET", help="packed dataset directory (fastload pack)")
    p.add_argument("--images", metavar="SRC", default=None, help="the unpacked ImageFolder tree (default: the source recorded at pack time)")
    p.add_argument("--device", default=None, metavar="DEV", help="cpu, cuda or cuda:N (default: cuda if present, else cpu)")
    p.add_argument("--model", default=None, metavar="NAME", help="small-cnn, resnet18, resnet34, resnet50 or none (default: small-cnn on cpu, resnet50 on cuda)")
    p.add_argument("--out", default=None, metavar="DIR", help="output directory (default reports/<timestamp>/)")
    p.add_argument("--batch-size", type=int, default=None, metavar="N", help=f"samples per batch (default {d.batch_size})")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--batches", type=int, default=None, metavar="N", help=f"timed batches per loader-only repeat (default {d.batches})")
    g.add_argument("--epochs", type=int, default=None, metavar="E", help="time E full epochs per repeat instead of --batches")
    p.add_argument("--warmup", type=int, default=None, metavar="N", help=f"warm-up batches/steps left out (default {d.warmup})")
    p.add_argument("--repeats", type=int, default=None, metavar="N", help=f"loader-only repeats (default {d.repeats})")
    p.add_argument("--train-steps", type=int, default=None, metavar="N", help=f"timed training steps per loader; 0 skips training (default {d.train_steps})")
    p.add_argument("--workers", type=_parse_workers_arg, default=None, metavar="LIST", help="num_workers values for the ImageFolder baseline, like 1,2,4 (default: up to the core count)")
    p.add_argument("--crop", type=int, default=None, metavar="PX", help=f"output side in pixels (default {d.crop})")
    p.add_argument("--quick", action="store_true", help="a few small batches per loader (seconds; for smoke tests)")

    def run(args) -> int:
        from .bench.runner import Progress, run_bench

        device = args.device
        if device is None:
            import torch

            device = "cuda" if torch.cuda.is_available() else "cpu"
        cfg = BenchConfig.quick(device=device) if args.quick else BenchConfig(device=device)
        for attr in ("model", "batch_size", "batches", "epochs", "warmup", "repeats", "train_steps", "workers", "crop"):
            value = getattr(args, attr)
            if value is not None:
                setattr(cfg, attr, value)
        progress = False if args.quiet else Progress()
        res = run_bench(args.dataset, images=args.images, out=args.out, config=cfg, progress=progress)
        print(res["verdict"])
        print(f"report: {res['files']['md']} (also report.json, report.png)")
        return 0

    p.set_defaults(func=run)


def _parse_workers_arg(text: str) -> list[int]:
    from .errors import ConfigError

    try:
        return _parse_workers(text)
    except ConfigError as e:  # argparse turns this into a one-line usage error
        raise argparse.ArgumentTypeError(str(e).removeprefix(f"--workers {text!r}: ")) from None


def _add_doctor(sub) -> None:
    """``fastload doctor``: versions, devices, the hardware JPEG decoder, and what to fix."""
    p = sub.add_parser(
        "doctor",
        help="check the environment: versions, pillow-simd, DALI, CUDA devices, hardware JPEG decoder, what to fix",
    )
    p.add_argument("--json", action="store_true", help="print JSON")

    def run(args) -> int:
        import json

        from .doctor import diagnose, format_report

        d = diagnose()
        print(json.dumps(d, indent=1) if args.json else format_report(d))
        return 0

    p.set_defaults(func=run)


_COMMANDS.extend([_add_bench, _add_doctor])
