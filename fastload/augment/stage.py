"""The augmentation stage of the DALI graph: the operations a loader's settings can draw, what the host feeds per batch, and the operators that apply it.

A :class:`GraphStage` is built once per loader from its :class:`~fastload.augment.settings.Augment`. It
holds a table of :class:`~fastload.augment.graphop.GraphOp` (index 0 is Identity) covering
every operation the settings can draw, and a fixed number of *steps*: TrivialAugmentWide's
one, a policy's widest plan, the jitter and the grayscale. Per batch the host turns the
seeded draws (:func:`fastload.augment.policies.plan`, :func:`~fastload.augment.draws.trivial_params`,
:func:`~fastload.augment.draws.color_params`, :func:`~fastload.augment.draws.erase_boxes`)
into dense arrays (:meth:`GraphStage.feed`): each sample's operation index and parameters per
step, its erasing rectangles and their noise. The graph (:meth:`GraphStage.apply`, then
:meth:`GraphStage.erase` after normalisation) runs each sample's operation by its index
(:mod:`fastload.augment.rounds`: the compiled step on the CPU, DALI's conditional ``select`` on a
GPU), so a batch is one set of batched operators on either backend and no image is touched by Python.
"""

from __future__ import annotations

import logging
import math
from typing import Any, Sequence

import numpy as np

from .draws import color_params, erase_boxes, noise_seeds, trivial_params, TRIVIAL_OPS
from .graphop import ARGS, GraphOp, identity
from .rounds import select_steps

log = logging.getLogger(__name__)
_HUE_SAID: list[bool] = []

#: What a GPU loader with ColorJitter's hue logs once per process (the one operation whose pixels differ visibly).
HUE_NOTE = (
    "ColorJitter's hue is turned in YIQ in the GPU graph (as DALI's hsv does), not by PIL's HSV round trip (which "
    "the CPU graph makes): the law of the hue factor is torchvision's, the pixels differ (on photos, about 8 levels "
    "on average at hue 0.05, 15 at 0.1; docs/dropin.md)"
)


def note_gpu_hue(stages: Sequence[Any]) -> None:
    """Log :data:`HUE_NOTE` once per process when one of a GPU loader's ``stages`` (GraphStage or None) turns a hue."""
    if any(st is not None and st.turns_hue for st in stages) and not _HUE_SAID:
        _HUE_SAID.append(True)
        log.warning(HUE_NOTE)


def graph_op(library: str, name: str, interpolation: str, fill: tuple[int, int, int]) -> GraphOp | None:
    """The graph's operation of ``library``'s ``name`` at ``interpolation`` (``fill`` for the geometry), or None."""
    if name == "Identity":
        return identity(library, interpolation)
    from .ops_color import color_op
    from .ops_geometry import geometry_op
    from .recipes import PIL_BLUR

    if name == PIL_BLUR:  # MoCo's and DINO's blur: PIL's GaussianBlur(radius), the operation timm's is
        return color_op("timm", "GaussianBlur", interpolation, fill)

    return color_op(library, name, interpolation, fill) or geometry_op(library, name, interpolation, fill)


def _three(fill: Sequence[float] | None) -> tuple[int, int, int]:
    """A fill as the three 0..255 ints PIL is given (None: black)."""
    if fill is None:
        return (0, 0, 0)
    vals = list(fill) if len(fill) == 3 else list(fill) * 3
    return tuple(int(round(v)) for v in vals)  # type: ignore[return-value]


def policy_steps(policy: Any) -> int:
    """The most operations :func:`fastload.augment.policies.plan` gives one sample under ``policy``."""
    if policy.kind == "rand":
        return int(policy.layers)
    if policy.kind == "chain":
        return sum(max(len(g) for g in st.groups) for st in policy.stages)
    return max(len(sp) for sp in policy.sub_policies)


def policy_names(policy: Any) -> set[str]:
    """Every operation name ``policy`` can draw."""
    if policy.kind == "rand":
        return {op.name for op in policy.ops}
    if policy.kind == "chain":
        return {op.name for st in policy.stages for g in st.groups for op in g}
    return {op.name for sp in policy.sub_policies for op in sp}


def _turns_hue(augment: Any) -> bool:
    """Whether any ColorJitter of ``augment`` (its own, or one in a chain policy) has a hue part."""
    jitters = [augment.jitter] if augment.jitter is not None else []
    pol = augment.policy
    if pol is not None and pol.kind == "chain":
        jitters += [op.jitter for st in pol.stages for g in st.groups for op in g if op.jitter is not None]
    return any(j.parts[3] is not None for j in jitters)


class GraphStage:
    """What a loader's settings do to each training crop, as a table of graph operations and its feed.

    Args:
        augment: the loader's settings (``train`` with ``trivial``, ``policy``, ``jitter``,
            ``grayscale`` or ``erasing``).

    Raises:
        ValueError: an operation the settings can draw has no graph operation (the translators
            refuse such transforms first, by name).
    """

    def __init__(self, augment: Any) -> None:
        self.augment, self.crop = augment, augment.crop
        self.ops: list[GraphOp] = [identity("torchvision")]
        self._index: dict[tuple[str, str, str], int] = {}
        self.tables: list[list[int]] = []  # per step, the indices into ops it can take (0, Identity, first)
        a = augment
        if a.trivial is not None:
            fill = _three(a.trivial.fill)
            self._trivial = np.array([self._add("torchvision", n, a.trivial.interpolation, fill) for n, *_ in TRIVIAL_OPS])
            self.tables.append(sorted({0, *self._trivial.tolist()}))
        if a.policy is not None:
            lib, fill = a.policy.library, _three(a.policy.fill)
            for name in sorted(policy_names(a.policy)):
                for interp in a.policy.interpolation:
                    self._add(lib, name, interp, fill)
            if a.policy.kind == "chain":  # each stage's operations at its own steps (plan(..., fixed=True))
                from .policies import chain_positions

                for names in chain_positions(a.policy):
                    self.tables.append([0] + sorted(self._index[(lib, n, i)] for n in names for i in a.policy.interpolation))
            else:
                everything = [0] + sorted(self._index[(lib, n, i)] for n in policy_names(a.policy) for i in a.policy.interpolation)
                self.tables += [everything] * policy_steps(a.policy)
        if a.jitter is not None:
            self.tables.append([0, self._add("torchvision", "ColorJitter", "bilinear", (0, 0, 0))])
        if a.grayscale > 0:
            self.tables.append([0, self._add("torchvision", "Grayscale", "bilinear", (0, 0, 0))])
        self.steps = len(self.tables)
        # a step's select has the operations of its table only (a chain's jitter is not built into its blur's step):
        # the feed gives each sample's position in its step's table (local[step][index into ops])
        self._local = np.full((max(self.steps, 1), len(self.ops)), -1, dtype=np.int32)
        for step, table in enumerate(self.tables):
            self._local[step, table] = np.arange(len(table), dtype=np.int32)
        # the params input exists only where an operation reads it (DALI warns of a fed input nothing uses)
        self.with_params = self.steps > 0 and any(op.takes_params for op in self.ops)
        self._lead = (1 + self.with_params) if self.steps else 0  # the feed's inputs before the erasing's
        self.turns_hue = _turns_hue(a)  # (a GPU graph's hue is YIQ's: note_gpu_hue)

    def _add(self, library: str, name: str, interp: str, fill: tuple[int, int, int]) -> int:
        key = (library, name, interp)
        if key not in self._index:
            op = graph_op(library, name, interp, fill)
            if op is None:
                raise ValueError(f"{library}'s {name} ({interp}) has no operation in the DALI graph")
            self._index[key] = len(self.ops)
            self.ops.append(op)
        return self._index[key]

    @property
    def erasing(self) -> Any:
        return self.augment.erasing

    @property
    def active(self) -> bool:
        """Whether there is anything to do (else the graph has no stage)."""
        return self.steps > 0 or self.erasing is not None

    @property
    def slots(self) -> int:
        """Erasing rectangles per sample (timm's ``max_count``; 0 without erasing)."""
        return 0 if self.erasing is None else int(self.erasing.count[1])

    # ---- host: what each sample gets
    def feed(self, *, seed: int, epoch: int, positions: np.ndarray, layout: str) -> list:
        """The stage's inputs for one batch: ``[indices [n, steps] int32, params [n, steps, ARGS] float32]`` (the params
        only where an operation reads them: :attr:`with_params`), then per
        erasing slot ``anchor [n, 2]``, ``shape [n, 2]`` (top/left, height/width; 0 where none) and, for noise, the
        patches (one float32 array per sample in ``layout``, zeros ``1x1`` where none)."""
        a, n = self.augment, len(positions)
        idx = np.zeros((n, max(self.steps, 1)), dtype=np.int32)
        par = np.zeros((n, max(self.steps, 1), ARGS), dtype=np.float32)
        s = 0
        if a.trivial is not None:
            ops, mags = trivial_params(seed=seed, epoch=epoch, positions=positions, num_bins=a.trivial.num_bins)
            idx[:, s] = self._trivial[ops]
            for k in np.flatnonzero(ops != 0).tolist():
                par[k, s] = self.ops[idx[k, s]].params((float(mags[k]),))
            s += 1
        if a.policy is not None:
            from .policies import plan

            lib = a.policy.library
            for k, steps in enumerate(plan(a.policy, seed=seed, epoch=epoch, positions=positions, fixed=a.policy.kind == "chain")):
                for j, step in enumerate(steps):
                    if step is None:  # a chain's position where nothing is done
                        continue
                    name, args, interp = step
                    i = self._index[(lib, name, interp)]
                    idx[k, s + j], par[k, s + j] = i, self.ops[i].params(args)
            s += policy_steps(a.policy)
        if a.jitter is not None or a.grayscale > 0:
            order, factors, gray = color_params(
                seed=seed, epoch=epoch, positions=positions,
                parts=a.jitter.parts if a.jitter is not None else (None,) * 4, grayscale=a.grayscale,
                p=a.jitter.p if a.jitter is not None else 1.0,
            )  # fmt: skip
            if a.jitter is not None:
                i = self._index[("torchvision", "ColorJitter", "bilinear")]
                on = ~np.isnan(factors).all(axis=1)
                idx[on, s] = i
                for k in np.flatnonzero(on).tolist():
                    par[k, s] = self.ops[i].params(tuple(order[k].tolist()) + tuple(factors[k].tolist()))
                s += 1
            if a.grayscale > 0:
                idx[np.asarray(gray, dtype=bool), s] = self._index[("torchvision", "Grayscale", "bilinear")]
                s += 1
        if self.steps:
            idx = self._local[np.arange(self.steps), idx]  # each step's index into its own table
            if (idx < 0).any():  # (an invariant: tables and draws are made from the same settings)
                raise AssertionError(f"an operation was drawn at a step whose table lacks it: {np.argwhere(idx < 0)[:3]}")
        return [idx, par][: self._lead] + self._erase_feed(seed, epoch, positions, layout)

    def _erase_feed(self, seed: int, epoch: int, positions: np.ndarray, layout: str) -> list:
        er = self.erasing
        if er is None:
            return []
        rects = erase_boxes(self.crop, seed=seed, epoch=epoch, positions=positions, p=er.p, scale=er.scale,
                            ratio=er.ratio, count=er.count)  # fmt: skip
        out: list = []
        patches = None if er.noise is None else noise_patches(
            rects, noise_seeds(seed=seed, epoch=epoch, positions=positions), noise=er.noise, layout=layout
        )  # fmt: skip
        for b in range(rects.shape[1]):
            out += [np.ascontiguousarray(rects[:, b, :2], dtype=np.float32), np.ascontiguousarray(rects[:, b, 2:], dtype=np.float32)]
            if patches is not None:
                out.append(patches[b])
        return out

    def input_kinds(self, layout: str) -> list[tuple[str, int, str]]:
        """``(dtype, ndim, layout)`` of each input :meth:`feed` gives, in its order."""
        kinds = [("int32", 1, ""), ("float32", 2, "")][: self._lead]
        for _ in range(self.slots):
            kinds += [("float32", 1, ""), ("float32", 1, "")]
            if self.erasing.noise is not None:
                kinds.append(("float32", 3, layout))
        return kinds

    # ---- graph: how
    def apply(self, img: Any, inputs: Sequence[Any]) -> Any:
        """Each sample's steps on the uint8 HWC ``img`` (``inputs``: all of :meth:`feed`'s, as graph nodes)."""
        if self.steps == 0:
            return img
        return select_steps(self.ops, img, inputs[0], inputs[1] if self.with_params else None, self.steps, tables=self.tables)

    def finishes_compiled(self, img: Any) -> bool:
        """Whether a graph of ``img`` (the stage's operations' output) normalises and erases in the compiled finish
        (:meth:`finish`): a CPU graph in the CPU's form."""
        from .ops_color import takes_compiled

        return takes_compiled(img)

    def finish(self, img: Any, inputs: Sequence[Any], *, mean: Sequence[float], std: Sequence[float], layout: str) -> Any:
        """The uint8 HWC RGB CPU ``img`` normalised (``mean``, ``std`` in levels) into float32 ``layout`` and erased, in
        one compiled operator (:func:`fastload.augment.compiled.finish`): what ``crop_mirror_normalize`` then
        :meth:`erase` give; ``inputs``: all of :meth:`feed`'s, as graph nodes."""
        from ..pipeline import import_dali
        from .compiled import finish

        _, fn, _ = import_dali()
        er = self.erasing
        if er is None:
            return finish(img, mean=mean, std=std, layout=layout, rects=None, noise=None, value=(0.0,))
        inputs = inputs[self._lead :]
        per = 2 if er.noise is None else 3
        rects = fn.cat(*[inputs[per * b + k] for b in range(self.slots) for k in (0, 1)], axis=0)
        if er.noise is None:
            return finish(img, mean=mean, std=std, layout=layout, rects=rects, noise=None, value=tuple(er.value))
        noise = fn.cat(*[fn.reshape(inputs[per * b + 2], shape=[-1]) for b in range(self.slots)], axis=0)
        return finish(img, mean=mean, std=std, layout=layout, rects=rects, noise=noise, value=None)

    def erase(self, img: Any, inputs: Sequence[Any], *, layout: str, value: Sequence[float], dtype: Any) -> Any:
        """The erasing rectangles on the normalised ``img`` (in ``layout``, of DALI type ``dtype``); ``inputs``: all of
        :meth:`feed`'s, as graph nodes on the CPU."""
        from nvidia.dali.auto_aug.core import select

        from ..pipeline import import_dali

        _, fn, types = import_dali()
        er = self.erasing
        if er is None:
            return img
        inputs = inputs[self._lead :]
        per = 2 if er.noise is None else 3
        hw = [float(self.crop), float(self.crop)]
        for b in range(self.slots):
            anchor, shape = inputs[per * b], inputs[per * b + 1]
            if er.noise is None:
                img = fn.erase(img, anchor=anchor, shape=shape, axis_names="HW", fill_value=list(value))
                continue
            patch = inputs[per * b + 2]
            erased = fn.cast(shape[0] > 0.5, dtype=types.INT32)
            img = select([_kept, _pasted], erased, img, anchor, shape, patch, hw=hw, dtype=dtype)
        return img


def _kept(img: Any, anchor: Any, shape: Any, patch: Any, *, hw: list, dtype: Any) -> Any:
    """A sample with no rectangle in this slot: as it is."""
    return img


def _pasted(img: Any, anchor: Any, shape: Any, patch: Any, *, hw: list, dtype: Any) -> Any:
    """The sample's noise ``patch`` in place of its rectangle: the rectangle zeroed, the patch padded to the image added."""
    from ..pipeline import import_dali

    _, fn, _ = import_dali()
    patch = patch.gpu() if img.device == "gpu" else patch
    canvas = fn.slice(patch, -anchor, hw, axis_names="HW", normalized_anchor=False, normalized_shape=False,
                      out_of_bounds_policy="pad", fill_values=0.0)  # fmt: skip
    zeroed = fn.erase(img, anchor=anchor, shape=shape, axis_names="HW", fill_value=0.0)
    return fn.cast(zeroed + canvas, dtype=dtype)


def noise_patches(rects: np.ndarray, seeds: np.ndarray, *, noise: str, layout: str) -> list[list[np.ndarray]]:
    """The standard normal noise of each erased rectangle, per slot a list of per-sample float32 arrays.

    ``noise="pixel"``: a draw per pixel and channel; ``"channel"``: one per channel, spread over
    the rectangle. Each image's noise is drawn from NumPy's generator seeded with its
    ``seeds[k]``, rectangle after rectangle, one bulk draw each: the same on every device.
    ``layout`` ``"CHW"`` or ``"HWC"``; a sample without a rectangle in a slot gets a ``1x1`` zero.
    """
    n, slots = rects.shape[:2]
    zero = np.zeros((3, 1, 1) if layout == "CHW" else (1, 1, 3), dtype=np.float32)
    out = [[zero] * n for _ in range(slots)]
    for k in np.flatnonzero((rects[:, :, 2] > 0).any(axis=1)).tolist():
        gen = np.random.default_rng(int(seeds[k]))
        for b in range(slots):
            _, _, h, w = (int(v) for v in rects[k, b])
            if h == 0:
                continue
            z = gen.standard_normal((3, h, w) if noise == "pixel" else (3, 1, 1), dtype=np.float32)
            z = np.broadcast_to(z, (3, h, w))
            out[b][k] = np.ascontiguousarray(z if layout == "CHW" else z.transpose(1, 2, 0))
    return out


def apply_plans(
    images: Sequence[np.ndarray], plans: Sequence[Sequence[tuple]], *, library: str, fill: Sequence[float] | None,
    num_threads: int = 1,
) -> list[np.ndarray]:  # fmt: skip
    """Each HWC uint8 image through its planned steps ``(name, args, interpolation)``, as the loader's graph applies them
    (a round per step), in a CPU pipeline of its own; HWC uint8 out. What the comparisons with torchvision's and
    timm's own functions use."""
    from ..pipeline import defined, import_dali

    dali, fn, types = import_dali()
    three = _three(fill)
    table: list[GraphOp] = [identity(library)]
    index: dict[tuple[str, str], int] = {}
    steps = max([len(p) for p in plans] + [1])
    idx = np.zeros((len(plans), steps), dtype=np.int32)
    par = np.zeros((len(plans), steps, ARGS), dtype=np.float32)
    for k, plan_k in enumerate(plans):
        for j, (name, args, interp) in enumerate(plan_k):
            if (name, interp) not in index:
                op = graph_op(library, name, interp, three)
                if op is None:
                    raise ValueError(f"{library}'s {name} ({interp}) has no operation in the DALI graph")
                index[(name, interp)] = len(table)
                table.append(op)
            idx[k, j] = index[(name, interp)]
            par[k, j] = table[idx[k, j]].params(tuple(args))
    imgs = [np.ascontiguousarray(i, dtype=np.uint8) for i in images]

    @dali.pipeline_def(batch_size=len(imgs), num_threads=num_threads, device_id=None, enable_conditionals=True)
    def pipe():
        img = fn.external_source(source=lambda: imgs, batch=True, layout="HWC", dtype=types.UINT8, ndim=3)
        i = fn.external_source(source=lambda: idx, batch=True, dtype=types.INT32, ndim=1)
        p = fn.external_source(source=lambda: par, batch=True, dtype=types.FLOAT, ndim=2)
        return select_steps(table, img, i, p, steps)

    pp = defined(pipe)
    (out,) = pp.run()
    return [np.array(out[k]) for k in range(len(imgs))]
