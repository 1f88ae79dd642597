"""fastload.profile checked on loops whose every wait and step is known exactly.

The profiler reads time through its module's ``time``; the tests give it a clock that moves only when
the loader hands over a batch (by the step's *wait*) or when the loop body runs (by its *compute*),
so each number ``stats()`` reports is arithmetic on the test's own lists: sums, means, the median and
the 90th percentile (NumPy's ``percentile``, the same linear rule), images/s. Binary fractions
(0.25, 0.5) make the threshold comparisons exact, so ``profile(threshold=)`` is checked on both
sides of its boundary. Utilisation comes from samplers that return the test's values, sampled at
points the test chooses; the suggestions, the summary and the progress line are written out whole.
"""

from __future__ import annotations

import importlib
import logging
import os
import time as real_time
import types

import numpy as np
import pytest

import fastload
from fastload.errors import ConfigError

prof_mod = importlib.import_module("fastload.profile")  # `fastload.profile` is the function
CORES = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


class TimedLoader:
    """``len(waits)`` batches of ``bs`` samples; fetching batch ``i`` takes ``waits[i]`` on ``clock``."""

    def __init__(self, clock: Clock, waits, bs=4, batch=None) -> None:
        self.clock, self.waits, self.bs, self.batch = clock, list(waits), bs, batch
        self.closed = 0

    def __len__(self) -> int:
        return len(self.waits)

    def __iter__(self):
        try:
            for w in self.waits:
                self.clock.t += w
                yield self.batch if self.batch is not None else (np.zeros((self.bs, 3, 2, 2), np.float32), np.arange(self.bs))
        finally:
            self.closed += 1


class Sampler:
    """A utilisation sampler returning the given values in turn (then the last one again)."""

    def __init__(self, values, available=True, reason="") -> None:
        self.values, self.available, self.reason, self.closed = list(values), available, reason, False

    def sample(self):
        return self.values.pop(0) if len(self.values) > 1 else self.values[0]

    def close(self) -> None:
        self.closed = True


@pytest.fixture
def clock(monkeypatch):
    c = Clock()
    monkeypatch.setattr(prof_mod, "time", types.SimpleNamespace(perf_counter=c, monotonic=c, sleep=real_time.sleep))
    monkeypatch.setattr(prof_mod, "make_cpu_sampler", lambda: Sampler([None], available=False, reason="no psutil here"))
    monkeypatch.setattr(prof_mod, "make_gpu_sampler", lambda: Sampler([None], available=False, reason="no NVML here"))
    return c


def run(clock, waits, computes, **kw):
    kw.setdefault("sample_interval", 1000.0)
    kw.setdefault("sync_cuda", False)
    loader = kw.pop("loader", None) or TimedLoader(clock, waits)
    prof = fastload.profile(loader, **kw)
    for i, _ in enumerate(prof):
        clock.t += computes[i]
    return prof


def expected(waits, computes, bs=4, warmup=0):
    w, c = waits[warmup:], computes[warmup:]
    steps = [a + b for a, b in zip(w, c)]
    ws, cs = sum(w), sum(c)
    return {
        "steps": len(w), "warmup_steps": min(warmup, len(waits)), "samples": bs * len(w), "wait_s": ws,
        "compute_s": cs, "elapsed_s": ws + cs, "wait_fraction": ws / (ws + cs), "wait_ms": 1e3 * ws / len(w),
        "compute_ms": 1e3 * cs / len(c), "step_ms": 1e3 * sum(steps) / len(steps),
        "step_ms_p50": 1e3 * float(np.median(steps)), "step_ms_p90": 1e3 * float(np.percentile(steps, 90)),
        "wait_ms_p50": 1e3 * float(np.median(w)), "wait_ms_p90": 1e3 * float(np.percentile(w, 90)),
        "images_per_s": bs * len(w) / (ws + cs), "steps_per_s": len(w) / (ws + cs),
    }  # fmt: skip


WAITS = [0.5, 0.25, 1.0, 0.125, 0.25, 2.0, 0.5]
COMPUTES = [1.0, 2.0, 0.5, 1.5, 0.25, 1.0, 4.0]


@pytest.mark.parametrize("warmup", [0, 1, 3])
def test_every_number_of_stats_is_the_arithmetic_of_the_loop(clock, warmup):
    """Kills: a wait or compute taken from the wrong clock reading; warm-up steps counted (or the
    count off by one); a mean over the wrong count; p90 as another quantile or the median of the
    other list; images/s over the wait or compute time only; the name or the reasons wrong."""
    prof = run(clock, WAITS, COMPUTES, warmup=warmup, name="mine")
    s = prof.stats()
    for k, v in expected(WAITS, COMPUTES, warmup=warmup).items():
        assert s[k] == pytest.approx(v, rel=1e-12, abs=1e-12), k
    assert s["name"] == "mine" and prof.steps == len(WAITS)
    assert s["gpu_util"] == s["cpu_util"] == "unavailable"
    assert (s["gpu_reason"], s["cpu_reason"]) == ("no NVML here", "no psutil here")
    assert repr(prof) == f"Profiler(mine, steps={len(WAITS)})"


def test_a_second_epoch_adds_to_the_totals_and_reset_forgets(clock):
    """Kills: the totals reset on each loop; ``reset`` keeping some list."""
    loader = TimedLoader(clock, WAITS[:3])
    prof = fastload.profile(loader, sample_interval=1000.0, sync_cuda=False, warmup=1)
    for epoch in range(2):
        for i, _ in enumerate(prof):
            clock.t += COMPUTES[i]
    s = prof.stats()
    w, c = WAITS[1:3] + WAITS[:3], COMPUTES[1:3] + COMPUTES[:3]
    assert s["steps"] == 5 and s["warmup_steps"] == 1 and s["samples"] == 20
    assert s["wait_s"] == pytest.approx(sum(w)) and s["compute_s"] == pytest.approx(sum(c))
    assert loader.closed == 2
    prof.reset()
    s = prof.stats()
    assert (s["steps"], s["warmup_steps"], s["samples"], s["wait_s"], s["verdict"]) == (0, 0, 0, 0, "unknown")
    for i, _ in enumerate(prof):
        clock.t += COMPUTES[i]
    assert prof.stats()["steps"] == 2  # the warm-up applies again


def test_a_break_closes_the_open_step_and_an_unfinished_step_counts_its_wait(clock):
    """A loop that breaks after its third batch: that step's compute runs to the break. ``stats()``
    inside the loop counts the wait of the step in progress, not its compute. Kills: the open step
    dropped; the open wait left out of ``wait_s`` and ``steps``."""
    loader = TimedLoader(clock, WAITS)
    prof = fastload.profile(loader, sample_interval=1000.0, sync_cuda=False)
    inside = None
    for i, _ in enumerate(prof):
        if i == 1:
            inside = prof.stats()
        clock.t += COMPUTES[i]
        if i == 2:
            break
    assert inside["steps"] == 2 and inside["wait_s"] == pytest.approx(WAITS[0] + WAITS[1])
    assert inside["compute_s"] == pytest.approx(COMPUTES[0]) and inside["step_ms"] == pytest.approx(1e3 * 1.5)
    assert inside["wait_ms"] == pytest.approx(1e3 * 0.75 / 2)
    s = prof.stats()
    for k, v in expected(WAITS[:3], COMPUTES[:3]).items():
        assert s[k] == pytest.approx(v), k
    assert loader.closed == 1


# waits 1, computes 3: waiting exactly 25 % of each step
@pytest.mark.parametrize(
    "threshold, verdict",
    [(0.25, "compute-bound"), (0.2, "input-bound"), (0.5, "compute-bound"), (0.125, "input-bound"), (0.999, "compute-bound")],
)
def test_threshold_decides_the_verdict_on_both_sides_of_its_boundary(clock, threshold, verdict):
    """Waiting exactly 25 %: compute-bound at ``threshold=0.25`` (the boundary is "above"), input-bound
    below it. Kills: the threshold ignored (the default 0.25 used), ``<`` for ``<=``, the share inverted."""
    prof = run(clock, [1.0] * 4, [3.0] * 4, threshold=threshold)
    s = prof.stats()
    assert s["wait_fraction"] == 0.25 and s["verdict"] == verdict
    assert prof.threshold == threshold


def test_the_default_threshold_is_a_quarter(clock):
    assert prof_mod.INPUT_BOUND_THRESHOLD == 0.25
    assert run(clock, [1.0] * 4, [3.0] * 4).stats()["verdict"] == "compute-bound"
    assert run(clock, [1.0] * 4, [2.9375] * 4).stats()["verdict"] == "input-bound"


@pytest.mark.parametrize("cpu, note", [(90.0, True), (89.5, False), (100.0, True)])
def test_compute_bound_suggestion_notes_saturated_cpus_from_90_percent(clock, monkeypatch, cpu, note):
    monkeypatch.setattr(prof_mod, "make_cpu_sampler", lambda: Sampler([cpu]))
    s = run(clock, [1.0] * 4, [7.0] * 4).stats()
    text = ("the input pipeline keeps up (waiting 12% of each step); optimise the model instead (AMP, channels_last, "
            "torch.compile, a larger batch)")  # fmt: skip
    if note:
        text += (f"; note the CPUs are saturated ({cpu:.0f}%): if the model runs on the CPU, decoding competes "
                 "with it for the cores")  # fmt: skip
    assert (s["verdict"], s["suggestion"]) == ("compute-bound", text)


class FastLoader:
    """Stands for fastload.FastLoader where the profiler reads only the class name and ``device``."""

    def __init__(self, clock, waits, device) -> None:
        self.inner, self.device = TimedLoader(clock, waits), device

    def __iter__(self):
        return iter(self.inner)


class WorkerLoader(TimedLoader):
    def __init__(self, clock, waits, num_workers) -> None:
        super().__init__(clock, waits)
        self.num_workers = num_workers


FIX = "switch to fastload.FastLoader(path, batch_size, device='cuda') after `fastload pack SRC DST`"


@pytest.mark.parametrize(
    "make, cpu, text",
    [
        (lambda c: FastLoader(c, [3.0] * 3, "cpu"), 10.0,
         "FastLoader runs DALI's CPU pipeline here and the CPUs cannot decode faster; use device='cuda' to decode on the GPU"),
        (lambda c: FastLoader(c, [3.0] * 3, "cuda:0"), 10.0,
         "raise FastLoader(prefetch=...) (batches in flight) and num_threads; if the GPU decoder is saturated, pack "
         "smaller images (fastload pack --max-size)"),
        (lambda c: FastLoader(c, [3.0] * 3, None), 10.0,
         "raise FastLoader(prefetch=...) (batches in flight) and num_threads; if the GPU decoder is saturated, pack "
         "smaller images (fastload pack --max-size)"),
        (lambda c: WorkerLoader(c, [3.0] * 3, 0), 99.0, f"raise num_workers (now 0, the machine has {CORES} cores), or {FIX}"),
        (lambda c: WorkerLoader(c, [3.0] * 3, CORES - 1), 84.5,
         f"raise num_workers (now {CORES - 1}, the machine has {CORES} cores), or {FIX}"),
        (lambda c: WorkerLoader(c, [3.0] * 3, CORES - 1), 85.0,
         f"the CPUs are saturated decoding images (num_workers={CORES - 1}, {CORES} cores); {FIX} to decode on the GPU"),
        (lambda c: WorkerLoader(c, [3.0] * 3, CORES), 10.0,
         f"the CPUs are saturated decoding images (num_workers={CORES}, {CORES} cores); {FIX} to decode on the GPU"),
        (lambda c: TimedLoader(c, [3.0] * 3), 10.0, f"the input pipeline is the bottleneck; {FIX}"),
    ],
)  # fmt: skip
def test_input_bound_suggestions(clock, monkeypatch, make, cpu, text):
    """Each suggestion written out whole, the CPU-busy boundary (85 %) on both sides. Kills: the branch
    tests inverted or off by one (``<=`` cores, ``> 85``), the cores or the workers misreported."""
    if CORES < 2:
        pytest.skip("needs 2 cores to tell 'fewer workers than cores' from 'none'")
    monkeypatch.setattr(prof_mod, "make_cpu_sampler", lambda: Sampler([cpu]))
    s = run(clock, None, [1.0] * 3, loader=make(clock)).stats()
    assert (s["verdict"], s["suggestion"]) == ("input-bound", text)


def test_utilisation_mean_max_and_count_from_the_samples_taken_after_the_warm_up(clock, monkeypatch):
    """Samples come in while the loop runs (here at chosen points) and once more at its end; those
    taken during the warm-up are dropped. Kills: mean for max, a sample kept from the warm-up, the
    final sample skipped, GPU and CPU swapped, the samplers not closed."""
    cpu, gpu = Sampler([11.0, 20.0, 40.0, 60.0]), Sampler([5.0, 50.0, 70.0, 90.0])
    monkeypatch.setattr(prof_mod, "make_cpu_sampler", lambda: cpu)
    monkeypatch.setattr(prof_mod, "make_gpu_sampler", lambda: gpu)
    loader = TimedLoader(clock, [1.0] * 4)
    prof = fastload.profile(loader, sample_interval=1000.0, sync_cuda=False, warmup=1)
    for i, _ in enumerate(prof):
        if i in (0, 2, 3):
            prof._sample_once()  # the sampler thread's one step, at a known point
        clock.t += 1.0
    s = prof.stats()
    # step 0 is the warm-up: its sample (11, 5) is dropped; 20/40 and 50/70 taken, then 60/90 at the end
    assert s["cpu_util"] == {"mean": 40.0, "max": 60.0, "samples": 3}
    assert s["gpu_util"] == {"mean": 70.0, "max": 90.0, "samples": 3}
    assert (s["cpu_reason"], s["gpu_reason"]) == ("", "")
    assert cpu.closed and gpu.closed
    assert prof.summary().splitlines()[2] == "  GPU util 70% (max 90%); CPU util 40% (max 60%)"


def test_samplers_that_fail_or_are_unavailable_are_reported_not_raised(clock, monkeypatch):
    def broken():
        raise OSError("nvml is broken")

    monkeypatch.setattr(prof_mod, "make_gpu_sampler", broken)
    monkeypatch.setattr(prof_mod, "make_cpu_sampler", lambda: Sampler([None], available=False))
    s = run(clock, [1.0] * 2, [1.0] * 2).stats()
    assert (s["gpu_util"], s["gpu_reason"]) == ("unavailable", "GPU sampler failed: nvml is broken")
    assert (s["cpu_util"], s["cpu_reason"]) == ("unavailable", "not available")
    fresh = fastload.profile(TimedLoader(clock, [1.0]), sample_interval=1000.0)
    assert (fresh.stats()["gpu_reason"], fresh.stats()["cpu_reason"]) == ("no samples yet", "no samples yet")


def test_summary_and_progress_line_written_out(clock, monkeypatch):
    """Kills: any number or word of the summary or the progress line changed, the images/s part kept
    when it is unknown."""
    monkeypatch.setattr(prof_mod, "make_cpu_sampler", lambda: Sampler([33.0]))
    prof = run(clock, [1.0, 3.0], [1.0, 3.0], name="L", warmup=0)
    assert prof.summary() == "\n".join([
        "fastload.profile(L): INPUT-BOUND - waiting for data 50% of each step",
        "  steps 2 (after 0 warm-up), per step: wait 2000.0 ms, compute 2000.0 ms, total 4000.0 ms; 1 images/s",
        "  GPU util unavailable (no NVML here); CPU util 33% (max 33%)",
        f"  suggestion: the input pipeline is the bottleneck; {FIX}",
    ])  # fmt: skip
    assert prof.progress_line() == "fastload.profile(L): step 2, waiting 50%, 4000.0 ms/step, 1 img/s, GPU unavailable, CPU 33%"
    unknown = run(clock, [1.0], [1.0], loader=TimedLoader(clock, [1.0], batch=[{"x": 3}]), name="U")
    assert unknown.stats()["samples"] is None and unknown.stats()["images_per_s"] is None
    assert "images/s" not in unknown.summary() and unknown.summary().splitlines()[1].endswith("total 2000.0 ms")
    assert "img/s" not in unknown.progress_line()
    empty = fastload.profile(TimedLoader(clock, []), name="E")
    assert empty.summary() == "fastload.profile(E): no steps measured yet: run the loop (past the warm-up) first"
    assert empty.progress_line() == "fastload.profile(E): step 0, waiting ?, GPU -, CPU -"


@pytest.mark.parametrize(
    "batch, n",
    [
        ((np.zeros((5, 3)), np.arange(5)), 5),
        ([np.zeros((6, 2))], 6),
        ({"image": np.zeros((7, 1)), "label": np.zeros(2)}, 7),
        ([[np.zeros((8,))]], 8),
        ([[[np.zeros((9,))]]], 9),
        ([[[[np.zeros((9,))]]]], None),  # four levels: not looked into
        (np.zeros(()), None),
        ([], None),
        ({}, None),
        ("text", None),
        (types.SimpleNamespace(shape=("a",)), None),
        (types.SimpleNamespace(shape=(None,)), None),
    ],
)
def test_samples_are_the_leading_size_of_the_first_tensor(clock, batch, n):
    """Kills: another dimension or item read, the depth limit changed, a batch of unknown size counted."""
    prof = run(clock, None, [1.0, 1.0], loader=TimedLoader(clock, [1.0, 1.0], batch=batch))
    assert prof.stats()["samples"] == (None if n is None else 2 * n)


def test_the_writer_gets_every_steps_scalars_and_the_aggregates(clock, caplog):
    """Per measured step ``wait_ms`` and ``step_ms`` at its step number; every ``log_every`` measured steps
    a progress line and the aggregates, and once more at the end. Kills: a step's scalars off by one,
    the warm-up step written, another tag, the log cadence or the final aggregates wrong."""

    class Writer:
        def __init__(self) -> None:
            self.got = []

        def add_scalar(self, tag, value, step):
            self.got.append((tag, value, step))

    w = Writer()
    waits, computes = [1.0, 2.0, 0.5, 1.0, 3.0], [3.0, 2.0, 1.5, 1.0, 1.0]
    with caplog.at_level(logging.INFO, logger="fastload.profile"):
        prof = run(clock, waits, computes, writer=w, log_every=2, warmup=1, name="W")
    per_step = [(t, v, s) for t, v, s in w.got if t in ("fastload/wait_ms", "fastload/step_ms")]
    want = []
    for s in range(1, 5):
        want += [("fastload/wait_ms", 1e3 * waits[s], s), ("fastload/step_ms", 1e3 * (waits[s] + computes[s]), s)]
    assert_scalars(per_step, want)
    agg = [(t, v, s) for t, v, s in w.got if t not in ("fastload/wait_ms", "fastload/step_ms")]

    def aggregate(k, step):
        ws, cs = sum(waits[1 : k + 1]), sum(computes[1 : k + 1])
        return [("fastload/wait_fraction", ws / (ws + cs), step), ("fastload/images_per_s", 4 * k / (ws + cs), step)]

    # after measured steps 2 and 4 (steps 2 and 4), and at the end (the profiler's step count, 5)
    assert_scalars(agg, aggregate(2, 2) + aggregate(4, 4) + aggregate(4, 5))
    lines = [r.getMessage() for r in caplog.records]
    # measured steps 1-2: waits 2 + 0.5 of 6 s (42 %), 3 s a step; 1-4: 6.5 of 12 s (54 %), 16 images in 12 s
    assert [m for m in lines if m.startswith("fastload.profile(W): step")] == [
        "fastload.profile(W): step 3, waiting 42%, 3000.0 ms/step, 1 img/s, GPU unavailable, CPU unavailable",
        "fastload.profile(W): step 5, waiting 54%, 3000.0 ms/step, 1 img/s, GPU unavailable, CPU unavailable",
    ]
    assert lines[-1] == prof.summary()


def test_log_summary_false_logs_nothing(clock, caplog):
    with caplog.at_level(logging.INFO, logger="fastload.profile"):
        run(clock, [1.0] * 2, [1.0] * 2, log_summary=False)
    assert not caplog.records


def assert_scalars(got, want):
    assert [(t, s) for t, _, s in got] == [(t, s) for t, _, s in want]
    assert [v for _, v, _ in got] == pytest.approx([v for _, v, _ in want], rel=1e-12)


BAD = [
    ({"log_every": 0}, "profile(log_every=0): expected a positive integer or None"),
    ({"log_every": True}, "profile(log_every=True): expected a positive integer or None"),
    ({"log_every": 1.0}, "profile(log_every=1.0): expected a positive integer or None"),
    ({"writer": 3}, "profile(writer=...): int has no add_scalar(); pass a TensorBoard SummaryWriter"),
    ({"sample_interval": 0}, "profile(sample_interval=0): expected seconds > 0"),
    ({"sample_interval": True}, "profile(sample_interval=True): expected seconds > 0"),
    ({"sample_interval": "1"}, "profile(sample_interval='1'): expected seconds > 0"),
    ({"warmup": -1}, "profile(warmup=-1): expected an integer >= 0 (steps left out of the totals)"),
    ({"warmup": True}, "profile(warmup=True): expected an integer >= 0 (steps left out of the totals)"),
    ({"warmup": 1.0}, "profile(warmup=1.0): expected an integer >= 0 (steps left out of the totals)"),
    ({"threshold": 0}, "profile(threshold=0): expected a share of the step time in (0, 1)"),
    ({"threshold": 1}, "profile(threshold=1): expected a share of the step time in (0, 1)"),
    ({"threshold": "0.5"}, "profile(threshold='0.5'): expected a share of the step time in (0, 1)"),
]


@pytest.mark.parametrize("kw, message", BAD, ids=[str(k) for k, _ in BAD])
def test_bad_arguments_exact_messages(kw, message):
    with pytest.raises(ConfigError) as e:
        fastload.profile([], **kw)
    assert str(e.value) == message


def test_good_edge_arguments_are_accepted_as_given():
    p = fastload.profile([], log_every=1, sample_interval=1e-9, warmup=0, threshold=1e-9, sync_cuda=0, log_summary=0)
    assert (p.log_every, p.sample_interval, p.warmup, p.sync_cuda, p.log_summary) == (1, 1e-9, 0, False, False)
    assert p.name == "list" and fastload.profile([], name="x").name == "x"
    with pytest.raises(ConfigError) as e:
        fastload.profile(5)
    assert str(e.value) == "profile(loader=...): expected an iterable of batches, got int"


def test_a_failing_writer_is_dropped_with_one_warning_and_the_loop_goes_on(clock, caplog):
    """Kills: the writer kept after it failed (a warning per step), the warning's text, the loop stopped."""

    class Broken:
        calls = 0

        def add_scalar(self, tag, value, step):
            Broken.calls += 1
            raise OSError("disk full")

    with caplog.at_level(logging.WARNING, logger="fastload.profile"):
        prof = run(clock, [1.0] * 4, [1.0] * 4, writer=Broken(), log_every=1)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == ["fastload.profile: writer.add_scalar failed (disk full); no more scalars"]
    assert Broken.calls == 1 and prof.writer is None and prof.stats()["steps"] == 4


def test_aggregates_skip_unknown_values_and_write_utilisation(clock, monkeypatch):
    """Kills: None values written, the utilisation aggregates left out or from the wrong sampler."""
    monkeypatch.setattr(prof_mod, "make_cpu_sampler", lambda: Sampler([30.0]))
    monkeypatch.setattr(prof_mod, "make_gpu_sampler", lambda: Sampler([70.0]))

    class Writer:
        def __init__(self) -> None:
            self.got = []

        def add_scalar(self, tag, value, step):
            self.got.append((tag, value, step))

    w = Writer()
    loader = TimedLoader(clock, [1.0, 1.0], batch=[{"x": 1}])  # samples unknown: no images/s
    run(clock, None, [1.0, 1.0], loader=loader, writer=w)
    agg = {t: (v, s) for t, v, s in w.got if t not in ("fastload/wait_ms", "fastload/step_ms")}
    assert agg == {"fastload/wait_fraction": (0.5, 2), "fastload/gpu_util": (70.0, 2), "fastload/cpu_util": (30.0, 2)}
    assert all(type(v) is float for v, _ in agg.values())


def test_no_thread_to_spare_means_no_utilisation_not_a_failure(clock, monkeypatch):
    """Kills: a thread that cannot start failing the loop, or its reason lost."""
    monkeypatch.setattr(prof_mod, "make_cpu_sampler", lambda: Sampler([30.0]))

    def refuse(self):
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(prof_mod.threading.Thread, "start", refuse)
    prof = run(clock, [1.0] * 2, [1.0] * 2)
    s = prof.stats()
    assert s["steps"] == 2
    assert (s["cpu_util"], s["cpu_reason"]) == ("unavailable", "no sampling thread (can't start new thread)")
    assert (s["gpu_util"], s["gpu_reason"]) == ("unavailable", "no sampling thread (can't start new thread)")


def test_samplers_are_made_per_loop_and_their_reasons_refreshed(clock, monkeypatch):
    """A sampler unavailable at the start but available at the end reports no reason; one whose close
    fails does not fail the loop. Kills: the reason kept from the start, the close error raised."""
    made = []

    class Flaky(Sampler):
        def close(self):
            raise OSError("close failed")

    def make():
        s = Flaky([50.0], available=False, reason="warming up")
        made.append(s)
        return s

    monkeypatch.setattr(prof_mod, "make_cpu_sampler", make)
    loader = TimedLoader(clock, [1.0] * 2)
    prof = fastload.profile(loader, sample_interval=1000.0, sync_cuda=False)
    for i, _ in enumerate(prof):
        made[-1].available = True  # becomes readable during the loop
        clock.t += 1.0
    s = prof.stats()
    assert s["cpu_util"] == {"mean": 50.0, "max": 50.0, "samples": 1} and s["cpu_reason"] == ""
    for _ in prof:
        pass
    assert len(made) == 2  # a new sampler for the second loop


def test_numbers_before_any_step_and_of_a_loop_under_a_second(clock):
    """Before any step every mean and quantile is None (not NaN); a loop of 0.5 s has its rates.
    Kills: the p90s computed from no steps (NaN), ``elapsed > 1`` for ``> 0``."""
    s = fastload.profile(TimedLoader(clock, [])).stats()
    for k in ("wait_fraction", "wait_ms", "compute_ms", "step_ms", "step_ms_p50", "step_ms_p90", "wait_ms_p50",
              "wait_ms_p90", "images_per_s", "steps_per_s"):  # fmt: skip
        assert s[k] is None, k
    assert (s["steps"], s["samples"], s["wait_s"], s["elapsed_s"]) == (0, 0, 0, 0)
    s = run(clock, [0.125, 0.125], [0.125, 0.125]).stats()
    assert (s["steps_per_s"], s["images_per_s"], s["elapsed_s"]) == (4.0, 16.0, 0.5)


def test_summary_in_the_first_step_and_with_fractional_milliseconds(clock):
    """Inside the first step nothing has been computed yet: "?" for compute and total; numbers are
    shown to one decimal. Kills: "?" replaced, the format spec dropped (12.3456 shown whole)."""
    loader = TimedLoader(clock, [0.0123456, 0.0123456])
    prof = fastload.profile(loader, sample_interval=1000.0, sync_cuda=False, name="Q")
    lines = None
    for i, _ in enumerate(prof):
        if i == 0:
            lines = prof.summary().splitlines()
        clock.t += 0.0376544
    assert lines[1] == "  steps 1 (after 0 warm-up), per step: wait 12.3 ms, compute ? ms, total ? ms; 324 images/s"
    assert prof.summary().splitlines()[1] == (
        "  steps 2 (after 0 warm-up), per step: wait 12.3 ms, compute 37.7 ms, total 50.0 ms; 80 images/s"
    )


@pytest.mark.parametrize(
    "affinity, cpu_count, cores",
    [({0, 1, 2}, 2, 3), (None, 4, 4), (None, None, 1)],  # None: no os.sched_getaffinity (macOS)
)
def test_the_suggestion_counts_the_cores_this_process_may_use(clock, monkeypatch, affinity, cpu_count, cores):
    """Kills: the affinity test inverted or misspelt (``cpu_count`` used where the affinity is
    narrower), ``cpu_count() and 1``, ``or 2``."""
    if affinity is None:
        monkeypatch.delattr(prof_mod.os, "sched_getaffinity", raising=False)
    else:
        monkeypatch.setattr(prof_mod.os, "sched_getaffinity", lambda pid: affinity, raising=False)
    monkeypatch.setattr(prof_mod.os, "cpu_count", lambda: cpu_count)
    s = run(clock, None, [1.0] * 3, loader=WorkerLoader(clock, [3.0] * 3, 0)).stats()
    assert s["suggestion"] == f"raise num_workers (now 0, the machine has {cores} cores), or {FIX}"


def test_a_fastloader_without_a_device_attribute_gets_the_gpu_suggestion(clock):
    class FastLoader:  # the class name is all the profiler needs; no device attribute at all
        def __init__(self) -> None:
            self.inner = TimedLoader(clock, [3.0] * 3)

        def __iter__(self):
            return iter(self.inner)

    s = run(clock, None, [1.0] * 3, loader=FastLoader()).stats()
    assert s["suggestion"].startswith("raise FastLoader(prefetch=...)")


def test_a_writer_failing_on_the_aggregates_is_dropped_with_one_warning(clock, caplog):
    """Kills: the aggregates' warning changed or its argument lost, the writer kept ("" for None)."""

    class Picky:
        def __init__(self) -> None:
            self.got = []

        def add_scalar(self, tag, value, step):
            if tag == "fastload/wait_fraction":
                raise ValueError("no such tag")
            self.got.append(tag)

    w = Picky()
    with caplog.at_level(logging.WARNING, logger="fastload.profile"):
        prof = run(clock, [1.0] * 4, [1.0] * 4, writer=w, log_every=2)
    assert [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING] == [
        "fastload.profile: writer.add_scalar failed (no such tag); no more scalars"
    ]
    assert prof.writer is None and w.got == ["fastload/wait_ms", "fastload/step_ms"] * 2


def test_the_loaders_generator_is_closed_before_the_summary_even_if_its_close_raises(clock, caplog):
    """Kills: the generator left to the garbage collector (closed after the summary), a failing close
    not suppressed."""
    state = {"closed": False}

    class Gen:
        def __iter__(self):
            try:
                for _ in range(5):
                    clock.t += 1.0
                    yield (np.zeros((2, 1)),)
            finally:
                state["closed"] = True
                raise RuntimeError("clean-up failed")

    seen = []

    class Watch(logging.Handler):
        def emit(self, record):
            if "INPUT-BOUND" in record.getMessage() or "COMPUTE-BOUND" in record.getMessage():
                seen.append(state["closed"])

    h = Watch()
    logging.getLogger("fastload.profile").addHandler(h)
    try:
        with caplog.at_level(logging.INFO, logger="fastload.profile"):
            prof = fastload.profile(Gen(), sample_interval=1000.0, sync_cuda=False)
            for i, _ in enumerate(prof):
                clock.t += 1.0
                if i == 1:
                    break
    finally:
        logging.getLogger("fastload.profile").removeHandler(h)
    assert seen == [True] and prof.stats()["steps"] == 2


def test_the_sampler_thread_samples_every_interval(monkeypatch):
    """Real time here: 0.02 s intervals over a loop of at least 0.3 s. Kills: the interval ignored
    (one sample, at the end)."""
    monkeypatch.setattr(prof_mod, "make_cpu_sampler", lambda: Sampler([40.0]))
    monkeypatch.setattr(prof_mod, "make_gpu_sampler", lambda: Sampler([None], available=False))
    prof = fastload.profile([(np.zeros((1, 1)),)] * 6, sample_interval=0.02, sync_cuda=False)
    for _ in prof:
        real_time.sleep(0.05)
    assert prof.stats()["cpu_util"]["samples"] >= 3


def test_a_sampler_that_raises_or_is_unavailable_gives_no_samples(clock, monkeypatch, caplog):
    """Kills: a failed sample appended (as ""), the availability tests joined by ``or`` or dropped,
    the debug message changed."""

    class Raising(Sampler):
        def sample(self):
            raise OSError("nvml gone")

    monkeypatch.setattr(prof_mod, "make_cpu_sampler", lambda: Sampler([50.0], available=False, reason="off"))
    monkeypatch.setattr(prof_mod, "make_gpu_sampler", lambda: Raising([1.0]))
    with caplog.at_level(logging.DEBUG, logger="fastload.profile"):
        prof = run(clock, [1.0] * 2, [1.0] * 2)
    s = prof.stats()
    assert s["cpu_util"] == "unavailable" and s["gpu_util"] == "unavailable"
    assert "fastload.profile: sampling failed: nvml gone" in [r.getMessage() for r in caplog.records]
    assert prof.summary().splitlines()[2] == "  GPU util unavailable (no samples yet); CPU util unavailable (off)"


def test_summary_of_an_endless_step(clock):
    """An infinite compute time is shown as "inf" (the format's case). Kills: '.1F'."""
    prof = fastload.profile(TimedLoader(clock, [1.0]), sample_interval=1000.0, sync_cuda=False, name="I")
    for _ in prof:
        clock.t += float("inf")
    assert prof.summary().splitlines()[1].startswith("  steps 1 (after 0 warm-up), per step: wait 1000.0 ms, compute inf ms, total inf ms")
    clock.t = 1000.0


def test_profiler_defaults_and_a_progress_line_every_step(clock, caplog):
    """Kills: Profiler's own defaults changed; the first progress line skipped (the last logged step
    starting at 1)."""
    for p in (prof_mod.Profiler([]), fastload.profile([])):
        assert (p.sync_cuda, p.sample_interval, p.warmup, p.threshold, p.log_every, p.log_summary) == (True, 0.5, 0, 0.25, None, True)
    with caplog.at_level(logging.INFO, logger="fastload.profile"):
        run(clock, [1.0] * 3, [1.0] * 3, log_every=1, name="E1")
    assert len([r for r in caplog.records if r.getMessage().startswith("fastload.profile(E1): step")]) == 3


class NoReason:
    """A sampler with no ``reason`` attribute at all."""

    def __init__(self, available: bool) -> None:
        self.available = available

    def sample(self):
        return None

    def close(self) -> None:
        pass


def test_reasons_while_the_loop_runs_and_after_it(clock, monkeypatch):
    """The reasons during the loop come from the samplers as made; after it, as they stand at the end.
    Kills: the reason's attribute misspelt or its default changed, "not available" changed, the
    reasons after the loop not refreshed (or refreshed into the wrong attribute), the thread not a
    daemon."""
    gpu = Sampler([None], available=True)
    monkeypatch.setattr(prof_mod, "make_cpu_sampler", lambda: NoReason(False))
    monkeypatch.setattr(prof_mod, "make_gpu_sampler", lambda: gpu)
    loader = TimedLoader(clock, [1.0] * 2)
    prof = fastload.profile(loader, sample_interval=1000.0, sync_cuda=False)
    during = None
    for i, _ in enumerate(prof):
        if i == 0:
            during = prof.stats()
            threads = [t for t in prof_mod.threading.enumerate() if t.name == "fastload-profile"]
            assert threads and all(t.daemon for t in threads)
            gpu.available, gpu.reason = False, "lost the device"
        clock.t += 1.0
    assert (during["cpu_reason"], during["gpu_reason"]) == ("not available", "no samples yet")
    s = prof.stats()
    assert (s["cpu_reason"], s["gpu_reason"]) == ("not available", "lost the device")
    monkeypatch.setattr(prof_mod, "make_cpu_sampler", lambda: Sampler([None], available=False, reason="psutil missing"))
    gpu2 = Sampler([None], available=True)
    monkeypatch.setattr(prof_mod, "make_gpu_sampler", lambda: gpu2)
    prof = run(clock, [1.0] * 2, [1.0] * 2)
    assert (prof.stats()["cpu_reason"], prof.stats()["gpu_reason"]) == ("psutil missing", "no samples yet")


def test_an_unavailable_gpu_sampler_is_not_read_and_reasons_follow_the_samplers(clock, monkeypatch):
    """Kills: the GPU sampler read though unavailable; the start's reason from another object or
    attribute; the CPU reason not refreshed after the loop."""
    cpu = Sampler([None], available=False, reason="warming up")
    monkeypatch.setattr(prof_mod, "make_cpu_sampler", lambda: cpu)
    monkeypatch.setattr(prof_mod, "make_gpu_sampler", lambda: Sampler([77.0], available=False, reason="no NVML"))
    prof = fastload.profile(TimedLoader(clock, [1.0] * 2), sample_interval=1000.0, sync_cuda=False)
    during = None
    for i, _ in enumerate(prof):
        if i == 0:
            prof._sample_once()
            during = prof.stats()
            cpu.reason = "psutil missing"
        clock.t += 1.0
    assert (during["cpu_reason"], during["gpu_reason"], during["gpu_util"]) == ("warming up", "no NVML", "unavailable")
    s = prof.stats()
    assert (s["cpu_reason"], s["gpu_util"]) == ("psutil missing", "unavailable")
