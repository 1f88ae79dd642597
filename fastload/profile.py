"""Is training waiting for data? A wait-versus-compute meter for any loop over batches.

::

    for images, labels in (prof := fastload.profile(loader)):
        ...                                  # the user's own training step
    print(prof.summary())                    # input-bound or compute-bound, numbers, what to do

Per step the profiler measures the time blocked inside ``next()`` on the loader
(*waiting*) and the time from handing a batch over to the next request (*computing*).
When CUDA is initialised it synchronises the *current stream* (the one the training step
queues its kernels on) before and after each wait, so GPU work still queued from the previous
step counts as computing, not as waiting, and the copy a batch's tensors wait for on that
stream counts as waiting. It never calls the device-wide ``torch.cuda.synchronize()``: that
would also wait for DALI's streams and the loader's side stream, which decode and copy the
*next* batches, and so serialise loading with training. ``sync_cuda=False`` measures CPU-side
time only (GPU work queued by a step then shows where the loop next blocks).
A background thread samples GPU utilisation through NVML (what ``nvidia-smi`` shows)
and CPU utilisation through psutil (:mod:`fastload.utilization`); either is reported
as ``"unavailable"`` when it cannot be read (no GPU, no driver, no psutil) and never
fails the loop.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import math
import os
import statistics
import sys
import threading
import time
from typing import Any, Callable, Iterable, Iterator

from .errors import ConfigError
from .utilization import CpuSampler, GpuSampler

log = logging.getLogger(__name__)

__all__ = ["Profiler", "profile", "INPUT_BOUND_THRESHOLD"]

#: Waiting above this share of the step time means the loop is input-bound.
INPUT_BOUND_THRESHOLD = 0.25

UNAVAILABLE = "unavailable"
_NO_SAMPLES = "no samples yet"


# ----------------------------------------------------------------------------- samplers

# The samplers are created through these names so tests can replace them.
make_cpu_sampler: Callable[[], Any] = CpuSampler
make_gpu_sampler: Callable[[], Any] = GpuSampler


# ----------------------------------------------------------------------------- CUDA sync


def _cuda_synchronize() -> None:
    """Wait for the current CUDA stream (``torch.cuda.current_stream().synchronize()``) when
    torch is imported and CUDA is initialised; never the whole device (see the module docstring)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return
    try:
        if torch.cuda.is_initialized():
            torch.cuda.current_stream().synchronize()
    except Exception:  # pragma: no cover - a broken CUDA context must not break the meter
        pass


# ----------------------------------------------------------------------------- profiler


def _batch_size(batch: Any) -> int | None:
    """Number of samples in a batch: the leading size of its first tensor-like item."""
    x = batch
    for _ in range(3):
        if isinstance(x, (tuple, list)) and x:
            x = x[0]
        elif isinstance(x, dict) and x:
            x = next(iter(x.values()))
        else:
            break
    shape = getattr(x, "shape", None)
    if shape is not None and len(shape) > 0:
        try:
            return int(shape[0])
        except (TypeError, ValueError):
            return None
    return None


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return math.nan
    s = sorted(values)
    k = (len(s) - 1) * q
    lo, hi = math.floor(k), math.ceil(k)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


class Profiler:
    """Iterable wrapper around a loader that measures waiting against computing.

    Use :func:`profile` to create one. Iterating yields the loader's batches
    unchanged; iterating again (the next epoch) keeps adding to the same totals.
    The sampler thread runs only while a loop is running; it stops when the loop
    ends, breaks or raises, and on :meth:`close`.
    """

    def __init__(
        self,
        loader: Iterable[Any],
        *,
        log_every: int | None = None,
        writer: Any = None,
        sync_cuda: bool = True,
        sample_interval: float = 0.5,
        warmup: int = 0,
        threshold: float = INPUT_BOUND_THRESHOLD,
        name: str | None = None,
        log_summary: bool = True,
    ) -> None:
        if not hasattr(loader, "__iter__"):
            raise ConfigError(f"profile(loader=...): expected an iterable of batches, got {type(loader).__name__}")
        if log_every is not None and (isinstance(log_every, bool) or not isinstance(log_every, int) or log_every < 1):
            raise ConfigError(f"profile(log_every={log_every!r}): expected a positive integer or None")
        if writer is not None and not callable(getattr(writer, "add_scalar", None)):
            raise ConfigError(
                f"profile(writer=...): {type(writer).__name__} has no add_scalar(); pass a TensorBoard SummaryWriter"
            )
        if not isinstance(sample_interval, (int, float)) or isinstance(sample_interval, bool) or not sample_interval > 0:
            raise ConfigError(f"profile(sample_interval={sample_interval!r}): expected seconds > 0")
        if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
            raise ConfigError(f"profile(warmup={warmup!r}): expected an integer >= 0 (steps left out of the totals)")
        if not isinstance(threshold, (int, float)) or not 0 < threshold < 1:
            raise ConfigError(f"profile(threshold={threshold!r}): expected a share of the step time in (0, 1)")
        self.loader = loader
        self.log_every = log_every
        self.writer = writer
        self.sync_cuda = bool(sync_cuda)
        self.sample_interval = float(sample_interval)
        self.warmup = warmup
        self.threshold = float(threshold)
        self.name = name or type(loader).__name__
        self.log_summary = bool(log_summary)
        self._lock = threading.Lock()
        self._reset_state()
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._cpu: Any = None
        self._gpu: Any = None
        self._cpu_reason = ""
        self._gpu_reason = ""

    def _reset_state(self) -> None:
        self.steps = 0  # all steps, warm-up included
        self._waits: list[float] = []  # measured steps only (after warm-up)
        self._computes: list[float] = []
        self._samples = 0
        self._samples_known = True
        self._warm_wait = 0.0
        self._measure_start: float | None = None  # monotonic time the first measured wait began
        self._cpu_util: list[float] = []
        self._gpu_util: list[float] = []
        self._last_log_step = 0

    def reset(self) -> None:
        """Forget everything measured so far (the warm-up applies again)."""
        with self._lock:
            self._reset_state()

    def __len__(self) -> int:
        return len(self.loader)  # type: ignore[arg-type]

    def __repr__(self) -> str:
        return f"Profiler({self.name}, steps={self.steps})"

    # -- the loop ---------------------------------------------------------------------------
    def __iter__(self) -> Iterator[Any]:
        sync = _cuda_synchronize if self.sync_cuda else None
        handed_over: float | None = None  # when the last batch was yielded
        pending_step: int | None = None  # step whose compute time is still open
        it: Any = None
        self._start_sampler()
        try:
            it = iter(self.loader)
            while True:
                if sync is not None:
                    sync()
                t_request = time.perf_counter()
                if pending_step is not None and handed_over is not None:
                    self._end_step(pending_step, t_request - handed_over)
                    pending_step = None
                try:
                    batch = next(it)
                except StopIteration:
                    handed_over = None
                    return
                if sync is not None:
                    sync()
                t_got = time.perf_counter()
                pending_step = self._begin_step(t_got - t_request, batch)
                handed_over = time.perf_counter()
                yield batch
        finally:
            if pending_step is not None and handed_over is not None:
                # the loop broke or raised after the last batch: close its compute time
                if sync is not None:
                    sync()
                self._end_step(pending_step, time.perf_counter() - handed_over)
            self._stop_sampler()
            if inspect.isgenerator(it):  # run the loader's own clean-up now, not at GC
                with contextlib.suppress(Exception):
                    it.close()
            self._log_summary()

    def _begin_step(self, wait: float, batch: Any) -> int:
        with self._lock:
            step = self.steps
            self.steps += 1
            if step < self.warmup:
                self._warm_wait += wait
                return step
            if self._measure_start is None:
                self._measure_start = time.monotonic() - wait
            self._waits.append(wait)
            n = _batch_size(batch)
            if n is None:
                self._samples_known = False
            else:
                self._samples += n
        return step

    def _end_step(self, step: int, compute: float) -> None:
        with self._lock:
            if step >= self.warmup:
                self._computes.append(compute)
            measured = len(self._computes)
        if self.writer is not None and step >= self.warmup:
            self._write_step(step, self._waits[measured - 1], compute)
        if self.log_every and measured and measured % self.log_every == 0 and measured != self._last_log_step:
            self._last_log_step = measured
            log.info("%s", self.progress_line())
            if self.writer is not None:
                self._write_aggregates(step)

    # -- sampling ---------------------------------------------------------------------------
    def _start_sampler(self) -> None:
        if self._thread is not None and self._thread.is_alive():
            return
        try:
            self._cpu = make_cpu_sampler()
        except Exception as e:  # a sampler must never break the loop
            self._cpu, self._cpu_reason = None, f"CPU sampler failed: {e}"
        try:
            self._gpu = make_gpu_sampler()
        except Exception as e:
            self._gpu, self._gpu_reason = None, f"GPU sampler failed: {e}"
        for sampler, attr in ((self._cpu, "_cpu_reason"), (self._gpu, "_gpu_reason")):
            if sampler is not None and not sampler.available:
                setattr(self, attr, getattr(sampler, "reason", "") or "not available")
        self._stop.clear()
        self._thread = threading.Thread(target=self._sample_loop, name="fastload-profile", daemon=True)
        try:
            self._thread.start()
        except RuntimeError as e:  # no thread to spare: the loop is measured without utilisation samples
            self._cpu_reason = self._gpu_reason = f"no sampling thread ({e})"
            self._cpu = self._gpu = None
            self._thread = None

    def _sample_loop(self) -> None:
        while not self._stop.wait(self.sample_interval):
            self._sample_once()

    def _sample_once(self) -> None:
        cpu = gpu = None
        try:
            cpu = self._cpu.sample() if self._cpu is not None and self._cpu.available else None
            gpu = self._gpu.sample() if self._gpu is not None and self._gpu.available else None
        except Exception as e:  # pragma: no cover - sampling is best effort
            log.debug("fastload.profile: sampling failed: %s", e)
        with self._lock:
            if self._measure_start is None:  # still warming up
                return
            if cpu is not None:
                self._cpu_util.append(cpu)
            if gpu is not None:
                self._gpu_util.append(gpu)

    def _stop_sampler(self) -> None:
        thread, self._thread = self._thread, None
        if thread is None:
            return
        self._stop.set()
        thread.join(timeout=max(5.0, 4 * self.sample_interval))
        self._sample_once()  # the tail since the last sample (and loops shorter than one interval)
        for sampler, attr in ((self._cpu, "_cpu_reason"), (self._gpu, "_gpu_reason")):
            if sampler is not None:
                setattr(self, attr, "" if sampler.available else (getattr(sampler, "reason", "") or "not available"))
                with contextlib.suppress(Exception):  # best effort clean-up
                    sampler.close()
        self._cpu = self._gpu = None

    def close(self) -> None:
        """Stop the sampler thread (also done automatically at the end of each loop)."""
        self._stop_sampler()

    def __enter__(self) -> "Profiler":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:  # pragma: no cover - best effort
        try:
            self._stop.set()
        except Exception:
            pass

    # -- results ----------------------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        """Every number as a dict (times in seconds unless the key says ms; shares in 0..1).

        Keys: ``steps`` (measured), ``warmup_steps``, ``samples``, ``wait_s``, ``compute_s``,
        ``elapsed_s``, ``wait_fraction``, ``wait_ms``/``compute_ms``/``step_ms`` (mean per step),
        ``step_ms_p50``/``step_ms_p90``, ``wait_ms_p50``/``wait_ms_p90``, ``images_per_s``,
        ``steps_per_s``, ``gpu_util``/``cpu_util`` (``{"mean", "max", "samples"}`` or
        ``"unavailable"``), ``gpu_reason``/``cpu_reason``, ``verdict``, ``suggestion``.
        """
        with self._lock:
            waits = list(self._waits[: len(self._computes)])
            computes = list(self._computes)
            open_wait = self._waits[len(computes) :]
            samples = self._samples if self._samples_known else None
            cpu_util, gpu_util = list(self._cpu_util), list(self._gpu_util)
            warm_steps = min(self.steps, self.warmup)
        n = len(computes)
        wait_s = sum(waits) + sum(open_wait)
        compute_s = sum(computes)
        elapsed = wait_s + compute_s
        steps_all = n + len(open_wait)
        step_times = [w + c for w, c in zip(waits, computes)]
        d: dict[str, Any] = {
            "name": self.name,
            "steps": steps_all,
            "warmup_steps": warm_steps,
            "samples": samples,
            "wait_s": wait_s,
            "compute_s": compute_s,
            "elapsed_s": elapsed,
            "wait_fraction": (wait_s / elapsed) if elapsed > 0 else None,
            "wait_ms": 1e3 * wait_s / steps_all if steps_all else None,
            "compute_ms": 1e3 * compute_s / n if n else None,
            "step_ms": 1e3 * (sum(step_times) / n) if n else None,
            "step_ms_p50": 1e3 * statistics.median(step_times) if step_times else None,
            "step_ms_p90": 1e3 * _percentile(step_times, 0.9) if step_times else None,
            "wait_ms_p50": 1e3 * statistics.median(waits) if waits else None,
            "wait_ms_p90": 1e3 * _percentile(waits, 0.9) if waits else None,
            "images_per_s": (samples / elapsed) if samples is not None and elapsed > 0 else None,
            "steps_per_s": (steps_all / elapsed) if elapsed > 0 else None,
            "gpu_util": _util(gpu_util),
            "cpu_util": _util(cpu_util),
            "gpu_reason": "" if gpu_util else (self._gpu_reason or _NO_SAMPLES),
            "cpu_reason": "" if cpu_util else (self._cpu_reason or _NO_SAMPLES),
        }
        d["verdict"], d["suggestion"] = self._verdict(d)
        return d

    def _verdict(self, d: dict[str, Any]) -> tuple[str, str]:
        frac = d["wait_fraction"]
        if frac is None:
            return "unknown", "no steps measured yet: run the loop (past the warm-up) first"
        if frac <= self.threshold:
            text = (
                f"the input pipeline keeps up (waiting {frac:.0%} of each step); optimise the model instead "
                "(AMP, channels_last, torch.compile, a larger batch)"
            )
            cpu = d["cpu_util"]
            if isinstance(cpu, dict) and cpu["mean"] >= 90:
                text += (
                    f"; note the CPUs are saturated ({cpu['mean']:.0f}%): if the model runs on the CPU, "
                    "decoding competes with it for the cores"
                )
            return "compute-bound", text
        return "input-bound", _input_suggestion(self.loader, d)

    def summary(self) -> str:
        """A few lines: the verdict, the numbers behind it and what to do."""
        d = self.stats()
        if d["verdict"] == "unknown":
            return f"fastload.profile({self.name}): {d['suggestion']}"
        lines = [
            f"fastload.profile({self.name}): {d['verdict'].upper()} - waiting for data "
            f"{d['wait_fraction']:.0%} of each step",
            f"  steps {d['steps']} (after {d['warmup_steps']} warm-up), per step: wait {d['wait_ms']:.1f} ms, "
            f"compute {_fmt(d['compute_ms'], '.1f')} ms, total {_fmt(d['step_ms'], '.1f')} ms"
            + (f"; {d['images_per_s']:.0f} images/s" if d["images_per_s"] else ""),
            f"  GPU util {_fmt_util(d['gpu_util'], d['gpu_reason'])}; CPU util {_fmt_util(d['cpu_util'], d['cpu_reason'])}",
            f"  suggestion: {d['suggestion']}",
        ]
        return "\n".join(lines)

    def progress_line(self) -> str:
        d = self.stats()
        frac = d["wait_fraction"]
        parts = [f"step {self.steps}", f"waiting {frac:.0%}" if frac is not None else "waiting ?"]
        if d["step_ms"] is not None:
            parts.append(f"{d['step_ms']:.1f} ms/step")
        if d["images_per_s"]:
            parts.append(f"{d['images_per_s']:.0f} img/s")
        for key in ("gpu", "cpu"):
            u, why = d[f"{key}_util"], d[f"{key}_reason"]
            parts.append(f"{key.upper()} " + ("-" if why == _NO_SAMPLES else _fmt_util(u, "", short=True)))
        return f"fastload.profile({self.name}): " + ", ".join(parts)

    def _log_summary(self) -> None:
        if self._computes and self.log_summary:
            log.info("%s", self.summary())
            if self.writer is not None:
                self._write_aggregates(self.steps)

    # -- TensorBoard ------------------------------------------------------------------------
    def _write_step(self, step: int, wait: float, compute: float) -> None:
        try:
            self.writer.add_scalar("fastload/wait_ms", 1e3 * wait, step)
            self.writer.add_scalar("fastload/step_ms", 1e3 * (wait + compute), step)
        except Exception as e:  # pragma: no cover - a writer problem must not stop training
            log.warning("fastload.profile: writer.add_scalar failed (%s); no more scalars", e)
            self.writer = None

    def _write_aggregates(self, step: int) -> None:
        d = self.stats()
        values = {"fastload/wait_fraction": d["wait_fraction"], "fastload/images_per_s": d["images_per_s"]}
        for k in ("gpu_util", "cpu_util"):
            if isinstance(d[k], dict):
                values[f"fastload/{k}"] = d[k]["mean"]
        try:
            for tag, v in values.items():
                if v is not None:
                    self.writer.add_scalar(tag, float(v), step)
        except Exception as e:  # pragma: no cover
            log.warning("fastload.profile: writer.add_scalar failed (%s); no more scalars", e)
            self.writer = None


def _util(values: list[float]) -> dict[str, Any] | str:
    if not values:
        return UNAVAILABLE
    return {"mean": sum(values) / len(values), "max": max(values), "samples": len(values)}


def _fmt(v: float | None, spec: str) -> str:
    return "?" if v is None else format(v, spec)


def _fmt_util(u: Any, reason: str, short: bool = False) -> str:
    if isinstance(u, dict):
        return f"{u['mean']:.0f}%" + ("" if short else f" (max {u['max']:.0f}%)")
    return UNAVAILABLE + (f" ({reason})" if reason and not short else "")


def _input_suggestion(loader: Any, d: dict[str, Any]) -> str:
    """A concrete next step for an input-bound loop, from what the loader is."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    cpu = d["cpu_util"]
    cpu_busy = isinstance(cpu, dict) and cpu["mean"] >= 85
    kind = type(loader).__name__
    if kind == "FastLoader":
        device = str(getattr(loader, "device", "") or "")
        if device.startswith("cpu"):
            return (
                "FastLoader runs DALI's CPU pipeline here and the CPUs cannot decode faster; "
                "use device='cuda' to decode on the GPU"
            )
        return (
            "raise FastLoader(prefetch=...) (batches in flight) and num_threads; "
            "if the GPU decoder is saturated, pack smaller images (fastload pack --max-size)"
        )
    workers = getattr(loader, "num_workers", None)
    fix = "switch to fastload.FastLoader(path, batch_size, device='cuda') after `fastload pack SRC DST`"
    if isinstance(workers, int):
        if workers == 0 or (workers < cores and not cpu_busy):
            return f"raise num_workers (now {workers}, the machine has {cores} cores), or {fix}"
        return (
            f"the CPUs are saturated decoding images (num_workers={workers}, {cores} cores); "
            f"{fix} to decode on the GPU"
        )
    return f"the input pipeline is the bottleneck; {fix}"


def profile(
    loader: Iterable[Any],
    *,
    log_every: int | None = None,
    writer: Any = None,
    sync_cuda: bool = True,
    sample_interval: float = 0.5,
    warmup: int = 0,
    threshold: float = INPUT_BOUND_THRESHOLD,
    name: str | None = None,
    log_summary: bool = True,
) -> Profiler:
    """Wrap ``loader`` (a DataLoader, a FastLoader, any iterable of batches) to see if it keeps up.

    ``for x, y in (prof := fastload.profile(loader)): ...`` then ``prof.summary()``.

    Args:
        loader: any iterable of batches; batches pass through unchanged.
        log_every: also log a progress line (and TensorBoard aggregates) every N measured steps.
        writer: a TensorBoard ``SummaryWriter`` (anything with ``add_scalar(tag, value, step)``).
        sync_cuda: synchronise the current CUDA stream (not the device) around each wait, so the
            step's queued GPU work counts as computing while the loader's streams run on.
        sample_interval: seconds between GPU/CPU utilisation samples.
        warmup: leading steps left out of the totals (worker start-up, cuDNN autotuning).
        threshold: waiting above this share of the step time is reported as input-bound.
        name: label used in logs (default: the loader's class name).
        log_summary: log :meth:`~Profiler.summary` at the end of each loop.

    Returns:
        A :class:`Profiler`; its :meth:`~Profiler.summary` and :meth:`~Profiler.stats` report.
    """
    return Profiler(
        loader,
        log_every=log_every,
        writer=writer,
        sync_cuda=sync_cuda,
        sample_interval=sample_interval,
        warmup=warmup,
        threshold=threshold,
        name=name,
        log_summary=log_summary,
    )
