"""A round of steps in the graph: each sample's operation, chosen among a table's by its drawn index.

On a GPU (or a CPU graph built in the GPU's form) a round is DALI's conditional ``select``: one branch per operation
of the table. On the CPU every operation with a compiled form (:attr:`GraphOp.code`) runs inside the compiled step
(:mod:`fastload.augment.compiled`), which picks each sample's kernel by its index, and consecutive rounds of such
operations are one operator, which skips a sample's Identity rounds and passes the image between the others without
a buffer of DALI's each; an operation without a compiled form (torchvision's Gaussian blur) keeps a branch of its own
beside the step. timm's RandAugment in branches was about 400 operators a batch, DALI's executor paying for each,
taken or not, and a fresh buffer per round; compiled, its two rounds are one operator.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from .graphop import GraphOp


def _compiled_codes(ops: Sequence[GraphOp], img: Any) -> list[int | None]:
    """Each operation's code in a graph of ``img``; all None where no operation but Identity has one (a GPU graph,
    or a table only DALI's operators do: the step would only copy)."""
    codes = [op.code(img) for op in ops]
    if all(c is None for op, c in zip(ops, codes) if op.name != "Identity"):
        return [None] * len(ops)
    return codes


def one_round(ops: Sequence[GraphOp], img: Any, idx: Any, par: Any) -> Any:
    """Each sample of the uint8 HWC ``img`` through ``ops[i]`` with params ``par`` (a float32 ``[ARGS]`` DataNode, or
    None where no operation reads any), ``i`` its int32 ``[1]`` DataNode ``idx`` (needs ``enable_conditionals``
    where some operation has no code)."""
    from nvidia.dali.auto_aug.core import select

    from ..pipeline import import_dali
    from .compiled import step

    _, fn, types = import_dali()
    codes = _compiled_codes(ops, img)
    if all(c is None for c in codes):
        return select([op.graph for op in ops], idx[0], img, par)
    table = [-1 if c is None else c for c in codes]
    own = [j for j, c in enumerate(codes) if c is None]  # operations with a branch of their own
    if not own:
        return step(img, table, par, idx)
    scalar = idx[0]
    branch = scalar * 0
    for k, j in enumerate(own):
        branch = branch + (scalar == j) * (k + 1)
    branches = [lambda x, i, p: step(x, table, p, i)] + [_branch(ops[j]) for j in own]
    return select(branches, fn.cast(branch, dtype=types.INT32), img, idx, par)


def _branch(op: GraphOp) -> Any:
    return lambda x, i, p: op.graph(x, p)


def select_steps(table: Sequence[GraphOp], img: Any, idx: Any, par: Any, steps: int, *,
                 tables: Sequence[Sequence[int]] | None = None) -> Any:  # fmt: skip
    """``steps`` rounds: in round ``s`` each sample gets ``table[idx[s]]`` with ``par[s]`` (``idx`` int32 ``[steps]``
    and ``par`` float32 ``[steps, ARGS]`` per sample, or None where no operation of ``table`` reads its params).
    ``tables``: round ``s`` chooses among ``table``'s operations ``tables[s]`` only, ``idx[s]`` indexing that list
    (default: all of ``table`` every round). Consecutive rounds whose operations all have codes run as one compiled
    operator; any other round as :func:`one_round`."""
    from .compiled import rounds

    chosen = [[table[i] for i in tables[s]] if tables is not None else list(table) for s in range(steps)]
    s = 0
    while s < steps:
        codes = _compiled_codes(chosen[s], img) if len(chosen[s]) > 1 else [None]
        if None in codes:
            if len(chosen[s]) > 1:
                img = one_round(chosen[s], img, idx[s : s + 1], None if par is None else par[s])
            s += 1
            continue
        run = [codes]
        while s + len(run) < steps and len(chosen[s + len(run)]) > 1:
            more = _compiled_codes(chosen[s + len(run)], img)
            if None in more:
                break
            run.append(more)
        end = s + len(run)
        img = rounds(img, run, None if par is None else par[s:end], idx[s:end])
        s = end
    return img


def apply_once(op: GraphOp, images: Sequence[np.ndarray], args: Sequence[tuple], *, num_threads: int = 1) -> list[np.ndarray]:
    """``op`` on each HWC uint8 image with its step's ``args``, as a loader's CPU graph runs it (a round of
    Identity and ``op``, every sample taking ``op``), in a CPU pipeline of its own; HWC uint8 out."""
    from ..pipeline import defined, import_dali
    from .graphop import identity

    dali, fn, types = import_dali()
    imgs = [np.ascontiguousarray(i, dtype=np.uint8) for i in images]
    params = [op.params(a) for a in args]
    if len(imgs) != len(params):
        raise ValueError(f"{len(imgs)} images but {len(params)} argument tuples")
    ones = [np.ones(1, dtype=np.int32)] * len(imgs)

    @dali.pipeline_def(batch_size=len(imgs), num_threads=num_threads, device_id=None, exec_dynamic=True, enable_conditionals=True)
    def pipe():
        img = fn.external_source(source=lambda: imgs, batch=True, layout="HWC", dtype=types.UINT8, ndim=3)
        p = fn.external_source(source=lambda: params, batch=True, dtype=types.FLOAT, ndim=1)
        i = fn.external_source(source=lambda: ones, batch=True, dtype=types.INT32, ndim=1)
        return one_round([identity(op.library), op], img, i, p)

    pp = defined(pipe)
    (out,) = pp.run()
    return [np.array(out[i]) for i in range(len(imgs))]
