"""A background thread's failure that is the machine's (a full disk, memory) reaches the consumer as a LoaderError naming it."""

from __future__ import annotations

import errno

import pytest

import fastload
from fastload.errors import LoaderError
from fastload.reader import Dataset


@pytest.mark.parametrize(
    "exc, words",
    [(OSError(errno.ENOSPC, "No space left on device"), "OSError: [Errno 28] No space left on device"),
     (MemoryError("cannot allocate 9 GiB"), "MemoryError: cannot allocate 9 GiB")],
    ids=["enospc", "memory"],
)  # fmt: skip
def test_the_machines_errors_in_the_epoch_thread_are_named_not_blamed_on_a_sample(pixel_dataset, monkeypatch, exc, words):
    """Before: sent through the decode-error search, which named no sample or the wrong cause."""

    def read_batch(self, *a, **k):
        raise exc

    monkeypatch.setattr(Dataset, "read_batch", read_batch)
    with fastload.FastLoader(pixel_dataset.packed, 4, device="cpu", crop=16) as ld:
        with pytest.raises(LoaderError, match="background thread failed: " + words.replace("[", r"\[").replace("]", r"\]")) as ei:
            next(iter(ld))
    assert ei.value.__cause__ is exc and "decode" not in str(ei.value)
