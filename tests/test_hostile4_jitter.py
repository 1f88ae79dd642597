"""Careless and hostile input, round four (issue 38), class 3: a colour-jitter factor torchvision refuses.

``ColorJitter(contrast=1e308)`` made all-NaN batches (the factor is inf in float32); torchvision
refuses to draw it (``torch.empty(1).uniform_`` past float32's range). Each factor above float32's
largest value is now a ConfigError when the jitter is made; one within it is accepted by both.
"""

from __future__ import annotations

import pytest
import torch

from fastload.errors import ConfigError
from fastload.augment.settings import Jitter

T = pytest.importorskip("torchvision.transforms")


def _torchvision_refuses(**kw) -> bool:
    try:
        T.ColorJitter(**kw)(torch.rand(3, 6, 10))
    except RuntimeError:
        return True
    return False


@pytest.mark.parametrize(
    "kw, refused",
    [
        (dict(contrast=1e308), True),
        (dict(brightness=1e39), True),
        (dict(saturation=(0.5, 1e300)), True),
        (dict(contrast=1e30), False),  # huge but within float32: both take it
        (dict(brightness=0.4, contrast=0.4, saturation=0.4), False),
    ],
)
def test_a_jitter_factor_is_refused_exactly_where_torchvision_refuses_it(kw, refused):
    assert _torchvision_refuses(**kw) is refused  # the oracle
    pairs = {k: (max(0.0, 1 - v), 1 + v) if isinstance(v, float) else v for k, v in kw.items()}  # ColorJitter's ranges
    if refused:
        name = next(iter(kw))
        with pytest.raises(ConfigError, match=rf"jitter {name} must satisfy 0.0 <= min <= max <= 3.40282346\d*e\+38"):
            Jitter(**pairs)
    else:
        j = Jitter(**pairs)
        assert all(torch.isfinite(torch.tensor(p, dtype=torch.float32)).all() for p in j.parts if p is not None)


def test_translate_refuses_colorjitter_contrast_1e308():
    from fastload.transforms import translate

    with pytest.raises(ConfigError, match="jitter contrast must satisfy"):
        translate(T.Compose([T.RandomResizedCrop(32), T.ColorJitter(contrast=1e308), T.ToTensor()]))
