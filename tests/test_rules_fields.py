"""Rules of padded ragged fields: rows kept, rows padded with pad_value, lengths, as torch's pad_sequence."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.nn.utils.rnn import pad_sequence

from fastload.fieldbatch import FieldRequest
from fastload.fields import IMAGE, Schema, parse_spec


def expected(rows_list: list[np.ndarray], rows: int, pad_value: float) -> tuple[torch.Tensor, torch.Tensor]:
    """torch's pad_sequence (batch_first), then cut or padded to ``rows`` with the same value."""
    seqs = [torch.from_numpy(a[:rows].copy()) for a in rows_list]
    out = pad_sequence(seqs, batch_first=True, padding_value=pad_value)
    if out.shape[1] < rows:
        fill = torch.full((out.shape[0], rows - out.shape[1], *out.shape[2:]), pad_value, dtype=out.dtype)
        out = torch.cat([out, fill], 1)
    return out, torch.tensor([len(s) for s in seqs], dtype=torch.int64)


# (spec of the ragged field, rows per sample, pad_to, pad_value)
TABLE = [
    ("int32[]", [3, 0, 5, 1], 4, -1),
    ("int64[]", [2, 7], 7, 50257),  # a tokenizer's pad id
    ("float32[][3]", [1, 4, 2], 3, float("nan")),
    ("float32[][2]", [0, 0], 2, 0.5),
    ("uint8[]", [6, 2, 2], 8, 255),
    ("int16[]", [1, 9], 3, 0),
]


@pytest.mark.parametrize("spec,lengths,pad_to,pad_value", TABLE)
def test_padded_ragged_fields_match_pad_sequence_with_the_pad_value(spec, lengths, pad_to, pad_value):
    """Bug: the padding rows left at zero (np.zeros, or the value applied only past the longest
    sample, or only to the first row) instead of ``pad_value``; rows past ``pad_to`` kept; the
    lengths counted before the cut. Expected: torch's ``pad_sequence`` with ``padding_value``."""
    field = parse_spec("tok", spec)
    schema = Schema([IMAGE, parse_spec("label", "label"), field])
    rng = np.random.default_rng(len(lengths))
    vals = [rng.integers(1, 100, (n, *field.shape)).astype(field.dtype) for n in lengths]
    req = FieldRequest(schema, ("image", "tok"), pad_to=pad_to, pad_value=pad_value)
    batch = req.collate(torch.zeros(len(vals), 3, 2, 2), torch.zeros(len(vals)), [{"tok": v} for v in vals], torch.device("cpu"))
    got = batch[1]
    want, want_len = expected(vals, pad_to, pad_value)
    assert got.dtype == want.dtype and got.shape == (len(vals), pad_to, *field.shape)
    torch.testing.assert_close(got, want, equal_nan=True, rtol=0, atol=0)
    assert batch.lengths["tok"].tolist() == want_len.tolist()
