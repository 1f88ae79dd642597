"""``fastload doctor``: what this machine has, what fastload will do on it, and what to fix.

:func:`diagnose` collects versions (Python, torch, torchvision, DALI, PIL and whether
it is pillow-simd, lmdb, numpy), CUDA devices, whether DALI's hardware JPEG decoder
is usable, the core count, and the GPU memory in use (:func:`gpu_memory`: NVML or
``torch.cuda.mem_get_info``, which see DALI's pools; "unavailable" without a GPU) beside
what one FastLoader should add (:func:`expected_loader_memory`), then derives a list of
concrete fixes. :func:`format_report` renders it as text. Nothing here raises for a
missing or broken package: that is exactly what the report is for.
"""

from __future__ import annotations

import importlib
import importlib.metadata as metadata
import os
import platform
import sys
from typing import Any

from .version import __version__

__all__ = [
    "diagnose", "format_report", "HW_DECODER_CAPABILITIES", "gpu_memory", "format_gpu_memory", "expected_loader_memory",
    "UNAVAILABLE",
]  # fmt: skip

NOT_INSTALLED = "not installed"
UNAVAILABLE = "unavailable"

#: Compute capabilities of data-centre GPUs with a hardware JPEG decoder (nvJPEG's
#: hardware back end): A100/A30 (8.0), H100/H200 (9.0), B100/B200 class (10.x).
HW_DECODER_CAPABILITIES = {(8, 0), (9, 0)}
HW_DECODER_MAJORS = {10}

_PILLOW_SIMD_HOWTO = (
    "pip uninstall -y pillow pillow-simd && "
    "pip install --no-cache-dir --force-reinstall --no-deps --no-binary pillow-simd pillow-simd "
    "(first: apt-get install libjpeg-dev zlib1g-dev libpng-dev libwebp-dev libtiff-dev liblcms2-dev; "
    "or run scripts/setup.sh)"
)


def _dist_version(*names: str) -> str | None:
    for n in names:
        try:
            return metadata.version(n)
        except metadata.PackageNotFoundError:
            continue
    return None


def _dali_dists() -> list[tuple[str, str]]:
    """Installed ``nvidia-dali-*`` distributions as ``(name, version)``."""
    found = []
    try:
        for dist in metadata.distributions():
            name = (dist.metadata.get("Name") or "").lower()
            if name.startswith("nvidia-dali") and "tf-plugin" not in name:
                found.append((name, dist.version))
    except Exception:  # pragma: no cover - a broken site-packages
        pass
    return sorted(set(found))


def _module_version(module: str, *dists: str) -> dict[str, Any]:
    """``{"version", "error"}`` of an importable module (import errors are reported, not raised)."""
    try:
        m = importlib.import_module(module)
    except ImportError as e:
        installed = _dist_version(*dists) if dists else None
        if installed:
            return {"version": installed, "error": f"installed but fails to import: {e}"}
        return {"version": None, "error": NOT_INSTALLED}
    except Exception as e:  # pragma: no cover - e.g. a broken native extension
        return {"version": None, "error": f"fails to import: {type(e).__name__}: {e}"}
    return {"version": str(getattr(m, "__version__", None) or _dist_version(*dists) or "?"), "error": None}


def _pil_info() -> dict[str, Any]:
    info = _module_version("PIL", "pillow-simd", "pillow")
    if info["version"] is None or info["error"]:
        return {**info, "simd": False, "distribution": None, "features": {}, "conflict": False}
    simd_v = _dist_version("pillow-simd")
    plain_v = _dist_version("pillow", "Pillow")
    # pillow and pillow-simd share the PIL package: PIL is pillow-simd when its version is
    # pillow-simd's (pillow-simd versions carry a ".postN" suffix that pillow never has).
    simd = simd_v is not None and simd_v == info["version"]
    features: dict[str, bool] = {}
    try:
        from PIL import features as pil_features

        for f in ("jpg", "zlib", "webp", "libtiff", "littlecms2", "libjpeg_turbo"):
            try:
                features[f] = bool(pil_features.check(f))
            except Exception:
                features[f] = False
    except ImportError:  # pragma: no cover
        pass
    try:  # the CPU path's fast way of finishing small crops: PIL's C image calls, checked here
        from .host import core_ops

        c_calls = core_ops() is not None
    except Exception:  # noqa: BLE001 - reported as unusable
        c_calls = False
    return {
        **info,
        "simd": simd,
        "distribution": "pillow-simd" if simd else ("pillow" if plain_v else "?"),
        "features": features,
        "conflict": simd_v is not None and plain_v is not None,
        "c_calls": c_calls,
    }


def _dali_info() -> dict[str, Any]:
    dists = _dali_dists()
    try:
        import nvidia.dali as dali
    except ImportError as e:
        if dists:
            return {"version": dists[0][1], "distribution": dists[0][0], "error": f"installed but fails to import: {e}"}
        return {"version": None, "distribution": None, "error": NOT_INSTALLED}
    except Exception as e:  # pragma: no cover
        return {"version": None, "distribution": dists[0][0] if dists else None, "error": f"fails to import: {e}"}
    dist = dists[0][0] if dists else None
    return {"version": str(getattr(dali, "__version__", "?")), "distribution": dist, "error": None}


def _cuda_info() -> dict[str, Any]:
    try:
        import torch
    except Exception as e:
        return {"available": False, "devices": [], "reason": f"torch is not importable ({e})", "torch_cuda": None}
    torch_cuda = getattr(torch.version, "cuda", None)
    try:
        available = bool(torch.cuda.is_available())
    except Exception as e:  # pragma: no cover
        return {"available": False, "devices": [], "reason": f"CUDA check failed: {e}", "torch_cuda": torch_cuda}
    if not available:
        reason = "no CUDA device" if torch_cuda else "torch is a CPU-only build (no CUDA)"
        return {"available": False, "devices": [], "reason": reason, "torch_cuda": torch_cuda}
    devices = []
    for i in range(torch.cuda.device_count()):
        try:
            p = torch.cuda.get_device_properties(i)
        except Exception as e:  # pragma: no cover
            devices.append({"index": i, "name": "?", "error": str(e)})
            continue
        cap = (int(p.major), int(p.minor))
        devices.append(
            {
                "index": i,
                "name": str(p.name),
                "memory_gb": round(p.total_memory / 2**30, 1),
                "capability": f"{cap[0]}.{cap[1]}",
                "multiprocessors": int(getattr(p, "multi_processor_count", 0)),
                "hw_jpeg_decoder": has_hw_decoder(cap),
            }
        )
    return {"available": True, "devices": devices, "reason": "", "torch_cuda": torch_cuda}


def has_hw_decoder(capability: tuple[int, int]) -> bool:
    """Whether a GPU of this compute capability has the hardware JPEG decoder (A100/H100/H200/B200)."""
    return tuple(capability) in HW_DECODER_CAPABILITIES or capability[0] in HW_DECODER_MAJORS


def _driver_version() -> str | None:
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:
        return None
    try:
        v = pynvml.nvmlSystemGetDriverVersion()
        return v.decode() if isinstance(v, bytes) else str(v)
    except Exception:  # pragma: no cover
        return None
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:  # pragma: no cover
            pass


def _nvml_handle_for(pynvml: Any, index: int) -> Any:
    """NVML's handle of CUDA device ``index`` as this process numbers it (``CUDA_VISIBLE_DEVICES``)."""
    torch = sys.modules.get("torch")
    if torch is not None:
        try:
            if torch.cuda.is_initialized():
                uuid = str(getattr(torch.cuda.get_device_properties(index), "uuid", "") or "")
                if uuid:
                    return pynvml.nvmlDeviceGetHandleByUUID(uuid if uuid.startswith(("GPU-", "MIG-")) else f"GPU-{uuid}")
        except Exception:
            pass
    visible = [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    if visible and index < len(visible):
        v = visible[index]
        return pynvml.nvmlDeviceGetHandleByIndex(int(v)) if v.isdigit() else pynvml.nvmlDeviceGetHandleByUUID(v)
    return pynvml.nvmlDeviceGetHandleByIndex(index)


def _nvml_process_bytes(pynvml: Any, handle: Any) -> int | None:
    """GPU memory NVML charges to this process on ``handle`` (None when it cannot tell)."""
    try:
        procs = pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
    except Exception:
        return None
    for proc in procs:
        if int(getattr(proc, "pid", -1)) == os.getpid():
            used = getattr(proc, "usedGpuMemory", None)
            return int(used) if isinstance(used, int) else None
    return None  # not listed: another PID namespace (containers), or no context yet


def gpu_memory(index: int = 0) -> dict[str, Any]:
    """GPU memory of CUDA device ``index`` now, in bytes; never raises.

    ``{"available": True, "source", "total", "used", "process"}``: ``used`` is the whole device
    (every process), ``process`` what NVML charges to this one (None when it cannot say, e.g.
    in a container's PID namespace). DALI allocates through its own pools, which
    ``torch.cuda.memory_allocated`` does not see; both sources used here do. When torch has
    initialised CUDA the figures come from ``torch.cuda.mem_get_info`` (``process`` still from
    NVML); otherwise from NVML alone, so that asking never creates a CUDA context.
    Without a GPU, driver or NVML: ``{"available": False, "reason"}``.
    """
    torch = sys.modules.get("torch")
    nvml, nvml_reason = None, "NVML is not usable"
    try:
        import pynvml

        pynvml.nvmlInit()
        nvml = pynvml
    except Exception as e:
        nvml_reason = "nvidia-ml-py is not installed" if isinstance(e, ImportError) else (
            "no NVIDIA driver (NVML library not found)" if type(e).__name__ == "NVMLError_LibraryNotFound" else f"NVML: {e}"
        )  # fmt: skip
    try:
        handle = None
        if nvml is not None:
            try:
                handle = _nvml_handle_for(nvml, index)
            except Exception as e:
                nvml_reason = f"NVML sees no device {index}: {e}"
        try:
            initialised = torch is not None and torch.cuda.is_initialized()
        except Exception:
            initialised = False
        if initialised:
            try:
                free, total = torch.cuda.mem_get_info(index)
                process = _nvml_process_bytes(nvml, handle) if handle is not None else None
                return {"available": True, "source": "torch.cuda.mem_get_info", "total": int(total),
                        "used": int(total - free), "process": process}  # fmt: skip
            except Exception as e:
                if handle is None:
                    return {"available": False, "reason": f"torch.cuda.mem_get_info failed: {e}"}
        if handle is None:
            return {"available": False, "reason": nvml_reason}
        try:
            info = nvml.nvmlDeviceGetMemoryInfo(handle)
        except Exception as e:
            return {"available": False, "reason": f"NVML memory query failed: {e}"}
        return {"available": True, "source": "nvml", "total": int(info.total), "used": int(info.used),
                "process": _nvml_process_bytes(nvml, handle)}  # fmt: skip
    finally:
        if nvml is not None:
            try:
                nvml.nvmlShutdown()
            except Exception:  # pragma: no cover
                pass


def _gib(n: int | None) -> str:
    return "?" if n is None else f"{n / 2**30:.2f} GiB"


def format_gpu_memory(m: dict[str, Any]) -> str:
    """One line for :func:`gpu_memory`'s dict: ``unavailable (why)`` or used/total/this process."""
    if not m.get("available"):
        return f"{UNAVAILABLE} ({m.get('reason') or 'no GPU'})"
    text = f"{_gib(m['used'])} used of {_gib(m['total'])}"
    if m.get("process") is not None:
        text += f", this process {_gib(m['process'])}"
    return text + f" ({m['source']})"


#: The dataset :func:`expected_loader_memory` assumes: ImageNet-like stored sizes, the pack's default limits.
_TYPICAL_STATS = {"width": {"median": 500, "max": 4000}, "height": {"median": 375, "max": 3000}}


def expected_loader_memory(batch_size: int = 256, *, crop: int = 224, prefetch: int = 2, stats: dict | None = None) -> dict[str, Any]:
    """What one ``FastLoader(device="cuda")`` should add, in bytes (:func:`fastload.pipeline.memory_estimate`).

    For ``stats`` (a manifest's ``stats``; default ImageNet-like sizes: median 500x375, largest
    4000x3000), float32 training batches of ``batch_size`` at ``crop``, ``prefetch`` in flight.
    ``{"device", "pinned", "threads", "assumes"}``.
    """
    from .pipeline import GraphSpec, decoder_sizing, memory_estimate

    st = _TYPICAL_STATS if stats is None else stats
    spec = GraphSpec(
        batch_size=batch_size, num_threads=os.cpu_count() or 1, device_id=0, train=True, crop=crop,
        resize=round(crop / 0.875), mean=[0.0] * 3, std=[1.0] * 3, out_dtype="float32", channels_last=True,
        prefetch=prefetch, hw_decoder_load=None, **decoder_sizing(st).fields(),
    )  # fmt: skip
    est = memory_estimate(spec)
    w, h = st.get("width", {}), st.get("height", {})
    est["assumes"] = (
        f"batch {batch_size}, {crop}x{crop} float32, prefetch {prefetch}, images median "
        f"{w.get('median', '?')}x{h.get('median', '?')}, largest {w.get('max', '?')}x{h.get('max', '?')}"
    )
    return est


def _cpu_info() -> dict[str, Any]:
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    model = platform.processor() or ""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    mem_gb = None
    try:
        import psutil

        mem_gb = round(psutil.virtual_memory().total / 2**30, 1)
    except Exception:
        pass
    return {"cores": os.cpu_count() or 1, "usable_cores": usable, "model": model or "?", "memory_gb": mem_gb}


def dali_package_for(torch_cuda: str | None) -> str:
    """The DALI wheel matching torch's CUDA major version (``nvidia-dali-cuda120`` by default)."""
    try:
        major = int(str(torch_cuda).split(".")[0])
    except (TypeError, ValueError):
        major = 12
    return {11: "nvidia-dali-cuda110", 13: "nvidia-dali-cuda130"}.get(major, "nvidia-dali-cuda120")


def _hw_decoder(dali: dict[str, Any], cuda: dict[str, Any]) -> dict[str, Any]:
    if not cuda["available"]:
        return {"usable": False, "reason": "no CUDA device"}
    if dali["error"]:
        return {"usable": False, "reason": f"DALI {dali['error']}"}
    try:
        major = int(str(dali["version"]).split(".")[0])
    except ValueError:
        major = 0
    if major < 1:
        return {"usable": False, "reason": f"DALI {dali['version']} is too old (the hardware decoder needs DALI >= 1.0)"}
    hw = [d for d in cuda["devices"] if d.get("hw_jpeg_decoder")]
    if not hw:
        names = ", ".join(f"{d['name']} (sm {d.get('capability', '?')})" for d in cuda["devices"])
        return {
            "usable": False,
            "reason": f"{names}: no hardware JPEG decoder; DALI decodes with nvJPEG on the CUDA cores instead",
        }
    return {
        "usable": True,
        "reason": "hardware JPEG decoder on " + ", ".join(f"cuda:{d['index']} {d['name']}" for d in hw),
    }


def diagnose() -> dict[str, Any]:
    """Everything ``fastload doctor`` reports, as a JSON-serialisable dict.

    Keys: ``fastload``, ``python``, ``platform``, ``packages`` (torch, torchvision, dali, pil,
    lmdb, numpy, psutil, nvidia-ml-py, matplotlib: each with ``version`` and ``error``),
    ``cpu``, ``cuda``, ``driver``, ``hw_decoder`` (``usable``, ``reason``), ``gpu_memory`` (one
    :func:`gpu_memory` dict per CUDA device; empty without one), ``loader_gpu_memory``
    (:func:`expected_loader_memory`, or ``"unavailable"`` without a GPU) and ``fixes`` (a list
    of strings, empty when nothing needs doing).
    """
    packages: dict[str, dict[str, Any]] = {
        "torch": _module_version("torch", "torch"),
        "torchvision": _module_version("torchvision", "torchvision"),
        "dali": _dali_info(),
        "pil": _pil_info(),
        "lmdb": _module_version("lmdb", "lmdb"),
        "numpy": _module_version("numpy", "numpy"),
        "psutil": _module_version("psutil", "psutil"),
        "nvidia-ml-py": {"version": _dist_version("nvidia-ml-py"), "error": None},
        "matplotlib": {"version": _dist_version("matplotlib"), "error": None},
    }
    for k in ("nvidia-ml-py", "matplotlib"):
        if packages[k]["version"] is None:
            packages[k]["error"] = NOT_INSTALLED
    cuda = _cuda_info()
    d: dict[str, Any] = {
        "fastload": __version__,
        "python": {"version": platform.python_version(), "executable": sys.executable},
        "platform": platform.platform(),
        "packages": packages,
        "cpu": _cpu_info(),
        "cuda": cuda,
        "driver": _driver_version(),
        "hw_decoder": _hw_decoder(packages["dali"], cuda),
        "gpu_memory": [gpu_memory(dev["index"]) for dev in cuda["devices"]] if cuda["available"] else [],
        "loader_gpu_memory": expected_loader_memory() if cuda["available"] else UNAVAILABLE,
    }
    d["fixes"] = _fixes(d)
    return d


def _fixes(d: dict[str, Any]) -> list[str]:
    p = d["packages"]
    fixes: list[str] = []
    if p["torch"]["error"]:
        fixes.append(f"torch: {p['torch']['error']}; pip install torch torchvision")
    elif p["torchvision"]["error"]:
        fixes.append(f"torchvision: {p['torchvision']['error']}; pip install torchvision (needed by `fastload bench`)")
    pil = p["pil"]
    if pil["error"]:
        fixes.append(f"PIL: {pil['error']}; install pillow-simd: {_PILLOW_SIMD_HOWTO}")
    else:
        if not pil["simd"]:
            fixes.append(
                f"PIL {pil['version']} is plain pillow, not pillow-simd (about 6x slower resizing in "
                f"DataLoader baselines and packing); reinstall: {_PILLOW_SIMD_HOWTO}"
            )
        elif pil["conflict"]:
            fixes.append(
                "both pillow and pillow-simd are installed and share PIL/: a later `pip install` of anything "
                f"that pulls pillow will overwrite pillow-simd; reinstall pillow-simd last: {_PILLOW_SIMD_HOWTO}"
            )
        if not pil.get("c_calls", True):
            fixes.append(
                f"PIL {pil['version']}'s C image calls do not give its public calls' pixels, so the CPU path "
                "finishes crops of 97 px and less image by image (about 1.6x slower at 56x56); reinstall "
                f"pillow-simd: {_PILLOW_SIMD_HOWTO}"
            )
        missing = [f for f in ("jpg", "zlib", "webp", "libtiff") if pil["features"] and not pil["features"].get(f)]
        if missing:
            fixes.append(
                f"PIL was built without {', '.join(missing)} support; install the -dev libraries and rebuild: "
                f"{_PILLOW_SIMD_HOWTO}"
            )
    dali = p["dali"]
    pkg = dali_package_for(d["cuda"].get("torch_cuda"))
    if dali["error"] == NOT_INSTALLED:
        fixes.append(f"DALI is not installed: FastLoader needs it; pip install {pkg}")
    elif dali["error"]:
        fixes.append(f"DALI {dali['error']}; reinstall it: pip install --force-reinstall {pkg}")
    for name in ("lmdb", "numpy"):
        if p[name]["error"]:
            fixes.append(f"{name}: {p[name]['error']}; pip install {name}")
    if not d["cuda"]["available"]:
        fixes.append(
            f"{d['cuda']['reason']}: FastLoader will use DALI's CPU pipeline (device='cpu'), "
            "at roughly the CPU's JPEG decode speed; a CUDA GPU decodes far faster"
        )
    elif not d["hw_decoder"]["usable"] and not dali["error"]:
        fixes.append(
            f"{d['hw_decoder']['reason']}; an A100/H100/H200-class GPU decodes JPEGs in hardware "
            "(FastLoader's hw_decoder_load then splits the work between it and the CUDA cores)"
        )
    cores = d["cpu"]["usable_cores"]
    if cores < 4:
        fixes.append(
            f"only {cores} usable CPU core{'s' if cores != 1 else ''}: CPU decoding (DataLoader workers, DALI's "
            "CPU pipeline) is limited to about that many images at once"
        )
    if p["psutil"]["error"] or p["nvidia-ml-py"]["error"] or p["matplotlib"]["error"]:
        miss = [k for k in ("psutil", "nvidia-ml-py", "matplotlib") if p[k]["error"]]
        fixes.append(
            f"{', '.join(miss)} missing: fastload.profile/bench report less (pip install 'fastload[bench]')"
        )
    return fixes


def _v(entry: dict[str, Any]) -> str:
    if entry.get("error"):
        return entry["error"] if entry["error"] == NOT_INSTALLED or not entry.get("version") else (
            f"{entry['version']} ({entry['error']})"
        )
    return str(entry.get("version"))


def format_report(d: dict[str, Any]) -> str:
    """Render :func:`diagnose`'s dict as the text ``fastload doctor`` prints."""
    p = d["packages"]
    pil = p["pil"]
    if pil.get("error"):
        pil_s = _v(pil)
    else:
        pil_s = f"{pil['version']} ({'pillow-simd' if pil['simd'] else 'plain pillow, not pillow-simd'})"
        feats = pil.get("features") or {}
        if feats:
            pil_s += "; " + " ".join(f"{k}{'+' if v else '-'}" for k, v in feats.items())
        if "c_calls" in pil:
            pil_s += f"; small-crop C calls{'+' if pil['c_calls'] else '-'}"
    dali = p["dali"]
    dali_s = _v(dali) + (f" [{dali['distribution']}]" if dali.get("distribution") and not dali.get("error") else "")
    cpu = d["cpu"]
    rows = [
        ("fastload", d["fastload"]),
        ("python", f"{d['python']['version']} ({d['python']['executable']})"),
        ("platform", d["platform"]),
        ("torch", _v(p["torch"]) + (f" (CUDA {d['cuda']['torch_cuda']})" if d["cuda"].get("torch_cuda") else "")),
        ("torchvision", _v(p["torchvision"])),
        ("DALI", dali_s),
        ("PIL", pil_s),
        ("lmdb", _v(p["lmdb"])),
        ("numpy", _v(p["numpy"])),
        ("psutil", _v(p["psutil"])),
        ("nvidia-ml-py", _v(p["nvidia-ml-py"])),
        ("matplotlib", _v(p["matplotlib"])),
        (
            "CPU",
            f"{cpu['usable_cores']} usable of {cpu['cores']} cores, {cpu['model']}"
            + (f", {cpu['memory_gb']} GiB RAM" if cpu.get("memory_gb") else ""),
        ),
        ("NVIDIA driver", d.get("driver") or "none found"),
    ]
    cuda = d["cuda"]
    if cuda["available"]:
        for dev in cuda["devices"]:
            rows.append(
                (
                    f"cuda:{dev['index']}",
                    f"{dev['name']}, {dev.get('memory_gb', '?')} GiB, compute capability {dev.get('capability', '?')}"
                    + (", hardware JPEG decoder" if dev.get("hw_jpeg_decoder") else ""),
                )
            )
    else:
        rows.append(("CUDA", cuda["reason"]))
    hw = d["hw_decoder"]
    rows.append(("DALI HW decoder", ("usable: " if hw["usable"] else "not usable: ") + hw["reason"]))
    mems = d.get("gpu_memory") or []
    if mems:
        for dev, m in zip(cuda["devices"], mems):
            rows.append((f"GPU memory cuda:{dev['index']}", format_gpu_memory(m)))
    else:
        rows.append(("GPU memory", f"{UNAVAILABLE} ({cuda.get('reason') or 'no CUDA device'})"))
    est = d.get("loader_gpu_memory")
    if isinstance(est, dict):
        rows.append(
            (
                "FastLoader(cuda)",
                f"about {_gib(est['device'])} GPU and {_gib(est['pinned'])} pinned host memory "
                f"({est['threads']} CPU threads; {est['assumes']}; see docs/gpu.md)",
            )
        )
    else:
        rows.append(("FastLoader(cuda)", f"GPU memory {UNAVAILABLE}: no CUDA device"))
    width = max(len(k) for k, _ in rows)
    lines = ["fastload doctor", ""] + [f"  {k.ljust(width)}  {v}" for k, v in rows] + [""]
    if d["fixes"]:
        lines.append("What to fix:")
        lines += [f"  - {f}" for f in d["fixes"]]
    else:
        lines.append("Nothing to fix.")
    return "\n".join(lines)
