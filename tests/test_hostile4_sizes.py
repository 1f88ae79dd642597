"""Careless and hostile input, round four (issue 38), class 5: every size argument bounded up front.

A brace pattern naming 10**12 tar files, ``iou_trials=10**9``, a detection ``size``,
``min_size`` or ``max_size`` of 10**6, ``pad_to=2**40``: each was taken as given and became an
allocation of gigabytes to terabytes (or a ``MemoryError``) once used. Each is now a
:class:`~fastload.ConfigError` naming the argument, its range and the value, before anything
is opened or allocated (the detection loader's are checked before its dataset is opened: the
path here does not exist).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from fastload.errors import ConfigError
from fastload.fieldbatch import FieldRequest
from fastload.fields import IMAGE, LABEL, Schema, parse_spec

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(
    "kw, says",
    [
        (dict(crop="iou", iou_trials=10**9), r"iou_trials must be an int in \[1, 10000\], got 1000000000"),
        (dict(size=10**6), r"size must be an int in \[1, 8192\] \(pixels\) or \(height, width\), got 1000000"),
        (dict(size=(10**6, 300)), r"size\[0\] must be an int in \[1, 8192\] \(height\), got 1000000"),
        (dict(size=(300, 2**40)), r"size\[1\] must be an int in \[1, 8192\] \(width\), got 1099511627776"),
        (dict(min_size=10**6, max_size=10**7), r"min_size must be an int in \[1, 8192\], got 1000000"),
        (dict(max_size=10**7), r"max_size must be an int in \[1, 8192\], got 10000000"),
    ],
)
def test_detection_sizes_are_bounded_before_the_dataset_is_opened(tmp_path, kw, says):
    from fastload.detection import DetectionLoader

    with pytest.raises(ConfigError, match=says):
        DetectionLoader(tmp_path / "no-such-dataset", 2, **kw)


@pytest.mark.parametrize(
    "pad_to, says",
    [
        (2**40, r"pad_to must be an int in \[1, 1048576\] \(rows a padded ragged field has\), got 1099511627776"),
        ({"tokens": 2**21}, r"pad_to\['tokens'\] must be an int in \[1, 1048576\].*got 2097152"),
    ],
)
def test_pad_to_is_bounded(pad_to, says):
    schema = Schema((IMAGE, LABEL, parse_spec("tokens", "int32[]")))
    with pytest.raises(ConfigError, match=says):
        FieldRequest(schema, ("image", "tokens"), pad_to)
    assert FieldRequest(schema, ("image", "tokens"), 1 << 20).pad_to == {"tokens": 1 << 20}  # the bound itself is accepted


def test_a_brace_pattern_naming_too_many_tars_is_refused_before_it_is_listed(tmp_path):
    """Run in a child under a 1 GiB address-space limit and a timeout: the old code listed every name."""
    pytest.importorskip("braceexpand")
    code = textwrap.dedent(
        """
        import resource, sys
        resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))
        from fastload.errors import ConfigError
        from fastload.packing.convert_wds import expand_shards
        try:
            expand_shards(sys.argv[1] + "/{000000000000..999999999999}.tar")
        except ConfigError as e:
            print("ConfigError:", e)
        """
    )
    p = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, timeout=120, cwd=ROOT,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})  # fmt: skip
    assert p.returncode == 0, p.stderr[-1500:]
    assert "the brace pattern names more than 1048576 tar files" in p.stdout, p.stdout + p.stderr[-500:]
