"""fastload.profile: wait-vs-compute verdicts on synthetic loops, samplers, clean shutdown."""

from __future__ import annotations

import importlib
import logging
import sys
import threading
import time
import types

import numpy as np
import pytest

import fastload
from fastload.errors import ConfigError

prof_mod = importlib.import_module("fastload.profile")  # `fastload.profile` is the function


class SleepyLoader:
    """Yields ``n`` batches of ``(images [bs, 3, 4, 4], labels [bs])``, sleeping ``delay`` s before each."""

    def __init__(self, n: int = 8, delay: float = 0.0, bs: int = 4, first_delay: float | None = None) -> None:
        self.n, self.delay, self.bs, self.first_delay = n, delay, bs, first_delay
        self.closed_iterators = 0

    def __len__(self) -> int:
        return self.n

    def __iter__(self):
        try:
            for i in range(self.n):
                d = self.first_delay if (i == 0 and self.first_delay is not None) else self.delay
                if d:
                    time.sleep(d)
                yield np.zeros((self.bs, 3, 4, 4), np.float32), np.arange(self.bs)
        finally:
            self.closed_iterators += 1


def _profile_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "fastload-profile" and t.is_alive()]


def test_sleeping_loader_is_input_bound():
    prof = fastload.profile(SleepyLoader(n=8, delay=0.03), sample_interval=0.05)
    seen = 0
    for images, labels in prof:
        seen += len(labels)
    s = prof.stats()
    assert seen == 32 and s["steps"] == 8 and s["samples"] == 32
    assert s["verdict"] == "input-bound"
    assert s["wait_fraction"] > 0.7
    assert 25 <= s["wait_ms"] <= 200
    assert s["images_per_s"] == pytest.approx(32 / s["elapsed_s"])
    text = prof.summary()
    assert "INPUT-BOUND" in text and f"{s['wait_fraction']:.0%}" in text
    assert "fastload.FastLoader" in text  # a concrete suggestion
    assert not _profile_threads()


def test_sleeping_step_is_compute_bound():
    prof = fastload.profile(SleepyLoader(n=8), sample_interval=0.05)
    for _ in prof:
        time.sleep(0.03)
    s = prof.stats()
    assert s["verdict"] == "compute-bound"
    assert s["wait_fraction"] < 0.1
    assert s["compute_ms"] >= 25
    assert "optimise the model" in prof.summary()
    assert "COMPUTE-BOUND" in prof.summary()


class FakeCpu:
    available = True
    reason = ""

    def __init__(self, percent: float) -> None:
        self.percent = percent

    def sample(self) -> float:
        return self.percent

    def close(self) -> None:
        pass


@pytest.mark.parametrize(
    "workers, cpu, expect",
    [(0, 100.0, "raise num_workers (now 0"), (1, 10.0, "raise num_workers (now 1"), (2, 100.0, "CPUs are saturated")],
)
def test_dataloader_suggestion_follows_workers_and_cpu(monkeypatch, workers, cpu, expect):
    monkeypatch.setattr(prof_mod, "make_cpu_sampler", lambda: FakeCpu(cpu))
    monkeypatch.setattr(prof_mod.os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    loader = SleepyLoader(n=4, delay=0.03)
    loader.num_workers = workers  # what a torch DataLoader exposes
    prof = fastload.profile(loader, sample_interval=0.01)
    for _ in prof:
        pass
    s = prof.stats()
    assert s["verdict"] == "input-bound"
    assert s["cpu_util"]["mean"] == cpu
    assert expect in s["suggestion"]
    assert "fastload.FastLoader" in s["suggestion"]


def test_warmup_steps_are_left_out():
    loader = SleepyLoader(n=6, first_delay=0.3)
    prof = fastload.profile(loader, warmup=1, sample_interval=10)
    for _ in prof:
        time.sleep(0.01)
    s = prof.stats()
    assert s["steps"] == 5 and s["warmup_steps"] == 1 and s["samples"] == 20
    assert s["verdict"] == "compute-bound"  # the slow first batch is not counted
    cold = fastload.profile(SleepyLoader(n=6, first_delay=0.3), sample_interval=10)
    for _ in cold:
        time.sleep(0.01)
    assert cold.stats()["verdict"] == "input-bound"


def test_break_and_exception_stop_the_sampler_and_close_the_loader():
    loader = SleepyLoader(n=50)
    prof = fastload.profile(loader, sample_interval=0.01)
    for i, _ in enumerate(prof):
        assert len(_profile_threads()) == 1
        time.sleep(0.005)
        if i == 2:
            break
    assert not _profile_threads()
    assert loader.closed_iterators == 1
    assert prof.stats()["steps"] == 3
    assert prof.stats()["compute_ms"] >= 4  # the last step's compute is closed at the break

    with pytest.raises(RuntimeError, match="boom"):
        for i, _ in enumerate(prof):
            if i == 1:
                raise RuntimeError("boom")
    assert not _profile_threads()
    assert loader.closed_iterators == 2
    assert prof.stats()["steps"] == 5  # iterating again keeps adding (epochs)


def test_a_loader_error_propagates_and_stops_the_sampler():
    class Broken:
        def __iter__(self):
            yield np.zeros((2, 3)), np.zeros(2)
            raise OSError("shard vanished")

    class NoIter:
        def __iter__(self):
            raise OSError("cannot start workers")

    for loader in (Broken(), NoIter()):
        prof = fastload.profile(loader, sample_interval=0.01)
        with pytest.raises(OSError):
            for _ in prof:
                pass
        assert not _profile_threads()


def test_cuda_sync_moves_queued_gpu_work_from_waiting_to_computing(monkeypatch):
    """A step that only queues 'GPU work' must not look input-bound when syncing is on."""

    class FakeGPU:
        busy_until = 0.0

        def queue(self, seconds: float) -> None:
            self.busy_until = time.perf_counter() + seconds

        def synchronize(self) -> None:
            left = self.busy_until - time.perf_counter()
            if left > 0:
                time.sleep(left)

    gpu = FakeGPU()

    class GpuLoader(SleepyLoader):
        def __iter__(self):
            for batch in super().__iter__():
                gpu.synchronize()  # a GPU loader blocks behind the queued work
                yield batch

    monkeypatch.setattr(prof_mod, "_cuda_synchronize", gpu.synchronize)
    results = {}
    for sync in (True, False):
        prof = fastload.profile(GpuLoader(n=6), sync_cuda=sync, sample_interval=10)
        for _ in prof:
            gpu.queue(0.03)  # returns at once, like an asynchronous CUDA launch
        results[sync] = prof.stats()["verdict"]
    assert results == {True: "compute-bound", False: "input-bound"}


def test_no_nvml_means_gpu_unavailable_not_a_crash(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml -> ImportError
    prof = fastload.profile(SleepyLoader(n=3, delay=0.01), sample_interval=0.01)
    for _ in prof:
        pass
    s = prof.stats()
    assert s["gpu_util"] == "unavailable"
    assert "nvidia-ml-py" in s["gpu_reason"]
    assert "GPU util unavailable" in prof.summary()


def test_nvml_without_driver_means_unavailable(monkeypatch):
    class NVMLError(Exception):
        pass

    class NVMLError_LibraryNotFound(NVMLError):
        pass

    def init():
        raise NVMLError_LibraryNotFound("NVML Shared Library Not Found")

    fake = types.SimpleNamespace(nvmlInit=init, NVMLError=NVMLError)
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    monkeypatch.setattr(prof_mod, "make_cpu_sampler", lambda: (_ for _ in ()).throw(RuntimeError("no psutil here")))
    prof = fastload.profile(SleepyLoader(n=3, delay=0.01), sample_interval=0.01)
    for _ in prof:
        pass
    s = prof.stats()
    assert s["gpu_util"] == "unavailable" and "no NVIDIA driver" in s["gpu_reason"]
    assert s["cpu_util"] == "unavailable" and "no psutil here" in s["cpu_reason"]
    assert s["verdict"] == "input-bound"  # the timing still works


def test_gpu_utilisation_is_sampled_through_nvml(monkeypatch):
    calls = {"init": 0, "shutdown": 0}
    fake = types.SimpleNamespace(
        nvmlInit=lambda: calls.__setitem__("init", calls["init"] + 1),
        nvmlShutdown=lambda: calls.__setitem__("shutdown", calls["shutdown"] + 1),
        nvmlDeviceGetCount=lambda: 1,
        nvmlDeviceGetHandleByIndex=lambda i: ("handle", i),
        nvmlDeviceGetUtilizationRates=lambda h: types.SimpleNamespace(gpu=42, memory=10),
    )
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    prof = fastload.profile(SleepyLoader(n=6, delay=0.02), sample_interval=0.01)
    for _ in prof:
        pass
    s = prof.stats()
    assert s["gpu_util"]["mean"] == 42 and s["gpu_util"]["samples"] >= 1
    assert calls["init"] == 1 and calls["shutdown"] == 1
    assert "GPU util 42%" in prof.summary()
    assert isinstance(s["cpu_util"], dict) and 0 <= s["cpu_util"]["mean"] <= 100


def test_tensorboard_writer_and_log_every(caplog):
    class FakeWriter:
        def __init__(self) -> None:
            self.scalars: list[tuple[str, float, int]] = []

        def add_scalar(self, tag, value, step):
            self.scalars.append((tag, float(value), int(step)))

    w = FakeWriter()
    with caplog.at_level(logging.INFO, logger="fastload.profile"):
        prof = fastload.profile(SleepyLoader(n=6, delay=0.01), writer=w, log_every=2, sample_interval=10)
        for _ in prof:
            pass
    tags = {t for t, _, _ in w.scalars}
    assert {"fastload/wait_ms", "fastload/step_ms", "fastload/wait_fraction", "fastload/images_per_s"} <= tags
    steps = [s for t, _, s in w.scalars if t == "fastload/wait_ms"]
    assert steps == list(range(6))
    wait_ms = [v for t, v, _ in w.scalars if t == "fastload/wait_ms"]
    assert all(5 <= v <= 200 for v in wait_ms)
    progress = [r.getMessage() for r in caplog.records if "step " in r.getMessage() and "waiting" in r.getMessage()]
    assert len(progress) == 3  # steps 2, 4, 6
    assert any("INPUT-BOUND" in r.getMessage() for r in caplog.records)  # the summary at loop end


def test_stats_before_any_step_and_len():
    prof = fastload.profile(SleepyLoader(n=5))
    assert len(prof) == 5
    s = prof.stats()
    assert s["verdict"] == "unknown" and s["steps"] == 0
    assert "no steps measured" in prof.summary()
    prof.close()  # harmless without a loop


@pytest.mark.parametrize(
    "kwargs, word",
    [
        ({"log_every": 0}, "log_every"),
        ({"writer": object()}, "add_scalar"),
        ({"sample_interval": 0}, "sample_interval"),
        ({"warmup": -1}, "warmup"),
        ({"threshold": 1.5}, "threshold"),
    ],
)
def test_bad_arguments_name_themselves(kwargs, word):
    with pytest.raises(ConfigError, match=word):
        fastload.profile(SleepyLoader(), **kwargs)
    with pytest.raises(ConfigError, match="iterable"):
        fastload.profile(5)  # type: ignore[arg-type]


# ----------------------------------------------------------------------------- which CUDA sync


def _count_cuda_syncs(monkeypatch, sync_cuda: bool) -> dict[str, int]:
    """Run a profiled loop of 3 steps with torch's CUDA calls recorded (CUDA 'initialised')."""
    import torch

    calls = {"device": 0, "stream": 0}

    class Stream:
        def synchronize(self) -> None:
            calls["stream"] += 1

    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: calls.__setitem__("device", calls["device"] + 1))
    monkeypatch.setattr(torch.cuda, "current_stream", lambda *a, **k: Stream())
    prof = fastload.profile(SleepyLoader(n=3), sync_cuda=sync_cuda, sample_interval=10)
    assert sum(1 for _ in prof) == 3
    return calls


def test_cuda_sync_waits_for_the_current_stream_never_the_whole_device(monkeypatch):
    calls = _count_cuda_syncs(monkeypatch, sync_cuda=True)
    assert calls["device"] == 0  # DALI's and the loader's streams keep working on the next batches
    assert calls["stream"] >= 2 * 3  # before and after each of the three waits


def test_cuda_sync_off_synchronises_nothing(monkeypatch):
    assert _count_cuda_syncs(monkeypatch, sync_cuda=False) == {"device": 0, "stream": 0}


@pytest.mark.gpu
def test_profiled_step_does_not_wait_for_work_on_another_stream():
    """A side stream busy for about a second (2e9 GPU cycles at 1-3 GHz; what the loader's copy
    stream and DALI's are to the training loop) must not be waited for at each step: the profiled
    loop finishes long before it."""
    import torch

    torch.cuda.init()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        torch.cuda._sleep(2_000_000_000)
    t0 = time.perf_counter()
    prof = fastload.profile(SleepyLoader(n=5), sample_interval=10)
    for _ in prof:
        torch.ones(8, device="cuda").sum()  # the step's own GPU work, on the current stream
    elapsed = time.perf_counter() - t0
    still_busy = not side.query()
    side.synchronize()
    assert still_busy and elapsed < 0.4, f"the loop took {elapsed:.2f} s: it waited for the side stream"
