"""What one installed timm version's objects say, beside what FastLoader reads from them (run in a subprocess).

``python old_timm_probe.py read``: one JSON object on the last line of stdout, with each object's
own attributes (the operation names as timm was asked to build them, recorded at construction)
beside what :mod:`fastload.augment.readaug` read from them; each level function's arguments on a grid of
levels, both signs; the version's own draws of a Rotate level under ``magnitude_std=inf`` and
``magnitude_max``; the refusals of unreadable objects. ``python old_timm_probe.py load ROOT CACHE
MODES``: the share of values outside the normalised pixel range in a FastLoader epoch and in the
version's own transform over the same ImageFolder. Nothing here decides what is expected.
"""

from __future__ import annotations

import collections.abc
import json
import logging
import random
import sys
import types

import numpy as np

log = logging.getLogger("old_timm_probe")

# timm 0.3.x imports torch._six.container_abcs (removed in torch 2.0): the same names from the standard library.
_six = types.ModuleType("torch._six")
_six.container_abcs, _six.string_classes, _six.int_classes = collections.abc, (str,), int
sys.modules.setdefault("torch._six", _six)

import timm  # noqa: E402
import timm.data  # noqa: E402
import timm.data.auto_augment as aa  # noqa: E402
import torch  # noqa: E402

from fastload.augment import readaug  # noqa: E402
from fastload.transforms import translate  # noqa: E402

BUILT: dict[int, str] = {}  # id(AugmentOp) -> the name timm built it from
_init = aa.AugmentOp.__init__


def _record(self, name, *a, **kw):
    _init(self, name, *a, **kw)
    BUILT[id(self)] = name


aa.AugmentOp.__init__ = _record
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def _transform(mode: str = "pixel", aa_config: str | None = "rand-m9-mstd0.5-inc1", **kw):
    return timm.data.create_transform(32, is_training=True, auto_augment=aa_config, re_prob=1.0, re_mode=mode,
                                      interpolation="bicubic", **kw)  # fmt: skip


def _own_erasing(t) -> dict:
    e = t.transforms[-1]
    return {"per_pixel": e.per_pixel, "rand_color": e.rand_color, "mode": getattr(e, "mode", None), "p": e.probability,
            "scale": [e.min_area, e.max_area], "log_ratio": list(e.log_aspect_ratio), "count": [e.min_count, e.max_count],
            "device": e.device, "num_splits": e.num_splits}  # fmt: skip


def _read_erasing(t) -> dict:
    er = translate(t).erasing
    return {"noise": er.noise, "p": er.p, "scale": list(er.scale), "ratio": list(er.ratio), "count": list(er.count)}


def _op_rows(ops) -> list:
    return [[BUILT[id(o)], o.prob, o.magnitude, o.hparams.get("magnitude_std", 0), o.hparams.get("translate_const"),
             list(o.kwargs["fillcolor"]), o.kwargs["resample"]] for o in ops]  # fmt: skip


def _read_rows(ops) -> list:
    return [[o.name, o.prob, o.magnitude, o.std, o.level_max, o.translate_const] for o in ops]


def _levels() -> dict:
    """Each LEVEL_TO_ARG function of this version at 41 levels in [0, 10], its random sign forced each way."""
    hp = {"translate_const": 100, "translate_pct": 0.3, "img_mean": (1, 2, 3)}
    out, negate = {}, aa._randomly_negate
    for name, fn in aa.LEVEL_TO_ARG.items():
        rows = []
        for level in np.linspace(0.0, 10.0, 41).tolist():
            args = []
            for sign in (lambda v: v, lambda v: -v):
                aa._randomly_negate = sign
                args.append(list(fn(level, hp)) if fn else [])
            rows.append([level] + args)
        out[name] = rows
    aa._randomly_negate = negate
    return out


def _own_rotations(op, n: int) -> list[float]:
    """The Rotate angles ``op`` itself draws in ``n`` calls (its aug_fn recorded, not run)."""
    got: list[float] = []
    fn = op.aug_fn
    op.aug_fn = lambda img, *args, **kw: (got.append(args[0]), img)[1]
    random.seed(4)
    for _ in range(n):
        op(None)
    op.aug_fn = fn
    return got


def _refusal(f) -> list:
    try:
        f()
    except Exception as e:  # noqa: BLE001 - the type is what is reported
        return [type(e).__name__, str(e)]
    return ["accepted", ""]


def _refusals() -> dict:
    def erasing(**attrs):
        e = _transform("pixel", None).transforms[-1]
        for k, v in attrs.items():
            delattr(e, k) if v is ... else setattr(e, k, v)
        return lambda: readaug.timm_erasing(e)

    def op_with(**attrs):
        op = aa.AugmentOp("TranslateX", prob=1.0, magnitude=5, hparams={"translate_const": 10, "img_mean": (1, 2, 3)})
        for k, v in attrs.items():
            delattr(op, k) if v is ... else setattr(op, k, v)
        return lambda: readaug.timm_policy(aa.RandAugment([op], 1), auto=False)

    no_layers = aa.RandAugment([aa.AugmentOp("Rotate", hparams={"translate_const": 10})], 1)
    del no_layers.num_layers
    return {
        "no per_pixel": _refusal(erasing(per_pixel=...)),
        "per_pixel 1": _refusal(erasing(per_pixel=1)),
        "mode unknown": _refusal(erasing(mode="noise")),
        "mode disagrees": _refusal(erasing(mode="const")),
        "no probability": _refusal(erasing(probability=...)),
        "no count": _refusal(erasing(max_count=...)),
        "aug_fn foreign": _refusal(op_with(aug_fn=lambda img, *a, **k: img)),
        "level_fn another's": _refusal(op_with(level_fn=aa.LEVEL_TO_ARG["TranslateXRel"])),
        "no translate_const": _refusal(op_with(hparams={"img_mean": (1, 2, 3)})),
        "no magnitude_std": _refusal(op_with(magnitude_std=...)),
        "no kwargs": _refusal(op_with(kwargs=...)),
        "no num_layers": _refusal(lambda: readaug.timm_policy(no_layers, auto=False)),
    }


def _section(f) -> dict:
    """``f()``, or the error it raised (so one unreadable object does not hide the others' results)."""
    try:
        return f()
    except Exception as e:  # noqa: BLE001 - reported to the test, which fails on it
        return {"error": f"{type(e).__name__}: {e}"}


def _erasing_of(mode: str) -> dict:
    alone = _transform(mode, None)  # the erasing object read on its own
    t = _transform(mode)  # and within a RandAugment transform
    return {"own": _own_erasing(t), "read": _section(lambda: _read_erasing(t)),
            "alone": _section(lambda: {"noise": readaug.timm_erasing(alone.transforms[-1]).noise})}  # fmt: skip


def _erasing() -> dict:
    return {mode: _erasing_of(mode) for mode in ("pixel", "rand", "const")}


def _rand() -> dict:
    t = _transform("pixel")
    ra, pol = t.transforms[2], translate(t).policy
    return {"own": _op_rows(ra.ops), "read": _read_rows(pol.ops), "layers": [ra.num_layers, pol.num_ops],
            "interp": list(pol.interpolation), "fill": list(pol.fill),
            "increasing": list(aa._RAND_INCREASING_TRANSFORMS)}  # fmt: skip


def _deit() -> dict:
    deit = timm.data.create_transform(40, is_training=True, color_jitter=0.3, auto_augment="rand-m9-mstd0.5-inc1",
                                      interpolation="bicubic", re_prob=0.25, re_mode="pixel", re_count=1)  # fmt: skip
    d = translate(deit)
    return {"own": _own_erasing(deit), "read": _read_erasing(deit), "jitter": d.jitter is None,
            "ops": [o.name for o in d.policy.ops], "own_ops": [BUILT[id(o)] for o in deit.transforms[2].ops]}  # fmt: skip


def _auto() -> dict:
    auto = _transform("const", "original-mstd0.5")
    a = translate(auto).policy
    return {"own": [_op_rows(s) for s in auto.transforms[2].policy], "read": [_read_rows(s) for s in a.sub_policies]}


def _hparams() -> dict:
    """``choice_weights``, a large ``mstd`` (1.x: uniform above 100), ``magnitude_std=inf`` and ``magnitude_max``."""
    w = aa.rand_augment_transform("rand-m9-n3-w0", {"translate_const": 100, "interpolation": 2})
    m101 = aa.rand_augment_transform("rand-m9-mstd101", {"translate_const": 100, "interpolation": 2})
    inf = aa.AugmentOp("Rotate", prob=1.0, magnitude=9, hparams={"interpolation": 2, "magnitude_std": float("inf")})
    read_inf = readaug.timm_policy(aa.RandAugment([inf], 1), auto=False).ops[0]
    mmax = aa.AugmentOp("Rotate", prob=1.0, magnitude=15, hparams={"interpolation": 2, "magnitude_max": 20})
    return {
        "weights": {"own": [float(x) for x in w.choice_weights], "read": list(readaug.timm_policy(w, auto=False).weights)},
        "mstd101": {"own": m101.ops[0].magnitude_std, "read": readaug.timm_policy(m101, auto=False).ops[0].std},
        "inf": {"own": _own_rotations(inf, 3000), "std": read_inf.std, "level_max": read_inf.level_max},
        "mmax": {"own": _own_rotations(mmax, 200),
                 "level_max": readaug.timm_policy(aa.RandAugment([mmax], 1), auto=False).ops[0].level_max},
    }  # fmt: skip


def read() -> dict:
    """What this version's objects say beside what FastLoader read from them (see the module's docstring)."""
    return {"version": timm.__version__, "erasing": _erasing(), "rand": _section(_rand), "deit": _section(_deit),
            "auto": _section(_auto), "hparams": _section(_hparams), "levels": _levels(), "refusals": _refusals()}  # fmt: skip


def load(root: str, cache: str, modes: str) -> dict:
    """Per erasing mode (comma-separated): the share of batch values outside [(0 - mean) / std, (1 - mean) / std]
    per channel in a FastLoader epoch, and in this version's own transform over the same images."""
    from torchvision.datasets import ImageFolder

    import fastload

    lo = torch.tensor([(0 - m) / s for m, s in zip(MEAN, STD)]).view(1, 3, 1, 1) - 1e-3
    hi = torch.tensor([(1 - m) / s for m, s in zip(MEAN, STD)]).view(1, 3, 1, 1) + 1e-3

    def share(batches) -> float:
        out = n = 0
        for x in batches:
            out += int(((x < lo) | (x > hi)).sum())
            n += x.numel()
        return out / n

    result: dict = {"version": timm.__version__}
    for mode in modes.split(","):
        ds = ImageFolder(root, transform=_transform(mode, None))  # erasing after ColorJitter: nothing else leaves the range
        with fastload.FastLoader(ds, 16, device="cpu", progress=False, cache_dir=cache, seed=1, shuffle=False) as fl:
            ours = share(x for x, _ in fl)
        random.seed(1), np.random.seed(1), torch.manual_seed(1)
        theirs = share(torch.stack([ds[i][0] for i in range(len(ds))]).split(16))
        result[mode] = {"fastload": ours, "timm": theirs}
    return result


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    result = read() if sys.argv[1] == "read" else load(*sys.argv[2:5])
    sys.stdout.write("\n" + json.dumps(result) + "\n")
