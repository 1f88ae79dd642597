"""fastload doctor: versions, pillow-simd status, DALI, CUDA and the hardware decoder, fixes."""

from __future__ import annotations

import importlib.metadata as metadata
import json
import sys

import pytest

from fastload import doctor
from fastload.cli import main


@pytest.fixture(scope="module")
def report() -> dict:
    return doctor.diagnose()


def test_diagnose_reports_this_environment(report):
    json.dumps(report)  # serialisable as is (for --json)
    assert report["python"]["version"] == ".".join(map(str, sys.version_info[:3]))
    import numpy
    import torch

    assert report["packages"]["torch"]["version"] == torch.__version__
    assert report["packages"]["numpy"]["version"] == numpy.__version__
    assert report["cpu"]["usable_cores"] >= 1
    import PIL

    pil = report["packages"]["pil"]
    assert pil["version"] == PIL.__version__
    try:
        simd_version = metadata.version("pillow-simd")
    except metadata.PackageNotFoundError:
        simd_version = None
    assert pil["simd"] is (simd_version == PIL.__version__)
    text = doctor.format_report(report)
    assert ("(pillow-simd)" in text) is pil["simd"]
    # the fixes section says exactly what the report's fixes are, one line each, in order
    lines = text.splitlines()
    if report["fixes"]:
        assert "Nothing to fix." not in lines
        at = lines.index("What to fix:")
        assert lines[at + 1 : at + 1 + len(report["fixes"])] == [f"  - {f}" for f in report["fixes"]]
    else:
        assert "What to fix:" not in lines and lines[-1] == "Nothing to fix."
    if not torch.cuda.is_available():
        assert report["cuda"]["reason"] == "no CUDA device"
        assert report["hw_decoder"] == {"usable": False, "reason": "no CUDA device"}
        assert any("FastLoader will use DALI's CPU pipeline" in f for f in report["fixes"])


def test_plain_pillow_gets_a_reinstall_fix(monkeypatch):
    real = doctor._dist_version

    def fake(*names):
        if names == ("pillow-simd",):
            return None
        if names[0] in ("pillow", "Pillow"):
            import PIL

            return PIL.__version__
        return real(*names)

    monkeypatch.setattr(doctor, "_dist_version", fake)
    d = doctor.diagnose()
    assert d["packages"]["pil"]["simd"] is False
    fix = [f for f in d["fixes"] if "not pillow-simd" in f]
    assert fix and "--no-binary pillow-simd pillow-simd" in fix[0]
    assert "plain pillow, not pillow-simd" in doctor.format_report(d)


def test_missing_dali_is_reported_with_the_package_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "nvidia.dali", None)  # import -> ImportError
    monkeypatch.setattr(doctor, "_dali_dists", lambda: [])
    d = doctor.diagnose()
    assert d["packages"]["dali"]["error"] == "not installed"
    pkg = doctor.dali_package_for(d["cuda"]["torch_cuda"])
    assert any(f"pip install {pkg}" in f for f in d["fixes"])
    assert any(line.split() == ["DALI", "not", "installed"] for line in doctor.format_report(d).splitlines())


def test_hardware_decoder_by_compute_capability():
    assert doctor.has_hw_decoder((8, 0)) and doctor.has_hw_decoder((9, 0)) and doctor.has_hw_decoder((10, 0))
    assert not doctor.has_hw_decoder((8, 6)) and not doctor.has_hw_decoder((7, 5)) and not doctor.has_hw_decoder((8, 9))
    h200 = {"index": 0, "name": "NVIDIA H200", "capability": "9.0", "hw_jpeg_decoder": True}
    l4 = {"index": 0, "name": "NVIDIA L4", "capability": "8.9", "hw_jpeg_decoder": False}
    dali = {"version": "2.4.0", "error": None}
    assert doctor._hw_decoder(dali, {"available": True, "devices": [h200]})["usable"] is True
    r = doctor._hw_decoder(dali, {"available": True, "devices": [l4]})
    assert r["usable"] is False and "no hardware JPEG decoder" in r["reason"]
    r = doctor._hw_decoder({"version": None, "error": "not installed"}, {"available": True, "devices": [h200]})
    assert r["usable"] is False and "not installed" in r["reason"]
    r = doctor._hw_decoder({"version": "0.28.0", "error": None}, {"available": True, "devices": [h200]})
    assert r["usable"] is False and "too old" in r["reason"]
    assert doctor._hw_decoder(dali, {"available": False, "devices": [], "reason": "no CUDA device"})["reason"] == "no CUDA device"


def test_gpu_rows_in_the_text_report(monkeypatch):
    cuda = {
        "available": True,
        "reason": "",
        "torch_cuda": "12.4",
        "devices": [
            {"index": 0, "name": "NVIDIA H200", "memory_gb": 139.8, "capability": "9.0", "multiprocessors": 132, "hw_jpeg_decoder": True}
        ],
    }
    monkeypatch.setattr(doctor, "_cuda_info", lambda: cuda)
    d = doctor.diagnose()
    text = doctor.format_report(d)
    assert "cuda:0" in text and "NVIDIA H200, 139.8 GiB, compute capability 9.0, hardware JPEG decoder" in text
    if d["packages"]["dali"]["error"] is None:
        assert d["hw_decoder"]["usable"] is True
        assert not any("FastLoader will use DALI's CPU pipeline" in f for f in d["fixes"])


def test_dali_package_matches_torch_cuda():
    assert doctor.dali_package_for("13.0") == "nvidia-dali-cuda130"
    assert doctor.dali_package_for("12.4") == "nvidia-dali-cuda120"
    assert doctor.dali_package_for("11.8") == "nvidia-dali-cuda110"
    assert doctor.dali_package_for(None) == "nvidia-dali-cuda120"


def test_cli_doctor_exits_0(capsys):
    assert main(["doctor"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("fastload doctor") and "PIL" in out and "DALI HW decoder" in out
    assert main(["doctor", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert {"packages", "cuda", "cpu", "hw_decoder", "fixes"} <= set(d)
    assert isinstance(d["packages"]["pil"]["simd"], bool)


# ----------------------------------------------------------------------------- GPU memory


def _has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def test_gpu_memory_is_reported_or_unavailable_with_a_reason():
    for index in (0, 99):
        m = doctor.gpu_memory(index)  # never raises, whatever the machine
        if m["available"]:
            assert 0 <= m["used"] <= m["total"] and m["source"] in ("nvml", "torch.cuda.mem_get_info")
            assert doctor.format_gpu_memory(m).endswith(f"({m['source']})")
        else:
            assert m["reason"] and doctor.format_gpu_memory(m) == f"unavailable ({m['reason']})"
    if not _has_cuda():
        assert doctor.gpu_memory(0)["available"] is False


def test_doctor_without_a_gpu_shows_gpu_memory_unavailable(report):
    if _has_cuda():
        assert len(report["gpu_memory"]) == len(report["cuda"]["devices"])
        assert isinstance(report["loader_gpu_memory"], dict)
        return
    assert report["gpu_memory"] == [] and report["loader_gpu_memory"] == "unavailable"
    lines = doctor.format_report(report).splitlines()
    row = next(line for line in lines if line.strip().startswith("GPU memory"))
    assert row.rstrip().endswith(f"unavailable ({report['cuda']['reason']})")
    assert any(line.strip().startswith("FastLoader(cuda)") and "unavailable" in line for line in lines)


def test_doctor_on_a_gpu_machine_gives_each_devices_memory_and_the_loaders_expected_share(monkeypatch):
    from fastload.pipeline import GPU_THREADS

    cuda = {
        "available": True, "reason": "", "torch_cuda": "12.4",
        "devices": [{"index": 0, "name": "NVIDIA H200", "memory_gb": 139.8, "capability": "9.0", "hw_jpeg_decoder": True}],
    }  # fmt: skip
    monkeypatch.setattr(doctor, "_cuda_info", lambda: cuda)
    d = doctor.diagnose()
    json.dumps(d)
    (mem,) = d["gpu_memory"]
    est = d["loader_gpu_memory"]
    assert est["threads"] <= GPU_THREADS and est["device"] > 0 and est["pinned"] > 0
    text = doctor.format_report(d)
    row = next(line for line in text.splitlines() if line.strip().startswith("GPU memory cuda:0"))
    assert row.rstrip().endswith(doctor.format_gpu_memory(mem))
    assert f"about {est['device'] / 2**30:.2f} GiB GPU and {est['pinned'] / 2**30:.2f} GiB pinned" in text


def test_expected_loader_memory_is_bounded_by_the_thread_cap_not_the_cores(monkeypatch):
    monkeypatch.setattr(doctor.os, "cpu_count", lambda: 2)
    small_host = doctor.expected_loader_memory()
    monkeypatch.setattr(doctor.os, "cpu_count", lambda: 192)
    big_host = doctor.expected_loader_memory()
    assert big_host["device"] == doctor.expected_loader_memory()["device"]
    assert small_host["device"] <= big_host["device"] and big_host["pinned"] < 2 << 30  # not ~ cores x 134 MB x 2
    tiny = doctor.expected_loader_memory(stats={"width": {"median": 64, "max": 80}, "height": {"median": 48, "max": 60}})
    assert tiny["device"] < big_host["device"] and "64x48" in tiny["assumes"]


def test_the_small_crop_c_calls_are_reported_and_a_pil_without_them_gets_a_fix(monkeypatch):
    from fastload import host

    d = doctor.diagnose()
    assert d["packages"]["pil"]["c_calls"] is True  # this set-up's pillow-simd passes the check
    assert "small-crop C calls+" in doctor.format_report(d)
    assert not any("C image calls" in f for f in d["fixes"])
    monkeypatch.setattr(host, "_CORE", [None])  # what core_ops() gives where the check failed
    d = doctor.diagnose()
    assert d["packages"]["pil"]["c_calls"] is False
    assert "small-crop C calls-" in doctor.format_report(d)
    fix = [f for f in d["fixes"] if "C image calls" in f]
    assert fix and "97 px" in fix[0] and "--no-binary pillow-simd" in fix[0]
