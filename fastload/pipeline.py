"""The DALI graph, and nothing else: no files, no epochs, no torch.

``external_source`` (encoded bytes, crop boxes, flips) -> decode (only the crop
window on the training path: ROI decoding) -> resize -> crop-mirror-normalize.
On a GPU (``device_id`` set) decoding is ``mixed`` (nvJPEG, with the hardware JPEG
decoder where the GPU has one) and the rest runs on the GPU.

On the CPU, training graphs stop after the ROI decode (``host_finish``): measured on
2 cores, DALI's CPU resize costs about 0.6 ms per 224x224 crop against 0.11 ms for
pillow-simd's SIMD resize, so the loader finishes those batches itself (see
``fastload.loader._host_finish``).
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Sequence

from .errors import DependencyError

DALI_HINT = "pip install nvidia-dali-cuda120 (see https://docs.nvidia.com/deeplearning/dali/)"

# nvJPEG scratch sizes from NVIDIA's ImageNet examples: avoid reallocations in the first epochs.
_DEVICE_PADDING = 211025920
_HOST_PADDING = 140544512


def import_dali():
    """Import DALI lazily, with an install hint when it is missing."""
    try:
        import nvidia.dali as dali
        import nvidia.dali.fn as fn
        import nvidia.dali.types as types
    except ImportError as e:
        raise DependencyError(f"NVIDIA DALI is not importable ({e}); {DALI_HINT}") from None
    return dali, fn, types


def dali_available() -> bool:
    """True when DALI imports."""
    try:
        import_dali()
    except DependencyError:
        return False
    return True


@dataclasses.dataclass(frozen=True)
class GraphSpec:
    """Everything the graph needs to know."""

    batch_size: int
    num_threads: int
    device_id: int | None
    train: bool
    crop: int
    resize: int
    mean: Sequence[float] | None  # 0..255 units
    std: Sequence[float] | None
    out_dtype: str  # "float32" | "float16" | "uint8"
    channels_last: bool
    prefetch: int
    hw_decoder_load: float | None
    host_finish: bool = False  # training on CPU: return the decoded crops; the loader resizes them


def build_pipeline(spec: GraphSpec, source: Callable[[], tuple]):
    """Build the DALI pipeline. ``source()`` returns one batch as a tuple of lists,
    ``(encoded uint8 arrays, anchors float32 [x, y], shapes float32 [w, h], flips int32)``
    when training (without the flips when ``host_finish``) and ``(encoded uint8 arrays,
    resized sizes float32 [h, w], crop corners float32 [x, y])`` for evaluation (see
    :func:`fastload.augment.eval_params`), or raises ``StopIteration``
    at the end of an epoch. Returns the built pipeline,
    whose single output is the image batch.
    """
    dali, fn, types = import_dali()
    gpu = spec.device_id is not None
    dec_device = "mixed" if gpu else "cpu"
    op_device = "gpu" if gpu else "cpu"
    dec_kw: dict = {"output_type": types.RGB}
    if gpu:
        dec_kw.update(device_memory_padding=_DEVICE_PADDING, host_memory_padding=_HOST_PADDING)
        if spec.hw_decoder_load is not None:
            dec_kw["hw_decoder_load"] = spec.hw_decoder_load
    out_dtype = {"float32": types.FLOAT, "float16": types.FLOAT16, "uint8": types.UINT8}[spec.out_dtype]
    layout = "HWC" if spec.channels_last else "CHW"

    @dali.pipeline_def(
        batch_size=spec.batch_size,
        num_threads=spec.num_threads,
        device_id=spec.device_id,
        prefetch_queue_depth=spec.prefetch,
        seed=0,
    )
    def graph():
        if spec.train and spec.host_finish:
            enc, anchor, shape = fn.external_source(
                source=source, num_outputs=3, batch=True, dtype=[types.UINT8, types.FLOAT, types.FLOAT], ndim=[1, 1, 1]
            )
            return fn.decoders.image_slice(
                enc, anchor, shape, device=dec_device, normalized_anchor=False, normalized_shape=False, **dec_kw
            )
        if spec.train:
            enc, anchor, shape, flip = fn.external_source(
                source=source,
                num_outputs=4,
                batch=True,
                dtype=[types.UINT8, types.FLOAT, types.FLOAT, types.INT32],
                ndim=[1, 1, 1, 0],
            )
            img = fn.decoders.image_slice(
                enc, anchor, shape, device=dec_device, normalized_anchor=False, normalized_shape=False, **dec_kw
            )
            img = fn.resize(img, device=op_device, size=[spec.crop, spec.crop], antialias=True)
            crop_kw: dict = {"mirror": flip}
        else:  # torchvision's Resize + CenterCrop, exactly: sizes and corners come from the host
            enc, size, corner = fn.external_source(
                source=source, num_outputs=3, batch=True, dtype=[types.UINT8, types.FLOAT, types.FLOAT], ndim=[1, 1, 1]
            )
            img = fn.decoders.image(enc, device=dec_device, **dec_kw)
            img = fn.resize(img, device=op_device, size=size, antialias=True)  # size is (height, width)
            img = fn.slice(img, corner, [float(spec.crop), float(spec.crop)], normalized_anchor=False, normalized_shape=False)
            crop_kw = {}
        if spec.mean is None:
            mean, std = [0.0, 0.0, 0.0], [1.0, 1.0, 1.0]
        else:
            mean, std = list(spec.mean), list(spec.std)
        img = fn.crop_mirror_normalize(
            img,
            device=op_device,
            mean=mean,
            std=std,
            dtype=out_dtype,
            output_layout=layout,
            **crop_kw,
        )
        return img

    pipe = graph()
    pipe.build()
    return pipe
