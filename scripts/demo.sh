#!/usr/bin/env bash
# The main job, end to end, on the built-in sample dataset (the README's first command):
#   set up .venv -> make 3,000 ImageNet-like JPEGs -> pack them -> inspect -> load one epoch
#   -> benchmark report (reports/sample/report.md, .json, .png).
# Creates or reuses .venv and data/sample-images; rewrites data/sample-packed.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
bash scripts/setup.sh

py="$root/.venv/bin/python"
images="data/sample-images"
packed="data/sample-packed"
step() { printf '\n== %s\n' "$*"; }

step "1/5 sample dataset -> $images (reused when already made with the same options)"
"$py" -m fastload sample "$images" --images 3000 --classes 10 --seed 0

step "2/5 pack -> $packed"
"$py" -m fastload pack "$images" "$packed" --overwrite

step "3/5 inspect"
"$py" -m fastload inspect "$packed"

step "4/5 load one epoch with FastLoader"
"$py" - "$packed" <<'PY'
import sys, time

from fastload import FastLoader

with FastLoader(sys.argv[1], 64, device=None) as loader:
    n, t0 = 0, time.perf_counter()
    for images, labels in loader:
        n += labels.shape[0]
    dt = time.perf_counter() - t0
print(f"loaded {n} images in {len(loader)} batches of {tuple(images.shape[1:])} {images.dtype} on "
      f"{images.device} in {dt:.1f} s: {n / dt:,.0f} images/s")
PY

step "5/5 benchmark report: FastLoader against DataLoader on the same images -> reports/sample/"
"$py" -m fastload bench "$packed" --images "$images" --out reports/sample
