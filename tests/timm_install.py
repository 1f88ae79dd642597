"""Installs a pinned timm version into a cache folder for the tests that run old scripts in a subprocess.

Each version is installed once with ``pip install --no-deps --target`` under
``~/.cache/fastload-tests/timm-<version>`` (``FASTLOAD_TEST_CACHE`` moves it); a test puts that folder
first on a subprocess's ``PYTHONPATH`` (its own process keeps the current timm). Without a package
index the test is skipped, never failed.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

CACHE = Path(os.environ.get("FASTLOAD_TEST_CACHE", Path.home() / ".cache" / "fastload-tests"))
#: What pip says when it cannot reach an index: the only failures that skip rather than fail.
OFFLINE = ("NewConnectionError", "Temporary failure in name resolution", "Network is unreachable",
           "No matching distribution found", "Could not find a version", "ConnectionError", "timed out")  # fmt: skip


def install_timm(version: str) -> Path:
    """The folder holding ``timm==version`` (installed there on first use, atomically)."""
    target = CACHE / f"timm-{version}"
    if (target / "timm" / "__init__.py").is_file():
        return target
    CACHE.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".timm-{version}-", dir=CACHE))
    cmd = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(tmp), f"timm=={version}"]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    except subprocess.TimeoutExpired:
        shutil.rmtree(tmp, ignore_errors=True)
        pytest.skip(f"timm=={version} could not be installed in 300 s (no network?)")
    if r.returncode != 0:
        shutil.rmtree(tmp, ignore_errors=True)
        if any(s in r.stderr for s in OFFLINE):
            pytest.skip(f"timm=={version} is not under {target} and pip cannot fetch it (no network): {r.stderr.strip()[-200:]}")
        pytest.fail(f"pip install timm=={version} failed: {r.stderr.strip()[-400:]}")
    try:
        tmp.rename(target)
    except OSError:  # another run installed it first
        shutil.rmtree(tmp, ignore_errors=True)
    return target
