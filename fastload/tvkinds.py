"""Recognise torchvision's and timm's transform objects: the kind of each, and the containers around them.

:class:`Kinds` looks the classes up once (torchvision is imported only then; timm's only
where timm is already loaded, since a timm transform object means it is) and answers which
known transform an object is, by its exact class. :func:`flatten` opens the containers
(``Compose``, ``nn.Sequential``) and the wrappers that only apply the ``.transforms`` they
keep (checked on a probe image, never assumed) into the list of steps that
:mod:`fastload.transforms` translates; :func:`views` counts the views a multi-view
transform returns. Nothing here decides what a step means for FastLoader.
"""

from __future__ import annotations

import sys
from typing import Any

from .errors import ConfigError

__all__ = ["Kinds", "flatten", "is_wrapper", "on_probe", "outputs_equal", "views"]


class Kinds:
    """The torchvision classes translate knows, looked up once per call (None if not installed)."""

    def __init__(self) -> None:
        import torch
        from torch import nn

        self.torch = torch
        self.containers: tuple = (nn.Sequential,)
        self.noop: tuple = (nn.Identity,)
        self.ok = False
        try:
            import torchvision.transforms as T
            from torchvision.transforms import InterpolationMode
        except ImportError:
            return
        try:
            from torchvision import tv_tensors
            from torchvision.transforms import v2
        except ImportError:  # pragma: no cover - torchvision < 0.15
            v2 = None
            tv_tensors = None
        self.ok = True
        self.mode = InterpolationMode
        self.tv_image = None if tv_tensors is None else tv_tensors.Image
        pairs = {
            "compose": "Compose", "rrc": "RandomResizedCrop", "resize": "Resize", "center": "CenterCrop",
            "flip": "RandomHorizontalFlip", "to_tensor": "ToTensor", "pil_to_tensor": "PILToTensor",
            "convert": "ConvertImageDtype", "normalize": "Normalize", "lambda": "Lambda",
            "random_apply": "RandomApply", "random_choice": "RandomChoice", "random_order": "RandomOrder",
            "random_crop": "RandomCrop", "to_pil": "ToPILImage", "jitter": "ColorJitter",
            "erasing": "RandomErasing", "grayscale": "RandomGrayscale",
            "trivial": "TrivialAugmentWide", "rand_augment": "RandAugment", "auto_augment": "AutoAugment",
            "augmix": "AugMix", "solarize": "RandomSolarize", "posterize": "RandomPosterize",
            "sharpness": "RandomAdjustSharpness", "autocontrast": "RandomAutocontrast", "equalize": "RandomEqualize",
            "invert": "RandomInvert", "blur": "GaussianBlur", "gray_fixed": "Grayscale",
        }  # fmt: skip
        self.cls: dict[str, tuple] = {}
        for key, name in pairs.items():
            found = [getattr(mod, name) for mod in (T, v2) if mod is not None and hasattr(mod, name)]
            self.cls[key] = tuple(dict.fromkeys(found))
        if v2 is not None:
            self.cls["to_image"] = (v2.ToImage,)
            self.cls["to_dtype"] = (v2.ToDtype,)
            self.noop = self.noop + tuple(getattr(v2, n) for n in ("Identity", "ToPureTensor", "RGB") if hasattr(v2, n))
        else:  # pragma: no cover
            self.cls["to_image"] = self.cls["to_dtype"] = ()
        self.containers = self.containers + self.cls["compose"]
        self.v1_convert = (T.ConvertImageDtype,)
        # timm's look-alikes, when timm is loaded (a timm transform object means it is): the same
        # operations on a PIL image (MaybeToTensor passes a tensor through unchanged).
        self.maybe: tuple = ()
        timm = sys.modules.get("timm.data.transforms")
        for key, name in (("rrc", "RandomResizedCropAndInterpolation"), ("to_tensor", "MaybeToTensor"),
                          ("pil_to_tensor", "MaybePILToTensor")):  # fmt: skip
            cls = getattr(timm, name, None) if timm is not None else None
            if isinstance(cls, type):
                self.cls[key] = self.cls[key] + (cls,)
                if name.startswith("Maybe"):
                    self.maybe = self.maybe + (cls,)
        # timm's auto-augment and erasing objects (timm.data.auto_augment, random_erasing) and ToNumpy
        # (a uint8 CHW array, which default_collate batches as PILToTensor's tensors)
        for modname, key, name in (("timm.data.auto_augment", "timm_rand", "RandAugment"),
                                   ("timm.data.auto_augment", "timm_auto", "AutoAugment"),
                                   ("timm.data.auto_augment", "timm_augmix", "AugMixAugment"),
                                   ("timm.data.random_erasing", "timm_erasing", "RandomErasing"),
                                   ("timm.data.transforms", "pil_to_tensor", "ToNumpy")):  # fmt: skip
            cls = getattr(sys.modules.get(modname), name, None)
            if isinstance(cls, type):
                self.cls[key] = self.cls.get(key, ()) + (cls,)

    def kind(self, t: Any) -> str | None:
        """Which known transform ``t`` is (its exact class), or None."""
        if not self.ok:
            return None
        cls = type(t)
        return next((k for k, v in self.cls.items() if cls in v), None)

    def subclass_of(self, t: Any) -> str | None:
        """The known transform ``t`` derives from without being it, or None."""
        if not self.ok:
            return None
        for v in self.cls.values():
            for c in v:
                if isinstance(t, c) and type(t) is not c:
                    return c.__name__
        return None


def outputs_equal(a: Any, b: Any) -> bool:
    """Whether two transform outputs (PIL images, tensors or arrays) are the same type, shape and values."""
    import numpy as np
    from PIL import Image

    if isinstance(a, Image.Image) and isinstance(b, Image.Image):
        return a.mode == b.mode and a.size == b.size and a.tobytes() == b.tobytes()
    if hasattr(a, "shape") and hasattr(b, "shape"):
        return type(a) is type(b) and tuple(a.shape) == tuple(b.shape) and bool(np.array_equal(np.asarray(a), np.asarray(b)))
    return False


def on_probe(f: Any, seed: int) -> Any:
    """``f`` called on a 64 x 48 RGB probe image from random state ``seed`` (every generator restored afterwards)."""
    import random

    import numpy as np
    import torch
    from PIL import Image

    probe = Image.fromarray(np.random.default_rng(7).integers(0, 256, (48, 64, 3), dtype=np.uint8))
    saved = (random.getstate(), np.random.get_state(), torch.get_rng_state())
    try:
        random.seed(seed), np.random.seed(seed), torch.manual_seed(seed)
        return f(probe)
    finally:
        random.setstate(saved[0]), np.random.set_state(saved[1]), torch.set_rng_state(saved[2])


def is_wrapper(t: Any, tv: Kinds) -> bool:
    """Whether ``t`` is an object that keeps its pipeline in ``.transforms`` and only applies it.

    Training scripts wrap their ``Compose`` in a class (torchvision's references'
    ``ClassificationPresetTrain``/``Eval``). Checked, not assumed: ``t`` and ``t.transforms``
    are called on the same probe image from the same random state (restored afterwards), and
    must give the same output, twice (two random states).
    """
    inner = getattr(t, "transforms", None)
    if tv.kind(t) is not None or type(t) in tv.noop or inner is None or not callable(t) or not callable(inner):
        return False
    try:
        return all(outputs_equal(on_probe(t, seed), on_probe(inner, seed)) for seed in (0, 1))
    except Exception:  # noqa: BLE001 - a wrapper that cannot run on an RGB image is not one we can read
        return False


def views(t: Any) -> int:
    """How many views a multi-view transform (SimCLR's, DINO's multi-crop) returns for a probe image; 0: not one."""
    from PIL import Image

    try:
        out = on_probe(t, 0) if callable(t) else None
    except Exception:  # noqa: BLE001 - one that cannot run on an RGB image is refused as unknown
        return 0
    is_image = lambda x: isinstance(x, Image.Image) or hasattr(x, "shape")  # noqa: E731
    return len(out) if isinstance(out, (tuple, list)) and len(out) >= 2 and all(is_image(x) for x in out) else 0


def flatten(transform: Any, tv: Kinds) -> list[Any]:
    """The steps of ``transform`` in order, its containers and checked wrappers opened (at most 50 deep)."""
    out: list[Any] = []

    def walk(t: Any, depth: int) -> None:
        if depth > 50:
            raise ConfigError("transform: containers nested more than 50 deep")
        if type(t) in tv.containers:
            inner = t.transforms if hasattr(t, "transforms") else list(t.children())
            for s in inner:
                walk(s, depth + 1)
        elif is_wrapper(t, tv):
            walk(t.transforms, depth + 1)
        else:
            out.append(t)

    walk(transform, 0)
    return out
