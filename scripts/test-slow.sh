#!/usr/bin/env bash
# Run the long tests (marked `slow`; `gpu` ones are skipped where no GPU exists),
# creating or reusing .venv first. Extra arguments go to pytest.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
bash scripts/setup.sh
exec .venv/bin/python -m pytest -m slow "$@"
