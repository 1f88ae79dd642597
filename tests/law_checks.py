"""Two-sample checks that fastload's draws follow a library's own law: KS for numbers, chi-square for categories."""

from __future__ import annotations

import numpy as np
from scipy import stats


def close(a, b, what: str) -> None:
    """Two samples of numbers from one law (Kolmogorov-Smirnov, p > 1e-4)."""
    p = stats.ks_2samp(np.asarray(a, float), np.asarray(b, float)).pvalue
    assert p > 1e-4, f"{what}: p={p:.2g}"


def rates(a, b, what: str) -> None:
    """Two samples of categories from one law (chi-square on their contingency table, p > 1e-4); nothing to test
    when only one category occurs."""
    cats = sorted(set(a) | set(b), key=repr)
    table = np.array([[list(a).count(c) for c in cats], [list(b).count(c) for c in cats]])
    table = table[:, table.sum(0) > 0]
    if table.shape[1] < 2:
        return
    p = stats.chi2_contingency(table).pvalue
    assert p > 1e-4, f"{what}: p={p:.2g} {table.tolist()}"
