"""Every CLI error path: one readable line on stderr, a non-zero exit code, no traceback.

Each subcommand (pack, inspect, verify, sample, bench, doctor) and the global flags
are driven through ``fastload.cli.main([...])``; ``--debug`` shows the traceback
instead; real ``python -m fastload`` subprocesses prove the exit codes and stderr
end to end (and that a closed pipe on stdout is not an error worth a traceback).
"""

from __future__ import annotations

import json
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import fastload
from fastload import FormatError
from fastload import checks
from fastload.cli import main
from fastload.format import MANIFEST_NAME

from conftest import encode_color, write_image


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> dict[str, Path]:
    """Every kind of path the error cases point at."""
    base = tmp_path_factory.mktemp("cli")
    src = base / "src"
    for label in range(2):
        for j in range(3):
            write_image(src / f"c{label}" / f"{j}.jpg", encode_color(label, 3 * label + j), quality=90)
    packed = base / "packed"
    fastload.pack(src, packed, workers=1, progress=False)
    badsrc = base / "badsrc"
    write_image(badsrc / "c0" / "0.jpg", (1, 2, 3), quality=90)
    (badsrc / "c0" / "1.jpg").write_bytes(b"not a jpeg")
    afile = base / "afile.dat"
    afile.write_text("hello\n")
    (base / "empty").mkdir()
    badlist = base / "bad.csv"
    badlist.write_text("path,label\nonly-a-path.jpg\n")
    m = json.loads((packed / MANIFEST_NAME).read_text())
    variants = {
        "garbage": lambda d: (d / MANIFEST_NAME).write_bytes(random.Random(0).randbytes(300)),
        "foreign": lambda d: (d / MANIFEST_NAME).write_text(json.dumps({**m, "format": "webdataset"})),
        "newer": lambda d: (d / MANIFEST_NAME).write_text(json.dumps({**m, "version": "4.0"})),
        "deep": lambda d: (d / MANIFEST_NAME).write_text("[" * 100_000),
        "truncated": lambda d: (d / m["shards"][0]["file"]).write_bytes((packed / m["shards"][0]["file"]).read_bytes()[:5000]),
        "randomshard": lambda d: (d / m["shards"][0]["file"]).write_bytes(random.Random(1).randbytes(m["shards"][0]["bytes"])),
    }
    paths = {"src": src, "packed": packed, "badsrc": badsrc, "afile": afile, "empty": base / "empty", "badlist": badlist, "tmp": base}
    for name, damage in variants.items():
        d = base / name
        shutil.copytree(packed, d)
        damage(d)
        paths[name] = d
    journal = base / "journalled.partial"  # an unfinished pack whose journal is not an object
    journal.mkdir()
    (journal / "journal.json").write_text("[]")
    return paths


CASES = [
    # global flags and commands
    ([], "no command given; choose one of: bench, doctor, inspect, pack, sample, verify"),
    (["--bogus"], "unrecognized arguments: --bogus"),
    (["frobnicate"], "invalid choice: 'frobnicate'"),
    (["-q", "--debugg"], "unrecognized arguments: --debugg"),
    # pack
    (["pack"], "the following arguments are required: SRC, OUT"),
    (["pack", "{src}"], "the following arguments are required: OUT"),
    (["pack", "{tmp}/nope", "{new}"], "SRC {tmp}/nope: no such file or directory"),
    (["pack", "{afile}", "{new}"], "a file but not a list file"),
    (["pack", "{empty}", "{new}"], "no class folders found"),
    (["pack", "{badlist}", "{new}"], "bad.csv:2: expected 'path,label'"),
    (["pack", "{src}", "{packed}"], "already exists; pass --overwrite"),
    (["pack", "{src}", "{afile}"], "already exists; pass --overwrite"),
    (["pack", "{src}", "{afile}", "--overwrite"], "is not a fastload dataset; refusing to replace it"),
    (["pack", "{src}", "{afile}/out"], "afile.dat/out.partial: cannot create the output directory: Not a directory"),
    (["pack", "{src}", "{src}/inside"], "inside SRC"),
    (["pack", "{src}", "{tmp}/journalled", "--resume"], "journal.json: unreadable journal"),
    (["pack", "{src}", "{tmp}/journalled"], "holds an unfinished pack; continue it with --resume"),
    (["pack", "{badsrc}", "{new}", "--on-error", "fail"], "badsrc/c0/1.jpg: not an image (cannot identify image file)"),
    (["pack", "{src}", "{new}", "--shard-size", "lots"], "shard_size (--shard-size): cannot parse 'lots'"),
    (["pack", "{src}", "{new}", "--shard-size", "0"], "shard_size (--shard-size): '0' must be a positive size"),
    (["pack", "{src}", "{new}", "--workers", "0"], "workers (--workers): expected an integer >= 1, got 0"),
    (["pack", "{src}", "{new}", "--workers", "two"], "argument --workers: invalid int value: 'two'"),
    (["pack", "{src}", "{new}", "--quality", "101"], "quality (--quality): expected an integer 1..100, got 101"),
    (["pack", "{src}", "{new}", "--max-size", "0"], "max_size (--max-size): expected an integer >= 1, got 0"),
    (["pack", "{src}", "{new}", "--max-pixels", "-5"], "max_pixels (--max-pixels): expected an integer >= 1, got -5"),
    (["pack", "{src}", "{new}", "--on-error", "ignore"], "argument --on-error: invalid choice: 'ignore'"),
    # inspect
    (["inspect"], "the following arguments are required: OUT"),
    (["inspect", "{tmp}/nope"], "no such dataset directory"),
    (["inspect", "{afile}"], "not a directory; a packed dataset is a directory made by `fastload pack`"),
    (["inspect", "{empty}"], "missing manifest"),
    (["inspect", "{garbage}"], "manifest.json: not valid JSON"),
    (["inspect", "{deep}"], "manifest.json: not valid JSON (nested too deeply)"),
    (["inspect", "{foreign}"], "not a fastload manifest (format='webdataset')"),
    (["inspect", "{newer}"], "format version 4.0 is newer than this fastload reads"),
    (["inspect", "{truncated}"], "5000 bytes, the manifest says"),
    (["inspect", "{randomshard}"], "damaged shard (not an LMDB file (bad meta page))"),
    (["inspect", "{packed}", "--yaml"], "unrecognized arguments: --yaml"),
    # verify (problems in a readable dataset exit 1 with a report: test_verify_report_*)
    (["verify"], "the following arguments are required: OUT"),
    (["verify", "{tmp}/nope"], "no such dataset directory"),
    (["verify", "{garbage}"], "manifest.json: not valid JSON"),
    (["verify", "{newer}"], "newer than this fastload reads"),
    (["verify", "{packed}", "--fast"], "unrecognized arguments: --fast"),
    # sample
    (["sample"], "the following arguments are required: OUT"),
    (["sample", "{new}", "--images", "0"], "num_images must be an int in [1, 10000000], got 0"),
    (["sample", "{new}", "--images", "5", "--classes", "10"], "num_images (5) must be at least num_classes (10)"),
    (["sample", "{new}", "--classes", "0"], "num_classes must be an int in [1, 1000], got 0"),
    (["sample", "{new}", "--seed", "x"], "argument --seed: invalid int value: 'x'"),
    (["sample", "{afile}"], "exists and is not a directory"),
    (["sample", "{packed}"], "already exists; pass overwrite=True (--overwrite)"),
    # bench
    (["bench"], "the following arguments are required: DATASET"),
    (["bench", "{tmp}/nope"], "no such dataset directory"),
    (["bench", "{garbage}", "--device", "cpu"], "manifest.json: not valid JSON"),
    (["bench", "{packed}", "--device", "tpu"], "device must be 'cpu', 'cuda' or 'cuda:N', got 'tpu'"),
    (["bench", "{packed}", "--device", "cpu", "--batch-size", "0"], "batch_size must be an int in [1, 65536] (samples per batch, MAX_BATCH), got 0"),
    (["bench", "{packed}", "--device", "cpu", "--model", "vgg"], "model must be one of"),
    (["bench", "{packed}", "--workers", "1,x"], "--workers"),
    (["bench", "{packed}", "--batches", "2", "--epochs", "1"], "not allowed with argument"),
    (["bench", "{packed}", "--images", "{tmp}/nope", "--device", "cpu"], "not a directory"),
    # doctor
    (["doctor", "--bogus"], "unrecognized arguments: --bogus"),
    (["doctor", "extra"], "unrecognized arguments: extra"),
]


@pytest.mark.parametrize("argv, message", CASES, ids=[" ".join(a) or "(none)" for a, _ in CASES])
def test_error_is_one_line_nonzero_no_traceback(world, tmp_path, capsys, argv, message):
    fill = {**{k: str(v) for k, v in world.items()}, "new": str(tmp_path / "new")}
    code = main([a.format(**fill) for a in argv])
    out, err = capsys.readouterr()
    assert code == 2, (code, out, err)
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith("fastload") and message.format(**fill) in lines[0], lines[0]
    assert out == ""
    assert not (tmp_path / "new").exists() and not (tmp_path / "new.partial").exists()


def test_verify_report_names_each_problem_and_exits_1(world, capsys):
    code = main(["verify", str(world["truncated"])])
    out, err = capsys.readouterr()
    shard = world["truncated"] / fastload.Dataset(world["packed"]).shards[0].file
    assert code == 1 and out == "" and "Traceback" not in err
    assert err.splitlines() == [
        f"bad shard {shard}: 5000 bytes, the manifest says {(world['packed'] / shard.name).stat().st_size} (truncated or replaced)",
        f"fastload verify: 1 problem(s) in {world['truncated']} (1 shards, 0 samples checked)",
    ]


# ----------------------------------------------------------------------------- --debug, and failures nobody planned for


def test_debug_shows_the_traceback(world, capsys):
    with pytest.raises(FormatError, match="no such dataset directory"):
        main(["--debug", "inspect", str(world["tmp"] / "nope")])
    with pytest.raises(FormatError, match="not valid JSON"):
        main(["--debug", "verify", str(world["garbage"])])


def test_unexpected_exception_is_still_one_line(world, capsys, monkeypatch):
    def broken(path):
        raise RuntimeError("something nobody planned for\nwith a second line")

    monkeypatch.setattr(checks, "inspect", broken)
    assert main(["inspect", str(world["packed"])]) == 2
    err = capsys.readouterr().err
    assert err == "fastload: error: unexpected RuntimeError: something nobody planned for (rerun with --debug for the traceback)\n"
    with pytest.raises(RuntimeError, match="nobody planned"):
        main(["--debug", "inspect", str(world["packed"])])


def test_os_error_names_the_file(world, capsys, monkeypatch):
    def denied(path):
        raise PermissionError(13, "Permission denied", "/data/set/manifest.json")

    monkeypatch.setattr(checks, "inspect", denied)
    assert main(["inspect", str(world["packed"])]) == 2
    assert capsys.readouterr().err == "fastload: error: /data/set/manifest.json: Permission denied\n"
    with pytest.raises(PermissionError):
        main(["--debug", "inspect", str(world["packed"])])


def test_ctrl_c_exits_130(world, capsys, monkeypatch):
    def interrupted(path):
        raise KeyboardInterrupt

    monkeypatch.setattr(checks, "inspect", interrupted)
    assert main(["inspect", str(world["packed"])]) == 130
    assert capsys.readouterr().err == "fastload: interrupted\n"


# ----------------------------------------------------------------------------- end to end, in real processes


def _fastload(*args: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "fastload", *args], capture_output=True, text=True, timeout=120, **kw)


def test_real_process_exit_code_and_stderr(world):
    r = _fastload("inspect", str(world["tmp"] / "nope"))
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr == f"fastload: error: {world['tmp'] / 'nope'}: no such dataset directory; create one with `fastload pack SRC {world['tmp'] / 'nope'}`\n"
    r = _fastload("pack", str(world["badsrc"]), str(world["tmp"] / "failed"), "--on-error", "fail", "--no-progress")
    assert r.returncode == 2 and r.stderr == f"fastload: error: {world['badsrc'] / 'c0' / '1.jpg'}: not an image (cannot identify image file)\n"
    assert not (world["tmp"] / "failed").exists() and not (world["tmp"] / "failed.partial").exists()
    r = _fastload("verify", str(world["truncated"]))
    assert r.returncode == 1 and "Traceback" not in r.stderr and r.stderr.count("\n") == 2


def test_real_process_debug_shows_the_traceback(world):
    r = _fastload("--debug", "inspect", str(world["tmp"] / "nope"))
    assert r.returncode == 1  # Python's own exit code for an uncaught exception
    assert r.stderr.startswith("Traceback (most recent call last):")
    assert "fastload.errors.FormatError: " in r.stderr and "no such dataset directory" in r.stderr


def test_a_closed_stdout_is_not_an_error(world):
    """``fastload inspect OUT | head -1``: the reader leaves early; no traceback, no complaint."""
    p = subprocess.Popen([sys.executable, "-m", "fastload", "inspect", str(world["packed"]), "--json"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
    p.stdout.close()  # before the child writes anything
    err = p.stderr.read().decode()
    assert p.wait(timeout=60) == 141 and err == ""


@pytest.mark.parametrize("name", ["red\x1b[31mALERT\x1b[0m", "two\nlines", "bell\x07", "c1\x9bcsi"])
def test_names_with_control_characters_are_printed_escaped(tmp_path, capsys, name):
    """A terminal escape or newline in a path cannot recolour, clear or split the error line."""
    missing = tmp_path / name
    assert main(["inspect", str(missing)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("fastload: error: ")
    assert not any(ord(c) < 0x20 and c != "\n" or 0x7F <= ord(c) < 0xA0 for c in err), repr(err)
    escaped = "".join(f"\\x{ord(c):02x}" if ord(c) < 0x20 or 0x7F <= ord(c) < 0xA0 else c for c in name)
    assert escaped in err
