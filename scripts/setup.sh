#!/usr/bin/env bash
# Create or reuse .venv in the repository and install everything fastload, its
# tests, benchmarks and sample data need. Idempotent: a second run with the same
# project files only checks the environment.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
venv="$root/.venv"
py="${PYTHON:-python3}"
stamp="$venv/.fastload-setup"
want="$(cat pyproject.toml requirements/constraints.txt scripts/setup.sh tests/azurite/package-lock.json | sha256sum | cut -d' ' -f1)"

log() { printf '[setup] %s\n' "$*" >&2; }

# Up to date only if the stamp matches AND the venv still works: fastload is installed
# (checked from outside the repo, where `import fastload` cannot come from the cwd) and
# PIL is still pillow-simd (a later `pip install` of anything needing pillow replaces it).
healthy() {
    (cd / && "$venv/bin/python" -c 'import PIL, fastload; raise SystemExit("post" not in PIL.__version__)') 2>/dev/null
}
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && healthy; then
    log "environment up to date ($venv)"
    exit 0
fi

# pillow-simd builds from source: it needs these headers or it silently loses
# WebP/TIFF/colour-profile support.
need=()
for p in libjpeg-dev zlib1g-dev libpng-dev libwebp-dev libtiff-dev liblcms2-dev libfreetype-dev; do
    dpkg -s "$p" >/dev/null 2>&1 || need+=("$p")
done
if [ "${#need[@]}" -gt 0 ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        log "installing system libraries: ${need[*]}"
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
    else
        log "missing system libraries: ${need[*]} (install them, e.g. sudo apt-get install ${need[*]})"
        exit 1
    fi
fi

[ -x "$venv/bin/python" ] || { log "creating $venv"; "$py" -m venv "$venv"; }
pip=("$venv/bin/python" -m pip --disable-pip-version-check -q)
"${pip[@]}" install -U pip setuptools wheel
log "installing torch and torchvision (pinned, a few minutes the first time)"
"${pip[@]}" install -c requirements/constraints.txt torch torchvision
log "installing fastload with its bench, sample, dev, integrations, s3, fields, detection, ray and spark extras (DALI is about 0.9 GB)"
"${pip[@]}" install -c requirements/constraints.txt -e ".[bench,sample,dev,integrations,s3,fields,detection,ray,spark]"
# torchvision (and timm, through it) pulls in pillow, and pillow and pillow-simd share the PIL package:
# remove both, then build pillow-simd from source, last, bypassing the wheel cache.
log "installing pillow-simd last, from source"
"${pip[@]}" uninstall -y pillow pillow-simd >/dev/null 2>&1 || true
"${pip[@]}" install -c requirements/constraints.txt --no-deps --no-cache-dir --force-reinstall \
    --no-binary pillow-simd pillow-simd
"$venv/bin/python" - <<'PY'
import PIL
from PIL import features
missing = [f for f in ("jpg", "zlib", "webp", "libtiff") if not features.check(f)]
if "post" not in PIL.__version__:
    raise SystemExit(f"PIL {PIL.__version__} is not pillow-simd")
if missing:
    raise SystemExit(f"pillow-simd built without {missing}")
print(f"[setup] PIL {PIL.__version__} (pillow-simd) with JPEG, PNG, WebP, TIFF")
PY
# Spark (the spark extra, tests/test_engines.py) runs on a Java 17 runtime
if ! command -v java >/dev/null; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        log "installing Java 17 for Spark (openjdk-17-jre-headless)"
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openjdk-17-jre-headless >/dev/null \
            || log "could not install Java: the Spark tests (tests/test_engines.py) will be skipped"
    else
        log "no java: the Spark tests (tests/test_engines.py) will be skipped; install a Java 17 runtime (openjdk-17-jre-headless)"
    fi
fi
# Azurite, Azure Storage's emulator, is the Blob server of tests/test_remote_azure.py (an npm package: Node.js)
if command -v npm >/dev/null; then
    log "installing Azurite (tests/azurite, npm ci)"
    npm ci --prefix tests/azurite --no-audit --no-fund --ignore-scripts --loglevel=error >/dev/null \
        || log "npm ci failed: the az:// tests (tests/test_remote_azure.py) will be skipped"
else
    log "no npm: the az:// tests (tests/test_remote_azure.py) will be skipped; install Node.js and run setup again"
fi
echo "$want" > "$stamp"
log "done: $venv"
