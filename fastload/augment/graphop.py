"""The contract between a step the host draws and the DALI operator that carries it out, sample by sample.

A :class:`GraphOp` is one operation of one library (``"timm"`` or ``"torchvision"``) at one
interpolation. The host turns the step's arguments (what :func:`fastload.augment.policies.plan` and
:func:`fastload.augment.trivial_params` draw) into at most :data:`ARGS` floats per sample
(:attr:`GraphOp.host`); the graph receives them as one float32 ``[ARGS]`` tensor per sample
through ``external_source`` and applies the operation to the uint8 HWC image
(:attr:`GraphOp.graph`), on whatever backend the image is (``cpu`` or ``gpu``). Which
operation a sample gets is chosen in the graph by its index (in a CPU graph by the compiled step,
elsewhere by ``auto_aug``'s ``select``), so a batch is one set of batched operators whatever each
sample drew.

How a round of them runs in the graph is :mod:`fastload.augment.rounds`.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Sequence

import numpy as np

#: Floats each sample receives per step (ColorJitter's four slots: a kind, a 3x3 colour matrix and a hue shift each).
ARGS = 44


@dataclasses.dataclass(frozen=True)
class GraphOp:
    """One operation as the graph applies it.

    Attributes:
        library: ``"timm"`` or ``"torchvision"``: whose semantics it has.
        name: the operation's name in that library (timm's ``NAME_TO_OP`` key, torchvision's ``_apply_op`` name,
            ``"ColorJitter"``, ``"Grayscale"``, ``"GaussianBlur"``, ``"Identity"``).
        interpolation: ``"nearest"``, ``"bilinear"`` or ``"bicubic"`` (what the library was asked for).
        host: the step's arguments -> at most :data:`ARGS` floats (the rest are fed as 0).
        graph: ``(image, params) -> image``: a uint8 HWC DataNode and the float32 ``[ARGS]`` DataNode (or None, for
            an operation that reads none) in, a uint8 HWC DataNode of the same shape out, on the image's backend.
        code: ``(image) -> int | None``: the compiled step's code (``kernels.layout``) a graph of ``image`` runs it
            by, or None where that graph takes DALI's operators (a GPU graph, or a CPU one built in the GPU's form).
            Where it is an int, the compiled step with that code gives what ``graph`` gives, so a round may run it so.
    """

    library: str
    name: str
    interpolation: str
    host: Callable[[tuple], Sequence[float]]
    graph: Callable[[Any, Any], Any]
    code: Callable[[Any], int | None] = lambda img: None

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.library, self.name, self.interpolation)

    @property
    def takes_params(self) -> bool:
        """Whether its graph reads the params fed (False for :func:`no_params` operations)."""
        return self.host is not no_params

    def params(self, args: tuple) -> np.ndarray:
        """The float32 ``[ARGS]`` vector fed for one sample's step."""
        vals = [float(v) for v in self.host(tuple(args))]
        if len(vals) > ARGS:
            raise ValueError(f"{self.name} gives {len(vals)} parameters, more than {ARGS}")
        out = np.zeros(ARGS, dtype=np.float32)
        out[: len(vals)] = vals
        return out


def no_params(args: tuple) -> tuple:
    """The host side of an operation fed nothing: its graph ignores the params node."""
    return ()


def identity(library: str, interpolation: str = "bilinear") -> GraphOp:
    """The operation that leaves the image as it is (RandAugment's Identity, a skipped step); code 0 in a round of
    the compiled step, where it is a copy."""
    return GraphOp(library, "Identity", interpolation, host=no_params, graph=lambda img, p: img,
                   code=lambda img: 0 if getattr(img, "device", "cpu") == "cpu" else None)  # fmt: skip
