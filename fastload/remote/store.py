"""The object-store client: obstore requests with retries, backoff and a deadline, and errors that name the URL."""

from __future__ import annotations

import json
import logging
import os
import random
import re
import threading
import time
from pathlib import Path
from typing import Any, Callable, TypeVar

from ..errors import ConfigError, CorruptDataError, DependencyError, FormatError, RemoteError, printable
from .url import RemoteURL

log = logging.getLogger(__name__)
T = TypeVar("T")

#: Default ``retry_deadline`` in seconds: rides out a restart of the server (a minute or so)
#: and still reports a dead endpoint within a few minutes.
DEFAULT_RETRY_DEADLINE = 180.0

#: ``storage_options`` keys that are HTTP client settings (obstore's ``client_options``).
_CLIENT_KEYS = {
    "allow_http", "allow_invalid_certificates", "connect_timeout", "default_content_type", "http1_only",
    "http2_only", "pool_idle_timeout", "pool_max_idle_per_host", "proxy_url", "read_timeout", "timeout", "user_agent",
}  # fmt: skip

#: HTTP client defaults: a connection that cannot be made in 5 s, or a read that stalls for 30 s,
#: is an attempt that failed (and is retried until the deadline).
_CLIENT_DEFAULTS = {"connect_timeout": "5s", "read_timeout": "30s", "pool_max_idle_per_host": "64"}

#: The process that first made a request: obstore's runtime (tokio) does not survive ``fork``, so a
#: forked child that made a request would wait forever (measured: a new client in the child too).
_RUNTIME_PID: int | None = None

#: ``storage_options`` keys (their prefixes) that give a ``gs://`` client its credentials: with one of
#: them, ``STORAGE_EMULATOR_HOST`` is not read.
_GOOGLE_CREDENTIAL_KEYS = ("service_account", "google_service_account", "application_credentials",
                           "google_application_credentials")  # fmt: skip

#: Where the credentials of each store kind come from, for the errors that say so.
_CREDENTIALS_HINT = {
    "s3": "AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, a profile, or storage_options",
    "gs": "GOOGLE_APPLICATION_CREDENTIALS or GOOGLE_SERVICE_ACCOUNT, or storage_options={'service_account_path': ...}",
    "az": "AZURE_STORAGE_ACCOUNT_NAME/AZURE_STORAGE_ACCOUNT_KEY, or storage_options",
    "http": "storage_options",
}

_CLIENT_ERROR = re.compile(r"status(?: code)?:? 4(?!08|29)\d\d")


class NotFound(RemoteError):
    """The object (or its bucket) does not exist."""


class Cancelled(Exception):
    """A request given up because its owner closed (``cancelled()`` became true): never a user's error."""


def _obstore() -> Any:
    try:
        import obstore
    except ImportError as e:
        raise DependencyError(
            f"reading or writing an object store (s3://, gs://, az://, https://) needs obstore ({e}); "
            'pip install "fastload[s3]"'
        ) from None
    return obstore


def check_deadline(value: Any) -> float:
    """``retry_deadline`` as seconds (> 0, finite); None gives :data:`DEFAULT_RETRY_DEADLINE`."""
    if value is None:
        return DEFAULT_RETRY_DEADLINE
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (0 < float(value) < 1e6):
        raise ConfigError(f"retry_deadline must be a number of seconds in (0, 1e6), got {value!r}")
    return float(value)


def _split_options(url: RemoteURL, options: Any) -> tuple[dict, dict]:
    if options is None:
        options = {}
    if not isinstance(options, dict) or not all(isinstance(k, str) for k in options):
        raise ConfigError(f"storage_options must be a dict of str keys, got {type(options).__name__}")
    config, client = {}, dict(_CLIENT_DEFAULTS)
    for k, v in options.items():
        if k == "client_options":
            if not isinstance(v, dict):
                raise ConfigError(f"storage_options['client_options'] must be a dict, got {type(v).__name__}")
            client.update(v)
        elif k in _CLIENT_KEYS:
            client[k] = v
        else:
            config[k] = v
    if url.kind == "s3" and not any(k in config for k in ("endpoint", "endpoint_url", "aws_endpoint")):
        env = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
        if env:
            config["endpoint"] = env
    if url.kind == "az" and not any(k in config for k in ("endpoint", "azure_storage_endpoint")):
        env = os.environ.get("AZURE_STORAGE_ENDPOINT")
        if env:
            config["endpoint"] = env
    endpoint = str(config.get("endpoint") or config.get("endpoint_url") or "")
    if url.kind == "gs" and not any(k.startswith(_GOOGLE_CREDENTIAL_KEYS) for k in config):
        env = os.environ.get("STORAGE_EMULATOR_HOST")  # Google's convention for an emulator (its clients, gcsfs)
        if env:
            endpoint = env if "://" in env else "http://" + env
            config["service_account_key"] = json.dumps(
                {"gcs_base_url": endpoint.rstrip("/"), "disable_oauth": True, "client_email": "", "private_key": "",
                 "private_key_id": ""}  # fmt: skip
            )
    if (endpoint.startswith("http://") or url.scheme == "http") and "allow_http" not in client:
        client["allow_http"] = True
    return config, client


class RemoteStore:
    """One dataset prefix in an object store, read and written through obstore.

    Every request is retried with exponential backoff and jitter on connection errors,
    timeouts and 5xx answers, until ``retry_deadline`` seconds after the request began; then
    :class:`~fastload.errors.RemoteError` names the URL, the tries and the last error. A missing
    object is :class:`NotFound`; refused credentials and access denied are RemoteErrors at once.

    Args:
        url: the dataset's URL.
        storage_options: obstore settings (``endpoint``, ``access_key_id``, ``secret_access_key``,
            ``region``, ``allow_http``, ``read_timeout``...; a nested ``client_options`` dict is
            merged into the HTTP settings); by default the usual environment (``AWS_*`` variables,
            profiles, ``AWS_ENDPOINT_URL``).
        retry_deadline: seconds a request is retried for (default 180).
    """

    def __init__(self, url: RemoteURL, *, storage_options: Any = None, retry_deadline: Any = None) -> None:
        self.url = url
        self.deadline = check_deadline(retry_deadline)
        self.config, self.client = _split_options(url, storage_options)
        self._store: Any = None
        self._lock = threading.Lock()
        self._rng = random.Random(0)  # jitter only: never affects data

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_store"], state["_lock"] = None, None
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    @property
    def store(self) -> Any:
        """The obstore store (made on first use, in each process)."""
        if self._store is None:
            with self._lock:
                if self._store is None:
                    obstore = _obstore()
                    from obstore.store import from_url

                    root = self.url.root + "/" if self.url.kind == "http" else self.url.root
                    try:
                        self._store = from_url(root, config=self.config or None, client_options=self.client,
                                               retry_config={"max_retries": 0})
                    except (obstore.exceptions.BaseError, ValueError, TypeError) as e:
                        raise ConfigError(f"{self.url}: cannot set up the object-store client: {_short(e)}") from None
        return self._store

    # ------------------------------------------------------------------ the retry loop
    def call(self, what: str, name: str, fn: Callable[[Any], T], *, cancelled: Callable[[], bool] | None = None) -> T:
        """``fn(store)`` with retries until the deadline; ``what`` and ``name`` say what for errors.
        With ``cancelled``, :class:`Cancelled` instead of a retry once it returns true."""
        global _RUNTIME_PID
        obstore = _obstore()
        ex = obstore.exceptions
        where = self.url.child(name) if name else str(self.url)
        if _RUNTIME_PID is None:
            _RUNTIME_PID = os.getpid()
        elif _RUNTIME_PID != os.getpid():
            raise RemoteError(
                f"{where}: a process forked from one that used the object store cannot reach it (its client does not "
                "survive fork: it would wait forever); start DataLoader workers with multiprocessing_context='spawn' "
                "or 'forkserver' (a dataset pickles to its URL), or read with fastload.FastLoader (threads)"
            )
        start = time.monotonic()
        tries = 0
        while True:
            tries += 1
            try:
                return fn(self.store)
            except OSError as e:
                transient = isinstance(e, (ConnectionError, TimeoutError))
                if e.errno is not None and not transient:
                    raise  # a local file's problem (the cache's disk full...), not the store's
                if isinstance(e, FileNotFoundError):  # obstore's NotFound
                    raise NotFound(f"{where}: not found (no such object, prefix or bucket)") from None
                if isinstance(e, PermissionError):
                    raise _refused(where, what, e, self.url.kind) from None
                err: BaseException = e
            except ex.NotFoundError:
                raise NotFound(f"{where}: not found (no such object, prefix or bucket)") from None
            except (ex.PermissionDeniedError, ex.UnauthenticatedError) as e:
                raise _refused(where, what, e, self.url.kind) from None
            except ex.BaseError as e:
                err = e
            msg = _short(err)
            if "169.254.169.254" in str(err) or "metadata.google.internal" in str(err):
                # no credentials anywhere: the client asked the cloud machine's metadata server
                raise RemoteError(_no_credentials(where, self.url.kind)) from None
            if "builder error" in msg:  # the client could not make the request at all: asking again will not help
                raise RemoteError(
                    f"{where}: {what} could not be sent: {msg}; check the endpoint in storage_options or the "
                    "environment (an http:// endpoint needs storage_options={'allow_http': True})"
                ) from None
            if _CLIENT_ERROR.search(msg):  # 4xx but 408/429: asking again will not help
                raise RemoteError(f"{where}: {what} refused by the server: {msg}") from None
            elapsed = time.monotonic() - start
            pause = min(5.0, 0.1 * 2 ** min(tries, 10)) * (0.5 + self._rng.random())
            if elapsed + pause > self.deadline:
                raise RemoteError(
                    f"{where}: {what} failed {tries} time(s) over {elapsed:.1f} s (retry_deadline="
                    f"{self.deadline:g} s); the server does not answer: {msg}"
                ) from None
            if cancelled is not None and cancelled():
                raise Cancelled(where)
            log.info("%s: %s failed (%s); trying again in %.1f s", where, what, msg, pause)
            time.sleep(pause)
            if cancelled is not None and cancelled():
                raise Cancelled(where)

    # ------------------------------------------------------------------ requests
    def get(self, name: str, *, limit: int | None = None) -> bytes:
        """The whole object ``name`` (refused past ``limit`` bytes)."""
        obstore = _obstore()

        def run(st: Any) -> bytes:
            r = obstore.get(st, self.url.key(name))
            size = r.meta["size"]
            if limit is not None and size > limit:
                raise FormatError(f"{self.url.child(name)}: {size} bytes, more than the {limit} expected")
            return bytes(r.bytes())

        return self.call("GET", name, run)

    def head(self, name: str) -> dict | None:
        """``{"size", "e_tag"}`` of ``name``, or None if it does not exist."""
        obstore = _obstore()
        try:
            meta = self.call("HEAD", name, lambda st: obstore.head(st, self.url.key(name)))
        except NotFound:
            return None
        return {"size": int(meta["size"]), "e_tag": (meta.get("e_tag") or "").strip('"')}

    def get_range(self, name: str, start: int, end: int, *, e_tag: str | None = None) -> Any:
        """Bytes ``start .. end`` (exclusive) of ``name`` (a buffer); with ``e_tag``, only of that
        version of the object (``If-Match``).

        Raises:
            CorruptDataError: the object is no longer the version ``e_tag`` names.
            RemoteError: as every request.
        """
        obstore = _obstore()
        opts: dict[str, Any] = {"range": (start, end)}
        if e_tag:
            opts["if_match"] = e_tag if e_tag.startswith('"') else f'"{e_tag}"'

        def replaced() -> CorruptDataError:
            return CorruptDataError(
                f"{self.url.child(name)}: the object was replaced while the dataset was read (its ETag is no longer "
                f"{e_tag}); none of its new bytes were used: open the dataset again"
            )

        def run(st: Any) -> Any:
            try:
                r = obstore.get(st, self.url.key(name), options=opts)
            except obstore.exceptions.PreconditionError:
                raise replaced() from None
            # a server that ignores If-Match still says which version it sent
            if e_tag and (r.meta.get("e_tag") or "").strip('"') not in ("", e_tag.strip('"')):
                raise replaced()
            data = r.bytes()
            if len(data) != end - start:
                raise OSError(f"a range request for {end - start} bytes brought {len(data)}")
            return data

        return self.call("GET", name, run)

    def download(self, name: str, dest: Path, size: int, *, progress: Callable[[Any], None] | None = None,
                 cancelled: Callable[[], bool] | None = None) -> None:  # fmt: skip
        """Write object ``name`` (``size`` bytes) into the file ``dest`` from its start, handing each
        chunk to ``progress`` (a hash's ``update``); a broken transfer goes on from where it stopped
        (a range request), within the deadline. With ``cancelled``: :class:`Cancelled` at the next
        chunk or retry once it returns true."""
        obstore = _obstore()
        with open(dest, "r+b" if dest.exists() else "wb") as f:  # r+b: keeps a reserved file's size while it fills

            def run(st: Any) -> None:
                done = f.tell()
                if done >= size and size > 0:
                    return
                opts = {"range": (done, size)} if done else None
                r = obstore.get(st, self.url.key(name), options=opts)
                if not done and r.meta["size"] != size:
                    raise FormatError(
                        f"{self.url.child(name)}: {r.meta['size']} bytes, the manifest says {size}; "
                        "the dataset in the store was altered or is being replaced"
                    )
                for chunk in r.stream(min_chunk_size=64 << 10):  # small: a cut transfer keeps what arrived
                    if cancelled is not None and cancelled():
                        raise Cancelled(self.url.child(name))
                    f.write(chunk)
                    if progress is not None:
                        progress(chunk)
                if f.tell() != size:
                    raise OSError(f"transfer ended after {f.tell()} of {size} bytes")

            self.call("GET", name, run, cancelled=cancelled)

    def put_file(self, name: str, path: Path) -> None:
        """Upload the local file ``path`` as ``name`` in one PUT (so its ETag is its MD5 on S3)."""
        obstore = _obstore()
        self._writable()

        def run(st: Any) -> None:
            with open(path, "rb") as f:
                obstore.put(st, self.url.key(name), f, use_multipart=False)

        self.call("PUT", name, run)

    def put_bytes(self, name: str, data: bytes) -> None:
        obstore = _obstore()
        self._writable()
        self.call("PUT", name, lambda st: obstore.put(st, self.url.key(name), data, use_multipart=False))

    def list(self) -> list[dict]:
        """Every object under the prefix (recursively): ``{"name", "size"}`` with names relative to it.
        The prefix's own folder marker (an empty ``prefix/`` object, what the S3 console's "Create
        folder" makes; the client lists it as ``prefix``) is not one of them: such a prefix is empty."""
        obstore = _obstore()
        pre = self.url.key("") if self.url.prefix else ""

        def run(st: Any) -> list[dict]:
            out = []
            for chunk in obstore.list(st, prefix=pre.rstrip("/") or None):
                for meta in chunk:
                    path = str(meta["path"])
                    if pre and path.rstrip("/") == pre.rstrip("/") and int(meta["size"]) == 0:
                        continue  # the folder marker
                    out.append({"name": path[len(pre):], "size": int(meta["size"])})
            return out

        return self.call("LIST", "", run)

    def delete(self, names: list[str]) -> None:
        obstore = _obstore()
        self._writable()
        if names:
            self.call("DELETE", names[0], lambda st: obstore.delete(st, [self.url.key(n) for n in names]))

    def _writable(self) -> None:
        if not self.url.writable:
            raise ConfigError(f"{self.url}: {self.url.scheme}:// is read-only; pack to s3://, gs:// or az://")


def _refused(where: str, what: str, e: BaseException, kind: str) -> RemoteError:
    return RemoteError(
        f"{where}: {what} refused ({_short(e)}); check the credentials ({_CREDENTIALS_HINT[kind]}) and the "
        "bucket's permissions"
    )


def _no_credentials(where: str, kind: str) -> str:
    if kind == "gs":
        how = ("set GOOGLE_APPLICATION_CREDENTIALS to a service account's key file, or pass "
               "storage_options={'service_account_path': ...}; for a public bucket storage_options={'skip_signature': True}")  # fmt: skip
    elif kind == "az":
        how = "set AZURE_STORAGE_ACCOUNT_NAME and AZURE_STORAGE_ACCOUNT_KEY, or pass storage_options"
    else:
        how = ("set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE), or pass "
               "storage_options={'access_key_id': ..., 'secret_access_key': ...}; for a public bucket "
               "storage_options={'skip_signature': True}")  # fmt: skip
    return f"{where}: no credentials found: {how}"


def _short(e: BaseException) -> str:
    text = " ".join(str(e).split())
    return printable(text[:300]) if text else type(e).__name__
