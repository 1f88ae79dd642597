"""A real Azure Blob server for the tests: Azurite, Azure Storage's own emulator (npm package ``azurite``,
installed into ``tests/azurite/`` by ``scripts/setup.sh``).

``AzuriteServer`` starts ``azurite-blob`` on 127.0.0.1 with a free port and a data directory of its
own, waits until it answers, and kills its process group on ``stop()``. Containers are made with
``azure-storage-blob``, Microsoft's client (obstore cannot make one). The account is Azurite's
documented development account.

The fixture ``azurite`` (one server per test module) is made available to every test by
``tests/conftest.py``; without Node.js and the installed package it skips, saying how to install it.
"""

from __future__ import annotations

import shutil
import subprocess
import uuid
from pathlib import Path

import pytest

from s3server import free_ports, kill_group, start_logged

#: Azurite's development account (public, documented by Microsoft for the emulator).
ACCOUNT = "devstoreaccount1"
ACCOUNT_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="

HERE = Path(__file__).resolve().parent


def azurite_binary() -> str | None:
    """``tests/azurite/node_modules/.bin/azurite-blob``, else one on PATH, else None."""
    local = HERE / "azurite" / "node_modules" / ".bin" / "azurite-blob"
    if local.exists() and shutil.which("node"):
        return str(local)
    return shutil.which("azurite-blob")


class AzuriteServer:
    """One ``azurite-blob`` process on 127.0.0.1."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.port = free_ports(1)[0]
        self.proc: subprocess.Popen | None = None
        self.log = self.root / "azurite.log"

    @property
    def endpoint(self) -> str:
        """The Blob service URL of the development account."""
        return f"http://127.0.0.1:{self.port}/{ACCOUNT}"

    def options(self, *, key: str = ACCOUNT_KEY) -> dict:
        """``storage_options`` for fastload pointing at this server."""
        return {"account_name": ACCOUNT, "access_key": key, "endpoint": self.endpoint, "allow_http": True}

    def start(self, timeout: float = 60.0) -> None:
        """Start the server and wait until it answers HTTP."""
        exe = azurite_binary()
        if exe is None:
            pytest.skip("Azurite is not installed (needs Node.js: npm ci --prefix tests/azurite, done by scripts/setup.sh)")
        pytest.importorskip("azure.storage.blob")
        args = [exe, "--blobHost", "127.0.0.1", "--blobPort", str(self.port), "--location", str(self.root / "data"),
                "--silent", "--skipApiVersionCheck", "--disableTelemetry"]  # fmt: skip
        self.proc = start_logged(args, self.root, self.log, self.endpoint + "?comp=list", "azurite-blob", timeout)

    def stop(self) -> None:
        """Kill the server's process group (SIGKILL) and wait for it."""
        kill_group(self.proc)
        self.proc = None

    def client(self):
        """An ``azure.storage.blob.BlobServiceClient`` of the development account on this server."""
        from azure.storage.blob import BlobServiceClient

        return BlobServiceClient(self.endpoint, credential={"account_name": ACCOUNT, "account_key": ACCOUNT_KEY})

    def make_container(self, name: str | None = None) -> str:
        """Create a container and return its name."""
        name = name or f"c{uuid.uuid4().hex[:12]}"
        self.client().create_container(name)
        return name


@pytest.fixture(scope="module")
def azurite(tmp_path_factory):
    """One Azurite Blob server for a test module."""
    server = AzuriteServer(tmp_path_factory.mktemp("azurite"))
    server.start()
    try:
        yield server
    finally:
        server.stop()
