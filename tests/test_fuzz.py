"""Fuzzing: hostile bytes never crash, hang or balloon fastload's parsers and readers.

* The record-header and manifest parsers, fed any bytes and any JSON (hypothesis):
  a result that is internally consistent, or a ``FastloadError`` subclass whose
  message starts with the file it was told about (``where=``).
* ``Dataset`` and ``FastLoader(device="cpu")`` opened on copies of a real packed
  dataset whose ``manifest.json``, ``labels.bin`` or a shard was truncated,
  overwritten with random bytes or had bytes flipped: every sample read is correct,
  or a ``FastloadError`` names the damaged dataset. These run in a child process so
  that a crash (SIGBUS, SIGSEGV) is seen as a return code, under a timeout.
* Every structural byte of an LMDB shard (meta pages, page headers, node tables, node
  headers) flipped one at a time: the same, through ``Dataset`` and ``verify``.

CI runs short, reproducible versions (``derandomize``, fixed seeds); the ``slow``
ones (``scripts/test-slow.sh``) run many more examples, seeds and every byte.
"""

from __future__ import annotations

import json
import math
import os
import random
import shutil
import signal
import struct
import subprocess
import sys
import tracemalloc
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import fastload
from fastload.errors import CorruptDataError, FormatError
from fastload.format import (
    ENC_JPEG,
    HEADER_SIZE,
    LABELS_NAME,
    MANIFEST_NAME,
    Manifest,
    RecordHeader,
    decode_header,
    encode_record,
    record_path,
    record_payload,
)

from conftest import encode_color, write_image

TESTS = Path(__file__).resolve().parent

CI = settings(max_examples=250, deadline=None, derandomize=True, database=None, suppress_health_check=list(HealthCheck))
SLOW = settings(max_examples=20_000, deadline=None, derandomize=True, database=None, suppress_health_check=list(HealthCheck))

WHERE = "/data/set/shard-00003.lmdb sample 41"


# ============================================================================ record headers


def _valid_record(payload: bytes = b"\xff\xd8\xff\xe0 jpeg bytes \xff\xd9", path: str = "cat/1.jpg") -> bytes:
    return encode_record(payload, label=3, encoding=ENC_JPEG, width=640, height=480, orig_width=1280,
                         orig_height=960, flags=1, path=path)  # fmt: skip


@st.composite
def _mutated_records(draw) -> bytes:
    """A valid record with some bytes flipped, overwritten, cut off or appended."""
    value = bytearray(_valid_record(draw(st.binary(max_size=64)), draw(st.text(max_size=12))))
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.sampled_from(["flip", "set", "truncate", "extend", "splice"]))
        if op == "flip" and value:
            value[draw(st.integers(0, len(value) - 1))] ^= draw(st.integers(1, 255))
        elif op == "set" and len(value) >= 4:
            at = draw(st.integers(0, min(len(value), HEADER_SIZE) - 4))
            value[at : at + 4] = draw(st.sampled_from([b"\0\0\0\0", b"\xff\xff\xff\xff", b"\0\0\0\x80", b"\x01\0\0\0"]))
        elif op == "truncate":
            del value[draw(st.integers(0, len(value))) :]
        elif op == "extend":
            value += draw(st.binary(min_size=1, max_size=40))
        elif op == "splice":
            at = draw(st.integers(0, len(value)))
            value[at:at] = draw(st.binary(min_size=1, max_size=8))
    return bytes(value)


def _header_property(value: bytes) -> None:
    for v in (value, memoryview(value)):
        try:
            h = decode_header(v, where=WHERE)
        except CorruptDataError as e:
            assert str(e).startswith(WHERE + ": "), str(e)
            continue
        assert isinstance(h, RecordHeader)
        assert HEADER_SIZE + h.path_len + h.payload_len == len(value)
        side = 65535 if h.encoding == ENC_JPEG else 2**31 - 1  # a JPEG's sides are 16-bit
        assert 0 < h.width <= side and 0 < h.height <= side
        assert isinstance(record_path(v, h), str)  # any bytes decode (surrogateescape)
        try:
            payload = record_payload(v, h, check=True, where=WHERE)
        except CorruptDataError as e:
            kind = "CRC-32" if h.version == 1 else "XXH3 checksum"  # record versions 1 and 2
            assert str(e) == f"{WHERE}: payload {kind} mismatch (the image bytes were altered)"
        else:
            assert len(payload) == h.payload_len


_records = st.binary(max_size=200) | _mutated_records()


@CI
@given(_records)
@example(b"")
@example(_valid_record())
@example(_valid_record()[:HEADER_SIZE])
@example(_valid_record()[:12] + struct.pack("<I", 0) + _valid_record()[16:])  # width 0
@example(_valid_record()[:12] + struct.pack("<I", 2**31) + _valid_record()[16:])  # a flipped high bit
def test_decode_header_any_bytes(value):
    _header_property(value)


@pytest.mark.slow
@SLOW
@given(_records)
def test_decode_header_any_bytes_slow(value):
    _header_property(value)


# ============================================================================ manifests


def _manifest_dict() -> dict:
    m = Manifest(
        num_samples=5,
        classes=["cat", "dog"],
        class_counts=[2, 3],
        shards=[fastload.format.ShardInfo("shard-00000.lmdb", 0, 3, 12288, "a" * 64),
                fastload.format.ShardInfo("shard-00001.lmdb", 3, 2, 12288, "b" * 64)],  # fmt: skip
        labels_sha256="c" * 64,
        skipped=[{"path": "x/bad.jpg", "reason": "zero-byte file"}],
        stats={"progressive": 0},
        options={"quality": 95},
        created="2026-01-01T00:00:00+00:00",
        fastload_version="0.1.0",
    )
    return json.loads(m.dumps())


_HOSTILE = [math.inf, -math.inf, math.nan, 10**30, -(10**30), 2**63, -1, 0, 1.5, "", "7", "1e400", "\ud800", "\0",
            "../x.lmdb", ".hidden", "a/b", "a\\b", "x\0y", True, None, [], {}, [[[]]], {"a": {"b": {}}}]  # fmt: skip
_scalars = (
    st.sampled_from(_HOSTILE)
    | st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=12)
)
_json = st.recursive(_scalars, lambda ch: st.lists(ch, max_size=4) | st.dictionaries(st.text(max_size=8), ch, max_size=4), max_leaves=16)
_FIELDS = ["format", "version", "num_samples", "classes", "class_counts", "labels", "shards", "skipped", "stats",
           "options", "created", "fastload_version", "labels.sha256", "shards.0", "shards.1", "shards.0.file",
           "shards.0.first", "shards.0.count", "shards.0.bytes", "shards.0.sha256", "shards.1.first", "skipped.0",
           "skipped.0.path", "classes.0", "class_counts.1"]  # fmt: skip


@st.composite
def _mutated_manifests(draw) -> str:
    """A valid manifest with up to three fields replaced by hostile values or removed."""
    d = _manifest_dict()
    for _ in range(draw(st.integers(1, 3))):
        *parents, last = draw(st.sampled_from(_FIELDS)).split(".")
        target = d
        try:
            for p in parents:
                target = target[int(p)] if isinstance(target, list) else target[p]
            k = int(last) if isinstance(target, list) else last
            if isinstance(target, dict) and draw(st.integers(0, 5)) == 0:
                target.pop(k, None)
            else:
                target[k] = draw(_json)
        except (KeyError, IndexError, TypeError, ValueError):
            pass  # an earlier edit replaced a parent: nothing to do
    return json.dumps(d, allow_nan=True)


def _manifest_property(text: str | bytes) -> None:
    try:
        m = Manifest.loads(text, where=WHERE)
    except FormatError as e:
        msg = str(e)
        assert msg.startswith(WHERE + ": ") and "\n" not in msg and len(msg) < 2000, msg
        return
    m.validate(where=WHERE)  # anything accepted is internally consistent
    assert m.num_samples == sum(s.count for s in m.shards) == sum(m.class_counts)
    assert len(m.classes) == len(m.class_counts)
    for s in m.shards:
        assert s.file and not set(s.file) & {"/", "\\", "\0"} and not s.file.startswith(".")
        assert s.first >= 0 and s.count >= 0 and s.bytes >= 0
    again = Manifest.loads(m.dumps(), where=WHERE)  # what it writes, it reads back (free-form
    assert Manifest.loads(again.dumps(), where=WHERE) == again  # "stats"/"options" keys become strings)
    assert (again.num_samples, again.classes, again.shards) == (m.num_samples, m.classes, m.shards)


_manifests = st.binary(max_size=300) | _json.map(lambda v: json.dumps(v, allow_nan=True)) | _mutated_manifests()

_VALID = json.dumps(_manifest_dict())
_DEEP = '{"format": "fastload", "version": "1.0", "shards": ' + "[" * 50_000 + "]" * 50_000 + "}"


@CI
@given(_manifests)
@example(_VALID)
@example(_VALID.encode("utf-16"))
@example(b"\xff\xfe\xfa garbage")
@example(_DEEP)  # RecursionError inside json.loads
@example("[" * 100_000)
@example(_VALID.replace('"num_samples": 5', '"num_samples": Infinity'))  # int(inf) is an OverflowError
@example(_VALID.replace('"first": 3', '"first": -Infinity'))
@example(_VALID.replace('"first": 3', '"first": NaN'))
@example(_VALID.replace('"shard-00001.lmdb"', '"shard\\u0000.lmdb"'))  # a NUL in a file name
@example(_VALID.replace('"shard-00001.lmdb"', '""'))
@example(_VALID.replace(f'"{fastload.format.FORMAT_VERSION}"', '"99.0"'))
@example(_VALID.replace(f'"{fastload.format.FORMAT_VERSION}"', '"' + "9" * 5000 + '"'))
def test_manifest_loads_any_bytes_or_json(text):
    _manifest_property(text)


@pytest.mark.slow
@SLOW
@given(_manifests)
def test_manifest_loads_any_bytes_or_json_slow(text):
    _manifest_property(text)


def test_claimed_sizes_do_not_allocate(tmp_path):
    """A manifest may claim 10**15 samples: parsing it, and refusing the dataset, allocates nothing big."""
    d = _manifest_dict()
    n = 10**15
    d.update(num_samples=n, class_counts=[n, 0])
    d["shards"] = [{**d["shards"][0], "count": n, "bytes": 10**18}]
    (tmp_path / MANIFEST_NAME).write_text(json.dumps(d))
    (tmp_path / LABELS_NAME).write_bytes(b"\0" * 20)
    tracemalloc.start()
    try:
        assert Manifest.loads((tmp_path / MANIFEST_NAME).read_text()).num_samples == n
        with pytest.raises(CorruptDataError, match=rf"{LABELS_NAME}: 20 bytes, expected {4 * n} for {n} samples"):
            fastload.Dataset(tmp_path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20, f"peak {peak} bytes"


# ============================================================================ damaged datasets, read in a child process


def _make_dataset(root: Path, *, per_class: int, sizes: list[tuple[int, int]], shard_size: str) -> Path:
    """3 classes of solid-colour JPEGs encoding (label, index); small ones are stored inside LMDB's
    leaf pages, large ones in overflow pages."""
    index = 0
    for label in range(3):
        for j in range(per_class):
            write_image(root / "src" / f"c{label}" / f"{j:02d}.jpg", encode_color(label, index), size=sizes[j % len(sizes)], quality=90)
            index += 1
    fastload.pack(root / "src", root / "packed", workers=1, shard_size=shard_size, progress=False)
    return root / "packed"


@pytest.fixture(scope="module")
def packed(tmp_path_factory) -> Path:
    out = _make_dataset(tmp_path_factory.mktemp("fuzz"), per_class=8, sizes=[(40, 56), (64, 48), (480, 360)], shard_size="32KiB")
    ds = fastload.Dataset(out)
    assert len(ds) == 24 and len(ds.shards) >= 4
    return out


# The child reads each damaged copy with Dataset (CRC-checked), verify() and a CPU FastLoader,
# compares everything it gets with the pristine dataset, and prints one JSON line per reader.
_CHILD = r"""
import faulthandler, json, sys, traceback
faulthandler.enable()
tests, pristine, spec = sys.argv[1], sys.argv[2], json.loads(open(sys.argv[3]).read())
sys.path.insert(0, tests)
import fastload
from fastload import FastloadError
from fastload import store
from conftest import decode_batch

ref = fastload.Dataset(pristine)
good = [ref[i] for i in range(len(ref))]
labels = ref.labels.tolist()

def read_dataset(path):
    ds = fastload.Dataset(path, check=True)
    # the data: every (bytes, label); class *names* are not checksummed (see docs/reliability.md)
    ok = len(ds) == len(good) and len(ds.classes) == len(ref.classes) and all(ds[i] == good[i] for i in range(len(ds)))
    for i in range(len(ds)):  # the descriptive accessors must not crash either
        ds.where(i)
    return ok

def read_verify(path):
    rep = fastload.verify(path, decode=True)
    if not spec["damaged"]:
        return rep.ok
    if "-manifest-" not in path:  # a shard or labels.bin changed: verify must see it
        return not rep.ok
    # a changed manifest that verify opens: it reports a problem, or the change is harmless (a
    # byte of "created", a class name): then every sample reads back exactly as it was packed
    if not rep.ok:
        return True
    try:
        return read_dataset(path)
    except FastloadError:
        return False  # verify passed a dataset that cannot be read

def read_loader(path):
    from fastload import FastLoader, IMAGENET_MEAN, IMAGENET_STD
    got = []
    with FastLoader(path, 5, device="cpu", crop=24, shuffle=False, num_threads=1) as loader:
        for x, y in loader:
            dec = decode_batch(x.numpy(), IMAGENET_MEAN, IMAGENET_STD)
            got += [(lab, idx, int(t)) for (lab, idx), t in zip(dec, y)]
    return [i for _, i, _ in got] == list(range(len(good))) and [l for l, _, _ in got] == [t for _, _, t in got] == labels

readers = {"dataset": read_dataset, "verify": read_verify, "loader": read_loader}
for case in spec["cases"]:
    for name in spec["readers"]:
        print(json.dumps({"start": case, "reader": name}), flush=True)
        try:
            r = {"outcome": "ok" if readers[name](case) else "WRONG"}
        except FastloadError as e:
            r = {"outcome": "error", "type": type(e).__name__, "msg": str(e)}
        except BaseException as e:
            r = {"outcome": "CRASH", "type": type(e).__name__, "msg": traceback.format_exc()[-2000:]}
        print(json.dumps({"case": case, "reader": name, **r}), flush=True)
    store.close_shared()  # keep the number of open files bounded
"""


def run_readers(pristine: Path, cases: list[str], readers: list[str], workdir: Path, *, timeout: float, damaged: bool = True) -> list[dict]:
    """Run the child over ``cases``; fail on a crash, a hang, a wrong result or an unexpected exception."""
    spec = workdir / "spec.json"
    spec.write_text(json.dumps({"cases": cases, "readers": readers, "damaged": damaged}))
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    try:
        r = subprocess.run([sys.executable, "-c", _CHILD, str(TESTS), str(pristine), str(spec)],
                           capture_output=True, text=True, timeout=timeout, env=env)  # fmt: skip
    except subprocess.TimeoutExpired as e:
        out = (e.stdout or b"").decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        last = [ln for ln in out.splitlines() if '"start"' in ln][-1:]
        pytest.fail(f"readers hung (> {timeout} s); last started: {last}")
    lines = [json.loads(ln) for ln in r.stdout.splitlines() if ln.startswith("{")]
    if r.returncode != 0:
        started = [ln for ln in lines if "start" in ln]
        sig = f"signal {signal.Signals(-r.returncode).name}" if r.returncode < 0 else f"exit code {r.returncode}"
        pytest.fail(f"reader process died ({sig}) while reading {started[-1] if started else '?'}:\n{r.stderr[-3000:]}")
    results = [ln for ln in lines if "outcome" in ln]
    assert len(results) == len(cases) * len(readers), r.stderr[-3000:]
    bad = [x for x in results if x["outcome"] not in ("ok", "error")]
    assert not bad, json.dumps(bad, indent=1)[:4000]
    for x in results:
        if x["outcome"] == "error":  # the message names the damaged dataset (a file inside it), in one line
            assert x["case"] in x["msg"] and "\n" not in x["msg"].strip(), x
    return results


def _damage(path: Path, op: str, rng: random.Random) -> str:
    data = bytearray(path.read_bytes())
    if op == "truncate":
        data = data[: rng.randrange(len(data))]
    elif op == "random":
        data = bytearray(rng.randbytes(len(data)))
    elif op == "flip":
        pos = rng.randrange(len(data))
        data[pos] ^= 1 << rng.randrange(8)
    elif op == "flips":
        for _ in range(16):
            data[rng.randrange(len(data))] ^= rng.randrange(1, 256)
    elif op == "zero-page":
        page = rng.randrange(max(1, len(data) // 4096))
        data[page * 4096 : (page + 1) * 4096] = bytes(len(data[page * 4096 : (page + 1) * 4096]))
    else:  # pragma: no cover
        raise ValueError(op)
    path.write_bytes(bytes(data))
    return f"{path.name}:{op}"


_TARGETS = {
    "manifest": ["truncate", "random", "flip", "flips"],
    "labels": ["truncate", "random", "flip"],
    "shard": ["truncate", "random", "flip", "flips", "zero-page"],
}


def _damaged_copies(pristine: Path, workdir: Path, seeds: range) -> list[str]:
    shards = sorted(p.name for p in pristine.glob("*.lmdb"))
    cases = []
    for seed in seeds:
        for target, ops in _TARGETS.items():
            for op in ops:
                rng = random.Random(f"{seed}-{target}-{op}")
                d = workdir / f"s{seed}-{target}-{op}"
                shutil.copytree(pristine, d)
                name = {"manifest": MANIFEST_NAME, "labels": LABELS_NAME}.get(target) or rng.choice(shards)
                _damage(d / name, op, rng)
                cases.append(str(d))
    return cases


def test_damaged_datasets_give_correct_data_or_a_clear_error(packed, tmp_path):
    cases = _damaged_copies(packed, tmp_path, range(2))  # 2 seeds x 12 kinds of damage
    results = run_readers(packed, cases, ["dataset", "verify", "loader"], tmp_path, timeout=240)
    errors = [x for x in results if x["outcome"] == "error"]
    refused = {r: {x["case"] for x in errors if x["reader"] == r} for r in ("dataset", "verify", "loader")}
    # run_readers failed on any wrong result: what is not refused below read back exactly.
    # A cut or overwritten file, and any change to labels.bin, is refused by both data readers;
    # a flipped bit may land in a harmless place (free space in a shard, "created" in the manifest)
    for case in cases:
        if "-labels-" in case or case.endswith(("-truncate", "-random")):
            assert case in refused["dataset"] and case in refused["loader"], case
        if "-manifest-" in case and case.endswith(("-truncate", "-random")):
            assert case in refused["verify"], case  # nothing to verify against: an error, not a report
        # the loader reads through the same checks as Dataset: both refuse a copy, or neither does
        assert (case in refused["dataset"]) == (case in refused["loader"]), case
    assert any(c.endswith(("-flip", "-flips", "-zero-page")) and c in refused["dataset"] for c in cases)


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_damaged_datasets_many_seeds(packed, tmp_path):
    cases = _damaged_copies(packed, tmp_path, range(2, 40))
    run_readers(packed, cases, ["dataset", "verify", "loader"], tmp_path, timeout=1800)


def test_an_intact_copy_reads_back_exactly(packed, tmp_path):
    """The harness itself: an undamaged copy is read back correctly by all three readers."""
    shutil.copytree(packed, tmp_path / "copy")
    results = run_readers(packed, [str(tmp_path / "copy")], ["dataset", "verify", "loader"], tmp_path, timeout=120, damaged=False)
    assert [x["outcome"] for x in results] == ["ok", "ok", "ok"]


# ============================================================================ LMDB's own pages, byte by byte


def _structural_offsets(data: bytes) -> list[int]:
    """Offsets of the bytes LMDB trusts to find records: meta fields, page headers, node tables and
    node headers (with overflow page numbers), and overflow page headers."""
    psize = struct.unpack_from("<I", data, 40)[0]
    offsets = list(range(16, 160)) + list(range(psize + 16, psize + 160))  # both meta pages
    for page in range(2, len(data) // psize):
        base = page * psize
        flags, lower = struct.unpack_from("<HH", data, base + 10)
        offsets += range(base, base + 16)
        if flags & 0x03:  # branch or leaf
            n = (lower - 16) // 2
            offsets += range(base + 16, base + lower)
            for k in range(n):
                node = base + struct.unpack_from("<H", data, base + 16 + 2 * k)[0]
                ksize = struct.unpack_from("<H", data, node + 6)[0]
                extra = 8 if flags & 0x02 and struct.unpack_from("<H", data, node + 4)[0] & 1 else 0
                offsets += range(node, node + 8 + ksize + extra)
    return sorted(set(o for o in offsets if o < len(data)))


@pytest.fixture(scope="module")
def one_shard(tmp_path_factory) -> Path:
    """One shard with a two-level B-tree: a branch page over several leaf pages, plus overflow records."""
    out = _make_dataset(tmp_path_factory.mktemp("tree"), per_class=14, sizes=[(64, 48)] * 5 + [(480, 360)], shard_size="1MB")
    ds = fastload.Dataset(out)
    assert len(ds.shards) == 1
    import lmdb

    env = lmdb.open(str(out / ds.shards[0].file), subdir=False, readonly=True, lock=False)
    assert env.stat()["depth"] == 2 and env.stat()["overflow_pages"] > 0, env.stat()
    env.close()
    return out


_SWEEP_CHILD = r"""
import faulthandler, json, os, sys, shutil
faulthandler.enable()
import fastload
from fastload import FastloadError
from fastload import store
pristine, work, spec = sys.argv[1], sys.argv[2], json.loads(open(sys.argv[3]).read())
ref = fastload.Dataset(pristine)
good = [ref[i] for i in range(len(ref))]
shard = ref.shards[0].file
data = open(os.path.join(pristine, shard), "rb").read()
counts = {"ok": 0, "error": 0}
d = os.path.join(work, "case")
shutil.copytree(pristine, d)
for k, (off, xor) in enumerate(spec):
    b = bytearray(data); b[off] ^= xor
    with open(os.path.join(d, "new.tmp"), "wb") as f:
        f.write(b)
    os.replace(os.path.join(d, "new.tmp"), os.path.join(d, shard))  # a new file (inode) each time
    print(f"START {off} {xor}", flush=True)
    for read in ("dataset", "verify"):
        try:
            if read == "dataset":
                ds = fastload.Dataset(d, check=True)
                ok = all(ds[i] == good[i] for i in range(len(ds)))
            else:
                ok = not fastload.verify(d).ok  # the file changed: verify must say so
            counts["ok" if ok else "WRONG"] = counts.get("ok" if ok else "WRONG", 0) + 1
            if not ok:
                print(json.dumps({"WRONG": [off, xor, read]}), flush=True)
        except FastloadError as e:
            counts["error"] += 1
            if d not in str(e):
                print(json.dumps({"UNNAMED": [off, xor, read, str(e)]}), flush=True)
        except BaseException as e:
            print(json.dumps({"CRASH": [off, xor, read, f"{type(e).__name__}: {e}"]}), flush=True)
    store.close_shared()
print("DONE " + json.dumps(counts), flush=True)
"""


def _sweep(pristine: Path, workdir: Path, flips: list[tuple[int, int]], timeout: float) -> dict:
    spec = workdir / "sweep.json"
    spec.write_text(json.dumps(flips))
    try:
        r = subprocess.run([sys.executable, "-c", _SWEEP_CHILD, str(pristine), str(workdir), str(spec)],
                           capture_output=True, text=True, timeout=timeout)  # fmt: skip
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        pytest.fail(f"hung (> {timeout} s) at {[ln for ln in out.splitlines() if ln.startswith('START')][-1:]}")
    started = [ln for ln in r.stdout.splitlines() if ln.startswith("START")]
    if r.returncode != 0:
        sig = f"signal {signal.Signals(-r.returncode).name}" if r.returncode < 0 else f"exit code {r.returncode}"
        pytest.fail(f"the reader died ({sig}) after flipping (offset, xor) {started[-1:]}:\n{r.stderr[-2000:]}")
    problems = [ln for ln in r.stdout.splitlines() if ln.startswith("{")]
    assert not problems, "\n".join(problems[:20])
    done = [ln for ln in r.stdout.splitlines() if ln.startswith("DONE ")]
    assert done, r.stderr[-2000:]
    return json.loads(done[0][5:])


@pytest.mark.slow  # long; test_scale's sampled flips stay fast
def test_every_structural_lmdb_byte_flipped(one_shard, tmp_path):
    data = (one_shard / fastload.Dataset(one_shard).shards[0].file).read_bytes()
    offsets = _structural_offsets(data)
    assert len(offsets) > 400
    flips = [(o, x) for o in offsets for x in (0x80, 0x01)]
    counts = _sweep(one_shard, tmp_path, flips, timeout=300)
    assert counts["ok"] + counts["error"] == 2 * len(flips)
    assert counts["error"] > len(flips) // 4  # many of these flips are caught, none crashes


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_every_byte_of_a_shard_flipped(one_shard, tmp_path):
    data = (one_shard / fastload.Dataset(one_shard).shards[0].file).read_bytes()
    flips = [(o, x) for o in range(len(data)) for x in (0x80, 0x01, 0xFF)]
    _sweep(one_shard, tmp_path, flips, timeout=3600)
