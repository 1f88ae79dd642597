"""Multi-view transforms (MoCo's, SimCLR's, BYOL's, DINO's multi-crop): find the transform of each view, and hold their settings.

A multi-view transform returns a list (or tuple) of views of one image: MoCo v2's
``TwoCropsTransform`` calls its ``base_transform`` twice, MoCo v3's calls ``base_transform1``
then ``base_transform2``, SimCLR's calls its ``base_transform`` ``n_views`` times, DINO's
``DataAugmentationDINO`` calls ``global_transfo1``, ``global_transfo2``, then ``local_transfo``
``local_crops_number`` times. :func:`read_views` finds those per-view transforms among the
object's attributes, in one of three layouts (one transform repeated; as many transforms as
views, in attribute order; the first ones once and the last repeated; or a list attribute of
them), and keeps a layout only when calling it gives what calling the object gives, view for
view, on a probe image from two random states (never assumed). Each view's transform is then
translated on its own (:func:`fastload.transforms.translate`), into one
:class:`~fastload.augment.settings.Augment` per view: a :class:`MultiView`.

A loader given a :class:`MultiView` decodes each image once and crops and augments each view
in the DALI graph; view ``v`` draws from :func:`fastload.augment.draws.view_seed` ``(seed, v)``,
so view 0 draws what a one-view loader draws.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Iterator, Sequence

from .errors import ConfigError

__all__ = ["MultiView", "item_settings", "read_views", "split_settings", "views_of_list"]

#: The most views one loader batches (DINO's recipes use 2 global + up to 10 local crops).
MAX_VIEWS = 32


@dataclasses.dataclass(frozen=True)
class MultiView:
    """The settings of a multi-view transform: one :class:`~fastload.augment.settings.Augment` per view, in the order
    the transform returns the views. Batches are ``[views, labels]``, ``views`` a list of one tensor per view.

    Args:
        views: each view's settings; at least two, each a training form (``RandomResizedCrop``), all with the
            same ``channels_last``.
        sources: where each view's transform was found (for messages); not compared.
    """

    views: tuple[Any, ...]
    sources: tuple[str, ...] = dataclasses.field(default=(), compare=False)

    def __post_init__(self) -> None:
        from .augment.settings import Augment

        views = tuple(self.views)
        if not 2 <= len(views) <= MAX_VIEWS or not all(isinstance(a, Augment) for a in views):
            raise ConfigError(f"a MultiView needs 2 to {MAX_VIEWS} fastload.Augment settings, got {self.views!r:.200}")
        names = tuple(self.sources) or tuple(f"view {i + 1}" for i in range(len(views)))
        for name, a in zip(names, views):
            if not a.train:
                raise ConfigError(
                    f"{name} is an evaluation transform (Resize + CenterCrop); FastLoader crops every view of a "
                    "multi-view transform with RandomResizedCrop: give each view RandomResizedCrop(N)"
                )
        if len({a.channels_last for a in views}) > 1:
            raise ConfigError("the views differ in channels_last; FastLoader lays every view of a batch out alike")
        object.__setattr__(self, "views", views)
        object.__setattr__(self, "sources", names)

    @property
    def first(self) -> Any:
        """View 0's settings (what a loader's flat attributes, ``crop`` or ``mean``, show)."""
        return self.views[0]


def _is_transform(v: Any) -> bool:
    """An attribute that may be one view's transform: a callable object (not a class, not a number)."""
    return callable(v) and not isinstance(v, type)


def _layouts(t: Any, n: int) -> Iterator[list[tuple[str, Callable[[Any], Any]]]]:
    """Candidate per-view transforms of ``t`` (``n`` views), each a list of ``(attribute, transform)``."""
    attrs = dict(vars(t)) if hasattr(t, "__dict__") else {}
    found = [(k, v) for k, v in attrs.items() if _is_transform(v)]
    for k, v in attrs.items():  # a list of per-view transforms (BYOL's two, a list of crops)
        if isinstance(v, (list, tuple)) and len(v) == n and all(_is_transform(x) for x in v):
            yield [(f"{k}[{i}]", x) for i, x in enumerate(v)]
    if len(found) == 1:  # MoCo v2, SimCLR: one transform, called once per view
        yield found * n
    if len(found) == n:  # MoCo v3: one transform per view, in attribute order
        yield found
    if 2 <= len(found) < n:  # DINO: the global crops' transforms once each, then the local one repeated
        yield found[:-1] + [found[-1]] * (n - len(found) + 1)


def _same_views(t: Any, layout: list[tuple[str, Callable[[Any], Any]]]) -> bool:
    """Whether calling ``layout``'s transforms in order gives ``t``'s views, on the probe from two random states."""
    from .tvkinds import on_probe, outputs_equal

    def each(img: Any) -> list:
        return [f(img) for _, f in layout]

    try:
        for seed in (0, 1):
            got, want = on_probe(each, seed), on_probe(t, seed)
            if len(got) != len(want) or not all(outputs_equal(a, b) for a, b in zip(got, want)):
                return False
    except Exception:  # noqa: BLE001 - a layout that cannot run on the probe is not the object's
        return False
    return True


def _describe(t: Any) -> str:
    """``module.Class``: the multi-view object's class, for messages."""
    cls = type(t)
    mod = cls.__module__ or ""
    return f"{mod}.{cls.__qualname__}" if mod and mod != "builtins" else cls.__qualname__


def _translated(view: Callable[[Any], Any], where: str) -> Any:
    """One view's transform as an Augment, its refusal prefixed with ``where``."""
    from .augment.settings import Augment
    from .transforms import translate

    try:
        out = translate(view)
    except ConfigError as e:
        raise ConfigError(f"{where}: {e}") from None
    if not isinstance(out, Augment):
        raise ConfigError(f"{where}: it returns views of its own; give each view one transform")
    return out


def read_views(t: Any, n: int) -> MultiView:
    """The settings of multi-view transform ``t``, which returned ``n`` views of the probe image.

    Raises:
        ConfigError: no layout of ``t``'s attributes gives its views (the message says to pass them as
            ``transform=[...]``), or one view's transform is refused (named by its view and attribute).
    """
    name = _describe(t)
    if n > MAX_VIEWS:
        raise ConfigError(f"{name} returns {n} views of each image; FastLoader batches at most {MAX_VIEWS}")
    layout = next((lay for lay in _layouts(t, n) if _same_views(t, lay)), None)
    if layout is None:
        raise ConfigError(
            f"{name} returns {n} views of each image (a {n}-item list or tuple), but no transforms among its "
            "attributes give those views when called in turn (checked on a probe image): pass the transform of each "
            f"view, in order, as FastLoader(..., transform=[view_1, ..., view_{n}])"
        )
    views = tuple(_translated(f, f"view {i + 1} of {n} ({name}.{k})") for i, (k, f) in enumerate(layout))
    return MultiView(views, sources=tuple(f"view {i + 1} of {n} ({name}.{k})" for i, (k, _) in enumerate(layout)))


def views_of_list(transforms: Sequence[Any]) -> MultiView:
    """``transform=[view_1, view_2, ...]``: one transform per view, each translated on its own."""
    n = len(transforms)
    if n < 2:
        raise ConfigError(f"transform= a list of {n} transform(s); a multi-view list needs one transform per view, at least two")
    views = tuple(_translated(f, f"view {i + 1} of {n} (transform[{i}])") for i, f in enumerate(transforms))
    return MultiView(views, sources=tuple(f"view {i + 1} of {n} (transform[{i}])" for i in range(n)))


def split_settings(settings: Any, given: dict[str, Any]) -> tuple[Any, MultiView | None]:
    """A loader's Augment (a multi-view transform's first view's) and its MultiView (None for one view), from its
    translated ``settings`` and the flat keywords ``given`` (refused with a multi-view transform)."""
    from .augment.settings import Augment

    if isinstance(settings, MultiView):
        if given:
            raise ConfigError(
                f"{', '.join(f'{k}=' for k in given)} given with a multi-view transform: each view's settings come from "
                "its own transform; set them there"
            )
        return settings.first, settings
    return Augment.merged(settings, given), None


def item_settings(views: MultiView, seed: int) -> list[dict[str, Any]]:
    """Each view's settings as ``loader.dataset`` processes an item with them, with the seed that view draws from."""
    from .augment import view_seed

    return [
        {"train": True, "crop": a.crop, "resize": a.resize_side, "scale": a.scale, "ratio": a.ratio, "flip": a.flip,
         "mean": a.mean, "std": a.std, "seed": view_seed(seed, v), "interpolation": a.interpolation}
        for v, a in enumerate(views.views)
    ]  # fmt: skip
