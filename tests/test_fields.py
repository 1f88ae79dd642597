"""Typed fields: the field block's bytes, the schema, pack_dataset of dict samples, verify and inspect.

Expected bytes are built here with ``struct`` from the layout in docs/format.md, never by
``fastload.fields``; expected values come from the sample's index (the fixture's formula).
Images are pixel-encoded: sample ``i`` is a flat grey of ``value(i)``, and its caption and
its vector name that value, so a field read for the wrong sample fails.
"""

from __future__ import annotations

import hashlib
import io
import json
import struct

import numpy as np
import pytest
import xxhash
from PIL import Image

import fastload
from fastload import ConfigError, CorruptDataError, FormatError
from fastload.cli import main
from fastload.fields import CLASSIC, Field, Schema, decode_block, encode_block, infer_field, parse_spec


def value(i: int) -> int:
    """The grey level of sample ``i`` (steps of 24 survive JPEG)."""
    return (i * 24 + 12) % 240


class Captioned:
    """Dict samples whose every field is a function of the index."""

    def __init__(self, n: int, *, bad: dict[int, dict] | None = None) -> None:
        self.n, self.bad = n, bad or {}

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict:
        v = value(i)
        s = {
            "image": np.full((24, 32, 3), v, np.uint8),
            "label": i % 3,
            "caption": f"grey {v} sample {i}",
            "tokens": np.arange(i % 5, dtype=np.int32) + v,
            "soft": np.array([v / 255, 1 - v / 255], np.float32),
            "raw": bytes([i]) * (i % 4),
            "step": -i,
        }
        s.update(self.bad.get(i, {}))
        return {k: x for k, x in s.items() if x is not _DROP}


_DROP = object()


def _block(*parts: bytes) -> bytes:
    body = b"".join(parts)
    return struct.pack("<I", xxhash.xxh3_64_intdigest(body) & 0xFFFFFFFF) + body


# ----------------------------------------------------------------------------- the block's bytes


def test_block_bytes_follow_the_documented_layout():
    fields = [
        Field("n", "int"),
        Field("v", "array", "float32", (3,)),
        Field("t", "ragged", "int32", ()),
        Field("b", "ragged", "float32", (4,)),
        Field("s", "str"),
        Field("raw", "bytes"),
    ]
    values = {"n": -2, "v": [1.5, 2.0, -1.0], "t": np.array([7, 258], np.int32), "b": np.array([[0, 1, 2, 3]], np.float32),
              "s": "hé", "raw": b"\x00\xff"}  # fmt: skip
    want = _block(
        struct.pack("<q", -2),
        struct.pack("<3f", 1.5, 2.0, -1.0),
        struct.pack("<I2i", 2, 7, 258),
        struct.pack("<I4f", 1, 0, 1, 2, 3),
        struct.pack("<I", 3) + "hé".encode(),
        struct.pack("<I", 2) + b"\x00\xff",
    )
    got = encode_block(fields, values, where="s0")
    assert got == want
    back = decode_block(fields, got)
    assert back["n"] == -2 and back["s"] == "hé" and back["raw"] == b"\x00\xff"
    assert back["v"].tolist() == [1.5, 2.0, -1.0] and back["v"].dtype == np.float32
    assert back["t"].tolist() == [7, 258] and back["b"].shape == (1, 4)


@pytest.mark.parametrize(
    "damage, match",
    [
        (lambda b: b[:4] + bytes([b[4] ^ 1]) + b[5:], "checksum mismatch"),
        (lambda b: _block(b[4:-1]), "ends inside field"),
        (lambda b: _block(b[4:] + b"x"), "bytes after its last field"),
        (lambda b: _block(b[4:12] + struct.pack("<I", 99) + b[16:]), "ends inside field 't'"),
        (lambda b: b"\x00\x00", "shorter than its 4-byte check"),
    ],
)
def test_a_damaged_block_is_refused(damage, match):
    fields = [Field("n", "int"), Field("t", "ragged", "int32", ())]
    good = encode_block(fields, {"n": 1, "t": [1, 2]}, where="x")
    with pytest.raises(CorruptDataError, match=match):
        decode_block(fields, damage(good), where="x")


def test_text_that_is_not_utf8_is_refused():
    f = [Field("s", "str")]
    with pytest.raises(CorruptDataError, match="not valid UTF-8"):
        decode_block(f, _block(struct.pack("<I", 1) + b"\xff"))


@pytest.mark.parametrize(
    "spec, want",
    [
        ("int", Field("x", "int")),
        ("str", Field("x", "str")),
        ("bytes", Field("x", "bytes")),
        ("float32[512]", Field("x", "array", "float32", (512,))),
        ("float64", Field("x", "array", "float64", ())),
        ("int64[2][3]", Field("x", "array", "int64", (2, 3))),
        ("int32[]", Field("x", "ragged", "int32", ())),
        ("float32[][4]", Field("x", "ragged", "float32", (4,))),
    ],
)
def test_spec_strings(spec, want):
    assert parse_spec("x", spec) == want
    assert want.spec == spec


@pytest.mark.parametrize("spec", ["float", "complex64[3]", "int32[][]", "float32[3][]", "int[3]", "", 5, "float32[0]"])
def test_bad_spec_strings_name_the_field(spec):
    with pytest.raises(ConfigError, match="field 'x'"):
        parse_spec("x", spec)


def test_inference_rules():
    assert infer_field("label", 3, where="s") == Field("label", "label")
    assert infer_field("n", np.int64(3), where="s") == Field("n", "int")
    assert infer_field("t", np.arange(4, dtype=np.int32), where="s") == Field("t", "ragged", "int32", ())
    assert infer_field("v", np.zeros(8, np.float32), where="s") == Field("v", "array", "float32", (8,))
    assert infer_field("v", [0.5, 1.5], where="s") == Field("v", "array", "float32", (2,))
    assert infer_field("v", [1, 2], where="s") == Field("v", "array", "int64", (2,))
    assert infer_field("c", "text", where="s") == Field("c", "str")
    with pytest.raises(ConfigError, match=r"s: field 'b' is a bool"):
        infer_field("b", True, where="s")
    with pytest.raises(ConfigError, match=r"s: field 'o' is a dict"):
        infer_field("o", {}, where="s")


def test_schema_rules():
    with pytest.raises(ConfigError, match="declared twice"):
        Schema([Field("image", "image"), Field("a", "int"), Field("a", "str")])
    with pytest.raises(ConfigError, match="first field must be the image"):
        Schema([Field("a", "int")])
    with pytest.raises(ConfigError, match="not usable"):
        Field("../x", "int")
    assert CLASSIC.plain and CLASSIC.names == ("image", "label")


# ----------------------------------------------------------------------------- pack_dataset of dicts


def _grey(payload: bytes) -> float:
    return float(np.asarray(Image.open(io.BytesIO(payload)).convert("L"), dtype=np.float64).mean())


def test_dict_samples_pack_every_field_and_pixel(tmp_path):
    n = 12
    res = fastload.pack_dataset(Captioned(n), tmp_path / "out", workers=1, progress=False)
    assert res.num_samples == n and not res.skipped
    ds = fastload.Dataset(tmp_path / "out", check=True)
    m = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert m["version"] == "3.0" and m["options"]["format_version"] == "3.0"
    assert m["fields"] == [
        {"name": "image", "kind": "image"},
        {"name": "label", "kind": "label"},
        {"name": "caption", "kind": "str"},
        {"name": "tokens", "kind": "ragged", "dtype": "int32", "shape": []},
        {"name": "soft", "kind": "array", "dtype": "float32", "shape": [2]},
        {"name": "raw", "kind": "bytes"},
        {"name": "step", "kind": "int"},
    ]
    for i in range(n):
        v = value(i)
        got = ds.fields(i, ["image", "label", "caption", "tokens", "soft", "raw", "step"])
        assert abs(_grey(got["image"]) - v) < 2, i
        assert got["label"] == i % 3 and got["caption"] == f"grey {v} sample {i}"
        assert got["tokens"].tolist() == list(range(v, v + i % 5)) and got["tokens"].dtype == np.int32
        assert np.array_equal(got["soft"], np.array([v / 255, 1 - v / 255], np.float32))
        assert got["raw"] == bytes([i]) * (i % 4) and got["step"] == -i
        # the caption names the grey its own pixels carry
        assert int(got["caption"].split()[1]) == round(_grey(got["image"]) / 24 - 0.5) * 24 + 12
    # field_values (the loader's reader) gives the same, in the order asked
    order = [5, 0, 11, 5]
    assert [d["caption"] for d in ds.field_values(order)] == [f"grey {value(i)} sample {i}" for i in order]
    # statistics, computed here from the fixture's formulas
    st = m["stats"]["fields"]
    lens = [len(f"grey {value(i)} sample {i}") for i in range(n)]
    assert st["caption"]["length"] == {"min": min(lens), "median": float(np.median(lens)), "max": max(lens)}
    toks = [t for i in range(n) for t in range(value(i), value(i) + i % 5)]
    assert (st["tokens"]["min"], st["tokens"]["max"]) == (min(toks), max(toks))
    assert (st["step"]["min"], st["step"]["max"]) == (-(n - 1), 0)
    assert fastload.verify(tmp_path / "out").ok


def test_dict_samples_without_typed_fields_write_format_2_byte_for_byte(tmp_path):
    class Pairs:
        def __len__(self):
            return 6

        def __getitem__(self, i):
            return np.full((16, 16, 3), value(i), np.uint8), i % 2

    class Dicts(Pairs):
        def __getitem__(self, i):
            img, lab = Pairs.__getitem__(self, i)
            return {"image": img, "label": lab}

    fastload.pack_dataset(Pairs(), tmp_path / "a", workers=1, progress=False)
    fastload.pack_dataset(Dicts(), tmp_path / "b", workers=1, progress=False)
    shard = "shard-00000.lmdb"
    assert hashlib.sha256((tmp_path / "a" / shard).read_bytes()).digest() == hashlib.sha256((tmp_path / "b" / shard).read_bytes()).digest()
    m = json.loads((tmp_path / "b" / "manifest.json").read_text())
    assert m["version"] == "2.0" and "fields" not in m
    assert fastload.Dataset(tmp_path / "b").schema == CLASSIC


def test_samples_without_label_and_declared_kinds(tmp_path):
    class D:
        def __len__(self):
            return 4

        def __getitem__(self, i):
            return {"image": np.full((16, 16, 3), value(i), np.uint8), "ids": [i, i + 1], "emb": [float(i)] * 3}

    fastload.pack_dataset(D(), tmp_path / "o", fields={"ids": "int32[]"}, workers=1, progress=False)
    ds = fastload.Dataset(tmp_path / "o")
    assert ds.schema.names == ("image", "ids", "emb") and ds.schema["ids"].kind == "ragged"
    assert ds.classes == ["0"] and ds.labels.tolist() == [0, 0, 0, 0]
    assert ds.fields(3) == {"ids": pytest.approx(np.array([3, 4])), "emb": pytest.approx(np.array([3.0, 3.0, 3.0]))}
    assert ds.fields(2)["emb"].dtype == np.float32


@pytest.mark.parametrize(
    "bad, match",
    [
        ({"caption": _DROP}, r"dataset\[4\]: field 'caption' is missing"),
        ({"caption": 5}, r"dataset\[4\]: field 'caption' \(str\) must be a str"),
        ({"soft": np.zeros(3, np.float32)}, r"dataset\[4\]: field 'soft' \(float32\[2\]\) must have shape \(2,\)"),
        ({"tokens": np.zeros((2, 2), np.int32)}, r"dataset\[4\]: field 'tokens' \(int32\[\]\) must be one-dimensional"),
        ({"step": 1.5}, r"dataset\[4\]: field 'step' must be an integer"),
        ({"extra": 1}, r"dataset\[4\]: key\(s\) 'extra' are not in the schema"),
        ({"label": 2.0}, r"dataset\[4\]: label 2.0 \(float\) is not an integer"),
        ({"tokens": np.array([2**40])}, r"dataset\[4\]: field 'tokens' \(int32\[\]\): a value does not fit in int32"),
    ],
)
def test_every_sample_is_checked_against_the_schema(tmp_path, bad, match):
    with pytest.raises(ConfigError, match=match):
        fastload.pack_dataset(Captioned(8, bad={4: bad}), tmp_path / "o", workers=1, progress=False)
    assert not (tmp_path / "o").exists() and not (tmp_path / "o.partial").exists()


def test_a_sample_without_image_is_skipped_and_listed(tmp_path):
    res = fastload.pack_dataset(Captioned(6, bad={2: {"image": _DROP}}), tmp_path / "o", workers=1, progress=False)
    assert res.skipped == [{"path": "dataset[2]", "reason": "the sample has no 'image'"}]
    ds = fastload.Dataset(tmp_path / "o")
    assert [ds.fields(k)["caption"] for k in range(5)] == [f"grey {value(i)} sample {i}" for i in (0, 1, 3, 4, 5)]


def test_resume_of_a_dict_pack_is_identical(tmp_path):
    class Stops(Captioned):
        armed = True

        def __getitem__(self, i):
            if self.armed and i == 30:
                raise KeyboardInterrupt
            return super().__getitem__(i)

    src = Stops(40)
    src.armed = False
    ref = fastload.pack_dataset(src, tmp_path / "ref", shard_size="8KiB", workers=1, progress=False)
    assert ref.num_shards >= 3
    src.armed = True
    with pytest.raises(KeyboardInterrupt):
        fastload.pack_dataset(src, tmp_path / "out", shard_size="8KiB", workers=1, progress=False)
    assert (tmp_path / "out.partial" / "journal.json").exists()
    src.armed = False
    fastload.pack_dataset(src, tmp_path / "out", shard_size="8KiB", workers=1, progress=False, resume=True)

    def files(d):
        return {p.name: p.read_bytes() for p in sorted(d.iterdir()) if p.name != "manifest.json"}

    def manifest(d):
        m = json.loads((d / "manifest.json").read_text())
        m.pop("created")
        return m

    assert files(tmp_path / "out") == files(tmp_path / "ref")
    assert manifest(tmp_path / "out") == manifest(tmp_path / "ref")  # stats.fields counted the kept shards too


# ----------------------------------------------------------------------------- damage, old readers, inspect


def _flip_in_shard(root, needle: bytes) -> None:
    p = root / "shard-00000.lmdb"
    data = bytearray(p.read_bytes())
    k = data.find(needle)
    assert k > 0 and data.find(needle, k + 1) < 0
    data[k] ^= 0x01
    p.write_bytes(bytes(data))


def test_verify_and_reads_catch_an_altered_field(tmp_path):
    fastload.pack_dataset(Captioned(6), tmp_path / "o", workers=1, progress=False)
    _flip_in_shard(tmp_path / "o", b"grey 84 sample 3")
    report = fastload.verify(tmp_path / "o")
    assert any("sample 3" in p and "field block checksum mismatch" in p for p in report.problems), report.problems
    with pytest.raises(CorruptDataError, match="sample 3.*field block checksum mismatch"):
        fastload.Dataset(tmp_path / "o", check=True).fields(3)
    assert fastload.Dataset(tmp_path / "o", check=True).fields(2)["caption"] == "grey 60 sample 2"


def test_verify_catches_altered_field_statistics(tmp_path):
    fastload.pack_dataset(Captioned(6), tmp_path / "o", workers=1, progress=False)
    mp = tmp_path / "o" / "manifest.json"
    m = json.loads(mp.read_text())
    m["stats"]["fields"]["step"]["min"] = -100
    mp.write_text(json.dumps(m))
    assert any("stats.fields differ" in p for p in fastload.verify(tmp_path / "o").problems)


@pytest.mark.parametrize(
    "change, match",
    [
        (lambda m: m.pop("fields"), "lacks a fields list"),
        (lambda m: m.update(version="2.0"), "has a fields list"),
        (lambda m: m["fields"].append({"name": "x", "kind": "array", "dtype": "complex64", "shape": [2]}), "dtype 'complex64'"),
        (lambda m: m["fields"].insert(0, m["fields"].pop(1)), "first field must be the image"),
        (lambda m: m.update(fields={"a": 1}), "fields is a dict, not a list"),
    ],
)
def test_a_malformed_schema_is_refused(tmp_path, change, match):
    fastload.pack_dataset(Captioned(3), tmp_path / "o", workers=1, progress=False)
    mp = tmp_path / "o" / "manifest.json"
    m = json.loads(mp.read_text())
    change(m)
    mp.write_text(json.dumps(m))
    with pytest.raises(FormatError, match=match):
        fastload.Dataset(tmp_path / "o")


def test_inspect_shows_the_schema_and_statistics(tmp_path, capsys):
    fastload.pack_dataset(Captioned(5), tmp_path / "o", workers=1, progress=False)
    info = fastload.inspect(tmp_path / "o")
    by = {f["name"]: f for f in info["fields"]}
    assert by["tokens"]["kind"] == "int32[]" and by["tokens"]["length"] == {"min": 0, "median": 2.0, "max": 4}
    assert (by["soft"]["min"], by["soft"]["max"]) == (pytest.approx(value(0) / 255), pytest.approx(1 - value(0) / 255))
    assert main(["inspect", str(tmp_path / "o")]) == 0
    out = capsys.readouterr().out
    assert "fields:" in out and "tokens" in out and "int32[]" in out and "length min 0  median 2.0  max 4" in out
    assert main(["verify", str(tmp_path / "o")]) == 0


def test_a_manifest_declaring_fields_over_records_without_them_is_reported(tmp_path):
    class Pairs:
        def __len__(self):
            return 3

        def __getitem__(self, i):
            return np.full((16, 16, 3), value(i), np.uint8), 0

    fastload.pack_dataset(Pairs(), tmp_path / "o", workers=1, progress=False)
    mp = tmp_path / "o" / "manifest.json"
    m = json.loads(mp.read_text())
    m.update(version="3.0", fields=[{"name": "image", "kind": "image"}, {"name": "label", "kind": "label"}, {"name": "txt", "kind": "str"}])
    mp.write_text(json.dumps(m))
    ds = fastload.Dataset(tmp_path / "o")
    with pytest.raises(CorruptDataError, match="sample 1: record version 2 has no field block, but the manifest declares fields"):
        ds.field_values([1])
    assert any("record version 2 has no field block" in p for p in fastload.verify(tmp_path / "o").problems)


def test_a_ragged_count_past_the_block_allocates_nothing():
    f = [Field("t", "ragged", "float64", (1024,))]
    forged = _block(struct.pack("<I", 2**32 - 1) + b"\x00" * 16)  # 4 billion rows of 8 KiB claimed
    with pytest.raises(CorruptDataError, match="ends inside field 't'"):
        decode_block(f, forged)


@pytest.mark.parametrize(
    "dataset, classes, message",
    [
        (Captioned(6), "cat", "classes: expected a list of class names, got str"),  # not the classes 'c', 'a', 't'
        (Captioned(6), [], "classes: the list of class names is empty"),
        (type("Unsized", (), {"__getitem__": lambda self, i: Captioned(6)[i]})(), None, "has no len()"),
    ],
)
def test_dict_datasets_check_their_length_and_classes_as_tuple_datasets_do(tmp_path, dataset, classes, message):
    with pytest.raises(ConfigError, match=message):
        fastload.pack_dataset(dataset, tmp_path / "out", classes=classes, fields={"caption": "str"}, workers=1, progress=False)
    assert not (tmp_path / "out").exists()
