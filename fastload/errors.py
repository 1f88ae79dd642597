"""The one exception hierarchy of fastload.

Every error fastload raises on purpose derives from :class:`FastloadError`, so
``except fastload.FastloadError`` catches them all::

    FastloadError
    ├── ConfigError (ValueError)        a bad argument or option; names it and the value
    ├── DependencyError (ImportError)   an optional dependency is missing; says what to install
    ├── FormatError                     a packed dataset is missing, foreign, too new or malformed
    │   └── CorruptDataError            bytes on disk do not match what the manifest or record says
    ├── PackError                       ``pack`` could not finish (source problem, disk full, ...)
    ├── RemoteError                     an object store (``s3://...``) refused a request or stopped answering
    │   └── BadImageError               one source image was refused (``--on-error fail``)
    └── LoaderError                     a background batch could not be produced

Errors carry their context (file, sample index, argument) in the message so a
single line on stderr is enough to act on. That line is at most :data:`MAX_MESSAGE`
characters: a longer message (a ``ConcatDataset`` of a hundred folders names each) keeps its
start and its end around a note of what was cut, and the whole text is the exception's
``details`` (and its ``args``, so it survives pickling).
"""

from __future__ import annotations

import operator
from typing import Any

__all__ = [
    "MAX_MESSAGE",
    "capped",
    "FastloadError",
    "ConfigError",
    "DependencyError",
    "FormatError",
    "CorruptDataError",
    "PackError",
    "BadImageError",
    "LoaderError",
    "RemoteError",
]


#: The most characters ``str()`` of a :class:`FastloadError` has (the whole message is its ``details``).
MAX_MESSAGE = 1000
_TAIL = 400  # of MAX_MESSAGE: the end (what to do); the start gets the rest


def capped(text: str, limit: int = MAX_MESSAGE) -> str:
    """``text`` if it has at most ``limit`` characters, else its start and end around a note of how
    many characters were cut (the start says what failed, the end what to do), ``limit`` in all."""
    if len(text) <= limit:
        return text
    tail = _TAIL * limit // MAX_MESSAGE
    note = "[... {} characters cut; the whole message: the exception's .details, or fastload --debug ...]"
    head = max(0, limit - tail - len(note.format(len(text))) - 2)
    return f"{text[:head]} {note.format(len(text) - head - tail)} {text[-tail:]}"[:limit]


class FastloadError(Exception):
    """Base class of every error fastload raises on purpose; ``str()`` is at most :data:`MAX_MESSAGE`
    characters, ``details`` the whole message."""

    @property
    def details(self) -> str:
        """The whole message, however long."""
        return super().__str__()

    def __str__(self) -> str:
        return capped(super().__str__())

    def __format__(self, spec: str) -> str:
        """The whole message: an error quoted inside another's message (``f"...: {e}"``) is capped once, there."""
        return format(self.details, spec)


class ConfigError(FastloadError, ValueError):
    """An argument or option has a value fastload cannot use."""


class DependencyError(FastloadError, ImportError):
    """An optional dependency (DALI, torchvision, ...) is not importable."""


class FormatError(FastloadError):
    """A packed dataset is missing, of a foreign format, too new, or malformed."""


class CorruptDataError(FormatError):
    """Stored bytes disagree with the manifest or the record header (hash, size, checksum)."""


class PackError(FastloadError):
    """Packing could not complete."""


class BadImageError(PackError):
    """A source image was refused; ``path`` and ``reason`` say which and why."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason


class RemoteError(FastloadError):
    """An object store could not be reached in time, or refused a request; the message names the URL."""


class LoaderError(FastloadError):
    """A batch could not be produced by the loader's background pipeline."""


def printable(s: str) -> str:
    """``s`` made safe to print on one line: control, format and other unprintable characters
    escaped (``\\x1b``, ``\\u202e``), undecodable bytes kept by ``surrogateescape`` shown as
    ``\\xNN``, other lone surrogates as ``\\udNNN``. Printable text (any script) is unchanged."""
    if s.isprintable():
        return s
    out = []
    for c in s:
        if c.isprintable():
            out.append(c)
            continue
        o = ord(c)
        if 0xDC80 <= o <= 0xDCFF:  # a byte that was not UTF-8 (surrogateescape)
            out.append(f"\\x{o - 0xDC00:02x}")
        elif o < 0x100:
            out.append(f"\\x{o:02x}")
        elif o < 0x10000:
            out.append(f"\\u{o:04x}")
        else:
            out.append(f"\\U{o:08x}")
    return "".join(out)


def short_message(e: BaseException) -> str:
    """The first line of an exception's message (its type name if empty), at most 200 characters."""
    msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    return msg[:200]


def as_int(name: str, value: Any, *, lo: int | None = None, hi: int | None = None, hint: str = "") -> int:
    """``value`` as an int through ``operator.index`` (NumPy and 0-d tensor integers too, never a
    bool or a float), within ``lo..hi`` when given: every integer argument is checked here.

    Raises:
        ConfigError: naming ``name``, the range (and ``hint``) and the value received, e.g.
            ``crop must be an int in [1, 8192] (pixels), got 0``.
    """
    try:
        if isinstance(value, bool):
            raise TypeError
        v = operator.index(value)
    except TypeError:
        raise ConfigError(f"{name} must be an int{hint}, got {value!r}") from None
    if (lo is not None and v < lo) or (hi is not None and v > hi):
        rng = f">= {lo}" if hi is None else f"in [{lo}, {hi}]" if lo is not None else f"<= {hi}"
        raise ConfigError(f"{name} must be an int {rng}{hint}, got {value!r}")
    return v
