"""OUT and OUT.partial: overwrite and resume rules, reuse of finished shards, the final rename.

A pack writes into ``OUT.partial``; :func:`finalize` writes ``labels.bin``, then
``manifest.json``, then renames the directory to ``OUT`` (see ``docs/format.md``).

What ``--overwrite`` may replace, and what fastload ever deletes:

* Only files fastload writes (:func:`is_fastload_file`: ``shard-NNNNN.lmdb``,
  ``labels.bin``, ``manifest.json``, ``journal.json`` and their ``.tmp`` forms, as
  regular files), then the directory itself if that left it empty. Never a tree.
* OUT is replaced only when it is empty, a fastload dataset (a fastload
  ``manifest.json``) or a fastload partial pack (a fastload ``journal.json``), holding
  nothing but those files; ``OUT.partial`` when it holds nothing but those files.
* Never a directory that is SRC, is inside SRC or contains SRC, its list file or the
  folder of any image it lists, all compared through symlinks (:class:`SourceGuard`).

One writer per OUT: a pack holds an exclusive ``flock`` on the ``OUT.partial``
directory itself (:class:`WriterLock`) from before it touches it until it returns;
the rename keeps the lock on the finished OUT. The kernel drops the lock when the
process dies, so an unfinished pack left by ``kill -9`` resumes without a stale lock.
"""

from __future__ import annotations

import contextlib
import datetime
import errno
import hashlib
import json
import logging
import os
import re
import stat
import time
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ConfigError, PackError, printable
from ..format import FIELDS_FORMAT_VERSION, FORMAT_VERSION, LABELS_DTYPE, LABELS_NAME, MANIFEST_NAME, Manifest, ShardInfo, shard_name
from ..store import HeaderStats, file_sha256, iter_headers
from ..version import __version__
from .journal import JOURNAL_FORMAT, JOURNAL_NAME, Journal, atomic_write, fsync_dir, HeldLock, hold_lock
from .sources import FileSource, Source

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX
    fcntl = None  # type: ignore[assignment]

log = logging.getLogger(__name__)

PARTIAL_SUFFIX = ".partial"
#: Seconds :func:`finalize` waits for another pack that is finishing the same OUT.
LOCK_WAIT = 10.0
#: Largest ``manifest.json`` / ``journal.json`` read to decide whether OUT may be replaced.
_MAX_JSON_BYTES = 1 << 30
#: Names fastload writes in OUT and OUT.partial (``atomic_write`` and shards use ``.tmp``).
_FASTLOAD_FILE = re.compile(r"(?:shard-[0-9]{5,}\.lmdb|labels\.bin|manifest\.json|journal\.json)(?:\.tmp)?", re.ASCII)
_OPEN_FLAGS = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOFOLLOW", 0)
_DIR_FLAGS = _OPEN_FLAGS | getattr(os, "O_DIRECTORY", 0)


def is_fastload_file(name: str) -> bool:
    """Whether ``name`` is one of the file names fastload writes in OUT or OUT.partial."""
    return _FASTLOAD_FILE.fullmatch(name) is not None


def _p(path: Any) -> str:
    return printable(os.fspath(path))


def _problem(e: OSError) -> str:
    return e.strerror or type(e).__name__


def _kind(mode: int) -> str:
    """``"a file"``, ``"a FIFO"``, ``"a character device"``... for a non-directory ``st_mode``."""
    kinds = ((stat.S_ISREG, "a file"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
             (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))  # fmt: skip
    return next((name for test, name in kinds if test(mode)), "a special file")


def _lstat(path: Path, what: str) -> os.stat_result | None:
    """``os.lstat``; ``None`` when nothing is there (or a parent is not a directory)."""
    try:
        return os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as e:
        raise ConfigError(f"{what} {_p(path)}: cannot look at it: {_problem(e)}") from None


# ============================================================================ the source guard


def _under(path: str, top: str) -> bool:
    """``path`` is ``top`` or inside it (both real, normalised paths)."""
    return path == top or path.startswith(top.rstrip(os.sep) + os.sep)


def _real(path: str | os.PathLike) -> str | None:
    try:
        return os.path.realpath(path)
    except (OSError, ValueError):  # an embedded NUL: nothing on disk has that name
        return None


class SourceGuard:
    """The real paths a pack never deletes: SRC, and what a file source reads.

    For a folder SRC, OUT (and OUT.partial) may not be SRC or inside it; for any file
    source, neither may contain SRC (the folder or the list file) or the folder of any
    image it reads. Paths are compared after :func:`os.path.realpath`, so a symlink to
    SRC's parent is caught. Image folders are resolved once each, only when a
    directory that could be deleted exists.
    """

    def __init__(self, source: Source) -> None:
        self.source = source
        self._protected: list[str] | None = None

    def _items(self) -> list[str]:
        if self._protected is None:
            assert isinstance(self.source, FileSource)
            dirs = {os.path.dirname(it.path) or os.curdir for it in self.source.items}
            real = {_real(d) for d in dirs} | {_real(self.source.description)}
            self._protected = sorted(r for r in real if r)
        return self._protected

    def check(self, directory: Path, what: str) -> None:
        """Refuse ``directory`` (OUT, or ``what`` names it) if replacing it could touch the source.

        Raises:
            ConfigError: naming ``what``, the directory and the source path it would touch.
        """
        src = self.source
        if not isinstance(src, FileSource):
            return
        real = _real(directory)
        top = _real(src.description)
        if real is None or top is None:
            return
        shown = f"{what} {_p(directory)}"
        if real != os.fspath(directory) and os.path.islink(directory):
            shown += f" (a symlink to {_p(real)})"
        if src.kind == "folder" and _under(real, top):
            where = "is SRC" if real == top else "is inside SRC"
            raise ConfigError(f"{shown} {where} {_p(src.description)}; write the packed dataset elsewhere")
        if not os.path.lexists(directory):
            return  # nothing there to delete
        if _under(top, real):
            raise ConfigError(
                f"{shown} contains SRC {_p(src.description)}; fastload never replaces a directory holding its "
                "source: write the packed dataset elsewhere"
            )
        hit = next((p for p in self._items() if _under(p, real)), None)
        if hit is not None:
            holds = "holds" if hit == real else f"contains {_p(hit)}, which holds"
            verb = "lists" if src.kind == "list" else "reads"
            raise ConfigError(
                f"{shown} {holds} images SRC {_p(src.description)} {verb}; fastload never "
                "replaces a directory holding its source: write the packed dataset elsewhere"
            )


# ============================================================================ one writer per OUT



def _holder(fd: int) -> int | None:
    """The PID holding the ``flock`` on the file behind ``fd``, from ``/proc/locks``."""
    try:
        st = os.fstat(fd)
        with open("/proc/locks", encoding="ascii", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    found = None
    for line in lines:
        parts = line.split()
        # "1: FLOCK  ADVISORY  WRITE 1234 08:01:56789 0 EOF"; waiters read "1: -> FLOCK ..."
        if len(parts) < 6 or parts[1] != "FLOCK":
            continue
        try:
            major, minor, ino = parts[5].split(":")
            pid = int(parts[4])
            if int(ino) != st.st_ino or pid <= 0:
                continue
            if (int(major, 16), int(minor, 16)) == (os.major(st.st_dev), os.minor(st.st_dev)):
                return pid
        except ValueError:
            continue
        found = pid if found is None else found  # same inode, another device numbering (overlayfs)
    return found


def _started(pid: int) -> str | None:
    """When process ``pid`` started, local time, from ``/proc``."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        with open("/proc/stat", "rb") as f:
            btime = next(int(ln.split()[1]) for ln in f if ln.startswith(b"btime"))
        t = btime + int(fields[19]) / os.sysconf("SC_CLK_TCK")
        return datetime.datetime.fromtimestamp(t).strftime("%Y-%m-%d %H:%M:%S")
    except (OSError, ValueError, IndexError, StopIteration):
        return None


def _busy(out: Path, fd: int) -> ConfigError:
    pid = _holder(fd)
    if pid is None:
        who = "another process"
    else:
        when = _started(pid)
        who = f"process {pid}" + (f" (started {when})" if when else "")
    return ConfigError(f"OUT {_p(out)} is being written by {who}; wait for it or stop it")


class WriterLock(HeldLock):
    """An exclusive ``flock`` on a directory (OUT.partial, or OUT while it is replaced).

    The lock is on the directory's inode, so it follows the directory through the final
    rename and leaves no file behind. Forked workers close their copy, and the kernel
    releases it when the process dies. Where the file system cannot lock (some network
    file systems), a warning is logged and the pack goes on unlocked.
    """

    @classmethod
    def acquire(cls, path: Path, out: Path, *, wait: float = 0.0) -> "WriterLock | None":
        """Lock the directory at ``path``; ``None`` if it is gone or was replaced meanwhile.

        Raises:
            ConfigError: another process holds the lock (after ``wait`` seconds), naming it.
            PackError: the directory cannot be opened.
        """
        try:
            fd = os.open(path, _DIR_FLAGS)
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError as e:
            if e.errno == errno.ELOOP:  # replaced by a symlink meanwhile: look again
                return None
            raise PackError(f"{_p(path)}: cannot open the directory: {_problem(e)}") from None
        try:
            if fcntl is not None:
                deadline = time.monotonic() + wait
                while True:
                    try:
                        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                        break
                    except BlockingIOError:
                        if time.monotonic() >= deadline:
                            raise _busy(out, fd) from None
                        time.sleep(0.05)
                    except OSError as e:  # ENOLCK, EOPNOTSUPP, EBADF on some network file systems
                        log.warning("%s: cannot lock it (%s); make sure no other pack writes %s meanwhile", _p(path), _problem(e), _p(out))
                        break
            now = os.fstat(fd)
            try:
                st = os.lstat(path)
            except OSError:
                st = None
            if st is None or (st.st_dev, st.st_ino) != (now.st_dev, now.st_ino):
                os.close(fd)
                return None
        except BaseException:
            with contextlib.suppress(OSError):
                os.close(fd)
            raise
        hold_lock(fd)
        return cls(fd, path)


# ============================================================================ what may be replaced


def _read_json(path: Path) -> Any:
    """A small JSON file that must be a regular file, read without following symlinks or blocking."""
    fd = os.open(path, _OPEN_FLAGS)
    with open(fd, "rb", closefd=True) as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode) or st.st_size > _MAX_JSON_BYTES:
            raise ValueError("not a small regular file")
        return json.loads(f.read(_MAX_JSON_BYTES + 1))


def _json_format(path: Path) -> Any:
    try:
        d = _read_json(path)
    except (OSError, ValueError, RecursionError, MemoryError):
        return None
    return d.get("format") if isinstance(d, dict) else None


def _entries(directory: Path, what: str) -> tuple[list[str], list[str]]:
    """(fastload's files, everything else as ``name`` or ``name/``) in ``directory``."""
    ours, foreign = [], []
    try:
        with os.scandir(directory) as it:
            for e in it:
                try:
                    regular = e.is_file(follow_symlinks=False)
                    isdir = not regular and e.is_dir(follow_symlinks=False)
                except OSError:
                    regular = isdir = False
                if regular and is_fastload_file(e.name):
                    ours.append(e.name)
                else:
                    foreign.append(e.name + ("/" if isdir else ""))
    except OSError as e:
        raise ConfigError(f"{what} {_p(directory)}: cannot list it: {_problem(e)}") from None
    return sorted(ours), sorted(foreign)


def _names(names: list[str], most: int = 5) -> str:
    shown = ", ".join(printable(n) for n in names[:most])
    return shown + (f" and {len(names) - most} more" if len(names) > most else "")


def replace_problem(directory: Path, what: str = "OUT", *, partial: bool = False) -> str | None:
    """Why ``--overwrite`` may not replace ``directory``, in one line; ``None`` if it may.

    It may replace an empty directory, or one holding nothing but fastload's own files
    that is a dataset (a fastload ``manifest.json``) or an unfinished pack (a fastload
    ``journal.json``; for ``partial``, the ``OUT.partial`` fastload names, any journal).
    """
    refuse = f"{what} {_p(directory)} is not a fastload dataset; refusing to replace it even with --overwrite"
    st = _lstat(directory, what)
    if st is None:
        return None
    if stat.S_ISLNK(st.st_mode):
        try:
            target = _p(os.readlink(directory))
        except OSError:
            target = "?"
        return f"{refuse}: it is a symlink (to {target}); pass the directory it points to, or remove the link yourself"
    if not stat.S_ISDIR(st.st_mode):
        return f"{refuse}: it is {_kind(st.st_mode)}, not a directory; choose another OUT or remove it yourself"
    ours, foreign = _entries(directory, what)
    if foreign:
        return f"{refuse}: it holds files fastload did not write ({_names(foreign)}); choose another OUT or remove them yourself"
    if not ours or partial:
        return None
    if MANIFEST_NAME in ours:
        if _json_format(directory / MANIFEST_NAME) == "fastload":
            return None
        return f"{refuse}: its {MANIFEST_NAME} is not a fastload manifest; choose another OUT or remove it yourself"
    if JOURNAL_NAME in ours and _json_format(directory / JOURNAL_NAME) == JOURNAL_FORMAT:
        return None
    return f"{refuse}: it has no fastload {MANIFEST_NAME}; choose another OUT or remove it yourself"


def remove_fastload_files(directory: Path, *, keep: frozenset[str] | set[str] = frozenset()) -> list[str]:
    """Delete fastload's own files in ``directory`` (not ``keep``); return the names left there.

    Raises:
        OSError: a file could not be deleted.
    """
    left = []
    with os.scandir(directory) as it:
        entries = list(it)
    for e in entries:
        if e.name in keep:
            continue
        if is_fastload_file(e.name) and e.is_file(follow_symlinks=False):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(e.path)
        else:
            left.append(e.name)
    return left


def remove_dataset_dir(directory: Path) -> None:
    """Delete fastload's files in ``directory``, then the directory if that emptied it.

    Never raises: what cannot be deleted is left, with a warning naming it.
    """
    try:
        left = remove_fastload_files(directory)
        if not left:
            os.rmdir(directory)
            return
        log.warning("%s: left in place, it holds files fastload did not write (%s)", _p(directory), _names(sorted(left)))
    except FileNotFoundError:
        pass
    except OSError as e:
        log.warning("%s: could not remove it (%s); remove it yourself", _p(directory), _problem(e))


# ============================================================================ OUT and OUT.partial


def check_out(out: Path, overwrite: bool) -> None:
    """Refuse an existing OUT without ``overwrite``, or one ``overwrite`` may not replace.

    Raises:
        ConfigError: one line naming OUT and what was found.
    """
    if _lstat(out, "OUT") is None:
        return
    if not overwrite:
        raise ConfigError(f"OUT {_p(out)} already exists; pass --overwrite (overwrite=True) to replace it")
    problem = replace_problem(out)
    if problem:
        raise ConfigError(problem)
    lock = WriterLock.acquire(out, out)  # another pack finishing this OUT right now
    if lock is not None:
        lock.release()


def _check_partial_kind(partial: Path, st: os.stat_result) -> None:
    if stat.S_ISLNK(st.st_mode):
        raise ConfigError(
            f"{_p(partial)} is a symlink; fastload writes an unfinished pack only into a real directory "
            "there: remove the link yourself, or choose another OUT"
        )
    if not stat.S_ISDIR(st.st_mode):
        raise ConfigError(
            f"{_p(partial)} is {_kind(st.st_mode)}, not an unfinished pack; fastload needs that name for one: "
            "move or remove it yourself, or choose another OUT"
        )


def prepare_partial(
    partial: Path, out: Path, journal: Journal, resume: bool, overwrite: bool, stats: HeaderStats, guard: SourceGuard
) -> tuple[Journal, WriterLock]:
    """Create or reuse ``OUT.partial`` and lock it; return the journal to continue from and the lock.

    Raises:
        ConfigError: another process writes it, it holds files fastload did not write, it is
            a symlink or a file, or it holds an unfinished pack and neither ``resume`` nor
            ``overwrite`` was given (or the resume does not match).
        PackError: it cannot be created or written.
    """
    for attempt in range(8):
        st = _lstat(partial, "OUT.partial")
        if st is None:
            if resume and attempt == 0:
                log.info("nothing to resume at %s: starting a new pack", _p(partial))
            try:
                partial.mkdir(parents=True)
            except FileExistsError:
                continue
            except OSError as e:
                raise PackError(f"{_p(partial)}: cannot create the output directory: {_problem(e)}") from None
            created = True
        else:
            _check_partial_kind(partial, st)
            guard.check(partial, f"OUT {_p(out)}: the unfinished pack")
            created = False
        lock = WriterLock.acquire(partial, out)
        if lock is None:
            continue
        try:
            return _prepare_locked(partial, journal, resume, overwrite, stats, created), lock
        except BaseException:
            lock.release()
            raise
    raise PackError(f"{_p(partial)}: keeps changing while fastload prepares it; is another program using it?")


def _prepare_locked(partial: Path, journal: Journal, resume: bool, overwrite: bool, stats: HeaderStats, created: bool) -> Journal:
    if not created:
        ours, foreign = _entries(partial, "OUT.partial")
        if foreign:
            raise ConfigError(
                f"{_p(partial)} holds files fastload did not write ({_names(foreign)}); it is not an unfinished "
                "pack of fastload: move them away yourself, or choose another OUT"
            )
        if resume and JOURNAL_NAME in ours:
            old = Journal.load(partial)
            if old.source_fingerprint != journal.source_fingerprint:
                raise ConfigError(
                    f"cannot resume {_p(partial)}: the source changed since it was started ({printable(old.source)}); "
                    "resume with the same SRC, or start over with --overwrite"
                )
            if old.options != journal.options:
                diff = ", ".join(f"{k} {old.options.get(k)!r} -> {v!r}" for k, v in journal.options.items() if old.options.get(k) != v)
                raise ConfigError(f"cannot resume {_p(partial)}: options changed ({diff}); resume with the same options, or start over with --overwrite")
            return _reuse_shards(partial, old, stats)
        if resume:
            # stopped between creating OUT.partial and writing its journal: nothing to reuse
            log.info("%s holds no journal (the pack stopped before its first shard): starting it again", _p(partial))
        elif not overwrite:
            raise ConfigError(
                f"{_p(partial)} holds an unfinished pack; continue it with --resume (resume=True) "
                "or start over with --overwrite (overwrite=True)"
            )
        try:
            remove_fastload_files(partial)
        except OSError as e:
            raise PackError(f"{_p(partial)}: cannot clear the unfinished pack: {_problem(e)}") from None
    try:
        journal.save(partial)
    except OSError as e:
        raise PackError(f"{_p(partial)}: cannot create the output directory: {_problem(e)}") from None
    return journal


def _reuse_shards(partial: Path, journal: Journal, stats: HeaderStats) -> Journal:
    """Keep the journal's shards that still match their name, size and hash; drop the rest."""
    kept: list[dict[str, Any]] = []
    for i, s in enumerate(journal.shards):
        p = partial / s["file"]
        try:
            st = os.lstat(p)
            ok = (
                s["file"] == shard_name(i)
                and stat.S_ISREG(st.st_mode)
                and st.st_size == int(s["bytes"])
                and file_sha256(p) == s["sha256"]
            )
        except (OSError, ValueError):
            ok = False
        if not ok:
            log.warning("%s: missing or changed since it was written; packing it again", _p(p))
            break
        kept.append(s)
    try:
        remove_fastload_files(partial, keep={s["file"] for s in kept} | {JOURNAL_NAME})
        for s in kept:
            for _i, h in iter_headers(partial / s["file"]):
                stats.add(h)
        nskipped = int(kept[-1]["skipped"]) if kept else 0
        journal.shards = kept
        journal.skipped = journal.skipped[:nskipped]
        journal.save(partial)
    except OSError as e:
        raise PackError(f"{_p(partial)}: cannot resume the unfinished pack: {_problem(e)}") from None
    if kept:
        log.info("resuming %s: %d finished shard(s) reused, continuing at source item %d", _p(partial), len(kept), journal.position)
    return journal


def discard_partial(partial: Path) -> None:
    """Remove an unfinished pack that cannot be resumed: fastload's files, then the directory."""
    remove_dataset_dir(partial)


def _aside(out: Path) -> Path:
    base = f"{out.name}.old-{os.getpid()}"
    for n in range(1000):
        p = out.with_name(base if n == 0 else f"{base}-{n}")
        if not os.path.lexists(p):
            return p
    raise PackError(f"{_p(out.parent)}: no free name to move the old OUT aside ({base}-*); remove those yourself")


def finalize(
    partial: Path,
    out: Path,
    source: Source,
    stats: HeaderStats,
    journal: Journal,
    options: dict[str, Any],
    on_error: str,
    overwrite: bool,
    guard: SourceGuard,
) -> Manifest:
    """labels.bin, then manifest.json, then rename ``partial`` to ``out`` (replacing an old OUT).

    Raises:
        PackError: a write or rename failed, or OUT cannot be replaced; ``partial`` is
            kept and the pack can be continued with ``--resume``.
    """
    labels = np.frombuffer(stats.labels, dtype=np.int32).astype(LABELS_DTYPE)
    classes = source.classes if source.classes is not None else [str(i) for i in range(int(labels.max()) + 1)]
    counts = np.bincount(labels, minlength=len(classes)).tolist()
    shards = [ShardInfo.from_json({k: s[k] for k in ("file", "first", "count", "bytes", "sha256")}, where=JOURNAL_NAME) for s in journal.shards]
    raw = labels.tobytes()
    schema = getattr(source, "schema", None)
    fields = schema if schema is not None and not schema.plain else None
    manifest = Manifest(
        num_samples=len(labels),
        classes=list(classes),
        class_counts=counts,
        shards=shards,
        labels_sha256=hashlib.sha256(raw).hexdigest(),
        skipped=list(journal.skipped),
        stats={**stats.to_json(), **({"fields": source.field_stats.to_json()} if fields is not None else {})},  # type: ignore[attr-defined]
        version=FIELDS_FORMAT_VERSION if fields is not None else FORMAT_VERSION,
        fields=fields,
        options={**options, "source": journal.source, "on_error": on_error},
        created=datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0).isoformat(),
        fastload_version=__version__,
    )
    manifest.validate(where=str(partial / MANIFEST_NAME))
    keep = f"; the finished pack is kept in {_p(partial)}"
    old_lock = None
    try:
        atomic_write(partial / LABELS_NAME, raw)
        atomic_write(partial / MANIFEST_NAME, manifest.dumps().encode("utf-8"))
        old = None
        for _attempt in range(8):
            if _lstat(out, "OUT") is None:
                break
            if not overwrite:
                raise PackError(f"OUT {_p(out)} appeared while packing{keep}: move OUT away, or pass --overwrite, and continue with --resume")
            guard.check(out, "OUT")
            problem = replace_problem(out)
            if problem:
                raise ConfigError(problem)
            old_lock = WriterLock.acquire(out, out, wait=LOCK_WAIT)
            if old_lock is None:
                continue
            problem = replace_problem(out)  # again, now that nobody else can be writing it
            if problem:
                raise ConfigError(problem)
            old = _aside(out)
            os.replace(out, old)
            break
        else:
            raise PackError(f"OUT {_p(out)} keeps changing while fastload replaces it{keep}")
        try:
            os.replace(partial, out)
        except OSError:
            if old is not None:  # put the old OUT back where it was
                with contextlib.suppress(OSError):
                    os.replace(old, out)
            raise
        fsync_dir(out.parent)
        # the journal goes last: a crash before the rename leaves a resumable OUT.partial
        with contextlib.suppress(FileNotFoundError):
            (out / JOURNAL_NAME).unlink()
        if old is not None:
            remove_dataset_dir(old)
    except ConfigError as e:  # OUT cannot be replaced (now): nothing is lost, the pack waits in OUT.partial
        raise PackError(f"{e}{keep}: continue with --resume once that is settled") from None
    except OSError as e:
        where = f" ({_p(e.filename)})" if getattr(e, "filename", None) else ""
        raise PackError(f"{_p(partial)}: cannot finish the pack: {_problem(e)}{where}; fix that, then continue with --resume") from None
    finally:
        if old_lock is not None:
            old_lock.release()
    return manifest
