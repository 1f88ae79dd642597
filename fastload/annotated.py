"""torchvision's CocoDetection, VOCSegmentation and VOCDetection (plain, under Subset, v2-wrapped) packed once with their annotations and their items rebuilt as their ``__getitem__`` builds them.

:func:`annotated_plan` recognises such a dataset (or says it is not one), :func:`check_transforms`
reads its transforms (the detection and segmentation references' random steps translated by
:mod:`fastload.detaug` and :mod:`fastload.segaug`,
anything else refused by name with a route that works), and
:meth:`AnnotatedPlan.open` packs the images (the pixels of ``Image.open(f).convert("RGB")``, as
the datasets load them) with each image's annotation into a cache entry, once. Each item is then
rebuilt from the entry exactly: COCO's annotation list (the JSON objects the annotation file
holds, stored as JSON text), VOC's mask (the PNG file's bytes, opened as the dataset opens them:
its palette and 255 border kept) or VOC's parsed XML (the file's bytes, parsed by the dataset's
own ``parse_voc_xml``); a v2-wrapped dataset's item goes through torchvision's own wrapper.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import logging
import os
import re
from pathlib import Path
from typing import Any, Callable, NamedTuple

import numpy as np

from .errors import ConfigError, printable

log = logging.getLogger(__name__)

__all__ = ["ANNOTATED_KINDS", "AnnotatedPlan", "TransformsCollate", "annotated_plan", "check_transforms", "shown"]

#: Bumped when what an entry holds changes.
ANNOTATED_CACHE_VERSION = 1

#: The datasets served, by class name: the field each entry stores besides the image, and its kind.
ANNOTATED_KINDS = {"CocoDetection": ("anns", "str"), "VOCSegmentation": ("mask", "bytes"), "VOCDetection": ("xml", "bytes")}

#: Methods whose override would change what a served dataset's ``dataset[i]`` is.
_ITEM_METHODS = ("__getitem__", "__len__", "_load_image", "_load_target", "parse_voc_xml")

#: The route for a step FastLoader does not run itself.
ROUTE = (
    "build the dataset without it (transforms=None, or only ToImage/ToDtype/PILToTensor/ToTensor) and pass "
    "collate_fn=fastload.TransformsCollate(transforms, collate_fn), which runs your transforms on each item as the "
    "dataset would, in the loop"
)


def shown(obj: Any) -> str:
    """``obj`` as a message shows it: its repr where that shows no address, else its class."""
    try:
        r = repr(obj)
    except Exception:  # noqa: BLE001 - a user's __repr__
        r = ""
    if not r or " at 0x" in r or len(r) > 160:
        return printable(getattr(type(obj), "__qualname__", type(obj).__name__)) + "(...)"
    return printable(r)


def _torchvision() -> Any:
    try:
        from torchvision import datasets
    except ImportError:  # pragma: no cover - no torchvision: nothing is one of its datasets
        return None
    return datasets


def _served_class(obj: Any) -> str | None:
    """The name of the torchvision dataset ``obj`` is (exactly, or a subclass overriding nothing that
    builds its items), else None."""
    ds = _torchvision()
    if ds is None:
        return None
    for name in ANNOTATED_KINDS:
        base = getattr(ds, name, None)
        if base is not None and isinstance(obj, base):
            return name
    return None


def _overrider(obj: Any, name: str) -> str | None:
    """The class of ``obj`` overriding one of the served dataset's item methods, as ``Class.method``."""
    base = getattr(_torchvision(), name)
    for m in _ITEM_METHODS:
        owner = next((c for c in type(obj).__mro__ if m in vars(c)), None)
        if owner is None or issubclass(base, owner):
            continue
        return f"{printable(owner.__qualname__)}.{m}"
    return None


def _is_v2_wrapped(obj: Any) -> bool:
    """Whether ``obj`` is what ``torchvision.datasets.wrap_dataset_for_transforms_v2`` returns."""
    return any(c.__name__ == "VisionDatasetTVTensorWrapper" and c.__module__.startswith("torchvision.") for c in type(obj).__mro__)


class AnnotatedPlan:
    """A served dataset, as :func:`annotated_plan` found it.

    Attributes:
        obj: the user's object; ``base`` the torchvision dataset under its Subsets and wrapper;
        kind: ``"CocoDetection"``, ``"VOCSegmentation"`` or ``"VOCDetection"``;
        wrapper: the v2 wrapper (``wrap_dataset_for_transforms_v2``), or None;
        transforms: the joint transform applied after loading (and wrapping), or None;
        indices: the base's index of each of the user's items; name: how messages name it.
    """

    def __init__(self, obj: Any, base: Any, kind: str, wrapper: Any, indices: np.ndarray, name: str) -> None:
        self.obj, self.base, self.kind, self.wrapper, self.indices, self.name = obj, base, kind, wrapper, indices, name
        self.transforms = wrapper.transforms if wrapper is not None else base.transforms
        self.field = ANNOTATED_KINDS[kind][0]
        self.program: Any = None  # the transforms as :func:`check_transforms` read them

    def __len__(self) -> int:
        return len(self.indices)

    def files(self) -> list[tuple[str, Any]]:
        """Each base item's image path and what its annotation field is made from (COCO: the annotation
        list; VOC: the annotation file's path)."""
        b = self.base
        if self.kind == "CocoDetection":
            out = []
            for iid in b.ids:
                info = b.coco.loadImgs(iid)[0]
                out.append((os.path.join(b.root, info["file_name"]), b.coco.loadAnns(b.coco.getAnnIds(iid))))
            return out
        targets = b.masks if self.kind == "VOCSegmentation" else b.annotations
        return [(os.fspath(p), os.fspath(t)) for p, t in zip(b.images, targets)]

    def open(self, *, cache_dir: Any = None, progress: bool = True) -> "AnnotatedItems":
        """Pack the base dataset once into its cache entry; return what rebuilds its items."""
        from .reader import Dataset

        entry = _cached(self, self.files(), cache_dir=cache_dir, progress=progress)
        return AnnotatedItems(self, Dataset(entry))


def annotated_plan(obj: Any) -> AnnotatedPlan | None:
    """``obj`` as a served dataset (any chain of ``Subset`` over a CocoDetection, VOCSegmentation or
    VOCDetection, v2-wrapped or not), or None when it is none of these.

    Raises:
        ConfigError: one of them that cannot be served as it is (a subclass overriding how items are
            built, a wrapper torchvision no longer builds as it did), with a route that works.
    """
    import torch.utils.data as tud

    from .composite import positions

    chain: list[Any] = []
    leaf = obj
    while isinstance(leaf, tud.Subset) and len(chain) < 64:
        chain.append(leaf)
        leaf = leaf.dataset
    kind = _served_class(leaf)
    if kind is None:
        return None
    name = "Subset(" * len(chain) + f"{type(leaf).__name__}({printable(str(getattr(leaf, 'root', '...')))})" + ")" * len(chain)
    wrapper = leaf if _is_v2_wrapped(leaf) else None
    base = getattr(leaf, "_dataset", None) if wrapper is not None else leaf
    if wrapper is not None and (_served_class(base) is None or not callable(getattr(wrapper, "_wrapper", None))):
        raise ConfigError(f"{name}: a v2-wrapped dataset whose wrapper this torchvision builds differently; {_plain_route(kind)}")
    for sub in chain:
        owner = next((c for c in type(sub).__mro__ if "__getitem__" in vars(c)), None)
        if owner is not tud.Subset:
            raise ConfigError(f"{name}: {printable(owner.__qualname__)}.__getitem__ overrides Subset's; {_plain_route(kind)}")
    over = _overrider(base, kind)
    if over is not None:
        raise ConfigError(f"{name}: {over} overrides torchvision's {kind}, so FastLoader cannot know what its items are; {_plain_route(kind)}")
    index = np.arange(len(base), dtype=np.int64)
    for sub in reversed(chain):
        index = index[positions(sub.indices, len(index), what=f"{name}.indices")]
    return AnnotatedPlan(obj, base, kind, wrapper, index, name)


def _plain_route(kind: str) -> str:
    return (
        f"give FastLoader torchvision's own {kind} (or a Subset of it, or wrap_dataset_for_transforms_v2 of it) and do "
        f"what the subclass adds in collate_fn=fastload.TransformsCollate(your (image, target) function, collate_fn)"
    )


def check_transforms(plan: AnnotatedPlan) -> Any:
    """Read the dataset's transforms into a :class:`fastload.detaug.Program` (None: no transforms), kept as
    ``plan.program``: deterministic conversions run as they are, the detection and segmentation references'
    random steps translated (:mod:`fastload.detaug`, :mod:`fastload.segaug`); any other step refused, by name.

    Raises:
        ConfigError: the step, its place, and :data:`ROUTE`.
    """
    from .detaug import program

    t = plan.transforms
    plan.program = None
    if t is None:
        return None
    where, joint = f"{plan.name}.transforms", True
    if type(t).__name__ == "StandardTransform":  # transform= and target_transform= of the dataset
        if t.target_transform is not None:
            raise ConfigError(
                f"{plan.name}: target_transform {shown(t.target_transform)} is a function FastLoader does not read; {ROUTE} "
                "(a target_transform f becomes the transforms lambda image, target: (image, f(target)))"
            )
        t, where, joint = t.transform, f"{plan.name}.transform", False
    plan.program = program(t, joint=joint, where=where, kind=plan.kind, route=ROUTE)
    return plan.program


class AnnotatedItems:
    """The user's items rebuilt from the entry: ``items[p]`` is ``plan.obj[p]``."""

    def __init__(self, plan: AnnotatedPlan, packed: Any) -> None:
        self.plan, self.packed = plan, packed

    def __len__(self) -> int:
        return len(self.plan)

    def __getitem__(self, p: int) -> tuple[Any, Any]:
        return self.item(p)

    def item(self, p: int, *, seed: int = 0, epoch: int = 0, position: int | None = None) -> tuple[Any, Any]:
        """Item ``p``; the draws of its transforms' random steps keyed by ``(seed, epoch, position)``
        (``position``: its place in the epoch; default ``p``)."""
        from PIL import Image

        plan = self.plan
        i = int(plan.indices[p])
        values = self.packed.fields(i, ("image", plan.field))
        image = Image.open(io.BytesIO(values["image"])).convert("RGB")
        raw = values[plan.field]
        if plan.kind == "CocoDetection":
            target: Any = json.loads(raw)
        elif plan.kind == "VOCSegmentation":
            target = Image.open(io.BytesIO(bytes(raw)))
        else:
            import xml.etree.ElementTree as ET

            target = plan.base.parse_voc_xml(ET.fromstring(bytes(raw)))
        if plan.wrapper is not None:
            image, target = plan.wrapper._wrapper(i, (image, target))
        program = getattr(plan, "program", None)
        if program is not None:
            return program(image, target, seed=seed, epoch=epoch, position=p if position is None else position)
        if plan.transforms is not None:
            image, target = plan.transforms(image, target)
        return image, target


class TransformsCollate:
    """A ``collate_fn`` that runs a dataset's joint ``transforms(image, target)`` on each item, then
    ``collate_fn`` (default: a tuple of images and a tuple of targets, the detection references'
    ``collate_fn``): the route for steps FastLoader does not run itself."""

    def __init__(self, transforms: Callable[[Any, Any], tuple[Any, Any]], collate_fn: Callable[[list], Any] | None = None) -> None:
        if not callable(transforms):
            raise ConfigError(f"TransformsCollate: transforms must be callable as transforms(image, target), got {shown(transforms)}")
        self.transforms, self.collate_fn = transforms, collate_fn

    def __call__(self, batch: list[tuple[Any, Any]]) -> Any:
        items = [self.transforms(image, target) for image, target in batch]
        return tuple(zip(*items)) if self.collate_fn is None else self.collate_fn(items)

    def __repr__(self) -> str:
        return f"TransformsCollate({shown(self.transforms)}, {shown(self.collate_fn)})"


# ============================================================================ the cache entry


class _Items:
    """The base dataset's items as ``pack_like_pil_loader`` packs them: dicts of the image file's bytes
    and the annotation field."""

    def __init__(self, kind: str, files: list[tuple[str, Any]]) -> None:
        self.kind, self.files = kind, files

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int) -> dict[str, Any]:
        path, ann = self.files[i]
        field = ANNOTATED_KINDS[self.kind][0]
        with open(path, "rb") as f:
            image = f.read()
        if self.kind == "CocoDetection":
            text = json.dumps(ann, ensure_ascii=False, allow_nan=True)
            if json.loads(text) != ann:
                raise ConfigError(f"{printable(path)}: its annotations do not come back equal from JSON; FastLoader stores them as JSON")
            return {"image": image, field: text}
        with open(ann, "rb") as f:
            return {"image": image, field: f.read()}


def _key(plan: AnnotatedPlan, files: list[tuple[str, Any]]) -> str:
    """A SHA-256 of every image's and annotation file's path and status, and COCO's annotation lists."""
    h = hashlib.sha256(json.dumps({"v": ANNOTATED_CACHE_VERSION, "kind": plan.kind, "n": len(files)}).encode())

    def sig(p: str) -> str:
        try:
            st = os.stat(p)
            return f"{os.path.abspath(p)}\0{st.st_size}\0{st.st_mtime_ns}\0{st.st_ctime_ns}\0{st.st_ino}"
        except (OSError, ValueError) as e:
            return f"{p}\0!{getattr(e, 'errno', None) or type(e).__name__}"

    for path, ann in files:
        h.update(sig(path).encode("utf-8", "surrogateescape"))
        h.update((json.dumps(ann, sort_keys=True) if plan.kind == "CocoDetection" else sig(ann)).encode("utf-8", "surrogateescape"))
    return h.hexdigest()


def _cached(plan: AnnotatedPlan, files: list[tuple[str, Any]], *, cache_dir: Any, progress: bool) -> Path:
    """The entry holding ``files``: packed under the cache's lock by the first process, found by the others."""
    from .cache import CACHE_ENV, EntryLock, default_cache_dir
    from .errors import BadImageError, PackError
    from .format import MANIFEST_NAME
    from .packing.outdir import remove_dataset_dir
    from .packing.run import pack_like_pil_loader

    if not files:
        raise ConfigError(f"{plan.name}: the dataset has no items; nothing to pack")
    base = default_cache_dir(cache_dir)
    try:
        base.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ConfigError(f"cache directory {printable(str(base))}: cannot create it ({e.strerror}); pass cache_dir= or set ${CACHE_ENV}") from None
    slug = re.sub(r"[^A-Za-z0-9._-]+", "_", os.path.basename(os.path.normpath(str(plan.base.root))))[:40].strip("._-") or "dataset"
    entry = base.resolve() / f"{slug}-{plan.kind.lower()}-{_key(plan, files)[:32]}"
    if (entry / MANIFEST_NAME).is_file():
        return entry
    with EntryLock(entry.with_name(entry.name + ".lock"), plan.name, entry) as lock:
        if (entry / MANIFEST_NAME).is_file():
            return entry
        staging = entry.with_name(entry.name + (".pack" if lock.locked else f".pack-{os.getpid()}"))
        with contextlib.suppress(OSError):
            remove_dataset_dir(staging)
        log.info("packing %s into cache entry %s (once)", plan.name, printable(str(entry)))
        try:
            pack_like_pil_loader(_Items(plan.kind, files), staging, fields={ANNOTATED_KINDS[plan.kind][0]: ANNOTATED_KINDS[plan.kind][1]},
                                 on_error="fail", progress=progress, overwrite=True)  # fmt: skip
        except BadImageError as e:
            raise PackError(f"{plan.name}: {e}; FastLoader keeps every item at its own index, so it packs all of them or none: fix that file") from None
        try:
            os.rename(staging, entry)
        except OSError:
            if not (entry / MANIFEST_NAME).is_file():
                raise
            remove_dataset_dir(staging)
    return entry
