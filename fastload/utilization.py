"""Read the machine's CPU and GPU utilisation now, never failing: psutil and NVML samplers.

Each sampler has ``available`` (False when it cannot read: no psutil, no NVML package,
no driver, no device), ``reason`` (why not, in words), ``sample()`` (percent, or None)
and ``close()``. :func:`fastload.profile` calls them from its background thread.
"""

from __future__ import annotations

import sys
from typing import Any, Callable

__all__ = ["CpuSampler", "GpuSampler"]


class CpuSampler:
    """System-wide CPU utilisation (percent of all cores) through psutil."""

    def __init__(self) -> None:
        self.reason = ""
        try:
            import psutil
        except ImportError:
            self._psutil = None
            self.reason = "psutil is not installed (pip install psutil)"
            return
        self._psutil = psutil
        psutil.cpu_percent(interval=None)  # the first call only sets the reference point

    @property
    def available(self) -> bool:
        return self._psutil is not None

    def sample(self) -> float | None:
        if self._psutil is None:
            return None
        return float(self._psutil.cpu_percent(interval=None))

    def close(self) -> None:
        pass


class GpuSampler:
    """GPU utilisation of the device in use, through NVML (pynvml from nvidia-ml-py).

    Never raises: without the package, the driver library or a device, ``available``
    is False and ``reason`` says why.
    """

    def __init__(self) -> None:
        self.reason = ""
        self._nvml = None
        self._handle = None
        try:
            import pynvml
        except ImportError:
            self.reason = "nvidia-ml-py is not installed (pip install nvidia-ml-py)"
            return
        try:
            pynvml.nvmlInit()
        except Exception as e:  # NVMLError_LibraryNotFound without a GPU driver, and kin
            self.reason = _nvml_message(e)
            return
        try:
            self._handle = _nvml_handle(pynvml)
        except Exception as e:
            self.reason = f"no GPU visible to NVML: {_nvml_message(e)}"
            _safe(pynvml.nvmlShutdown)
            return
        self._nvml = pynvml

    @property
    def available(self) -> bool:
        return self._nvml is not None

    def sample(self) -> float | None:
        if self._nvml is None:
            return None
        try:
            return float(self._nvml.nvmlDeviceGetUtilizationRates(self._handle).gpu)
        except Exception as e:
            self.reason = f"NVML stopped answering: {_nvml_message(e)}"
            self.close()
            return None

    def close(self) -> None:
        if self._nvml is not None:
            _safe(self._nvml.nvmlShutdown)
            self._nvml = None


def _nvml_message(e: BaseException) -> str:
    if type(e).__name__ == "NVMLError_LibraryNotFound":
        return "no NVIDIA driver (NVML library not found)"
    return f"{type(e).__name__}: {e}" if str(e) else type(e).__name__


def _safe(fn: Callable[[], Any]) -> None:
    try:
        fn()
    except Exception:  # pragma: no cover - best effort clean-up
        pass


def _nvml_handle(pynvml: Any) -> Any:
    """The NVML handle of the CUDA device torch uses (matched by UUID), else device 0."""
    torch = sys.modules.get("torch")
    if torch is not None:
        try:
            if torch.cuda.is_available() and torch.cuda.is_initialized():
                props = torch.cuda.get_device_properties(torch.cuda.current_device())
                uuid = str(getattr(props, "uuid", "") or "")
                if uuid:
                    uuid = uuid if uuid.startswith(("GPU-", "MIG-")) else f"GPU-{uuid}"
                    return pynvml.nvmlDeviceGetHandleByUUID(uuid)
        except Exception:
            pass
    if pynvml.nvmlDeviceGetCount() < 1:
        raise RuntimeError("NVML reports no devices")
    return pynvml.nvmlDeviceGetHandleByIndex(0)
