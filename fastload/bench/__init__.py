"""``fastload bench``: FastLoader against the DataLoader baselines, on the same images.

:func:`run_bench` measures each loader (loader-only images/s, and a real training loop
through :func:`fastload.profile`) and writes ``report.md``, ``report.json`` and
``report.png``. Loaders are named factories (:func:`loader_spec`), so any loader can be
added to the comparison.
"""

from __future__ import annotations

from .runner import BenchConfig, default_loaders, default_workers, loader_spec, run_bench

__all__ = ["BenchConfig", "run_bench", "loader_spec", "default_loaders", "default_workers"]
