"""WebDataset tar shards as a pack source: members grouped by key as WebDataset groups them, each extension a field.

A WebDataset shard is a plain tar whose members ``KEY.EXT`` make one sample per KEY (what
img2dataset writes: ``000000.jpg``, ``000000.txt``, ``000000.json``, ``000000.cls``). The
source is a directory of ``.tar`` files (sorted by name), one ``.tar`` file, or a brace
pattern (``shards/{00000..00099}.tar``). Members are grouped exactly as
``webdataset.tariterators.group_by_keys`` does: the key is the member's name up to the first
dot of its base name, the extension the rest, lower-cased; consecutive members of one key
make one sample; ``__...__`` metadata members are skipped. A GNU sparse member (``tar --sparse``)
is read expanded, as ``tarfile`` and webdataset read it (up to :data:`MAX_SPARSE_BYTES`).

Fields are named by their extensions, as a WebDataset user reads them (``sample["txt"]``):
``jpg``/``jpeg``/``png``/``webp`` is the image, ``cls`` the int ``label``, ``txt`` a ``str``,
``json`` a ``str`` (or, with ``json_fields``, typed fields taken from it), any other extension
``bytes``. The schema comes from the first sample that has an image; a sample without an
image, or missing one of the schema's fields, is a refused sample listed in ``skipped``.

The tars are scanned once (member headers only); images are read with ``pread`` when their
task is made and validated in the worker pool like any in-memory image, so a pack is
parallel, resumable and byte-identical for any number of workers.
"""

from __future__ import annotations

import glob
import hashlib
import json
import logging
import os
import re
import tarfile
from typing import Any, Iterator, Sequence

from ..errors import ConfigError, DependencyError, printable, short_message
from ..fields import IMAGE, LABEL, Field, Schema, infer_field, parse_spec
from .samples import FieldSource, check_label, reason_of
from .sources import Task

log = logging.getLogger(__name__)

#: The most tar files a brace pattern may name (a mistyped ``{0..999999999999}`` is refused, not listed).
MAX_TAR_FILES = 1 << 20
#: The most bytes a GNU sparse member may expand to (its claimed size is not backed by the tar's own size).
MAX_SPARSE_BYTES = 1 << 30
#: Extensions that hold the image, in the order one is chosen when a sample has several.
IMAGE_EXTENSIONS = ("jpg", "jpeg", "png", "webp")
_KEY_RE = re.compile(r"^((?:.*/|)[^.]+)[.]([^/]*)$")  # webdataset's base_plus_ext
_META_RE = re.compile(r"__[^/]*__($|/)")  # webdataset's skip_meta
#: Extensions stored as ``str`` fields (UTF-8 text); any other but the image and ``cls`` is ``bytes``.
_TEXT = ("txt", "json")


_RANGE_RE = re.compile(r"(-?\d+|[A-Za-z])\.\.(-?\d+|[A-Za-z])(?:\.\.-?\d+)?\Z")


def brace_count(pattern: str) -> int:
    """At most how many names ``pattern`` expands to, found without expanding it: the product of
    each brace group's count (a range ``{a..b}``: its length; ``{x,y,z}``: its alternatives)."""
    total = 1
    while True:
        groups = list(re.finditer(r"\{([^{}]*)\}", pattern))  # the innermost groups
        if not groups:
            return total
        for g in groups:
            m = _RANGE_RE.match(g.group(1))
            if m:
                a, b = m.group(1), m.group(2)
                total *= abs(int(b) - int(a)) + 1 if a.lstrip("-").isdigit() and b.lstrip("-").isdigit() else abs(ord(b[0]) - ord(a[0])) + 1
            else:
                total *= g.group(1).count(",") + 1
        pattern = pattern[: groups[0].start()] + "".join(
            "x" + pattern[g.end() : (groups[i + 1].start() if i + 1 < len(groups) else len(pattern))] for i, g in enumerate(groups)
        )


def expand_shards(src: str | os.PathLike | Sequence[str]) -> list[str]:
    """The tar files of a WebDataset source: a directory (its ``*.tar``, sorted), a ``.tar``
    file, a brace pattern (``a/{000..009}.tar``), a glob, or a list of any of these.

    Raises:
        ConfigError: nothing found, a path that is not a regular ``.tar`` file, a compressed tar.
    """
    if isinstance(src, (list, tuple)):
        out: list[str] = []
        for s in src:
            out.extend(expand_shards(s))
        return out
    s = os.fspath(src)
    if "{" in s:
        try:
            from braceexpand import braceexpand
        except ImportError:
            raise DependencyError("a brace pattern needs the braceexpand package: pip install 'fastload[fields]'") from None
        if brace_count(s) > MAX_TAR_FILES:  # braceexpand lists each range whole before the first name
            raise ConfigError(f"SRC {printable(s)[:200]}: the brace pattern names more than {MAX_TAR_FILES} tar files")
        paths = list(braceexpand(s))
        missing = [p for p in paths if not os.path.isfile(p)]
        if missing:
            raise ConfigError(f"SRC {printable(s)}: {len(missing)} of its {len(paths)} tar files do not exist, such as {printable(missing[0])}")
    elif os.path.isdir(s):
        paths = sorted(os.path.join(s, n) for n in os.listdir(s) if n.endswith(".tar"))
        if not paths:
            raise ConfigError(f"SRC {printable(s)}: no .tar files in this directory (a WebDataset source is a directory of .tar shards)")
    elif any(c in s for c in "*?["):
        paths = sorted(glob.glob(s))
        if not paths:
            raise ConfigError(f"SRC {printable(s)}: no file matches this pattern")
    else:
        paths = [s]
    for p in paths:
        if p.endswith((".tar.gz", ".tgz", ".tar.bz2", ".tar.xz")):
            raise ConfigError(f"{printable(p)}: a compressed tar; fastload reads plain .tar shards (decompress it first)")
        if not os.path.isfile(p):
            raise ConfigError(f"SRC {printable(p)}: not a regular file")
    return paths


class _Sample:
    __slots__ = ("shard", "key", "members", "sparse", "problem")

    def __init__(self, shard: int, key: str) -> None:
        self.shard, self.key = shard, key
        self.members: dict[str, tuple[int, int]] = {}  # extension -> (offset, size)
        self.sparse: dict[str, list[tuple[int, int]]] = {}  # extension -> a sparse member's (offset, length) map
        self.problem: str | None = None


def _scan(paths: list[str]) -> list[_Sample]:
    """Every sample of the tars, in order: members grouped by key as WebDataset groups them."""
    samples: list[_Sample] = []
    for k, path in enumerate(paths):
        current: _Sample | None = None
        try:
            with tarfile.open(path, "r:") as tf:
                for m in tf:
                    if not m.isreg() or _META_RE.match(m.name):
                        continue
                    match = _KEY_RE.match(m.name)
                    if not match:
                        continue
                    prefix, suffix = match.group(1), match.group(2).lower()
                    if current is None or prefix != current.key:
                        current = _Sample(k, prefix)
                        samples.append(current)
                    if suffix in current.members:
                        current.problem = f"two members {prefix}.{suffix} (a duplicate file name)"
                    current.members[suffix] = (m.offset_data, m.size)
                    if m.issparse():  # GNU sparse: stored as data chunks that tarfile (and webdataset) expand
                        current.sparse[suffix] = [(int(o), int(n)) for o, n in m.sparse or ()]
        except (tarfile.TarError, OSError) as e:
            raise ConfigError(f"{printable(path)}: not a readable tar file ({short_message(e)})") from None
    return samples


def _expand_sparse(fd: int, off: int, size: int, chunks: list[tuple[int, int]], what: str) -> bytes:
    """A GNU sparse member's bytes as ``tarfile.extractfile`` gives them (what webdataset reads): zeros,
    with each stored chunk (consecutive in the archive from ``off``) at its place. The map is checked
    first: chunks in order, within the claimed size, which is at most :data:`MAX_SPARSE_BYTES`.

    Raises:
        ValueError: the claimed size or the map is refused (naming ``what``).
        OSError: the tar ended before a chunk.
    """
    if size > MAX_SPARSE_BYTES:
        raise ValueError(f"{printable(what)} is a sparse file claiming {size} bytes, over the {MAX_SPARSE_BYTES} a member may expand to")
    out, end, pos = bytearray(size), 0, off
    for o, n in chunks:
        if n == 0:  # GNU tar pads its map with empty entries
            continue
        if o < end or n < 0 or o + n > size:
            raise ValueError(f"{printable(what)}: its sparse map is malformed (chunk {o}+{n} of a {size}-byte file)")
        data = os.pread(fd, n, pos)
        if len(data) != n:
            raise OSError(f"{printable(what)}: the tar ends inside it")
        out[o : o + n] = data
        end, pos = o + n, pos + n
    return bytes(out)


def _json_spec(items: Sequence[str] | str | None) -> list[tuple[str, str | None]]:
    """``json_fields`` as ``(name, spec or None)`` pairs: ``"a,b:int32[]"`` or ``["a", "b:int32[]"]``."""
    if items is None:
        return []
    if isinstance(items, str):
        items = [s for s in items.split(",") if s.strip()]
    out = []
    for it in items:
        if not isinstance(it, str) or not it.strip():
            raise ConfigError(f"json_fields (--json-fields): {it!r} is not a key name (use a,b or a:int,b:float32[3])")
        name, _, spec = it.strip().partition(":")
        out.append((name.strip(), spec.strip() or None))
    if not out:
        raise ConfigError("json_fields (--json-fields): no key names given (use a,b or a:int,b:float32[3])")
    return out


class WebDatasetSource(FieldSource):
    """WebDataset tar shards (see the module's docstring).

    Args:
        src: a directory of ``.tar`` files, a ``.tar`` file, a brace pattern, or a list of them.
        json_fields: keys of each sample's ``.json`` to store as typed fields (``"a,b"``, each
            optionally ``name:kind`` such as ``"score:float32[]"``; kinds inferred from the first
            sample otherwise) instead of the ``json`` text.
    """

    def __init__(self, src: Any, *, json_fields: Sequence[str] | str | None = None) -> None:
        self.paths = expand_shards(src)
        self.samples = _scan(self.paths)
        if not self.samples:
            raise ConfigError(f"SRC {printable(str(src))}: the tar files hold no samples")
        self.json_fields = _json_spec(json_fields)
        self._fds: dict[int, int] = {}
        self.kind = "webdataset"
        self.description = printable(os.fspath(src)) if not isinstance(src, (list, tuple)) else f"{len(self.paths)} tar files"
        self.schema = self._schema()
        super().__init__()
        self.classes = None if self.schema.has_label else ["0"]
        self.extra_ignored: set[str] = set()
        log.info("webdataset %s: %d samples in %d tar files; fields %s", self.description, len(self.samples), len(self.paths),
                 ", ".join(f"{f.name} ({f.spec})" for f in self.schema))  # fmt: skip

    # -- the schema, from the first sample with an image
    def _schema(self) -> Schema:
        first = next((s for s in self.samples if s.problem is None and any(e in s.members for e in IMAGE_EXTENSIONS)), None)
        if first is None:
            raise ConfigError(f"SRC {self.description}: no sample has an image ({', '.join(IMAGE_EXTENSIONS)} member)")
        where = self._where(first)
        image_ext = next(e for e in IMAGE_EXTENSIONS if e in first.members)
        fields: list[Field] = [IMAGE]
        if "cls" in first.members:
            fields.append(LABEL)
        try:
            values = self._values(first, image_ext, None) if self.json_fields else {}
        except ValueError as e:  # the schema's sample cannot be read: say which and why
            raise ConfigError(f"{where}: the fields of the first sample with an image decide the schema, and it cannot be read: {e}") from None
        for ext in first.members:
            if ext in (image_ext, "cls"):
                continue
            if ext == "json" and self.json_fields:
                for name, spec in self.json_fields:
                    if name not in values:
                        raise ConfigError(f"json_fields (--json-fields): {where}.json has no key {name!r}")
                    fields.append(parse_spec(name, spec) if spec else infer_field(name, values[name], where=f"{where}.json"))
                continue
            fields.append(Field(ext, "str") if ext in _TEXT else Field(ext, "bytes"))
        return Schema(fields)

    # -- reading one sample
    def _read(self, s: _Sample, ext: str) -> bytes:
        fd = self._fds.get(s.shard)
        if fd is None:
            fd = self._fds[s.shard] = os.open(self.paths[s.shard], os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        off, size = s.members[ext]
        if ext in s.sparse:
            return _expand_sparse(fd, off, size, s.sparse[ext], f"{self.paths[s.shard]}: member {s.key}.{ext}")
        data = os.pread(fd, size, off)
        if len(data) != size:
            raise OSError(f"{self.paths[s.shard]} ended early (the tar changed while being packed)")
        return data

    def _values(self, s: _Sample, image_ext: str, schema: Schema | None) -> dict[str, Any]:
        """The field values of ``s`` (raises ValueError with the reason it cannot be packed)."""
        out: dict[str, Any] = {}
        if "cls" in s.members and (schema is None or schema.has_label):
            text = self._read(s, "cls").decode("utf-8", "replace").strip()
            if not text.isascii() or not text.isdigit():
                raise ValueError(f".cls holds {text[:40]!r}, not a class index 0, 1, 2, ...")
            out["label"] = int(text)
        names = None if schema is None else {f.name for f in schema.stored}
        for ext in s.members:
            if ext in (image_ext, "cls"):
                continue
            if ext == "json" and self.json_fields:
                try:
                    doc = json.loads(self._read(s, "json"))
                except (ValueError, UnicodeDecodeError) as e:
                    raise ValueError(f".json is not valid JSON ({short_message(e)})") from None
                except RecursionError:  # Python's reader gives up at about 1000 levels (a hostile member)
                    raise ValueError(".json nests deeper than Python's JSON reader can read") from None
                if not isinstance(doc, dict):
                    raise ValueError(f".json holds a {type(doc).__name__}, not an object")
                for name, _spec in self.json_fields:
                    if name not in doc:
                        raise ValueError(f".json has no key {name!r}")
                    out[name] = doc[name]
                continue
            if names is not None and ext not in names:
                self.extra_ignored.add(ext)
                continue
            raw = self._read(s, ext)
            if ext in _TEXT:
                try:
                    out[ext] = raw.decode("utf-8")
                except UnicodeDecodeError:
                    raise ValueError(f".{ext} is not UTF-8 text") from None
            else:
                out[ext] = raw
        return out

    def _where(self, s: _Sample) -> str:
        return f"{printable(self.paths[s.shard])}:{printable(s.key)}"

    # -- Source
    def __len__(self) -> int:
        return len(self.samples)

    def fingerprint(self) -> str:
        h = hashlib.sha256()
        h.update(json.dumps({"kind": self.kind, "json_fields": self.json_fields, "fields": self.schema.to_json()}).encode())
        for p in self.paths:
            st = os.stat(p)
            h.update(f"{p}\0{st.st_size}\0{st.st_mtime_ns}\n".encode("utf-8", "surrogateescape"))
        return h.hexdigest()

    def tasks(self, start: int = 0) -> Iterator[Task]:
        try:
            for i in range(start, len(self.samples)):
                yield self.task(i)
        finally:
            self.close()
            if self.extra_ignored:
                log.warning("webdataset %s: members with extension(s) %s are not in the schema of the first sample and were not packed",
                            self.description, ", ".join(sorted(self.extra_ignored)))  # fmt: skip

    def task(self, i: int) -> Task:
        s = self.samples[i]
        where = self._where(s)
        name = f"{os.path.basename(self.paths[s.shard])}:{s.key}"
        if s.problem is not None:
            return ("error", s.problem, 0, name, where)
        image_ext = next((e for e in IMAGE_EXTENSIONS if e in s.members), None)
        if image_ext is None:
            return ("error", f"no image member ({', '.join(IMAGE_EXTENSIONS)}); it has {', '.join(sorted(s.members))}", 0, name, where)
        missing = [f.name for f in self.schema if f.kind not in ("image", "label") and f.name not in s.members and f.name not in dict(self.json_fields)]
        if self.schema.has_label and "cls" not in s.members:
            missing.insert(0, "cls")
        if self.json_fields and "json" not in s.members:
            missing.append("json")
        if missing:
            return ("error", f"missing member(s) {', '.join('.' + m for m in missing)}", 0, name, where)
        try:
            values = self._values(s, image_ext, self.schema)
            label = check_label(values["label"], where, None) if self.schema.has_label else 0
            self.keep_block(i, values, where)
            data = self._read(s, image_ext)
        except (ValueError, ConfigError) as e:
            return ("error", reason_of(e, where), 0, name, where)
        except OSError as e:
            return ("error", f"unreadable ({printable(short_message(e))})", 0, name, where)
        return ("bytes", data, label, name, where)

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()


__all__ = ["WebDatasetSource", "expand_shards", "IMAGE_EXTENSIONS"]
