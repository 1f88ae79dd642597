"""Benchmark reports: ``report.json`` (every number), ``report.md`` (tables, verdict), ``report.png``.

Everything in the Markdown and the chart is derived from the same dict that is written
to ``report.json``, so the three files always agree.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

__all__ = ["add_environment", "summarise", "verdict", "render_markdown", "plot", "write_report", "best_dataloader", "gpu_text"]


def add_environment(result: dict[str, Any]) -> None:
    """Fill ``result["machine"]`` and ``result["versions"]`` from :func:`fastload.doctor.diagnose`."""
    from ..doctor import diagnose

    d = diagnose()
    p = d["packages"]
    result["machine"] = {
        "platform": d["platform"],
        "cpu": d["cpu"]["model"],
        "cores": d["cpu"]["cores"],
        "usable_cores": d["cpu"]["usable_cores"],
        "memory_gb": d["cpu"]["memory_gb"],
        "gpus": [
            {k: dev.get(k) for k in ("name", "memory_gb", "capability", "hw_jpeg_decoder")} for dev in d["cuda"]["devices"]
        ],
        "cuda": d["cuda"]["reason"] or "available",
        "driver": d["driver"],
    }
    result["versions"] = {
        "fastload": d["fastload"],
        "python": d["python"]["version"],
        "torch": p["torch"]["version"] or p["torch"]["error"],
        "torchvision": p["torchvision"]["version"] or p["torchvision"]["error"],
        "dali": p["dali"]["version"] or p["dali"]["error"],
        "pil": (p["pil"]["version"] or p["pil"]["error"]) + (" (pillow-simd)" if p["pil"].get("simd") else ""),
        "numpy": p["numpy"]["version"],
        "lmdb": p["lmdb"]["version"],
        "cuda_toolkit": d["cuda"].get("torch_cuda"),
    }


def _lo(e: dict[str, Any]) -> float | None:
    lo = e.get("loader_only")
    return lo["images_per_s"]["median"] if lo else None


def _wait(e: dict[str, Any]) -> float | None:
    tr = e.get("training")
    return tr.get("wait_fraction") if tr else None


def best_dataloader(result: dict[str, Any]) -> dict[str, Any] | None:
    """The DataLoader baseline with the highest median loader-only images/s."""
    base = [e for e in result["loaders"] if e["kind"] == "DataLoader" and _lo(e) is not None]
    return max(base, key=lambda e: _lo(e)) if base else None  # type: ignore[arg-type, return-value]


def _fast(result: dict[str, Any]) -> dict[str, Any] | None:
    fl = [e for e in result["loaders"] if e["kind"] == "FastLoader"]
    ok = [e for e in fl if _lo(e) is not None]
    return (max(ok, key=lambda e: _lo(e)) if ok else fl[0]) if fl else None  # type: ignore[arg-type]


def verdict(result: dict[str, Any]) -> str:
    """One line: FastLoader's speed-up over the best DataLoader, and both loops' waiting share."""
    best, fast = best_dataloader(result), _fast(result)
    if fast is None:
        if best is None:
            return "no loader produced a measurement"
        return f"best DataLoader: {best['name']} at {_lo(best):,.0f} images/s (loader only); FastLoader not measured"
    if fast.get("error") or _lo(fast) is None:
        tail = f"; best DataLoader: {best['name']} at {_lo(best):,.0f} images/s" if best else ""
        return f"FastLoader failed: {fast.get('error') or 'no measurement'}{tail}"
    if best is None:
        return f"FastLoader: {_lo(fast):,.0f} images/s (loader only); no DataLoader baseline measured"
    ratio = _lo(fast) / _lo(best) if _lo(best) else math.inf  # type: ignore[operator]
    line = f"FastLoader: {ratio:.2f}x the best DataLoader (images/s, loader only)"
    wf, wb = _wait(fast), _wait(best)
    if wf is not None and wb is not None:
        line += f"; training waits {wf:.0%} vs {wb:.0%} of each step"
    return line


def summarise(result: dict[str, Any]) -> None:
    """Add ``result["summary"]`` (the numbers behind the verdict) and ``result["verdict"]``."""
    best, fast = best_dataloader(result), _fast(result)
    s: dict[str, Any] = {
        "best_dataloader": best["name"] if best else None,
        "best_dataloader_images_per_s": _lo(best) if best else None,
        "fastloader": fast["name"] if fast else None,
        "fastloader_images_per_s": _lo(fast) if fast else None,
        "speedup_loader_only": None,
        "training_wait_fastloader": _wait(fast) if fast else None,
        "training_wait_best_dataloader": _wait(best) if best else None,
        "speedup_training": None,
    }
    if s["fastloader_images_per_s"] and s["best_dataloader_images_per_s"]:
        s["speedup_loader_only"] = s["fastloader_images_per_s"] / s["best_dataloader_images_per_s"]
    tf = (fast or {}).get("training") or {}
    tb = (best or {}).get("training") or {}
    if tf.get("images_per_s") and tb.get("images_per_s"):
        s["speedup_training"] = tf["images_per_s"] / tb["images_per_s"]
    result["summary"] = s
    result["verdict"] = verdict(result)


# ----------------------------------------------------------------------------- markdown


def _n(v: Any, spec: str = ",.0f") -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    return format(v, spec)


def _pct(v: Any) -> str:
    return "-" if v is None else f"{v:.0%}"


def _util(u: Any) -> str:
    if isinstance(u, dict):
        return f"{u['mean']:.0f}% (max {u['max']:.0f}%)"
    return str(u or "-")


_MEMORY_NOTE = (
    "This process after each loader's loader-only repeats: anonymous RSS (its own heap: batches, tensors, "
    "DALI's host buffers) and file-backed resident pages (libraries, mapped files; the kernel drops them "
    "at will) apart, as `top` adds them into RES. GPU memory from NVML or `torch.cuda.mem_get_info`, which "
    "see DALI's pools; `unavailable` without a GPU. DataLoader workers are other processes, not counted."
)


def _mb(v: Any, signed: bool = False) -> str:
    if not isinstance(v, (int, float)):
        return "-"
    return f"{v / 2**20:{'+' if signed else ''},.0f} MB"


def gpu_text(g: Any) -> str:
    """GPU memory of a :func:`fastload.bench.measure.memory_snapshot`: in use (this process) or ``unavailable``."""
    if not isinstance(g, dict) or not g.get("available"):
        reason = g.get("reason") if isinstance(g, dict) else None
        return "unavailable" + (f" ({reason})" if reason else "")
    text = f"{g['used'] / 2**20:,.0f} MB of {g['total'] / 2**30:.0f} GiB"
    if g.get("process") is not None:
        text += f" (this process {g['process'] / 2**20:,.0f} MB)"
    return text


def _esc(s: str) -> str:
    return str(s).replace("|", "\\|")


def render_markdown(result: dict[str, Any]) -> str:
    """``report.md``: verdict, loader-only and training tables, machine, versions, settings, notes."""
    cfg, m, v = result["config"], result["machine"], result["versions"]
    ds = result["dataset"]
    L: list[str] = [
        "# fastload benchmark",
        "",
        f"**{_esc(result['verdict'])}**",
        "",
        f"{ds['num_samples']:,} images in {ds['classes']} classes (`{ds['path']}`"
        + (f", ImageFolder `{result['images']}`" if result.get("images") else "")
        + f"), device `{cfg['device']}`, batch {cfg['batch_size']}, {cfg['crop']}x{cfg['crop']} float32 normalized, "
        f"created {result['created']}.",
        "",
        "![images/s per loader; step time split into waiting and computing](report.png)",
        "",
        "## Loader only",
        "",
        f"Images/s pulling batches as fast as possible (moved to the device when the loader leaves them on the host); "
        f"{cfg['repeats']} repeats interleaved across loaders (repeat 1 of every loader, then repeat 2, ...), each a new epoch with {cfg['warmup']} warm-up batches left out.",
        "",
        "| loader | kind | images/s (median) | min | max | vs best DataLoader | first batch (s) |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    best = best_dataloader(result)
    base = _lo(best) if best else None
    for e in result["loaders"]:
        lo = e.get("loader_only")
        if lo:
            ips = lo["images_per_s"]
            rel = f"{ips['median'] / base:.2f}x" if base else "-"
            L.append(
                f"| {_esc(e['name'])} | {e['kind']} | {_n(ips['median'])} | {_n(ips['min'])} | {_n(ips['max'])} "
                f"| {rel} | {_n(lo.get('first_batch_s'), '.2f')} |"
            )
        else:
            L.append(f"| {_esc(e['name'])} | {e['kind']} | failed | - | - | - | - |")
    L += [
        "",
        "## Training loop",
        "",
        f"Model `{cfg['model']}` trained for {cfg['train_steps']} steps after {cfg['warmup']} warm-up steps"
        + (f" (torch threads: {cfg['train_threads']})" if cfg.get("train_threads") else "")
        + ", measured with `fastload.profile`: waiting = time blocked on the next batch.",
        "",
        "| loader | images/s | waiting | computing | step (ms, mean) | wait (ms, mean) | GPU util | CPU util (all cores) | verdict |",
        "|---|---:|---:|---:|---:|---:|---|---|---|",
    ]
    for e in result["loaders"]:
        tr = e.get("training")
        if tr:
            wf = tr.get("wait_fraction")
            L.append(
                f"| {_esc(e['name'])} | {_n(tr.get('images_per_s'))} | {_pct(wf)} | {_pct(None if wf is None else 1 - wf)} "
                f"| {_n(tr.get('step_ms'), '.1f')} | {_n(tr.get('wait_ms'), '.1f')} | {_esc(_util(tr.get('gpu_util')))} "
                f"| {_esc(_util(tr.get('cpu_util')))} | {tr.get('verdict', '-')} |"
            )
        else:
            why = "failed" if e.get("error") else "not run"
            L.append(f"| {_esc(e['name'])} | {why} | - | - | - | - | - | - | - |")
    L += ["", "## Memory", "", _MEMORY_NOTE, "",
          "| loader | anonymous RSS | file-backed pages | GPU memory in use | added by its first repeat (anon / file / GPU) |",
          "|---|---:|---:|---|---|"]  # fmt: skip
    for e in result["loaders"]:
        mem = e.get("memory") or {}
        after, added = mem.get("after"), mem.get("added_first_repeat")
        if not after:
            L.append(f"| {_esc(e['name'])} | - | - | - | - |")
            continue
        add = f"{_mb(added['anon'], signed=True)} / {_mb(added['file'], signed=True)} / " + (
            _mb(added["gpu"], signed=True) if isinstance(added.get("gpu"), int) else "unavailable"
        ) if added else "-"  # fmt: skip
        L.append(f"| {_esc(e['name'])} | {_mb(after.get('anon'))} | {_mb(after.get('file'))} | {_esc(gpu_text(after.get('gpu')))} | {add} |")
    errors = [e for e in result["loaders"] if e.get("error")]
    if errors:
        L += ["", "## Failures", ""] + [f"- {_esc(e['name'])}: `{e['error']}`" for e in errors]
    gpus = m.get("gpus") or []
    gpu_s = "; ".join(
        f"{g['name']} ({g.get('memory_gb')} GiB, sm {g.get('capability')}"
        + (", hardware JPEG decoder" if g.get("hw_jpeg_decoder") else "")
        + ")"
        for g in gpus
    ) or f"none ({m.get('cuda')})"
    L += [
        "",
        "## Machine",
        "",
        f"- CPU: {m.get('cpu')}, {m.get('usable_cores')} usable of {m.get('cores')} cores"
        + (f", {m['memory_gb']} GiB RAM" if m.get("memory_gb") else ""),
        f"- GPU: {gpu_s}" + (f", driver {m['driver']}" if m.get("driver") else ""),
        f"- {m.get('platform')}",
        "",
        "## Versions",
        "",
        ", ".join(f"{k} {val}" for k, val in v.items() if val),
        "",
        "## Settings",
        "",
        "`" + " ".join(f"{k}={cfg[k]}" for k in sorted(cfg)) + "`",
        "",
        f"Total run time {result.get('elapsed_s', 0):.0f} s. Every number is in `report.json`.",
    ]
    if result.get("notes"):
        L += ["", "## Notes", ""] + [f"- {_esc(n)}" for n in result["notes"]]
    return "\n".join(L) + "\n"


# ----------------------------------------------------------------------------- chart


def plot(result: dict[str, Any], path: str | os.PathLike) -> None:
    """``report.png``: images/s per loader (loader only, min-max whiskers) and step time waiting vs computing."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    loaders = result["loaders"]
    names = [e["name"] for e in loaders]
    colors = ["#2a9d8f" if e["kind"] == "FastLoader" else "#8d99ae" for e in loaders]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 2.2 + 0.6 * max(2, len(loaders))))
    y = list(range(len(loaders)))
    med = [_lo(e) or 0.0 for e in loaders]
    lo_err = [max(0.0, m - e["loader_only"]["images_per_s"]["min"]) if e.get("loader_only") else 0 for m, e in zip(med, loaders)]
    hi_err = [max(0.0, e["loader_only"]["images_per_s"]["max"] - m) if e.get("loader_only") else 0 for m, e in zip(med, loaders)]
    ax1.barh(y, med, color=colors, xerr=[lo_err, hi_err], capsize=3)
    for yi, m, hi, e in zip(y, med, hi_err, loaders):
        ax1.text(m + hi, yi, f"  {m:,.0f}" if e.get("loader_only") else " failed", va="center", fontsize=8)
    ax1.set_yticks(y, names, fontsize=8)
    ax1.invert_yaxis()
    ax1.set_xlabel("images/s (loader only, median; whiskers min-max)")
    ax1.set_title("Throughput")
    ax1.margins(x=0.2)

    wait = [((e.get("training") or {}).get("wait_ms") or 0.0) for e in loaders]
    comp = [((e.get("training") or {}).get("compute_ms") or 0.0) for e in loaders]
    ax2.barh(y, wait, color="#e76f51", label="waiting for the next batch")
    ax2.barh(y, comp, left=wait, color="#264653", label="computing")
    for yi, w, c, e in zip(y, wait, comp, loaders):
        wf = (e.get("training") or {}).get("wait_fraction")
        ax2.text(w + c, yi, f" {wf:.0%} waiting" if wf is not None else " not measured", va="center", fontsize=8)
    ax2.set_yticks(y, [""] * len(y))
    ax2.invert_yaxis()
    ax2.set_xlabel(f"ms per training step ({result['config'].get('model')}, batch {result['config']['batch_size']})")
    ax2.set_title("Training step: waiting vs computing")
    ax2.legend(loc="upper center", bbox_to_anchor=(0.5, -0.22), ncol=2, fontsize=8, frameon=False)
    ax2.margins(x=0.25)
    fig.suptitle(result["verdict"], fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _clean(o: Any) -> Any:
    """JSON-safe: NaN/inf become null."""
    if isinstance(o, float) and not math.isfinite(o):
        return None
    if isinstance(o, dict):
        return {str(k): _clean(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [_clean(v) for v in o]
    return o


def write_report(result: dict[str, Any], out_dir: str | os.PathLike) -> dict[str, str]:
    """Write ``report.json``, ``report.md`` and ``report.png`` into ``out_dir``; return their paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    files = {"json": str(out / "report.json"), "md": str(out / "report.md"), "png": str(out / "report.png")}
    data = _clean({k: v for k, v in result.items() if k != "files"})
    data["files"] = files
    _atomic_write(Path(files["json"]), json.dumps(data, indent=1, ensure_ascii=False) + "\n")
    _atomic_write(Path(files["md"]), render_markdown(data))
    plot(data, files["png"])
    return files


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)
