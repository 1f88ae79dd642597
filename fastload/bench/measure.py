"""Time one loader: loader-only throughput, and a training loop measured by :func:`fastload.profile`.

* **loader only** (:func:`measure_loader`): ``repeats`` runs, each starting a new epoch,
  ``warmup`` batches left out, then ``batches`` timed batches (moved to the device when
  the loader leaves them on the host); images/s median, min and max.
* **training** (:func:`measure_training`): a real model (:mod:`fastload.bench.models`)
  trained for ``train_steps`` steps after ``warmup``, measured with :func:`fastload.profile`:
  images/s, the share of each step spent waiting for the next batch, GPU and CPU utilisation.
* **memory** (:func:`memory_snapshot`, :func:`memory_added`): this process's anonymous RSS and
  file-backed resident pages apart (:func:`fastload.store.process_memory`), and the GPU
  memory in use (:func:`fastload.doctor.gpu_memory`: NVML or ``torch.cuda.mem_get_info``,
  which see DALI's pools), ``"unavailable"`` without a GPU.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from typing import Any, Callable, Iterable, Iterator

from ..errors import FastloadError
from .config import BenchConfig

__all__ = ["measure_loader", "measure_training", "warm_model", "spread", "memory_snapshot", "memory_added"]


def _epochs(loader: Iterable[Any]) -> Iterator[Any]:
    """Batches of ``loader``, epoch after epoch (a new ``iter()`` at each end)."""
    while True:
        n = 0
        for batch in loader:
            n += 1
            yield batch
        if n == 0:
            raise FastloadError(f"{type(loader).__name__} yielded no batches (is the dataset empty?)")


def _num(batch: Any) -> int:
    x = batch[0] if isinstance(batch, (tuple, list)) else batch
    shape = getattr(x, "shape", None)
    if shape is None or not len(shape):
        raise FastloadError(f"a batch must be (images, labels) with images [B, ...]; got {type(x).__name__}")
    return int(shape[0])


def _to_device(batch: Any, device: Any) -> None:
    if device is None:
        return
    for t in batch if isinstance(batch, (tuple, list)) else (batch,):
        if getattr(t, "device", None) is not None and t.device != device:
            t.to(device, non_blocking=True)


def spread(values: list[float]) -> dict[str, Any]:
    """Median, min, max and every value of a list of images/s runs."""
    return {
        "median": statistics.median(values),
        "min": min(values),
        "max": max(values),
        "runs": list(values),
    }


def measure_loader(loader: Iterable[Any], cfg: BenchConfig, *, on_batch: Callable[[int, int, int], None] | None = None) -> dict[str, Any]:
    """Loader-only throughput: ``cfg.repeats`` runs, each a new epoch, warm-up batches left out.

    ``on_batch(repeat, done, total)`` is called after each timed batch (progress display).
    """
    torch_device, sync = _device_and_sync(cfg.device)
    runs: list[float] = []
    first_batch_s: float | None = None
    timed = None
    for r in range(cfg.repeats):
        stream = _epochs(loader)
        try:
            t_start = time.perf_counter()
            for i in range(cfg.warmup):
                batch = next(stream)
                if i == 0 and first_batch_s is None:
                    first_batch_s = time.perf_counter() - t_start
                _to_device(batch, torch_device)
            if timed is None:
                timed = cfg.batches if cfg.epochs is None else max(1, cfg.epochs * len(loader) - cfg.warmup)  # type: ignore[arg-type]
            sync()
            images = 0
            t0 = time.perf_counter()
            for i in range(timed):
                batch = next(stream)
                if first_batch_s is None:
                    first_batch_s = time.perf_counter() - t_start
                images += _num(batch)
                _to_device(batch, torch_device)
                if on_batch is not None:
                    on_batch(r, i + 1, timed)
            sync()
            dt = time.perf_counter() - t0
        finally:
            stream.close()
        runs.append(images / dt if dt > 0 else float("nan"))
    return {
        "images_per_s": spread(runs),
        "batches_per_repeat": timed,
        "repeats": cfg.repeats,
        "warmup_batches": cfg.warmup,
        "first_batch_s": first_batch_s,
    }


def _device_and_sync(device: str) -> tuple[Any, Callable[[], None]]:
    if not str(device).startswith("cuda"):
        return None, lambda: None
    import torch

    dev = torch.device(device)
    return dev, (lambda: torch.cuda.synchronize(dev))


@contextlib.contextmanager
def _torch_threads(n: int | None) -> Iterator[None]:
    """Run with ``torch.set_num_threads(n)`` (no change for None), restoring the old value."""
    if n is None:
        yield
        return
    import torch

    old = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(old)


def measure_training(
    loader: Iterable[Any],
    cfg: BenchConfig,
    num_classes: int,
    *,
    name: str = "loader",
    on_step: Callable[[int, int], None] | None = None,
) -> dict[str, Any]:
    """Train ``cfg.model`` for ``cfg.warmup + cfg.train_steps`` steps on ``loader``; report via :func:`fastload.profile`."""
    from ..profile import profile
    from .models import TrainStep, build_model

    model = build_model(str(cfg.model), num_classes, cfg.device)
    step = TrainStep(model, cfg.device)
    total = cfg.warmup + cfg.train_steps
    # The profiler wraps the loader itself (so its suggestion knows the loader) and is
    # iterated epoch after epoch; its totals accumulate across epochs.
    prof = profile(loader, warmup=cfg.warmup, sample_interval=cfg.sample_interval, name=name, log_summary=False)
    loss = None
    done = 0
    try:
        with _torch_threads(cfg.train_threads):
            while done < total:
                before = done
                for images, labels in prof:
                    loss = step(images, labels)
                    done += 1
                    if on_step is not None:
                        on_step(done, total)
                    if done >= total:
                        break
                if done == before:
                    raise FastloadError(f"{name} yielded no batches (is the dataset empty?)")
    finally:
        prof.close()
    s = prof.stats()
    final_loss = float(loss.detach().float().item()) if loss is not None else None
    keep = (
        "steps", "warmup_steps", "samples", "images_per_s", "wait_fraction", "wait_ms", "compute_ms", "step_ms",
        "step_ms_p50", "step_ms_p90", "wait_ms_p50", "wait_ms_p90", "gpu_util", "cpu_util", "gpu_reason",
        "cpu_reason", "verdict", "suggestion",
    )  # fmt: skip
    out = {k: s[k] for k in keep}
    out.update(
        model=cfg.model, amp=step.amp, channels_last=step.cuda, torch_threads=cfg.train_threads, final_loss=final_loss
    )
    return out


def warm_model(cfg: BenchConfig, num_classes: int, steps: int = 2) -> None:
    """Train a throw-away model for ``steps`` steps on random data of the benchmark's shape.

    The first steps in a process pay one-time costs (oneDNN/cuDNN kernel selection,
    allocator growth); without this the first loader measured would pay them alone.
    """
    import torch

    from .models import TrainStep, build_model

    step = TrainStep(build_model(str(cfg.model), num_classes, cfg.device), cfg.device)
    x = torch.randn(cfg.batch_size, 3, cfg.crop, cfg.crop)
    y = torch.randint(0, num_classes, (cfg.batch_size,))
    with _torch_threads(cfg.train_threads):
        for _ in range(steps):
            step(x, y)
    if str(cfg.device).startswith("cuda"):
        torch.cuda.synchronize()


def memory_snapshot(device: str) -> dict[str, Any]:
    """This process's memory now: ``rss``, ``anon``, ``file``, ``shmem`` (bytes) and ``gpu``.

    ``anon`` is the process's own heap (decoded batches, tensors, DALI's host buffers);
    ``file`` the resident pages of mapped files (libraries, any mapped shard), which the kernel
    can drop at will. ``gpu`` is :func:`fastload.doctor.gpu_memory` of the benchmark's CUDA
    device, or ``{"available": False, "reason"}`` when it runs on the CPU.
    """
    from ..doctor import gpu_memory
    from ..store import process_memory

    out: dict[str, Any] = dict(process_memory())
    if str(device).startswith("cuda"):
        import torch

        out["gpu"] = gpu_memory(torch.device(device).index or 0)
    else:
        out["gpu"] = {"available": False, "reason": f"device {device}: no GPU in use"}
    return out


def _gpu_bytes(g: dict[str, Any]) -> int | None:
    """This process's GPU bytes where NVML names them, else the device's."""
    if not g.get("available"):
        return None
    return g["process"] if g.get("process") is not None else g.get("used")


def memory_added(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """What grew between two :func:`memory_snapshot` s: ``anon``, ``file`` and ``gpu`` bytes
    (``gpu`` is ``"unavailable"`` when either snapshot has no GPU reading)."""
    out: dict[str, Any] = {k: after.get(k, 0) - before.get(k, 0) for k in ("anon", "file")}
    gb, ga = _gpu_bytes(before.get("gpu") or {}), _gpu_bytes(after.get("gpu") or {})
    same_source = ((before.get("gpu") or {}).get("process") is None) == ((after.get("gpu") or {}).get("process") is None)
    out["gpu"] = ga - gb if gb is not None and ga is not None and same_source else "unavailable"
    return out
