#!/usr/bin/env bash
# Run the test suite (everything but `slow` and `gpu` tests), creating or reusing
# .venv first. Extra arguments go to pytest, e.g. `bash scripts/test.sh -k sample -x`.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
bash scripts/setup.sh
exec .venv/bin/python -m pytest -m "not slow and not gpu" "$@"
