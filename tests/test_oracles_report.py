"""fastload.bench.report checked on hand-built results: every derived number and line written out by hand.

The result dicts here are made up with round numbers so each expected value is arithmetic done in
the test (500 / 250 = 2.00x), not the report's own code: the summary (``speedup_training`` from the
*training* images/s of the FastLoader and of the best DataLoader, where "best" is by loader-only
images/s, not by training speed), the verdict line of every branch, the Markdown rows, the chart's
bars, labels and size (read back from the matplotlib figure it draws), and the JSON's NaN handling.
"""

from __future__ import annotations

import copy
import json
import math
import os
import platform

import numpy as np
import PIL
import pytest
import torch
from PIL import Image

from fastload.bench import report


def _lo(median, lo=None, hi=None, first=None):
    return {"images_per_s": {"median": median, "min": lo if lo is not None else median * 0.9,
                             "max": hi if hi is not None else median * 1.1, "runs": []},
            "first_batch_s": first}  # fmt: skip


def _tr(ips, wait, step_ms=10.0, verdict="compute-bound", gpu="unavailable", cpu=None):
    return {"images_per_s": ips, "wait_fraction": wait, "step_ms": step_ms, "wait_ms": step_ms * wait,
            "compute_ms": step_ms * (1 - wait), "gpu_util": gpu, "cpu_util": cpu or {"mean": 50.0, "max": 75.0},
            "verdict": verdict}  # fmt: skip


def loader(name, kind, lo=None, tr=None, error=None, memory=None):
    return {"name": name, "kind": kind, "loader_only": lo, "training": tr, "error": error, "memory": memory}


def result(loaders, **kw):
    r = {
        "loaders": loaders,
        "config": {"device": "cpu", "batch_size": 16, "crop": 32, "repeats": 3, "warmup": 1, "model": "small-cnn",
                   "train_steps": 5, "train_threads": 2},
        "machine": {"platform": "Linux-x", "cpu": "Xeon", "cores": 4, "usable_cores": 2, "memory_gb": 8,
                    "gpus": [], "cuda": "no GPU", "driver": None},
        "versions": {"fastload": "1.0", "torch": "2.x", "dali": None},
        "dataset": {"num_samples": 1200, "classes": 3, "path": "/d"},
        "created": "2026-12-01T00:00:00Z",
        "elapsed_s": 12.4,
    }  # fmt: skip
    r.update(kw)
    return r


def four():
    """DataLoader A: 100 img/s loader only, 300 in training; B: 250 and 200; FastLoader 500 and 400;
    a second FastLoader slower (300). Best DataLoader: B (by loader only), though A trains faster."""
    return [
        loader("A", "DataLoader", _lo(100.0), _tr(300.0, 0.5)),
        loader("B", "DataLoader", _lo(250.0), _tr(200.0, 0.6)),
        loader("F", "FastLoader", _lo(500.0), _tr(400.0, 0.05)),
        loader("G", "FastLoader", _lo(300.0), _tr(350.0, 0.1)),
    ]


def test_summary_speedups_are_of_the_best_loaders_by_loader_only_speed():
    """``speedup_training`` = FastLoader F's training images/s over B's (400 / 200 = 2.0), B being the best
    DataLoader by loader-only images/s; from A (the faster trainer) it would be 1.33, from F itself 1.0.
    Kills: any loader swapped, the ratio inverted, min for max, a field dropped or renamed."""
    r = result(four())
    report.summarise(r)
    assert r["summary"] == {
        "best_dataloader": "B", "best_dataloader_images_per_s": 250.0, "fastloader": "F",
        "fastloader_images_per_s": 500.0, "speedup_loader_only": 2.0, "training_wait_fastloader": 0.05,
        "training_wait_best_dataloader": 0.6, "speedup_training": 2.0,
    }  # fmt: skip
    assert r["verdict"] == "FastLoader: 2.00x the best DataLoader (images/s, loader only); training waits 5% vs 60% of each step"


@pytest.mark.parametrize(
    "loaders, summary",
    [
        # no training on the DataLoader side: no training speed-up, its wait None
        ([loader("B", "DataLoader", _lo(250.0)), loader("F", "FastLoader", _lo(500.0), _tr(400.0, 0.05))],
         {"speedup_loader_only": 2.0, "speedup_training": None, "training_wait_best_dataloader": None,
          "training_wait_fastloader": 0.05}),
        # a training dict without images/s
        ([loader("B", "DataLoader", _lo(250.0), {"wait_fraction": 0.5}), loader("F", "FastLoader", _lo(500.0), _tr(400.0, 0.05))],
         {"speedup_loader_only": 2.0, "speedup_training": None, "training_wait_best_dataloader": 0.5}),
        ([loader("B", "DataLoader", _lo(250.0), _tr(200.0, 0.6)), loader("F", "FastLoader", _lo(500.0), {"wait_fraction": 0.1})],
         {"speedup_training": None, "training_wait_fastloader": 0.1}),
        # only a FastLoader
        ([loader("F", "FastLoader", _lo(500.0), _tr(400.0, 0.05))],
         {"best_dataloader": None, "best_dataloader_images_per_s": None, "speedup_loader_only": None,
          "speedup_training": None, "training_wait_best_dataloader": None, "fastloader": "F"}),
        # only DataLoaders
        ([loader("A", "DataLoader", _lo(100.0), _tr(300.0, 0.5))],
         {"fastloader": None, "fastloader_images_per_s": None, "training_wait_fastloader": None, "speedup_training": None,
          "best_dataloader": "A"}),
        # a FastLoader that failed, listed first: the measured one is chosen
        ([loader("X", "FastLoader", None, None, error="boom"), loader("B", "DataLoader", _lo(250.0), _tr(200.0, 0.6)),
          loader("F", "FastLoader", _lo(125.0), _tr(50.0, 0.7))],
         {"fastloader": "F", "speedup_loader_only": 0.5, "speedup_training": 0.25}),
        # every FastLoader failed: the first is reported
        ([loader("X", "FastLoader", None, None, error="boom"), loader("Y", "FastLoader", None, None, error="bang"),
          loader("B", "DataLoader", _lo(250.0))],
         {"fastloader": "X", "fastloader_images_per_s": None, "speedup_loader_only": None}),
    ],
)
def test_summary_of_partial_results(loaders, summary):
    r = result(loaders)
    report.summarise(r)
    for k, v in summary.items():
        assert r["summary"][k] == v, k


@pytest.mark.parametrize(
    "loaders, line",
    [
        ([], "no loader produced a measurement"),
        ([loader("X", "FastLoader", None, None, error="boom")], "FastLoader failed: boom"),
        ([loader("X", "FastLoader", None, None)], "FastLoader failed: no measurement"),
        # an error after its loader-only repeats (training failed): still reported as failed
        ([loader("X", "FastLoader", _lo(900.0), None, error="boom")], "FastLoader failed: boom"),
        ([loader("X", "FastLoader", None, None, error="boom"), loader("B", "DataLoader", _lo(2500.0))],
         "FastLoader failed: boom; best DataLoader: B at 2,500 images/s"),
        ([loader("B", "DataLoader", _lo(2500.0)), loader("A", "DataLoader", _lo(1000.0))],
         "best DataLoader: B at 2,500 images/s (loader only); FastLoader not measured"),
        ([loader("F", "FastLoader", _lo(4321.0))], "FastLoader: 4,321 images/s (loader only); no DataLoader baseline measured"),
        ([loader("B", "DataLoader", _lo(300.0)), loader("F", "FastLoader", _lo(400.0))],
         "FastLoader: 1.33x the best DataLoader (images/s, loader only)"),
        ([loader("B", "DataLoader", _lo(300.0), _tr(1, 0.5)), loader("F", "FastLoader", _lo(400.0))],
         "FastLoader: 1.33x the best DataLoader (images/s, loader only)"),
        ([loader("B", "DataLoader", _lo(0.0)), loader("F", "FastLoader", _lo(400.0))],
         "FastLoader: infx the best DataLoader (images/s, loader only)"),
        ([loader("B", "DataLoader", _lo(300.0), _tr(1, 0.5)), loader("F", "FastLoader", _lo(600.0), _tr(1, 0.125))],
         "FastLoader: 2.00x the best DataLoader (images/s, loader only); training waits 12% vs 50% of each step"),
    ],
)
def test_verdict_of_every_branch(loaders, line):
    """Each branch's line, written out. Kills: a branch's test inverted, the names or numbers swapped."""
    assert report.verdict(result(loaders)) == line


def test_best_dataloader_is_the_fastest_measured_one():
    ls = four() + [loader("C", "DataLoader", None, None, error="x")]
    assert report.best_dataloader(result(ls))["name"] == "B"
    assert report.best_dataloader(result([loader("F", "FastLoader", _lo(1.0))])) is None
    assert report.best_dataloader(result([loader("C", "DataLoader", None)])) is None


@pytest.mark.parametrize(
    "g, text",
    [
        (None, "unavailable"),
        ("x", "unavailable"),
        ({"available": False}, "unavailable"),
        ({"available": False, "reason": "no NVML"}, "unavailable (no NVML)"),
        ({"available": True, "used": 3 * 2**20 * 1000, "total": 80 * 2**30}, "3,000 MB of 80 GiB"),
        ({"available": True, "used": 2**20, "total": 2**30, "process": 512 * 2**20}, "1 MB of 1 GiB (this process 512 MB)"),
        ({"available": True, "used": 2**20, "total": 2**30, "process": 0}, "1 MB of 1 GiB (this process 0 MB)"),
    ],
)
def test_gpu_text(g, text):
    assert report.gpu_text(g) == text


def _md_result():
    ls = four()
    ls[0]["loader_only"] = _lo(1234.4, 1000.0, 1500.6, first=0.456)
    ls[0]["training"] = _tr(987.6, 0.25, step_ms=12.34, verdict="input-bound",
                            gpu={"mean": 81.2, "max": 99.0}, cpu={"mean": 40.4, "max": 60.6})  # fmt: skip
    ls[0]["memory"] = {"after": {"anon": 300 * 2**20, "file": 20 * 2**20, "gpu": {"available": False, "reason": "none"}},
                       "added_first_repeat": {"anon": 10 * 2**20, "file": -2 * 2**20, "gpu": None}}  # fmt: skip
    ls[1]["memory"] = {"after": {"anon": 2048 * 2**20, "file": 0, "gpu": {"available": True, "used": 2**30, "total": 2**34}},
                       "added_first_repeat": {"anon": 0, "file": 0, "gpu": 5 * 2**20}}  # fmt: skip
    ls[2]["memory"] = {"after": {"anon": 1.5, "file": None}, "added_first_repeat": None}
    ls.append(loader("H|x", "FastLoader", None, None, error="RuntimeError: no"))
    ls.append(loader("N", "DataLoader", _lo(50.0), None))
    r = result(ls, images="/imgs", notes=["a note", "pipe | here"])
    r["machine"]["gpus"] = [{"name": "H200", "memory_gb": 139, "capability": "9.0", "hw_jpeg_decoder": True},
                            {"name": "T4", "memory_gb": 15, "capability": "7.5", "hw_jpeg_decoder": False}]  # fmt: skip
    r["machine"]["driver"] = "550.1"
    report.summarise(r)
    return r


def test_markdown_rows_are_the_numbers_of_the_result():
    """Every table row and line written out by hand from the result's numbers (1234.4 -> "1,234",
    500 / 1234.4 -> "0.41x" against A, now the best DataLoader, 0.25 -> "25%" and "75%"...). Kills: columns swapped, the relative speed
    against the wrong base, a format changed, a branch's test inverted, the escape of ``|`` dropped."""
    md = report.render_markdown(_md_result())
    lines = md.splitlines()
    want = [
        "# fastload benchmark",
        "**FastLoader: 0.41x the best DataLoader (images/s, loader only); training waits 5% vs 25% of each step**",
        "1,200 images in 3 classes (`/d`, ImageFolder `/imgs`), device `cpu`, batch 16, 32x32 float32 normalized, "
        "created 2026-12-01T00:00:00Z.",
        "![images/s per loader; step time split into waiting and computing](report.png)",
        "Images/s pulling batches as fast as possible (moved to the device when the loader leaves them on the host); "
        "3 repeats interleaved across loaders (repeat 1 of every loader, then repeat 2, ...), each a new epoch with "
        "1 warm-up batches left out.",
        "| loader | kind | images/s (median) | min | max | vs best DataLoader | first batch (s) |",
        "| A | DataLoader | 1,234 | 1,000 | 1,501 | 1.00x | 0.46 |",
        "| B | DataLoader | 250 | 225 | 275 | 0.20x | - |",
        "| F | FastLoader | 500 | 450 | 550 | 0.41x | - |",
        "| G | FastLoader | 300 | 270 | 330 | 0.24x | - |",
        "| H\\|x | FastLoader | failed | - | - | - | - |",
        "Model `small-cnn` trained for 5 steps after 1 warm-up steps (torch threads: 2), measured with "
        "`fastload.profile`: waiting = time blocked on the next batch.",
        "| A | 988 | 25% | 75% | 12.3 | 3.1 | 81% (max 99%) | 40% (max 61%) | input-bound |",
        "| B | 200 | 60% | 40% | 10.0 | 6.0 | unavailable | 50% (max 75%) | compute-bound |",
        "| H\\|x | failed | - | - | - | - | - | - | - |",
        "| N | not run | - | - | - | - | - | - | - |",
        "| A | 300 MB | 20 MB | unavailable (none) | +10 MB / -2 MB / unavailable |",
        "| B | 2,048 MB | 0 MB | 1,024 MB of 16 GiB | +0 MB / +0 MB / +5 MB |",
        "| F | 0 MB | - | unavailable | - |",
        "| G | - | - | - | - |",
        "## Failures",
        "- H\\|x: `RuntimeError: no`",
        "- CPU: Xeon, 2 usable of 4 cores, 8 GiB RAM",
        "- GPU: H200 (139 GiB, sm 9.0, hardware JPEG decoder); T4 (15 GiB, sm 7.5), driver 550.1",
        "- Linux-x",
        "fastload 1.0, torch 2.x",
        "`batch_size=16 crop=32 device=cpu model=small-cnn repeats=3 train_steps=5 train_threads=2 warmup=1`",
        "Total run time 12 s. Every number is in `report.json`.",
        "## Notes",
        "- a note",
        "- pipe \\| here",
    ]
    for w in want:
        assert w in lines, w
    for head in ("## Loader only", "## Training loop", "## Memory", "## Machine", "## Versions", "## Settings"):
        assert head in lines
    assert report._MEMORY_NOTE in lines
    assert md.endswith("\n") and not md.endswith("\n\n")
    assert lines.index("## Loader only") < lines.index("## Training loop") < lines.index("## Memory")
    assert lines.index("## Failures") < lines.index("## Machine") < lines.index("## Versions") < lines.index("## Settings")


def test_markdown_without_optional_parts():
    """No ImageFolder, no notes, no failures, no GPU, no threads, no memory size, no driver."""
    r = result([loader("B", "DataLoader", _lo(250.0)), loader("F", "FastLoader", _lo(500.0))])
    del r["config"]["train_threads"], r["elapsed_s"]
    r["machine"]["memory_gb"] = None
    report.summarise(r)
    lines = report.render_markdown(r).splitlines()
    assert "1,200 images in 3 classes (`/d`), device `cpu`, batch 16, 32x32 float32 normalized, created 2026-12-01T00:00:00Z." in lines
    assert ("Model `small-cnn` trained for 5 steps after 1 warm-up steps, measured with `fastload.profile`: waiting = "
            "time blocked on the next batch.") in lines  # fmt: skip
    assert "- CPU: Xeon, 2 usable of 4 cores" in lines and "- GPU: none (no GPU)" in lines
    assert "| F | not run | - | - | - | - | - | - | - |" in lines
    assert not any(line.startswith("## Failures") or line.startswith("## Notes") for line in lines)
    assert "Total run time 0 s. Every number is in `report.json`." == lines[-1]  # no elapsed_s: 0


class _Capture:
    """Keeps the figure ``plot`` saves (the real matplotlib figure) to read its bars and labels back."""

    def __init__(self, monkeypatch):
        import matplotlib.figure

        self.fig = None
        real = matplotlib.figure.Figure.savefig

        def keep(fig, path, **kw):
            self.fig, self.kw = fig, kw
            return real(fig, path, **kw)

        monkeypatch.setattr(matplotlib.figure.Figure, "savefig", keep)


def test_the_chart_draws_the_results_numbers(tmp_path, monkeypatch):
    """Read back from the figure: bar lengths are the median images/s, whiskers down to min and up to
    max, FastLoaders in their own colour, the training bars waiting then computing from where waiting
    ends, the labels, titles and the verdict; the PNG is ``figsize x 110`` dpi. Kills: a bar or whisker
    from another number, colours swapped, a label or title changed, the stacking lost, the size."""
    import matplotlib.colors as mcolors

    cap = _Capture(monkeypatch)
    r = _md_result()
    path = tmp_path / "c.png"
    report.plot(r, path)
    fig = cap.fig
    ax1, ax2 = fig.axes[:2]
    ls = r["loaders"]
    n = len(ls)
    bars = ax1.patches
    med = [e["loader_only"]["images_per_s"]["median"] if e["loader_only"] else 0.0 for e in ls]
    assert [b.get_width() for b in bars] == pytest.approx(med)
    assert [b.get_y() + b.get_height() / 2 for b in bars] == pytest.approx(list(range(n)))
    teal, grey = mcolors.to_rgba("#2a9d8f"), mcolors.to_rgba("#8d99ae")
    assert [b.get_facecolor() for b in bars] == [teal if e["kind"] == "FastLoader" else grey for e in ls]
    # whiskers: one segment per bar from min to max (0-length for the failed one)
    segs = [c for c in ax1.collections if hasattr(c, "get_segments")][0].get_segments()
    for e, s, m in zip(ls, segs, med):
        lo, hi = sorted([s[0][0], s[1][0]])
        if e["loader_only"]:
            ips = e["loader_only"]["images_per_s"]
            assert (lo, hi) == pytest.approx((min(ips["min"], m), max(ips["max"], m)))
        else:
            assert (lo, hi) == (0, 0)
    texts = [t.get_text() for t in ax1.texts]
    assert texts == [f"  {m:,.0f}" if e["loader_only"] else " failed" for m, e in zip(med, ls)]
    assert all(t.get_fontsize() == 8 for t in ax1.texts)
    assert [t.get_text() for t in ax1.get_yticklabels()] == [e["name"] for e in ls]
    assert ax1.get_xlabel() == "images/s (loader only, median; whiskers min-max)" and ax1.get_title() == "Throughput"
    assert ax1.yaxis_inverted() and ax2.yaxis_inverted()
    wait = [(e["training"] or {}).get("wait_ms") or 0.0 for e in ls]
    comp = [(e["training"] or {}).get("compute_ms") or 0.0 for e in ls]
    wbars, cbars = ax2.patches[:n], ax2.patches[n : 2 * n]
    assert [b.get_width() for b in wbars] == pytest.approx(wait) and [b.get_x() for b in wbars] == [0] * n
    assert [b.get_width() for b in cbars] == pytest.approx(comp)
    assert [b.get_x() for b in cbars] == pytest.approx(wait)
    assert {b.get_facecolor() for b in wbars} == {mcolors.to_rgba("#e76f51")}
    assert {b.get_facecolor() for b in cbars} == {mcolors.to_rgba("#264653")}
    assert [t.get_text() for t in ax2.texts] == [
        f" {e['training']['wait_fraction']:.0%} waiting" if e["training"] else " not measured" for e in ls
    ]
    assert [t.get_position()[0] for t in ax2.texts] == pytest.approx([w + c for w, c in zip(wait, comp)])
    assert [t.get_text() for t in ax2.get_legend().get_texts()] == ["waiting for the next batch", "computing"]
    assert ax2.get_xlabel() == "ms per training step (small-cnn, batch 16)"
    assert ax2.get_title() == "Training step: waiting vs computing"
    assert fig._suptitle.get_text() == r["verdict"]
    assert cap.kw == {"dpi": 110}
    with Image.open(path) as im:
        assert im.format == "PNG" and im.size == (1430, round((2.2 + 0.6 * n) * 110))
    small = result([loader("F", "FastLoader", _lo(500.0))])
    report.summarise(small)
    report.plot(small, tmp_path / "s.png")
    with Image.open(tmp_path / "s.png") as im:
        assert im.size == (1430, round((2.2 + 0.6 * 2) * 110))  # at least room for two rows


def test_write_report_writes_json_without_nan_and_markdown_of_that_json(tmp_path):
    """NaN and infinities become null (JSON has neither), a tuple a list; ``files`` names the three paths;
    the Markdown is rendered from the cleaned data. Kills: the finite test inverted, keys not strings,
    the files entry kept from the input, a file under another name."""
    r = _md_result()
    r["extra"] = {1: [math.nan, (math.inf, -math.inf, 2.5)], "x": float("nan")}
    r["files"] = {"old": "x"}
    out = tmp_path / "deep" / "out"
    files = report.write_report(r, out)
    assert files == {"json": str(out / "report.json"), "md": str(out / "report.md"), "png": str(out / "report.png")}
    assert sorted(os.listdir(out)) == ["report.json", "report.md", "report.png"]
    data = json.loads((out / "report.json").read_text(), parse_constant=lambda c: pytest.fail(c))
    assert data["extra"] == {"1": [None, [None, None, 2.5]], "x": None}
    assert data["files"] == files
    want = copy.deepcopy({k: v for k, v in r.items() if k != "files"})
    want["extra"] = {"1": [None, [None, None, 2.5]], "x": None}
    want["files"] = files
    assert data == json.loads(json.dumps(want))
    assert (out / "report.md").read_text() == report.render_markdown(data)
    assert (out / "report.json").read_text().endswith("}\n")
    assert (out / "report.json").read_text().startswith('{\n "loaders"')


def test_add_environment_records_this_machine_and_these_versions():
    """Against the packages and the OS themselves. Kills: a version from another package, a machine field
    from another key."""
    r: dict = {}
    report.add_environment(r)
    v, m = r["versions"], r["machine"]
    assert v["torch"] == torch.__version__ and v["numpy"] == np.__version__
    assert v["python"] == platform.python_version()
    assert v["pil"] == PIL.__version__ + (" (pillow-simd)" if "post" in PIL.__version__ else "")
    import lmdb
    import torchvision

    import fastload

    assert v["torchvision"] == torchvision.__version__ and v["lmdb"] == lmdb.__version__
    assert v["fastload"] == fastload.__version__ and v["cuda_toolkit"] == torch.version.cuda
    assert m["cores"] == os.cpu_count() and m["usable_cores"] == len(os.sched_getaffinity(0))
    assert m["platform"] == platform.platform()
    assert set(m) == {"platform", "cpu", "cores", "usable_cores", "memory_gb", "gpus", "cuda", "driver"}
    assert set(v) == {"fastload", "python", "torch", "torchvision", "dali", "pil", "numpy", "lmdb", "cuda_toolkit"}
    if not torch.cuda.is_available():
        assert m["gpus"] == [] and m["cuda"] != "available"


def test_write_report_into_an_existing_folder_and_the_files_key_last(tmp_path):
    """A second report into the same folder replaces the first; ``files`` is the JSON's last key even
    when the result held one first, and non-ASCII names are written as they are. Kills: ``exist_ok``
    dropped (a second run fails), the stale ``files`` kept in place."""
    r = {"files": {"old": "x"}, **_md_result()}
    r["loaders"][0]["name"] = "Ä–ø"
    out = tmp_path / "same"
    report.write_report(r, out)
    files = report.write_report(r, out)
    text = (out / "report.json").read_text(encoding="utf-8")
    assert list(json.loads(text)) == [k for k in r if k != "files"] + ["files"]
    assert json.loads(text)["files"] == files and '"Ä–ø"' in text


def test_markdown_of_missing_and_infinite_numbers():
    """Unknown numbers are "-", an infinite one "inf". Kills: the None tests of the percent and
    utilisation cells inverted or their dash changed, the number format's case."""
    z = loader("Z", "DataLoader", _lo(100.0, 50.0, math.inf, first=math.inf), {"step_ms": math.inf, "wait_ms": math.inf, "gpu_util": None, "cpu_util": ""})
    r = result([z, loader("F", "FastLoader", _lo(200.0))])
    report.summarise(r)
    lines = report.render_markdown(r).splitlines()
    assert "| Z | DataLoader | 100 | 50 | inf | 1.00x | inf |" in lines
    assert "| Z | - | - | - | inf | inf | - | - | - |" in lines
    alone = result([loader("F", "FastLoader", _lo(200.0, 150.0, 250.0, first=0.125))])  # no baseline: no ratio
    report.summarise(alone)
    assert "| F | FastLoader | 200 | 150 | 250 | - | 0.12 |" in report.render_markdown(alone).splitlines()


def test_the_whole_markdown_document_written_out():
    """Every line in its place, blank lines included (the lines alone are checked above). Kills: a
    separator or blank line changed or dropped, sections reordered, a table header changed."""
    r = _md_result()
    want = "\n".join([
        "# fastload benchmark", "",
        "**FastLoader: 0.41x the best DataLoader (images/s, loader only); training waits 5% vs 25% of each step**", "",
        "1,200 images in 3 classes (`/d`, ImageFolder `/imgs`), device `cpu`, batch 16, 32x32 float32 normalized, "
        "created 2026-12-01T00:00:00Z.", "",
        "![images/s per loader; step time split into waiting and computing](report.png)", "",
        "## Loader only", "",
        "Images/s pulling batches as fast as possible (moved to the device when the loader leaves them on the host); "
        "3 repeats interleaved across loaders (repeat 1 of every loader, then repeat 2, ...), each a new epoch with "
        "1 warm-up batches left out.", "",
        "| loader | kind | images/s (median) | min | max | vs best DataLoader | first batch (s) |",
        "|---|---|---:|---:|---:|---:|---:|",
        "| A | DataLoader | 1,234 | 1,000 | 1,501 | 1.00x | 0.46 |",
        "| B | DataLoader | 250 | 225 | 275 | 0.20x | - |",
        "| F | FastLoader | 500 | 450 | 550 | 0.41x | - |",
        "| G | FastLoader | 300 | 270 | 330 | 0.24x | - |",
        "| H\\|x | FastLoader | failed | - | - | - | - |",
        "| N | DataLoader | 50 | 45 | 55 | 0.04x | - |", "",
        "## Training loop", "",
        "Model `small-cnn` trained for 5 steps after 1 warm-up steps (torch threads: 2), measured with "
        "`fastload.profile`: waiting = time blocked on the next batch.", "",
        "| loader | images/s | waiting | computing | step (ms, mean) | wait (ms, mean) | GPU util | CPU util (all cores) | verdict |",
        "|---|---:|---:|---:|---:|---:|---|---|---|",
        "| A | 988 | 25% | 75% | 12.3 | 3.1 | 81% (max 99%) | 40% (max 61%) | input-bound |",
        "| B | 200 | 60% | 40% | 10.0 | 6.0 | unavailable | 50% (max 75%) | compute-bound |",
        "| F | 400 | 5% | 95% | 10.0 | 0.5 | unavailable | 50% (max 75%) | compute-bound |",
        "| G | 350 | 10% | 90% | 10.0 | 1.0 | unavailable | 50% (max 75%) | compute-bound |",
        "| H\\|x | failed | - | - | - | - | - | - | - |",
        "| N | not run | - | - | - | - | - | - | - |", "",
        "## Memory", "", report._MEMORY_NOTE, "",
        "| loader | anonymous RSS | file-backed pages | GPU memory in use | added by its first repeat (anon / file / GPU) |",
        "|---|---:|---:|---|---|",
        "| A | 300 MB | 20 MB | unavailable (none) | +10 MB / -2 MB / unavailable |",
        "| B | 2,048 MB | 0 MB | 1,024 MB of 16 GiB | +0 MB / +0 MB / +5 MB |",
        "| F | 0 MB | - | unavailable | - |",
        "| G | - | - | - | - |",
        "| H\\|x | - | - | - | - |",
        "| N | - | - | - | - |", "",
        "## Failures", "", "- H\\|x: `RuntimeError: no`", "",
        "## Machine", "",
        "- CPU: Xeon, 2 usable of 4 cores, 8 GiB RAM",
        "- GPU: H200 (139 GiB, sm 9.0, hardware JPEG decoder); T4 (15 GiB, sm 7.5), driver 550.1",
        "- Linux-x", "",
        "## Versions", "", "fastload 1.0, torch 2.x", "",
        "## Settings", "",
        "`batch_size=16 crop=32 device=cpu model=small-cnn repeats=3 train_steps=5 train_threads=2 warmup=1`", "",
        "Total run time 12 s. Every number is in `report.json`.", "",
        "## Notes", "", "- a note", "- pipe \\| here",
    ]) + "\n"  # fmt: skip
    assert report.render_markdown(r) == want


def test_the_charts_layout_read_back(tmp_path, monkeypatch):
    """The chart's smaller settings as the figure holds them. Kills: whisker caps, text alignment and
    sizes, margins, the legend's place, columns and frame, the second axis' empty tick labels, the
    suptitle's size, the figure left open."""
    import matplotlib.pyplot as plt

    cap = _Capture(monkeypatch)
    r = _md_result()
    report.plot(r, tmp_path / "c.png")
    fig = cap.fig
    ax1, ax2 = fig.axes[:2]
    n = len(r["loaders"])
    caps = [line for line in ax1.lines if line.get_marker() in ("|", "_")]
    assert caps and all(line.get_markersize() == 3 * 2 for line in caps)  # capsize=3: markers of 2 * capsize
    assert all(t.get_va() == "center" for t in ax1.texts + ax2.texts)
    ends = [(e["loader_only"]["images_per_s"]["max"] if e["loader_only"] else 0.0) for e in r["loaders"]]
    assert [t.get_position()[0] for t in ax1.texts] == pytest.approx(ends)  # at the whisker's end
    assert all(t.get_fontsize() == 8 for t in ax2.texts)
    assert [t.get_fontsize() for t in ax1.get_yticklabels()] == [8] * n
    assert ax1.margins() == (0.2, pytest.approx(ax1.margins()[1])) and ax2.margins()[0] == 0.25
    assert [t.get_text() for t in ax2.get_yticklabels()] == [""] * n
    assert list(ax2.get_yticks()) == list(range(n))
    leg = ax2.get_legend()
    assert (leg._loc, leg._ncols, leg.get_frame_on()) == (9, 2, False)  # 9: "upper center"
    assert all(t.get_fontsize() == 8 for t in leg.get_texts())
    anchor = ax2.transAxes.inverted().transform(leg.get_bbox_to_anchor().get_points())
    assert anchor.ravel().tolist() == pytest.approx([0.5, -0.22, 0.5, -0.22])
    assert fig._suptitle.get_fontsize() == 9
    assert tuple(fig.get_size_inches()) == (13, pytest.approx(2.2 + 0.6 * n))
    assert fig.number not in plt.get_fignums()


def test_the_chart_side_by_side_and_whiskers_of_a_steady_loader(tmp_path, monkeypatch):
    """The two panels side by side (one row); a loader whose repeats were all alike has no whisker.
    Kills: ``subplots(2)`` (one above the other), a whisker of at least 1 image/s."""
    cap = _Capture(monkeypatch)
    r = result([loader("S", "DataLoader", _lo(100.0, 100.0, 100.0)), loader("F", "FastLoader", _lo(200.0, 150.0, 250.0))])
    report.summarise(r)
    report.plot(r, tmp_path / "s.png")
    ax1, ax2 = cap.fig.axes[:2]
    p1, p2 = ax1.get_position(), ax2.get_position()
    assert p1.x1 <= p2.x0 and abs(p1.y0 - p2.y0) < 0.05
    segs = [c for c in ax1.collections if hasattr(c, "get_segments")][0].get_segments()
    assert sorted([segs[0][0][0], segs[0][1][0]]) == [100.0, 100.0]
    assert sorted([segs[1][0][0], segs[1][1][0]]) == [150.0, 250.0]


def test_add_environment_maps_a_gpu_machines_diagnosis(monkeypatch):
    """What ``fastload.doctor.diagnose`` says on a machine with a GPU (written out as it reports one):
    each device's four fields, "available", the versions with pillow-simd marked. Kills: a device
    field read under another key, the CUDA line's default, the versions' error fallbacks."""
    import fastload.doctor

    pkg = lambda v, e=None: {"version": v, "error": e}  # noqa: E731
    diag = {
        "platform": "Linux-6", "fastload": "9.9", "python": {"version": "3.11.7"}, "driver": "550.54",
        "cpu": {"model": "EPYC", "cores": 16, "usable_cores": 12, "memory_gb": 128.0},
        "cuda": {"reason": "", "torch_cuda": "12.4", "devices": [
            {"name": "H200", "memory_gb": 139.8, "capability": "9.0", "hw_jpeg_decoder": True, "extra": 1}]},
        "packages": {"torch": pkg("2.5"), "torchvision": pkg(None, "not installed"), "dali": pkg("1.40"),
                     "pil": {**pkg("10.3.0.post1"), "simd": True}, "numpy": pkg("2.0"), "lmdb": pkg("1.4")},
    }  # fmt: skip
    monkeypatch.setattr(fastload.doctor, "diagnose", lambda: diag)
    r: dict = {}
    report.add_environment(r)
    assert r["machine"] == {
        "platform": "Linux-6", "cpu": "EPYC", "cores": 16, "usable_cores": 12, "memory_gb": 128.0,
        "gpus": [{"name": "H200", "memory_gb": 139.8, "capability": "9.0", "hw_jpeg_decoder": True}],
        "cuda": "available", "driver": "550.54",
    }  # fmt: skip
    assert r["versions"] == {
        "fastload": "9.9", "python": "3.11.7", "torch": "2.5", "torchvision": "not installed", "dali": "1.40",
        "pil": "10.3.0.post1 (pillow-simd)", "numpy": "2.0", "lmdb": "1.4", "cuda_toolkit": "12.4",
    }  # fmt: skip
    diag["cuda"]["reason"] = "no NVIDIA driver"
    diag["packages"]["pil"] = {**pkg(None, "broken"), "simd": False}
    diag["packages"]["torch"], diag["packages"]["dali"] = pkg(None, "no torch"), pkg(None, "no dali")
    report.add_environment(r)
    assert r["machine"]["cuda"] == "no NVIDIA driver" and r["versions"]["pil"] == "broken"
    assert (r["versions"]["torch"], r["versions"]["dali"]) == ("no torch", "no dali")
