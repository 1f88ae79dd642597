"""fastload bench: runner, report files (md/json/png) consistent with each other, CLI errors, example."""

from __future__ import annotations

import io
import json
import math
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from PIL import Image

import fastload
from fastload.bench import BenchConfig, default_workers, loader_spec, run_bench
from fastload.bench.loaders import resolve_images
from fastload.bench.measure import measure_loader
from fastload.bench.runner import Progress
from fastload.cli import main
from fastload.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]
HAS_CUDA = torch.cuda.is_available()


class FakeLoader:
    """``n`` batches of random ``(images [bs, 3, crop, crop], labels)``, sleeping ``delay`` before each."""

    def __init__(self, n: int = 4, bs: int = 8, crop: int = 32, delay: float = 0.0) -> None:
        self.n, self.bs, self.crop, self.delay = n, bs, crop, delay
        self.closed = False

    def __len__(self) -> int:
        return self.n

    def __iter__(self):
        for _ in range(self.n):
            if self.delay:
                time.sleep(self.delay)
            yield torch.randn(self.bs, 3, self.crop, self.crop), torch.randint(0, 3, (self.bs,))

    def close(self) -> None:
        self.closed = True


@pytest.fixture
def packed(make_folder, tmp_path) -> tuple[Path, Path]:
    """(ImageFolder source, packed dataset): 3 classes x 8 solid-colour JPEGs."""
    src = make_folder(classes=3, per_class=8, size=(64, 48))
    out = tmp_path / "packed"
    fastload.pack(src, out, progress=False)
    return src, out


def _quick(**kw) -> BenchConfig:
    return BenchConfig.quick(crop=32, **kw)


def _md_row(md: str, name: str, after: str) -> str:
    """The table row of loader ``name`` in the section starting with ``after``."""
    section = md.split(after, 1)[1]
    rows = [line for line in section.splitlines() if line.startswith(f"| {name} |")]
    assert rows, f"no row for {name} under {after}"
    return rows[0]


def test_report_files_are_complete_and_agree_with_the_json(packed, tmp_path):
    _, ds = packed
    made: list[FakeLoader] = []

    def make(delay: float):
        def f():
            made.append(FakeLoader(n=5, bs=8, delay=delay))
            return made[-1]

        return f

    specs = [
        loader_spec("DataLoader(slow)", "DataLoader", make(0.03), num_workers=0),
        loader_spec("FastLoader(fake)", "FastLoader", make(0.0), device="cpu"),
    ]
    out = tmp_path / "report"
    res = run_bench(ds, out=out, config=_quick(), loaders=specs, progress=False)
    assert all(f.closed for f in made) and len(made) == 2

    files = {k: Path(v) for k, v in res["files"].items()}
    assert files == {"json": out / "report.json", "md": out / "report.md", "png": out / "report.png"}
    data = json.loads(files["json"].read_text(), parse_constant=lambda c: pytest.fail(f"{c} in report.json"))
    md = files["md"].read_text()

    assert [e["name"] for e in data["loaders"]] == ["DataLoader(slow)", "FastLoader(fake)"]
    assert [e["kind"] for e in data["loaders"]] == ["DataLoader", "FastLoader"]
    assert data["dataset"]["num_samples"] == 24 and data["dataset"]["classes"] == 3
    assert data["versions"]["torch"] == torch.__version__ and data["machine"]["usable_cores"] >= 1
    for e in data["loaders"]:
        assert e["error"] is None
        ips = e["loader_only"]["images_per_s"]
        assert len(ips["runs"]) == 2 and ips["min"] <= ips["median"] <= ips["max"]
        assert e["loader_only"]["batches_per_repeat"] == 3
        tr = e["training"]
        assert tr["steps"] == 3 and tr["warmup_steps"] == 1 and tr["samples"] == 24
        assert 0 <= tr["wait_fraction"] <= 1
        if not HAS_CUDA:
            assert tr["gpu_util"] == "unavailable"
        # every number in the tables comes from the JSON
        row = _md_row(md, e["name"], "## Loader only")
        assert f"| {ips['median']:,.0f} | {ips['min']:,.0f} | {ips['max']:,.0f} |" in row
        row = _md_row(md, e["name"], "## Training loop")
        assert f"| {tr['images_per_s']:,.0f} | {tr['wait_fraction']:.0%} |" in row and tr["verdict"] in row

    slow, fast = data["loaders"]
    assert slow["loader_only"]["images_per_s"]["median"] < fast["loader_only"]["images_per_s"]["median"]
    assert slow["training"]["verdict"] == "input-bound"
    assert fast["training"]["wait_fraction"] < slow["training"]["wait_fraction"]
    s = data["summary"]
    assert s["best_dataloader"] == "DataLoader(slow)" and s["fastloader"] == "FastLoader(fake)"
    assert s["speedup_loader_only"] == pytest.approx(
        fast["loader_only"]["images_per_s"]["median"] / slow["loader_only"]["images_per_s"]["median"]
    )
    expected = (
        f"FastLoader: {s['speedup_loader_only']:.2f}x the best DataLoader (images/s, loader only); "
        f"training waits {fast['training']['wait_fraction']:.0%} vs {slow['training']['wait_fraction']:.0%} of each step"
    )
    assert data["verdict"] == expected == res["verdict"]
    assert f"**{expected}**" in md
    assert "](report.png)" in md and torch.__version__ in md

    raw = files["png"].read_bytes()
    assert raw[:8] == b"\x89PNG\r\n\x1a\n"
    with Image.open(io.BytesIO(raw)) as im:
        im.load()
        assert im.format == "PNG" and im.size[0] >= 600 and im.size[1] >= 200


def test_a_failing_loader_is_reported_and_the_others_still_run(packed, tmp_path):
    _, ds = packed

    def broken():
        raise RuntimeError("DALI pipeline could not be built")

    specs = [
        loader_spec("DataLoader(fake)", "DataLoader", lambda: FakeLoader(n=4)),
        loader_spec("FastLoader(cpu)", "FastLoader", broken),
    ]
    res = run_bench(ds, out=tmp_path / "r", config=_quick(train_steps=0), loaders=specs, progress=False)
    ok, bad = res["loaders"]
    assert ok["error"] is None and ok["loader_only"]["images_per_s"]["median"] > 0 and ok["training"] is None
    assert bad["error"] == "RuntimeError: DALI pipeline could not be built" and bad["loader_only"] is None
    assert res["verdict"].startswith("FastLoader failed: RuntimeError: DALI pipeline could not be built")
    md = Path(res["files"]["md"]).read_text()
    assert "## Failures" in md and "FastLoader(cpu)" in md and "| FastLoader(cpu) | FastLoader | failed |" in md
    assert Path(res["files"]["png"]).stat().st_size > 1000


def test_cli_bench_with_the_real_loaders(packed, tmp_path, capsys):
    """The default set on real data: ImageFolder and packed+PIL DataLoaders (persistent workers), FastLoader,
    and the drop-in FastLoader(ImageFolder) whose one-time pack is reported apart."""
    src, ds = packed
    out = tmp_path / "cli"
    t0 = time.perf_counter()
    rc = main(["-q", "bench", str(ds), "--quick", "--crop", "32", "--workers", "1", "--out", str(out), "--device", "cpu"])
    wall = time.perf_counter() - t0
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    data = json.loads((out / "report.json").read_text())
    names = [e["name"] for e in data["loaders"]]
    assert names == ["DataLoader(ImageFolder, workers=1)", "DataLoader(packed+PIL, workers=1)", "FastLoader(cpu)", "FastLoader(ImageFolder, cpu)"]
    assert [e["kind"] for e in data["loaders"]] == ["DataLoader", "DataLoader", "FastLoader", "FastLoader"]
    assert any(n.startswith("FastLoader(ImageFolder): the one-time pack of") for n in data["notes"])
    assert (out / "cache").is_dir()
    cfg = data["config"]
    assert (cfg["batch_size"], cfg["batches"], cfg["warmup"], cfg["repeats"], cfg["train_steps"]) == (16, 3, 1, 2, 3)
    timed_s = 0.0
    for e in data["loaders"]:
        assert e["error"] is None, e["error"]
        lo, tr = e["loader_only"], e["training"]
        ips = lo["images_per_s"]
        runs = ips["runs"]
        assert len(runs) == 2 and all(math.isfinite(v) and v > 0 for v in runs), e["name"]
        assert (ips["median"], ips["min"], ips["max"]) == (statistics.median(runs), min(runs), max(runs))
        assert lo["batches_per_repeat"] == 3 and lo["warmup_batches"] == 1
        # 24 images in batches of 16: each repeat's warm-up batch is 16, the 3 timed ones 8 + 16 + 8
        timed_s += sum(32 / v for v in runs)
        # training: 1 warm-up step (16 images), then 8 + 16 + 8; its numbers agree with each other
        assert (tr["steps"], tr["warmup_steps"], tr["samples"]) == (3, 1, 32), e["name"]
        assert tr["images_per_s"] == pytest.approx(tr["samples"] / (tr["steps"] * tr["step_ms"] / 1000), rel=1e-6)
        assert tr["wait_ms"] + tr["compute_ms"] == pytest.approx(tr["step_ms"], rel=1e-6)
        assert tr["wait_fraction"] == pytest.approx(tr["wait_ms"] / tr["step_ms"], rel=1e-6)
        assert math.isfinite(tr["final_loss"]) and tr["final_loss"] > 0
    # the timed batches took real time: all of it fits in the command's own run time
    assert timed_s < wall
    s = data["summary"]
    by_kind = {k: [e for e in data["loaders"] if e["kind"] == k] for k in ("DataLoader", "FastLoader")}
    best = max(by_kind["DataLoader"], key=lambda e: e["loader_only"]["images_per_s"]["median"])
    fast = max(by_kind["FastLoader"], key=lambda e: e["loader_only"]["images_per_s"]["median"])
    assert (s["best_dataloader"], s["fastloader"]) == (best["name"], fast["name"])
    assert s["speedup_loader_only"] == pytest.approx(
        fast["loader_only"]["images_per_s"]["median"] / best["loader_only"]["images_per_s"]["median"]
    )
    assert data["images"] == str(src) and any("ImageFolder baseline over" in n for n in data["notes"])
    assert data["config"]["workers"] == [1] and data["config"]["model"] == "small-cnn"
    md = (out / "report.md").read_text()
    assert all(n in md for n in names)
    assert captured.out.splitlines()[0] == data["verdict"]
    assert (out / "report.png").read_bytes()[:4] == b"\x89PNG"


def test_imagefolder_source_is_found_given_or_skipped(packed, tmp_path):
    src, ds = packed
    assert resolve_images(ds, None)[0] == str(src)  # recorded in the manifest by pack
    assert resolve_images(ds, src) == (str(src), f"ImageFolder baseline over {src}")
    with pytest.raises(ConfigError, match="not a directory"):
        resolve_images(ds, tmp_path / "nope")
    src.rename(tmp_path / "moved")
    path, note = resolve_images(ds, None)
    assert path is None and "skipped" in note and "--images" in note


def test_measure_loader_epochs_and_batches_across_epochs():
    lo = measure_loader(FakeLoader(n=5), _quick(epochs=1, warmup=1, repeats=2).validate())
    assert lo["batches_per_repeat"] == 4 and len(lo["images_per_s"]["runs"]) == 2
    lo = measure_loader(FakeLoader(n=2), _quick(batches=7, warmup=2, repeats=1).validate())
    assert lo["batches_per_repeat"] == 7  # runs on into the next epochs
    assert lo["first_batch_s"] is not None and lo["first_batch_s"] >= 0


def test_default_workers_sweep_up_to_the_core_count():
    assert default_workers(1) == [1]
    assert default_workers(2) == [1, 2]
    assert default_workers(6) == [2, 4, 6]
    assert default_workers(16) == [4, 8, 16]


@pytest.mark.parametrize(
    "kw, word",
    [({"device": "tpu"}, "device"), ({"model": "vgg"}, "model"), ({"batches": 0}, "batches"), ({"workers": []}, "workers")],
)
def test_config_errors_name_the_setting(kw, word):
    with pytest.raises(ConfigError, match=word):
        BenchConfig(**kw).validate()


def test_live_progress_redraws_one_line():
    buf = io.StringIO()
    p = Progress(buf, live=True, interval=0)
    p.update("[1/2] loader: batch 1/3")
    p.update("[1/2] loader: b 2")
    p.line("done")
    text = buf.getvalue()
    assert text.startswith("\r[1/2] loader: batch 1/3\r[1/2] loader: b 2")
    assert text.endswith("\rdone\n")
    quiet = io.StringIO()
    Progress(quiet, live=False).update("x")
    assert quiet.getvalue() == ""


def _one_line_error(capsys, argv, *words):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    for w in words:
        assert w in err, err


def test_cli_errors_are_one_readable_line(packed, tmp_path, capsys):
    _, ds = packed
    _one_line_error(capsys, ["bench", str(tmp_path / "missing")], "fastload: error:", "no such dataset directory")
    _one_line_error(capsys, ["bench", str(ds), "--workers", "1,x"], "--workers", "comma-separated")
    _one_line_error(capsys, ["bench", str(ds), "--images", str(tmp_path / "nope")], "--images", "not a directory")
    _one_line_error(capsys, ["bench", str(ds), "--model", "vgg", "--device", "cpu"], "model must be one of")
    _one_line_error(capsys, ["bench", str(ds), "--batches", "2", "--epochs", "1"], "not allowed with")
    if not HAS_CUDA:
        _one_line_error(capsys, ["bench", str(ds), "--device", "cuda"], "--device cuda", "no CUDA device")


@pytest.mark.parametrize("loader", ["torch", "fastload"])
def test_example_train_runs_on_cpu(packed, loader):
    _, ds = packed
    cmd = [
        sys.executable, str(ROOT / "examples" / "train.py"), str(ds), "--loader", loader, "--arch", "resnet18",
        "--steps", "3", "--batch-size", "4", "--crop", "32", "--workers", "0", "--device", "cpu", "--log-every", "1",
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("WORLD_SIZE", None)
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "3 steps in" in r.stdout
    assert "fastload.profile(" in r.stdout and ("INPUT-BOUND" in r.stdout or "COMPUTE-BOUND" in r.stdout)
    assert ("DataLoader" if loader == "torch" else "FastLoader") in r.stdout


@pytest.mark.slow
def test_example_train_under_torchrun_ddp(packed):
    _, ds = packed
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--master_port=29533",
        str(ROOT / "examples" / "train.py"), str(ds), "--loader", "fastload", "--arch", "resnet18",
        "--steps", "2", "--batch-size", "4", "--crop", "32", "--device", "cpu",
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "2 steps in" in r.stdout and "(2 processes)" in r.stderr


# ----------------------------------------------------------------------------- memory per loader


class _HoldingLoader(FakeLoader):
    """A FakeLoader that, on its first epoch, keeps ``anon_mb`` of heap or maps and reads a
    ``file_mb`` file: what a loader's buffers (anonymous) and mapped shards (file-backed) do."""

    def __init__(self, *, anon_mb: int = 0, file: Path | None = None) -> None:
        super().__init__(n=4, bs=8)
        self.anon_mb, self.file = anon_mb, file
        self.held: list = []

    def __iter__(self):
        if not self.held:
            import mmap

            import numpy as np

            if self.anon_mb:
                self.held.append(np.ones(self.anon_mb << 20, dtype=np.uint8))  # touched pages
            if self.file is not None:
                with open(self.file, "rb") as f:
                    m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
                sum(m[i] for i in range(0, len(m), 4096))  # fault every page in
                self.held.append(m)
        yield from super().__iter__()


def test_report_gives_each_loaders_anonymous_file_backed_and_gpu_memory(packed, tmp_path):
    _, ds = packed
    big = tmp_path / "mapped.bin"
    big.write_bytes(os.urandom(48 << 20))
    specs = [
        loader_spec("DataLoader(plain)", "DataLoader", lambda: _HoldingLoader(), num_workers=0),
        loader_spec("FastLoader(heap)", "FastLoader", lambda: _HoldingLoader(anon_mb=96), device="cpu"),
        loader_spec("FastLoader(mapped)", "FastLoader", lambda: _HoldingLoader(file=big), device="cpu"),
    ]
    out = tmp_path / "report"
    run_bench(ds, out=out, config=_quick(train_steps=0), loaders=specs, progress=False)
    data = json.loads((out / "report.json").read_text())
    mem = {e["name"]: e["memory"] for e in data["loaders"]}
    added = {n: m["added_first_repeat"] for n, m in mem.items()}
    mb = 1 << 20
    assert added["FastLoader(heap)"]["anon"] >= 90 * mb and added["FastLoader(heap)"]["file"] < 16 * mb
    assert added["FastLoader(mapped)"]["file"] >= 44 * mb and added["FastLoader(mapped)"]["anon"] < 16 * mb
    assert added["DataLoader(plain)"]["anon"] < 16 * mb and added["DataLoader(plain)"]["file"] < 16 * mb
    # process totals after each loader: the heap loader's buffer is still held when the last one runs
    assert mem["FastLoader(mapped)"]["after"]["anon"] >= 96 * mb
    for m in mem.values():
        assert m["after"]["rss"] >= m["after"]["anon"] + m["after"]["file"] - 4 * mb
        assert m["after"]["gpu"]["available"] is False and added_gpu(m) == "unavailable"  # device="cpu"
    md = (out / "report.md").read_text()
    row = _md_row(md, "FastLoader(heap)", "## Memory")
    after = mem["FastLoader(heap)"]["after"]
    assert f"| {after['anon'] / mb:,.0f} MB | {after['file'] / mb:,.0f} MB | unavailable" in row
    assert f"{added['FastLoader(heap)']['anon'] / mb:+,.0f} MB / " in row and row.rstrip().endswith("/ unavailable |")


def added_gpu(m: dict):
    return m["added_first_repeat"]["gpu"]


def test_memory_snapshot_reads_gpu_memory_only_where_one_is_used():
    from fastload.bench.measure import memory_added, memory_snapshot
    from fastload.store import process_memory

    snap = memory_snapshot("cpu")
    assert set(snap) >= {"rss", "anon", "file", "gpu"} and snap["gpu"]["available"] is False
    assert abs(snap["anon"] - process_memory()["anon"]) < 32 << 20
    import numpy as np

    keep = np.ones(64 << 20, dtype=np.uint8)
    grown = memory_added(snap, memory_snapshot("cpu"))
    assert grown["anon"] >= 60 << 20 and grown["gpu"] == "unavailable"
    del keep
    if HAS_CUDA:
        g = memory_snapshot("cuda")["gpu"]
        assert g["available"] and 0 < g["used"] <= g["total"]
