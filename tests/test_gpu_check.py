"""benchmarks/gpu_check.py --cpu-dry-run: every step of the GPU check runs on the CPU and reports."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
STEPS = ["preflight", "data", "pytest", "agreement", "race", "hw_decoder", "throughput", "augment", "training"]


def test_cpu_dry_run_runs_every_step_and_writes_the_report(tmp_path):
    out = tmp_path / "report"
    cmd = [sys.executable, str(ROOT / "benchmarks" / "gpu_check.py"), "--cpu-dry-run", "--work", str(tmp_path / "work"), "--out", str(out)]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=400, env=env, cwd=ROOT)
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    data = json.loads((out / "report.json").read_text())
    steps = data["steps"]
    assert list(steps) == STEPS and data["dry_run"] is True
    assert {k: s["status"] for k, s in steps.items()} == dict.fromkeys(STEPS, "ok"), {k: s.get("note") for k, s in steps.items()}
    n = data["plan"]["agree_images"]
    for mode in ("eval", "train"):
        a = steps["agreement"][mode]
        assert len(a["per_image"]) == a["images"] == n  # one max-abs and PSNR per image
        assert a["below_floor"] == 0 and a["psnr_min"] >= a["floor_db"]
    assert steps["race"]["equal"] is True and steps["race"]["batches"] == data["plan"]["race_batches"]
    tp = steps["throughput"]["loaders"]
    assert set(tp) == {"FastLoader", f"DataLoader ({data['plan']['workers']} workers)", "DALI readers.file"}
    for e in tp.values():
        assert len(e["runs"]) == data["plan"]["repeats"] and e["images_per_s"] > 0
        assert e["gpu_added_bytes"] == "unavailable"  # no GPU in a dry run, said so
        assert isinstance(e["anon_added_bytes"], int) and isinstance(e["file_added_bytes"], int)
    assert tp["FastLoader"]["fastloader_ratio"] == 1.0
    tr = steps["training"]
    for name in ("FastLoader", f"DataLoader ({data['plan']['workers']} workers)"):
        assert tr[name]["steps"] == data["plan"]["train_steps"] and 0 <= tr[name]["wait_fraction"] <= 1
    md = (out / "report.md").read_text()
    assert md.startswith("# GPU check (CPU dry run)") and "## Agreement with the CPU path (per image)" in md
    with Image.open(io.BytesIO((out / "report.png").read_bytes())) as im:
        assert im.format == "PNG"
    # the short table comes last: one line per step
    tail = r.stdout.strip().splitlines()[-len(STEPS) - 1 :]
    assert tail[0].split() == ["step", "status", "result"]
    assert [line.split()[0] for line in tail[1:]] == STEPS and all(line.split()[1] == "ok" for line in tail[1:])
