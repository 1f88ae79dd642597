"""Object-store URLs: telling a URL from a local path, and splitting one into scheme, bucket and prefix."""

from __future__ import annotations

import dataclasses
import os
import re
from typing import Any

from ..errors import ConfigError, printable

#: ``scheme://``: any string that starts so is a URL, never a local path.
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")

#: Schemes read through obstore; ``http``/``https`` are read-only.
SCHEMES = {"s3": "s3", "s3a": "s3", "gs": "gs", "gcs": "gs", "az": "az", "azure": "az", "abfs": "az", "http": "http", "https": "http"}


#: ``s3:/bucket``, ``s3:bucket``: an object-store scheme with its slashes mistyped (a URL, refused by
#: :func:`parse_url`, never a local directory named ``s3:``)
_MISTYPED = re.compile(r"^(s3|s3a|gs|gcs|az|abfs|abfss|https?):(?!//)", re.IGNORECASE)


def is_url(value: Any) -> bool:
    """True when ``value`` is a string (or bytes) that starts with ``scheme://``, or with an object
    store's scheme whose slashes are mistyped (``s3:/bucket``)."""
    if isinstance(value, bytes):
        value = os.fsdecode(value)
    return isinstance(value, str) and (_SCHEME.match(value) is not None or _MISTYPED.match(value) is not None)


@dataclasses.dataclass(frozen=True)
class RemoteURL:
    """A dataset's place in an object store: ``scheme://bucket/prefix``.

    Attributes:
        scheme: the URL's scheme as written (``s3``, ``gs``, ``az``, ``https``...).
        kind: the store kind: ``s3``, ``gs``, ``az`` or ``http``.
        bucket: the bucket (the host for ``http``/``https``).
        prefix: the key prefix, without leading or trailing ``/`` (may be empty).
    """

    scheme: str
    kind: str
    bucket: str
    prefix: str

    def key(self, name: str) -> str:
        """The object key of the dataset file ``name``."""
        return f"{self.prefix}/{name}" if self.prefix else name

    @property
    def root(self) -> str:
        """``scheme://bucket``: what the store is opened on."""
        return f"{self.scheme}://{self.bucket}"

    @property
    def writable(self) -> bool:
        return self.kind != "http"

    def __str__(self) -> str:
        return f"{self.root}/{self.prefix}" if self.prefix else self.root

    def child(self, name: str) -> str:
        """The URL of the dataset file ``name``, for messages."""
        return f"{self}/{name}"


def parse_url(value: Any) -> RemoteURL:
    """Split ``value`` (``s3://bucket/prefix``...) into a :class:`RemoteURL`.

    Raises:
        ConfigError: not a URL, a scheme fastload cannot read, or no bucket.
    """
    text = os.fsdecode(value) if isinstance(value, bytes) else value
    m = _SCHEME.match(text) if isinstance(text, str) else None
    if m is None:
        bad = _MISTYPED.match(text) if isinstance(text, str) else None
        if bad is not None:
            raise ConfigError(f"{printable(text)}: not a URL: write {bad.group(1).lower()}://bucket/prefix (two slashes)")
        raise ConfigError(f"{printable(str(value))}: not a URL (expected scheme://bucket/prefix)")
    scheme = m.group(1).lower()
    kind = SCHEMES.get(scheme)
    if kind is None:
        raise ConfigError(
            f"{printable(text)}: the scheme {scheme!r} is not supported; use s3://, gs://, az:// or https:// "
            "(read-only), or a local directory path"
        )
    rest = text[m.end():]
    bucket, _, prefix = rest.partition("/")
    if not bucket:
        raise ConfigError(f"{printable(text)}: no bucket in the URL (expected {scheme}://bucket/prefix)")
    if any(part in (".", "..") for part in prefix.split("/") if part):
        raise ConfigError(f"{printable(text)}: '.' and '..' are not allowed in an object-store prefix")
    return RemoteURL(scheme=scheme, kind=kind, bucket=bucket, prefix=prefix.strip("/"))
