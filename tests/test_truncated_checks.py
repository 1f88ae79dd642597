"""A shard truncated while ``inspect`` or ``verify`` reads it is an error naming the shard, never SIGBUS.

``verify`` (with and without ``--decode``), ``inspect`` and ``fastload.store.iter_headers``
read every record of a shard. They used to read them through LMDB's memory map: a shard
cut short after they opened it made the next page they touched lie past the end of the
file, and the process died of SIGBUS (return code -7). They now read with ``pread``
through the checked B-tree reader, so a short read is an error: ``verify`` reports a
problem line naming the shard (exit 1), ``inspect`` fails naming it (exit 2).

Each call runs in a child process (a regression is a dead child, not a dead test run);
the shard is cut from inside the call, after its first few records, by wrapping a
function the call runs once per record.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import fastload

#: What the shard is cut down to: its two meta pages and no more (4 KiB LMDB pages).
CUT = 8192

#: Runs ``fastload <argv>`` (the real CLI) in a child, cutting SHARD to CUT bytes when the
#: HOOK-ed function (called once per record) runs for the AFTER-th time.
_CHILD = """
import os, sys
import fastload, fastload.checks, fastload.store
from fastload.cli import main

shard, hook, after, cut = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
argv = sys.argv[5:]
owner, _, name = hook.rpartition(".")
owner = {"checks": fastload.checks, "HeaderStats": fastload.store.HeaderStats}[owner]
real = getattr(owner, name)
calls = [0]

def cut_then_call(*a, **kw):
    calls[0] += 1
    if calls[0] == after:
        os.truncate(shard, cut)
        print(f"cut {shard} to {cut} bytes at record {after}", file=sys.stderr, flush=True)
    return real(*a, **kw)

setattr(owner, name, cut_then_call)
if argv[0] == "iter_headers":
    n = 0
    try:
        for _i, _h in fastload.store.iter_headers(argv[1]):
            n += 1
    except fastload.FastloadError as e:
        print(f"{type(e).__name__}: {e}", file=sys.stderr)
        sys.exit(1)
    print(f"read {n} headers")
    sys.exit(0)
sys.exit(main(argv))
"""


def _run(shard: Path, hook: str, after: int, *argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", _CHILD, str(shard), hook, str(after), str(CUT), *argv],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def _save(path: Path, rgb: np.ndarray) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(rgb).save(path, quality=90)


@pytest.fixture(scope="module")
def datasets(tmp_path_factory) -> dict[str, Path]:
    """Two one-shard datasets: ``big`` (records of ~30 KB, in LMDB overflow pages) and ``small``
    (records of a few hundred bytes inside leaf pages; enough of them that a scan reads its
    leaf pages in several rounds)."""
    base = tmp_path_factory.mktemp("truncated_checks")
    rng = np.random.default_rng(0)
    for i in range(12):
        _save(base / "big-src" / f"c{i % 2}" / f"img_{i:03d}.jpg", rng.integers(0, 256, (120, 160, 3), dtype=np.uint8))
    for i in range(400):
        _save(base / "small-src" / f"c{i % 2}" / f"img_{i:03d}.jpg", np.full((8, 8, 3), (i % 256, (7 * i) % 256, 60), np.uint8))
    out = {}
    for name in ("big", "small"):
        out[name] = base / name
        fastload.pack(base / f"{name}-src", out[name], workers=1, progress=False)
        ds = fastload.Dataset(out[name])
        assert len(ds.shards) == 1 and (out[name] / ds.shards[0].file).stat().st_size > 4 * CUT
    return out


@pytest.fixture(params=["big", "small"])
def packed(request, datasets, tmp_path) -> tuple[Path, Path]:
    """A fresh copy of one dataset to cut, and its shard."""
    root = Path(shutil.copytree(datasets[request.param], tmp_path / "packed"))
    return root, root / fastload.Dataset(root).shards[0].file


def _assert_named_not_killed(r: subprocess.CompletedProcess, shard: Path, codes: tuple[int, ...]) -> None:
    assert r.returncode >= 0, f"killed by signal {-r.returncode} (SIGBUS is 7): {r.stderr[-2000:]}"
    assert r.returncode in codes, f"exit {r.returncode}\nstdout: {r.stdout[-2000:]}\nstderr: {r.stderr[-2000:]}"
    assert str(shard) in r.stderr, r.stderr[-2000:]


def test_verify_decode_of_a_shard_cut_while_it_runs(packed):
    root, shard = packed
    r = _run(shard, "checks._decode_problem", 3, "verify", "--decode", str(root))
    assert f"cut {shard}" in r.stderr
    _assert_named_not_killed(r, shard, (1,))
    assert f"bad shard {shard}: " in r.stderr and "problem(s) in" in r.stderr


def test_verify_of_a_shard_cut_while_it_runs(packed):
    root, shard = packed
    r = _run(shard, "checks.decode_header", 3, "verify", str(root))
    assert f"cut {shard}" in r.stderr
    _assert_named_not_killed(r, shard, (1,))
    assert f"bad shard {shard}: " in r.stderr


def test_inspect_of_a_shard_cut_while_it_runs(packed):
    root, shard = packed
    r = _run(shard, "HeaderStats.add", 3, "inspect", str(root))
    assert f"cut {shard}" in r.stderr
    _assert_named_not_killed(r, shard, (2,))
    assert r.stderr.startswith(f"cut {shard}") and f"fastload: error: {shard}: " in r.stderr


def test_iter_headers_of_a_shard_cut_while_it_runs(packed):
    """What a resumed pack reads the shards it keeps with."""
    _root, shard = packed
    code = """
        import os, sys, fastload, fastload.store
        shard = sys.argv[1]
        try:
            for n, _ in enumerate(fastload.store.iter_headers(shard)):
                if n == 2:
                    os.truncate(shard, int(sys.argv[2]))
        except fastload.FastloadError as e:
            print(f"{type(e).__name__}: {e}", file=sys.stderr)
            sys.exit(1)
    """
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(code), str(shard), str(CUT)], capture_output=True, text=True, timeout=120)
    _assert_named_not_killed(r, shard, (1,))
    assert r.stderr.startswith(f"DamagedShardError: {shard}: damaged shard (")


def test_a_shard_cut_before_the_call_is_named(packed):
    """Cut before the call: ``verify`` and ``inspect`` see the size differ from the manifest's;
    ``iter_headers``, which has no manifest, sees the meta page claim more pages than the file holds."""
    root, shard = packed
    size = shard.stat().st_size
    with open(shard, "r+b") as f:
        f.truncate(CUT)
    for decode in ([], ["--decode"]):
        r = _run(shard, "checks.decode_header", 0, "verify", *decode, str(root))
        _assert_named_not_killed(r, shard, (1,))
        assert f"bad shard {shard}: {CUT} bytes, the manifest says {size} (truncated or replaced)" in r.stderr
    r = _run(shard, "checks.decode_header", 0, "inspect", str(root))
    _assert_named_not_killed(r, shard, (2,))
    assert f"fastload: error: {shard}: {CUT} bytes, the manifest says {size}" in r.stderr
    with pytest.raises(fastload.CorruptDataError, match=rf"{shard}: damaged shard \(LMDB meta page says \d+ pages, the file holds 2\)"):
        list(fastload.store.iter_headers(shard))
