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


# ----------------------------------------------------------------------------- delimiters, comments, blank rows


def rows_of(src):
    return [(it.name, it.error) if it.error else (it.name, src.classes[it.label]) for it in src.items]


def test_a_tsv_is_split_at_tabs_whatever_its_first_row_holds(tmp_path):
    """Kills: the ``.tsv`` suffix test joined by ``and``, compared with ``.TSV``, or the suffix not passed
    (``None``/upper case): the file is then read as CSV because its first row holds a comma."""
    lst = tmp_path / "l.tsv"
    lst.write_text("a,1.jpg\nb.jpg\tcat\nc.jpg\tdog\n")
    src = read_list(lst, on_error="skip")
    assert rows_of(src) == [(f"{lst}:1", "expected 'path,label', got ['a,1.jpg']"), ("b.jpg", "cat"), ("c.jpg", "dog")]


def test_a_csv_is_split_at_commas_whatever_its_first_row_holds(tmp_path):
    """Kills: the ``.csv`` test as ``.CSV`` or the suffix not passed: a first row without a comma then makes
    the file whitespace-separated, and every row is refused."""
    lst = tmp_path / "l.csv"
    lst.write_text("x.jpg\nb.jpg,cat\nc d.jpg,dog\n")
    src = read_list(lst, on_error="skip")
    assert rows_of(src) == [(f"{lst}:1", "expected 'path,label', got ['x.jpg']"), ("b.jpg", "cat"), ("c d.jpg", "dog")]


def test_another_suffix_with_tabs_in_its_first_row_is_tab_separated(tmp_path):
    """A label with a space stays whole, quotes are CSV quotes. Kills: the tab test as another string, the
    tab delimiter replaced by whitespace splitting (the label's last word would be the label)."""
    lst = tmp_path / "l.lst"
    lst.write_text('a.jpg\tmy cat\n"b.jpg"\t"big dog"\n')
    src = read_list(lst)
    assert rows_of(src) == [("a.jpg", "my cat"), ("b.jpg", "big dog")]


def test_a_whitespace_list_keeps_unicode_spaces_and_refuses_a_row_of_one_cell(tmp_path):
    """Only ASCII spaces and tabs are stripped around a line (a no-break space is part of the label), and a
    line with no space is one cell. Kills: ``strip()`` of every Unicode space; a line with no space split
    anyway (``and False``)."""
    lst = tmp_path / "l.txt"
    lst.write_text("a.jpg cat\u00a0\n\tb.jpg dog \nlonely.jpg\n")
    src = read_list(lst, on_error="skip")
    assert rows_of(src) == [("a.jpg", "cat\u00a0"), ("b.jpg", "dog"), (f"{lst}:3", "expected 'path,label', got ['lonely.jpg']")]


def test_a_list_of_comments_only_has_no_rows(tmp_path):
    """Kills: the first data line defaulting to None when there is none (``"\\t" in None``)."""
    lst = tmp_path / "l.txt"
    lst.write_text("# nothing here\n\n   # nor here\n")
    with pytest.raises(ConfigError) as e:
        read_list(lst)
    assert str(e.value) == f"SRC {lst}: the list file has no 'path,label' rows"


def test_indented_comments_and_rows_of_empty_cells_are_skipped_in_csv(tmp_path):
    """Kills: the comment test on the right-stripped cell (an indented ``#`` row read as data); a row of
    empty cells (``,``) kept because the row itself is not empty (``and`` for ``or``)."""
    lst = tmp_path / "l.csv"
    lst.write_text("a.jpg,cat\n   # a note,dog\n,\n , \nb.jpg,dog\n")
    src = read_list(lst)
    assert rows_of(src) == [("a.jpg", "cat"), ("b.jpg", "dog")] and src.classes == ["cat", "dog"]


@pytest.mark.parametrize("suffix, delim, kind", [(".csv", ",", "CSV"), (".tsv", "\t", "TSV")])
def test_rows_after_a_csv_error_are_still_read(tmp_path, suffix, delim, kind):
    """A cell over the csv module's field limit is a bad row, not the end of the file, named by the file's
    kind. Kills: ``break`` for ``continue`` after the csv error; the kind's name changed."""
    import csv

    lst = tmp_path / f"l{suffix}"
    lst.write_text(f"a.jpg{delim}cat\n" + "x" * (csv.field_size_limit() + 10) + f"{delim}dog\nb.jpg{delim}dog\n")
    src = read_list(lst, on_error="skip")
    got = rows_of(src)
    assert got[0] == ("a.jpg", "cat") and got[2] == ("b.jpg", "dog") and len(got) == 3
    assert got[1] == (f"{lst}:2", f"not a valid {kind} row (field larger than field limit ({csv.field_size_limit()}))")


# ----------------------------------------------------------------------------- labels


def test_integer_label_errors_name_the_label_cut_at_40_characters(tmp_path):
    """Labels are shown whole up to 40 characters, then their first 40 and ``...``. Kills: the bound as
    ``<`` or 41, the cut at 41, the ellipsis changed, the label not shown; the negative-label message."""
    from fastload.packing.sources import MAX_CLASSES

    cases = [
        ("1" * 40, f"label {'1' * 40} is too large; integer labels must be below {MAX_CLASSES} (MAX_CLASSES)"),
        ("2" * 41, f"label {'2' * 40}... is too large; integer labels must be below {MAX_CLASSES} (MAX_CLASSES)"),
        (str(MAX_CLASSES), f"label {MAX_CLASSES} is too large; integer labels must be below {MAX_CLASSES} (MAX_CLASSES)"),
        ("-5", "label -5 is negative; labels are 0, 1, 2, ... or class names"),
    ]
    for lab, message in cases:
        lst = tmp_path / "l.csv"
        lst.write_text(f"a.jpg,1\nb.jpg,{lab}\n")
        with pytest.raises(ConfigError) as e:
            read_list(lst)
        assert str(e.value) == f"SRC {lst}:2: {message}"
    lst.write_text(f"a.jpg,{MAX_CLASSES - 1}\nb.jpg,{'0' * 60}7\n")
    src = read_list(lst)
    assert [it.label for it in src.items] == [MAX_CLASSES - 1, 7] and len(src.classes) == MAX_CLASSES


# ----------------------------------------------------------------------------- files that are not list files


@pytest.mark.timeout(30)  # a FIFO opened without O_NONBLOCK would wait for a writer forever
def test_what_is_not_a_regular_readable_file_is_refused_naming_it(tmp_path):
    """Kills: the path left out of the messages, ``what`` (``list file``) changed, the file kind not named,
    the OS's reason replaced by the exception's text, a FIFO opened blocking (the test would hang)."""
    fifo = tmp_path / "l.csv"
    os.mkfifo(fifo)
    cases = [
        (fifo, f"SRC {fifo}: not a regular file (FIFO); a list file must be a regular file"),
        (tmp_path, f"SRC {tmp_path}: not a regular file (directory); a list file must be a regular file"),
        (tmp_path / "missing.csv", f"SRC {tmp_path / 'missing.csv'}: cannot read list file: No such file or directory"),
        ("/proc/self/mem", "SRC /proc/self/mem: cannot read list file: Input/output error"),  # regular, unreadable
    ]
    for path, message in cases:
        with pytest.raises(ConfigError) as e:
            read_list(path)
        assert str(e.value) == message


def test_reading_a_list_file_warns_nothing(tmp_path):
    """Kills: the file opened line-buffered (Python warns that binary files cannot be)."""
    import warnings

    lst = tmp_path / "l.csv"
    lst.write_text("a.jpg,cat\n")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert rows_of(read_list(lst)) == [("a.jpg", "cat")]


def test_file_kinds_in_words():
    """Kills: the fallback for a mode no test matches (a symlink's, 0) changed or dropped."""
    import stat

    from fastload.packing.sources import file_kind

    got = [file_kind(m) for m in (stat.S_IFIFO, stat.S_IFCHR, stat.S_IFBLK, stat.S_IFSOCK, stat.S_IFDIR, stat.S_IFLNK, 0)]
    assert got == ["FIFO", "character device", "block device", "socket", "directory", "special file", "special file"]


@pytest.mark.parametrize(
    "name, want",
    [("\udc80", "\\x80"), ("\udcff", "\\xff"), ("\udc7f", "\\udc7f"), ("\udd00", "\\udd00"), ("a\udcc3b", "a\\xc3b"),
     ("caf\u00e9", "caf\u00e9"), ("\udc80\ue000", "\\x80\ue000"), ("\ud7ff\udc80", "\ud7ff\\x80"), ("\ud800", "\\ud800"),
     ("\udfff", "\\udfff")],  # fmt: skip
)
def test_stored_names_escape_undecodable_bytes_and_other_surrogates(name, want):
    """Kills: the surrogateescape range's bounds moved (0xdc80 and 0xdcff are bytes 0x80 and 0xff); the surrogate
    range's upper bound past 0xdfff (U+E000, a private-use character beside an undecodable byte, is valid text)."""
    from fastload.packing.sources import stored_name

    assert stored_name(name) == want


# ----------------------------------------------------------------------------- in-memory datasets


class Items:
    def __init__(self, items) -> None:
        self.items = items

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i):
        return self.items[i]


def test_dataset_label_and_length_errors_name_the_value_and_type():
    """Kills: the refused label or its type left out of the message (``None`` in their place), for a string
    and for a tensor of several values (whose ``.item()`` fails); the dataset's type left out."""
    import torch

    from fastload.packing.sources import DatasetSource, map_style_len

    img = b"\xff\xd8"
    for label, shown in (("cat", "'cat' (str)"), (torch.tensor([1, 2]), "tensor([1, 2]) (Tensor)"), (2.0, "2.0 (float)")):
        with pytest.raises(ConfigError) as e:
            DatasetSource(Items([(img, label)])).task(0)
        assert str(e.value) == f"dataset[0]: label {shown} is not an integer; items must be (image, int label)"

    class NoLen:
        def __getitem__(self, i):
            return img, 0

    with pytest.raises(ConfigError) as e:
        map_style_len(NoLen())
    assert str(e.value) == "dataset: NoLen has no len(); pass a map-style dataset (len() and [i])"
    with pytest.raises(ConfigError) as e:
        map_style_len(Items([]))
    assert str(e.value) == "dataset: Items is empty (len 0); nothing to pack"


def test_class_names_refuse_what_is_not_a_list_of_names_and_read_no_more_than_needed():
    """Kills: the not-a-list test joined by ``and`` (a string read as its letters, an int iterated), its
    message's type name; more than MAX_CLASSES + 1 names read (an endless iterator would never end), the
    too-many message."""
    from fastload.packing.sources import MAX_CLASSES, class_names

    for classes, kind in (("abc", "str"), (b"ab", "bytes"), (5, "int")):
        with pytest.raises(ConfigError) as e:
            class_names(None, classes)
        assert str(e.value) == f"classes: expected a list of class names, got {kind}"

    def names():
        yield from range(MAX_CLASSES + 1)
        raise AssertionError("read past MAX_CLASSES + 1 names")

    with pytest.raises(ConfigError) as e:
        class_names(None, names())
    assert str(e.value) == f"classes: more than {MAX_CLASSES} class names; at most {MAX_CLASSES} (MAX_CLASSES) are supported"
    assert class_names(None, iter(["b", "a"])) == ["b", "a"]


def test_image_task_of_a_tensor_is_its_array_and_of_anything_else_an_error():
    """Kills: the tensor test on another attribute or object, the tensor replaced by None; the unsupported
    type's name left out."""
    import numpy as np
    import torch

    from fastload.packing.sources import image_task

    t = torch.arange(4 * 5 * 3, dtype=torch.uint8).reshape(4, 5, 3)
    kind, data, label, name, where = image_task(t, 3, "dataset[1]")
    assert (kind, label, name, where) == ("array", 3, "dataset[1]", "dataset[1]")
    assert isinstance(data, np.ndarray) and np.array_equal(data, t.numpy())
    assert image_task(2.5, 1, "dataset[2]") == (
        "error", "unsupported image type float (need a PIL image, uint8 array or bytes)", 1, "dataset[2]", "dataset[2]")  # fmt: skip


def test_a_whitespace_list_splits_at_the_last_space_or_tab(tmp_path):
    """The label is what follows the last space or tab (the path may hold both). Kills: the first tab taken
    for the last (``find`` for ``rfind``)."""
    lst = tmp_path / "l.txt"
    lst.write_text("a.jpg cat\nsome dir\tb.jpg\tdog\nc d.jpg\tcat\n")
    assert rows_of(read_list(lst)) == [("a.jpg", "cat"), ("some dir\tb.jpg", "dog"), ("c d.jpg", "cat")]


def test_the_class_count_bound_is_inclusive_and_names_the_file(tmp_path, monkeypatch):
    """MAX_CLASSES class names are accepted, one more refused (the bound made small here). Kills: ``>=``
    for ``>``."""
    import fastload.packing.sources as sources

    monkeypatch.setattr(sources, "MAX_CLASSES", 3)
    lst = tmp_path / "l.csv"
    lst.write_text("a.jpg,x\nb.jpg,y\nc.jpg,z\n")
    assert read_list(lst).classes == ["x", "y", "z"]
    lst.write_text("a.jpg,x\nb.jpg,y\nc.jpg,z\nd.jpg,w\n")
    with pytest.raises(ConfigError) as e:
        read_list(lst)
    assert str(e.value) == f"SRC {lst}: 4 class names; at most 3 classes (MAX_CLASSES) are supported"


def test_skipped_rows_are_logged_once_with_the_first(tmp_path, caplog):
    """Kills: the warning's text or its first bad row left out."""
    import logging

    lst = tmp_path / "l.csv"
    lst.write_text("a.jpg,cat\nlonely\nb.jpg,dog\nalone\n")
    with caplog.at_level(logging.WARNING, logger="fastload.packing.sources"):
        read_list(lst, on_error="skip")
    assert [r.getMessage() for r in caplog.records] == [
        f"{lst}: 2 row(s) that do not parse are skipped; the first, line 2: expected 'path,label', got ['lonely']"
    ]


def test_a_quoted_path_may_span_lines_and_a_long_bad_row_is_shown_whole(tmp_path):
    """A row of two cells whose quoted path holds a newline is a row like any other; a bad row of up to 200
    characters is shown whole (reprlib would cut a 50-character cell at 30). Kills: the quoted-cell test as
    ``<= 2`` columns; reprlib used for short rows."""
    lst = tmp_path / "l.csv"
    lst.write_text('"a\nb.jpg",cat\n' + "p" * 50 + "\nc.jpg,dog\n")
    src = read_list(lst, on_error="skip")
    assert rows_of(src) == [("a\nb.jpg", "cat"), (f"{lst}:3", f"expected 'path,label', got ['{'p' * 50}']"), ("c.jpg", "dog")]


def test_fingerprints_change_with_the_classes_and_the_samples(tmp_path):
    """"A SHA-256 that changes whenever the list of samples or classes changes" (Source.fingerprint).
    Kills: the classes left out of a list source's hash, a dataset source hashing a constant; the empty
    class list's message."""
    from fastload.packing.sources import DatasetSource, class_names

    lst = tmp_path / "l.csv"
    lst.write_text("a.jpg,1\nb.jpg,0\n")
    ints = read_list(lst).fingerprint()
    lst.write_text("a.jpg,dog\nb.jpg,cat\n")  # the same paths and labels (1, 0), other class names
    names = read_list(lst).fingerprint()
    assert len({ints, names}) == 2 and read_list(lst).fingerprint() == names
    img = b"\xff\xd8"
    a = DatasetSource(Items([(img, 0)] * 3), classes=["x", "y"]).fingerprint()
    assert a == DatasetSource(Items([(img, 0)] * 3), classes=["x", "y"]).fingerprint()
    assert len({a, DatasetSource(Items([(img, 0)] * 4), classes=["x", "y"]).fingerprint(),
                DatasetSource(Items([(img, 0)] * 3), classes=["x", "z"]).fingerprint()}) == 3  # fmt: skip
    with pytest.raises(ConfigError) as e:
        class_names(None, [])
    assert str(e.value) == "classes: the list of class names is empty"


def test_sources_that_cannot_be_read_say_why(tmp_path):
    """Kills: the OS's reason replaced by the exception's text, or looked up so that a ValueError (no
    ``strerror``) fails; the folder's name left out, the no-class and no-image messages changed."""
    from fastload.packing.sources import open_source, scan_folder

    long_name = tmp_path / ("x" * 300)
    cases = [
        (long_name, f"SRC {long_name}: cannot access it: File name too long"),
        (f"{tmp_path}/x\0y", f"SRC {tmp_path}/x\\x00y: cannot access it: embedded null byte"),
    ]
    for path, message in cases:
        with pytest.raises(ConfigError) as e:
            open_source(path)
        assert str(e.value) == message
    src = tmp_path / "src"
    (src / "cat").mkdir(parents=True)
    with pytest.raises(ConfigError) as e:
        scan_folder(src)
    assert str(e.value) == (f"SRC {src}: found no images in 1 class folder(s) "
                            "(extensions: .jpg, .jpeg, .png, .ppm, .bmp, .pgm, .tif, .tiff, .webp)")  # fmt: skip
    (src / "cat").rmdir()
    (src / "a.jpg").write_bytes(b"")
    with pytest.raises(ConfigError) as e:
        scan_folder(src)
    assert str(e.value) == (f"SRC {src}: no class folders found; an ImageFolder tree has one sub-folder per class "
                            "(SRC/cat/1.jpg, SRC/dog/2.jpg), or pass a list file (.csv/.tsv/.txt)")  # fmt: skip


def test_empty_class_folders_are_named_in_one_warning_the_first_ten(tmp_path, caplog):
    """Eleven empty class folders and one with an image: one warning, the count, then the first ten names
    in label order, joined by ", ". Kills: the names' separator changed."""
    import logging

    from fastload.packing.sources import scan_folder

    src = tmp_path / "src"
    empty = [f"e{i:02d}" for i in range(11)]
    for c in empty:
        (src / c).mkdir(parents=True)
    (src / "z").mkdir()
    (src / "z" / "a.jpg").write_bytes(b"")
    with caplog.at_level(logging.WARNING, logger="fastload.packing.sources"):
        got = scan_folder(src)
    assert got.classes == empty + ["z"]
    assert [r.getMessage() for r in caplog.records] == [
        "11 empty class folder(s) kept as classes with 0 samples: e00, e01, e02, e03, e04, e05, e06, e07, e08, e09"
    ]


def test_a_file_items_where_is_shown_as_given_and_its_path_made_printable_otherwise(tmp_path):
    """FileItem.where: "shown to users; default: printable(path)". Kills: the given ``where`` ignored."""
    from fastload.packing.sources import FileItem, FileSource

    items = [FileItem("/d/a\x1b.jpg", "a\x1b.jpg", 1), FileItem("/d/b.jpg", "b.jpg", 0, where="list.csv:7"),
             FileItem("/d/c.jpg", "c.jpg", 2, error="bad row", where="list.csv:9")]  # fmt: skip
    src = FileSource("list", "list.csv", ["x", "y", "z"], items)
    assert list(src.tasks()) == [
        ("file", "/d/a\x1b.jpg", 1, "a\x1b.jpg", "/d/a\\x1b.jpg"),
        ("file", "/d/b.jpg", 0, "b.jpg", "list.csv:7"),
        ("error", "bad row", 2, "c.jpg", "list.csv:9"),
    ]
    assert list(src.tasks(2)) == [("error", "bad row", 2, "c.jpg", "list.csv:9")]


def test_a_symlink_loop_is_named_in_its_warning(tmp_path, caplog):
    """The loop's link and the folder it leads back to, both by their full paths. Kills: the warning's text
    changed."""
    import logging

    from fastload.packing.sources import scan_folder

    root = tmp_path.resolve() / "t"
    (root / "a").mkdir(parents=True)
    (root / "a" / "1.jpg").write_bytes(b"")
    os.symlink(root / "a", root / "a" / "loop")
    with caplog.at_level(logging.WARNING, logger="fastload.packing.sources"):
        src = scan_folder(root)
    assert [it.name for it in src.items] == ["a/1.jpg"]
    assert [r.getMessage() for r in caplog.records] == [f"{root}/a/loop: symlink loop back to {root}/a; not followed"]


def test_more_class_folders_than_max_classes_are_refused_naming_the_count(tmp_path, monkeypatch):
    """MAX_CLASSES class folders are accepted, one more refused (the bound made small here). Kills: the
    message dropped."""
    import fastload.packing.sources as sources

    monkeypatch.setattr(sources, "MAX_CLASSES", 3)
    src = tmp_path / "src"
    for c in "abc":
        (src / c).mkdir(parents=True)
        (src / c / "1.jpg").write_bytes(b"")
    assert sources.scan_folder(src).classes == ["a", "b", "c"]
    (src / "d").mkdir()
    with pytest.raises(ConfigError) as e:
        sources.scan_folder(src)
    assert str(e.value) == f"SRC {src}: 4 class folders; at most 3 classes (MAX_CLASSES) are supported"


@pytest.mark.timeout(30)  # a FIFO opened without O_NONBLOCK would wait for a writer forever
def test_a_fifo_given_as_src_is_refused_saying_what_it_is(tmp_path):
    """Kills: the file's kind looked up from something other than its mode (a TypeError then)."""
    from fastload.packing.sources import open_source

    fifo = tmp_path / "l.csv"
    os.mkfifo(fifo)
    with pytest.raises(ConfigError) as e:
        open_source(fifo)
    assert str(e.value) == (f"SRC {fifo}: not a regular file (FIFO); pass an ImageFolder directory or a .csv/.tsv/.txt "
                            "list of 'path,label'")  # fmt: skip


def test_a_list_file_path_with_a_nul_is_refused_saying_so(tmp_path):
    """os.open raises ValueError (no ``strerror``) for it. Kills: ``strerror`` looked up without a default."""
    with pytest.raises(ConfigError) as e:
        read_list(f"{tmp_path}/x\0y.csv")
    assert str(e.value) == f"SRC {tmp_path}/x\\x00y.csv: cannot read list file: embedded null byte"


def test_a_quoted_cell_over_lines_that_leaves_the_path_or_the_label_empty_is_named(tmp_path):
    """A row that spans lines and has an empty path or label is a quote left open, whichever cell is empty.
    Kills: the two empty-cell tests joined by ``and``."""
    lst = tmp_path / "l.csv"
    lst.write_text('a.jpg,cat\n"b.jpg,\nc.jpg",\n,"d\ne"\nf.jpg,dog\n')
    assert rows_of(read_list(lst, on_error="skip")) == [
        ("a.jpg", "cat"),
        (f"{lst}:2", "a quoted cell runs from line 2 to line 3 (a quote left open?)"),
        (f"{lst}:4", "a quoted cell runs from line 4 to line 5 (a quote left open?)"),
        ("f.jpg", "dog"),
    ]


def test_a_row_of_another_column_count_says_how_many_columns_unless_it_has_fewer_than_two(tmp_path):
    """Most rows have 3 columns: a row of 2 or 4 is bad and its column count is said; a row of 1 is bad
    without it. Kills: ``> 2`` for ``>= 2``."""
    lst = tmp_path / "l.csv"
    lst.write_text("a.jpg,cat,1\nb.jpg,dog\nc.jpg,cat,2\nlonely\nd.jpg,dog,3,4\ne.jpg,dog,5\n")
    assert rows_of(read_list(lst, on_error="skip")) == [
        ("a.jpg", "cat"),
        (f"{lst}:2", "expected 'path,label', got ['b.jpg', 'dog'] (2 columns where the other rows have 3)"),
        ("c.jpg", "cat"),
        (f"{lst}:4", "expected 'path,label', got ['lonely']"),
        (f"{lst}:5", "expected 'path,label', got ['d.jpg', 'dog', '3', '4'] (4 columns where the other rows have 3)"),
        ("e.jpg", "dog"),
    ]


def test_a_dataset_source_is_described_by_its_type_and_its_fingerprint_changes_with_it():
    """Kills: the dataset's type name taken from another object."""
    from fastload.packing.sources import DatasetSource

    class Other(Items):
        pass

    img = b"\xff\xd8"
    a, b = DatasetSource(Items([(img, 0)])), DatasetSource(Other([(img, 0)]))
    assert a.description == f"{Items.__module__}.Items"
    assert b.description == f"{Items.__module__}.{Other.__qualname__}" and Other.__qualname__.endswith(".<locals>.Other")
    assert a.fingerprint() != b.fingerprint()


def test_a_csv_is_split_at_commas_even_where_its_first_row_holds_a_tab(tmp_path):
    """A ``.csv`` is comma-separated whatever its first row holds, a tab included (the tab is then part of
    the path). Kills: the ``.csv`` suffix not recognised in the tab test."""
    lst = tmp_path / "l.csv"
    lst.write_text("a\tb.jpg,cat\nc.jpg,dog\n")
    assert rows_of(read_list(lst)) == [("a\tb.jpg", "cat"), ("c.jpg", "dog")]


def test_dataset_refusals_name_what_is_wrong():
    """No ``[i]``, an item that is not a pair (its type named), a label past the classes (the range
    ``0..len - 1``). Kills: those messages dropped or changed."""
    from fastload.packing.sources import DatasetSource, map_style_len

    class LenOnly:
        def __len__(self) -> int:
            return 3

    with pytest.raises(ConfigError) as e:
        map_style_len(LenOnly())
    assert str(e.value) == "dataset: LenOnly has no [i]; pass a map-style dataset"
    with pytest.raises(ConfigError) as e:
        DatasetSource(Items([5])).task(0)
    assert str(e.value) == "dataset[0]: expected an (image, label) pair, got int"
    with pytest.raises(ConfigError) as e:
        DatasetSource(Items([(b"\xff\xd8", 0), (b"\xff\xd8", 2)]), classes=["a", "b"]).task(1)
    assert str(e.value) == "dataset[1]: label 2 is outside the 2 classes (0..1)"


def test_each_source_says_its_kind(tmp_path):
    """Source.kind: "folder", "list" or "dataset". Kills: a dataset source's kind changed."""
    from fastload.packing.sources import DatasetSource, open_source

    (tmp_path / "src" / "a").mkdir(parents=True)
    (tmp_path / "src" / "a" / "1.jpg").write_bytes(b"")
    (tmp_path / "l.csv").write_text("a.jpg,cat\n")
    assert open_source(tmp_path / "src").kind == "folder"
    assert open_source(tmp_path / "l.csv").kind == "list"
    assert DatasetSource(Items([(b"\xff\xd8", 0)])).kind == "dataset"


def test_dangling_symlinks_with_image_names_are_items_and_the_listing_goes_on_past_them(tmp_path):
    """Two symlinks to nothing named like images (their stat fails; opening them will say why) among
    plain files: every name is an item, in sorted order, none refused here. Kills: the listing stopped at
    the first entry whose stat fails (the second link is after it whatever the directory's order)."""
    from fastload.packing.sources import scan_folder

    cls = tmp_path / "src" / "c"
    cls.mkdir(parents=True)
    names = [f"{i:02d}.jpg" for i in range(8)]
    for n in names[:6]:
        (cls / n).write_bytes(b"")
    for n in names[6:]:
        os.symlink(tmp_path / "nowhere" / n, cls / n)
    src = scan_folder(tmp_path / "src")
    assert [(it.name, it.error) for it in src.items] == [(f"c/{n}", None) for n in names]


def test_a_list_sources_fingerprint_changes_with_a_skipped_rows_reason(tmp_path):
    """Two list files alike but for what their skipped line 2 holds: the skipped item (same name and label)
    differs only in its reason, and so do the fingerprints. Kills: the reasons hashed only for items
    without one."""
    lst = tmp_path / "l.csv"
    lst.write_text("a.jpg,cat\nlonely\nb.jpg,dog\n")
    one = read_list(lst, on_error="skip").fingerprint()
    lst.write_text("a.jpg,cat\nalone\nb.jpg,dog\n")
    other = read_list(lst, on_error="skip").fingerprint()
    assert one != other and read_list(lst, on_error="skip").fingerprint() == other


def test_an_indented_comment_does_not_choose_a_whitespace_lists_delimiter(tmp_path):
    """A list file of another suffix takes its delimiter from its first data row; an indented comment that
    holds a comma comes first but is a comment, so the rows stay split at their last space. Kills: the
    comment test on the right-stripped line (the comment's comma then makes the file CSV, and every
    ``path label`` row one cell)."""
    lst = tmp_path / "l.txt"
    lst.write_text("   # photos, by breed\na.jpg cat\nb.jpg dog\n")
    src = read_list(lst)
    assert rows_of(src) == [("a.jpg", "cat"), ("b.jpg", "dog")] and src.classes == ["cat", "dog"]


def test_an_int_label_with_an_item_method_is_its_own_value():
    """An ``int`` (here a subclass that also has an ``.item()``) is taken as the integer it is; only what is
    not an integer is asked for ``.item()``. Kills: ``or`` for ``and`` in that test (the subclass's
    ``.item()``, 99, would become the label)."""
    from fastload.packing.sources import DatasetSource

    class Code(int):
        def item(self):
            return 99

    assert DatasetSource(Items([(b"\xff\xd8", Code(3))])).task(0)[2] == 3


def test_crlf_line_ends_are_one_line_end_each(tmp_path):
    """A list saved with Windows line ends: a bad row is named by its own line number, and a quoted path
    over two lines keeps one line end. Kills: ``\\r\\n`` not replaced before ``\\r`` (each CRLF then two line
    ends: the bad row named as line 3, the quoted path holding ``\\n\\n``)."""
    lst = tmp_path / "l.csv"
    lst.write_bytes(b'a.jpg,cat\r\nlonely\r\n"b\r\nc.jpg",dog\r\n')
    src = read_list(lst, on_error="skip")
    assert rows_of(src) == [("a.jpg", "cat"), (f"{lst}:2", "expected 'path,label', got ['lonely']"), ("b\nc.jpg", "dog")]


def test_a_bad_row_is_an_item_named_and_shown_by_its_file_and_line(tmp_path):
    """With ``on_error="skip"`` a bad row is an item whose path, stored name and ``where`` are all
    ``LISTFILE:LINE``, label 0, and its reason. Kills: any of the three left None."""
    from fastload.packing.sources import FileItem

    lst = tmp_path / "l.csv"
    lst.write_text("a.jpg,cat\nlonely\n")
    src = read_list(lst, on_error="skip")
    at = f"{lst}:2"
    assert src.items[1] == FileItem(at, at, 0, "expected 'path,label', got ['lonely']", at)


@pytest.mark.parametrize(
    "cell, shown",
    [
        ("p" * 196, "['" + "p" * 196 + "']"),  # its repr is 200 characters: shown whole
        # 201: reprlib's cut of the string's repr to 30 characters: its first 13 ("'" and 12), "...", its last 14
        ("p" * 197, "['" + "p" * 12 + "..." + "p" * 13 + "']"),
    ],
)
def test_a_bad_row_is_shown_whole_up_to_200_characters_and_cut_past_them(tmp_path, cell, shown):
    """The refused row as Python writes it while that takes at most 200 characters, else as ``reprlib`` cuts
    it (a string's repr to its first 13 and last 14 characters). Kills: the cut never made, made at 200 or at 202,
    or made of nothing (``reprlib.repr(None)``)."""
    lst = tmp_path / "l.csv"
    lst.write_text(f"a.jpg,cat\n{cell}\n")
    src = read_list(lst, on_error="skip")
    assert rows_of(src)[1] == (f"{lst}:2", f"expected 'path,label', got {shown}")


def test_a_walk_goes_on_past_a_symlink_loop_and_a_folder_it_cannot_list(tmp_path, monkeypatch):
    """In one class folder: a symlink back to the folder (a loop, not followed), then a sub-folder that cannot
    be listed (``os.scandir`` refuses it, as it does a folder without read permission), then one that can.
    The images after both are still found. Kills: ``break`` for ``continue`` after the loop or after the
    folder that cannot be listed (the rest of the walk dropped)."""
    from fastload.packing.sources import scan_folder

    cat = tmp_path / "src" / "cat"
    cat.mkdir(parents=True)
    (cat / "a.jpg").write_bytes(b"")
    os.symlink(cat, cat / "a_back")
    (cat / "m").mkdir()
    (cat / "m" / "hidden.jpg").write_bytes(b"")
    (cat / "z").mkdir()
    (cat / "z" / "y.jpg").write_bytes(b"")
    real = os.scandir
    blocked = str(cat / "m")

    class Listing:
        """A folder's entries in name order (the file system's own order is arbitrary), so the loop comes
        before its siblings."""

        def __init__(self, path):
            with real(path) as it:
                self.entries = iter(sorted(it, key=lambda e: e.name))

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def __iter__(self):
            return self

        def __next__(self):
            return next(self.entries)

    def scandir(path="."):
        if os.fspath(path) == blocked:
            raise PermissionError(13, "Permission denied", blocked)
        return Listing(path)

    monkeypatch.setattr(os, "scandir", scandir)
    src = scan_folder(tmp_path / "src")
    assert [(it.name, it.label, it.error) for it in src.items] == [("cat/a.jpg", 0, None), ("cat/z/y.jpg", 0, None)]


def test_a_symlink_to_itself_with_an_image_name_is_an_item(tmp_path):
    """A symlink that points at itself is neither a folder nor a regular file the listing can see: it stays
    an item (its read fails later, as a bad sample). Kills: an entry whose ``is_dir()`` fails taken for a
    folder (the image then vanishes from the walk)."""
    from fastload.packing.sources import scan_folder

    cat = tmp_path / "src" / "cat"
    cat.mkdir(parents=True)
    (cat / "a.jpg").write_bytes(b"")
    os.symlink(cat / "loop.jpg", cat / "loop.jpg")
    src = scan_folder(tmp_path / "src")
    assert [it.name for it in src.items] == ["cat/a.jpg", "cat/loop.jpg"]


@pytest.mark.timeout(30)  # a FIFO opened without O_NONBLOCK would wait for a writer forever
def test_an_image_name_that_is_no_regular_file_is_an_item_with_its_name_label_and_reason(tmp_path):
    """A FIFO named like an image in the second class folder: an item with its path, its stored name relative
    to SRC, label 1 and the reason. Kills: the name or the label of such an item left None."""
    from fastload.packing.sources import FileItem, scan_folder

    (tmp_path / "src" / "cat").mkdir(parents=True)
    (tmp_path / "src" / "cat" / "a.jpg").write_bytes(b"")
    (tmp_path / "src" / "dog").mkdir()
    os.mkfifo(tmp_path / "src" / "dog" / "pipe.jpg")
    src = scan_folder(tmp_path / "src")
    path = str(tmp_path / "src" / "dog" / "pipe.jpg")
    assert src.items[1] == FileItem(path, "dog/pipe.jpg", 1, "not a regular file (FIFO)")


def test_a_folder_source_that_is_no_folder_is_refused_whole(tmp_path):
    """Kills: the 'cannot list the folder' message replaced by None."""
    from fastload.packing.sources import scan_folder

    f = tmp_path / "a.jpg"
    f.write_bytes(b"")
    with pytest.raises(ConfigError) as e:
        scan_folder(f)
    assert str(e.value) == f"SRC {f}: cannot list the folder: Not a directory"


def test_exactly_max_classes_class_names_are_accepted(monkeypatch):
    """The bound on a dataset's class names is inclusive. Kills: ``>=`` for ``>``."""
    import fastload.packing.sources as sources

    monkeypatch.setattr(sources, "MAX_CLASSES", 3)
    assert sources.class_names(None, ["a", "b", "c"]) == ["a", "b", "c"]
    with pytest.raises(ConfigError) as e:
        sources.class_names(None, ["a", "b", "c", "d"])
    assert str(e.value) == "classes: more than 3 class names; at most 3 (MAX_CLASSES) are supported"
