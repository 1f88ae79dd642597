"""``fastload pack / inspect / verify`` through ``fastload.cli.main([...])``."""

from __future__ import annotations

import json
import logging
import os
import re
from pathlib import Path

import pytest

from fastload.cli import main
from fastload.format import shard_name


def run(capsys, *argv) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def one_error_line(err: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1, err
    assert "Traceback" not in err
    return lines[0]


@pytest.fixture
def packed(make_folder, tmp_path) -> tuple[Path, Path]:
    src = make_folder(classes=3, per_class=4)
    (src / "class_1" / "broken.jpg").write_bytes(b"")
    out = tmp_path / "out"
    assert main(["pack", str(src), str(out), "--workers", "1", "--no-progress"]) == 0
    return src, out


def test_pack_summary_and_skipped(make_folder, tmp_path, capsys):
    src = make_folder(classes=3, per_class=4)
    (src / "class_1" / "broken.jpg").write_bytes(b"")
    code, out, err = run(capsys, "pack", src, tmp_path / "o", "--workers", "2", "--shard-size", "8KiB")
    assert code == 0, err
    lines = out.splitlines()
    assert re.fullmatch(
        rf"packed 12 images, 3 classes, \d+ shards, \d+\.\d MB, 1 skipped, \d+\.\d s -> {re.escape(str(tmp_path / 'o'))}", lines[0]
    ), lines[0]
    assert lines[1] == f"  skipped {src / 'class_1' / 'broken.jpg'}: zero-byte file"
    assert "Traceback" not in err


def test_pack_all_options(make_folder, tmp_path, capsys):
    src = make_folder(classes=2, per_class=2, size=(100, 80))
    out = tmp_path / "o"
    code, _, err = run(
        capsys, "pack", src, out, "--workers", "1", "--shard-size", "1MB", "--on-error", "fail", "--max-size", "50",
        "--quality", "70", "--baseline", "--max-pixels", "100000", "--no-progress",
    )  # fmt: skip
    assert code == 0, err
    m = json.loads((out / "manifest.json").read_text())
    assert m["options"]["max_size"] == 50 and m["options"]["quality"] == 70 and m["options"]["baseline"] is True
    assert m["options"]["shard_size"] == 10**6 and m["stats"]["resized"] == 4 and m["stats"]["width"]["max"] == 50
    code, _, err = run(capsys, "pack", src, out, "--overwrite", "--no-progress")
    assert code == 0, err


def test_inspect_text_and_json(packed, capsys):
    _src, out = packed
    code, text, _ = run(capsys, "inspect", out)
    assert code == 0
    assert "samples      12" in text and "skipped      1" in text and "encodings    jpeg 12" in text
    assert "width        min 64  median 64  max 64" in text and re.search(r"\s4\s+class_1", text)
    code, js, _ = run(capsys, "inspect", out, "--json")
    info = json.loads(js)
    assert info["samples"] == 12 and info["classes"][1] == {"name": "class_1", "count": 4}
    assert info["shards"][0]["file"] == shard_name(0) and info["progressive"] == 0
    assert info["height"] == {"min": 48, "median": 48, "max": 48}


def test_verify_ok_and_bad(packed, capsys):
    _src, out = packed
    code, text, _ = run(capsys, "verify", out, "--decode")
    assert code == 0 and text.strip() == f"ok: {out}: 1 shards, 12 samples decoded"
    shard = out / shard_name(0)
    data = shard.read_bytes()
    shard.write_bytes(data[:-4096])
    code, _, err = run(capsys, "verify", out)
    assert code == 1
    assert f"bad shard {shard}: {len(data) - 4096} bytes, the manifest says {len(data)}" in err
    assert "Traceback" not in err


@pytest.mark.parametrize(
    "argv, message",
    [
        (["pack"], "the following arguments are required: SRC, OUT"),
        (["pack", "{src}", "{out}", "--shard-size", "lots"], "--shard-size"),
        (["pack", "{src}", "{out}", "--on-error", "ignore"], "invalid choice: 'ignore'"),
        (["pack", "{src}", "{out}", "--workers", "two"], "--workers: invalid int value"),
        (["pack", "{src}", "{out}", "--workers", "0"], "--workers"),
        (["pack", "{src}", "{out}", "--quality", "0"], "--quality"),
        (["pack", "{src}", "{out}", "--max-size", "-1"], "--max-size"),
        (["pack", "{tmp}/nope", "{out}"], "no such file or directory"),
        (["pack", "{src}", "{src}/inside"], "inside SRC"),
        (["pack", "{src}", "{packed}"], "already exists; pass --overwrite"),
        (["inspect", "{tmp}/nope"], "no such dataset directory"),
        (["inspect", "{src}"], "missing manifest"),
        (["verify", "{tmp}/nope"], "no such dataset directory"),
        (["verify"], "required: OUT"),
    ],
)
def test_error_paths_are_one_line_exit_2(packed, tmp_path, capsys, argv, message):
    src, out = packed
    fill = {"src": src, "out": tmp_path / "new", "packed": out, "tmp": tmp_path}
    code, _, err = run(capsys, *[a.format(**fill) for a in argv])
    assert code == 2
    line = one_error_line(err)
    assert message in line, line
    assert not (tmp_path / "new").exists() and not (tmp_path / "new.partial").exists()


def test_on_error_fail_exits_2_and_leaves_nothing(packed, tmp_path, capsys):
    src, _ = packed
    code, out, err = run(capsys, "pack", src, tmp_path / "new", "--on-error", "fail", "--no-progress")
    assert code == 2
    assert one_error_line(err) == f"fastload: error: {src / 'class_1' / 'broken.jpg'}: zero-byte file"
    assert not (tmp_path / "new").exists() and not (tmp_path / "new.partial").exists()


def test_unfinished_pack_needs_resume(packed, tmp_path, capsys):
    src, _ = packed
    partial = tmp_path / "new.partial"
    partial.mkdir()
    (partial / "journal.json").write_text("{}")
    code, _, err = run(capsys, "pack", src, tmp_path / "new")
    assert code == 2 and "--resume" in one_error_line(err) and "--overwrite" in err
    code, _, err = run(capsys, "pack", src, tmp_path / "new", "--resume")
    assert code == 2 and "unreadable journal" in one_error_line(err)
    code, _, err = run(capsys, "pack", src, tmp_path / "new", "--overwrite", "--no-progress")
    assert code == 0, err
    assert sorted(os.listdir(tmp_path / "new")) == ["labels.bin", "manifest.json", shard_name(0)]
