"""fastload.packing.sources' list files as tables: header forms x delimiters x label kinds, expected by hand.

Every list file here is written from the same three data rows; the expected items (path resolved
against the list file's folder, the stored name, the label) and classes are written out in the
test, so a header row read as data (or a data row read as a header) shows as an item more or
less, or a refused row, whatever the parser does. The header forms are the issue's: both cells
known (``path,label``), one known cell only (``image_path,breed``, ``loc,class``), any case and
padding, after comments and blank lines, neither cell known (then it is data), and a header-like
row that is not first (data too).
"""

from __future__ import annotations

import os

import pytest

from fastload.errors import ConfigError
from fastload.packing.sources import read_list

NAMES = [("a.jpg", "cat"), ("sub/b.jpg", "dog"), ("c.jpg", "cat")]
INTS = [("a.jpg", "2"), ("sub/b.jpg", "007"), ("c.jpg", "0")]
WANT = {"names": (["cat", "dog"], [0, 1, 0]), "ints": (["0", "1", "2", "3", "4", "5", "6", "7"], [2, 7, 0])}

# (header cells, is it a header?)
HEADERS = [
    (("path", "label"), True),
    (("image_path", "breed"), True),  # one known cell: the path's
    (("filename", "species"), True),
    (("loc", "class"), True),  # one known cell: the label's
    (("whatever", "target"), True),
    (("IMAGE", "Label"), True),  # any case
    (("  file  ", " category "), True),  # padded
    (("img", "y"), True),
    (("name", "classname"), True),
    (("file_name", "labels"), True),
    (("filepath", "class_name"), True),
    (("loc", "breed"), False),  # neither cell known: a data row
    (("photo", "kind"), False),
]
FORMATS = {  # suffix -> (delimiter, quote the cells?)
    ".csv": (",", False),
    ".tsv": ("\t", False),
    ".txt": (" ", False),
    ".lst": (",", True),  # no known suffix: the delimiter from the first row
}


def write(path, header, rows, delim, quote, pre=""):
    def cell(c):
        return f'"{c}"' if quote else c

    lines = [delim.join(cell(c) for c in header)] if header else []
    lines += [delim.join(cell(c) for c in r) for r in rows]
    path.write_text(pre + "\n".join(lines) + "\n")
    return path


@pytest.mark.parametrize("suffix", list(FORMATS))
@pytest.mark.parametrize("labels", ["names", "ints"])
@pytest.mark.parametrize("header, is_header", HEADERS, ids=[",".join(h) for h, _ in HEADERS])
@pytest.mark.parametrize("pre", ["", "# made by hand\n\n"])
def test_header_forms_table(tmp_path, suffix, labels, header, is_header, pre):
    """Kills: the header test needing both cells known (``image_path,breed`` read as a data row: a
    "breed" class more, or an integer file refused), the case or padding not normalised, a comment or
    blank line before it counting as the first row, the header test applied to later rows."""
    delim, quote = FORMATS[suffix]
    if delim == " " and any(" " in c.strip() for c in header):
        pytest.skip("a whitespace list cannot hold a cell with a space")
    rows = NAMES if labels == "names" else INTS
    lst = write(tmp_path / f"list{suffix}", [c if delim != " " else c.strip() for c in header], rows, delim, quote, pre)
    classes, want_labels = WANT[labels]
    items = [(str(tmp_path / p), p, lab) for (p, _), lab in zip(rows, want_labels)]
    if is_header:
        src = read_list(lst)
        assert (src.classes, [(it.path, it.name, it.label) for it in src.items]) == (classes, items)
        assert all(it.error is None for it in src.items)
        return
    line = 1 + pre.count("\n")
    if labels == "names":
        # the row is data: its label is a class of its own
        src = read_list(lst)
        extra = header[1].strip()
        names = sorted({"cat", "dog", extra})
        assert src.classes == names
        got = [(it.name, src.classes[it.label]) for it in src.items]
        assert got == [(header[0].strip(), extra)] + [(p, c) for p, c in NAMES]
    else:
        with pytest.raises(ConfigError) as e:
            read_list(lst)
        assert str(e.value) == (
            f"SRC {lst}:{line}: label {header[1].strip()!r} is not an integer, but this list file's labels are "
            "integers (ASCII digits) (3 of 4 rows)"
        )
        src = read_list(lst, on_error="skip")
        assert [it.error is not None for it in src.items] == [True, False, False, False]
        assert src.items[0].name == f"{lst}:{line}" and src.classes == classes


@pytest.mark.parametrize("suffix", [".csv", ".tsv"])
def test_a_header_like_row_that_is_not_first_is_data(tmp_path, suffix):
    delim = FORMATS[suffix][0]
    lst = write(tmp_path / f"l{suffix}", None, [NAMES[0], ("path", "label"), NAMES[1]], delim, False)
    src = read_list(lst)
    assert src.classes == ["cat", "dog", "label"]
    assert [(it.name, it.label) for it in src.items] == [("a.jpg", 0), ("path", 2), ("sub/b.jpg", 1)]


def test_a_header_of_one_cell_is_not_a_header(tmp_path):
    """A first row with one cell is a bad row (not skipped as a header even if it says "path")."""
    lst = tmp_path / "l.csv"
    lst.write_text("path\na.jpg,cat\nb.jpg,dog\n")
    with pytest.raises(ConfigError) as e:
        read_list(lst)
    assert str(e.value) == f"SRC {lst}:1: expected 'path,label', got ['path']"


def test_a_utf8_bom_and_crlf_do_not_hide_the_header(tmp_path):
    lst = tmp_path / "l.csv"
    lst.write_bytes("\ufeffImage_Path,breed\r\na.jpg,cat\r\nsub/b.jpg,dog\r\n".encode("utf-8"))
    src = read_list(lst)
    assert src.classes == ["cat", "dog"] and [(it.name, it.label) for it in src.items] == [("a.jpg", 0), ("sub/b.jpg", 1)]


def test_only_a_header_is_no_list(tmp_path):
    lst = tmp_path / "l.csv"
    lst.write_text("path,label\n")
    with pytest.raises(ConfigError) as e:
        read_list(lst)
    assert str(e.value) == f"SRC {lst}: the list file has no 'path,label' rows"


@pytest.mark.parametrize(
    "text, classes, labels",
    [
        ("a.jpg,1\nb.jpg,x\nc.jpg,2\n", ["0", "1", "2"], "x"),  # integers are most: 'x' is refused
        ("a.jpg,x\nb.jpg,1\nc.jpg,y\n", ["x", "y"], "1"),  # names are most: '1' is refused
        ("a.jpg,x\nb.jpg,1\n", ["x"], "1"),  # a tie: the first data row's kind
        ("a.jpg,1\nb.jpg,x\n", ["0", "1"], "x"),
    ],
)
def test_the_label_kind_is_the_majoritys(tmp_path, text, classes, labels):
    lst = tmp_path / "l.csv"
    lst.write_text(text)
    src = read_list(lst, on_error="skip")
    bad = [it for it in src.items if it.error]
    assert len(bad) == 1 and f"label {labels!r}" in bad[0].error
    assert src.classes == classes


def test_relative_paths_resolve_against_the_list_files_folder(tmp_path):
    (tmp_path / "deep").mkdir()
    lst = tmp_path / "deep" / "l.txt"
    lst.write_text("x/a.jpg 0\n/abs/b.jpg 1\n")
    src = read_list(lst)
    assert [it.path for it in src.items] == [os.path.join(str(tmp_path / "deep"), "x/a.jpg"), "/abs/b.jpg"]
