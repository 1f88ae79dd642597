"""The DALI graph and the batches that cross into and out of it, nothing else: no files, no epochs, no torch.

``external_source`` (encoded bytes, crop boxes, flips) -> decode (only the crop
window on the training path: ROI decoding) -> resize -> crop-mirror-normalize.
Payloads go in as one ``TensorListCPU`` (:func:`encoded_batch`); a CPU output comes back
as NumPy views of DALI's buffer (:func:`cpu_samples`). Detection batches have their own small
graph (:func:`build_detection_pipeline`: window decode -> resize to a per-sample size -> flip).
On a GPU (``device_id`` set) decoding is ``mixed`` (nvJPEG, with the hardware JPEG
decoder where the GPU has one) and the rest runs on the GPU.

On the CPU, training graphs stop after the ROI decode (``host_finish``): measured on
2 cores, DALI's CPU resize costs 1.2 (bilinear) to 1.9 ms (bicubic) per 224x224 crop against
0.2 to 0.3 ms for torch's port of pillow-simd's resize, so the loader finishes those batches
itself (see ``fastload.host.finish_crops``), one GIL-free call per batch. Augmented batches then go
through the stage's own CPU graph (:func:`build_augment_pipeline`: the stage's operations, the
normalisation, the erasing: on a GPU the same operators follow the resize in one graph).
A multi-view transform's graph (:func:`build_views_pipeline`) decodes each image once, whole, and
cuts, resizes, flips, augments and normalises each view from it, one output per view; on the CPU it
stops at each view's window, and the views are finished on the host and augmented by the stage graph,
as single crops are.

Every decoder runs with ``adjust_orientation=False``: ``fastload pack`` stores payloads
upright (EXIF orientation applied, the record header giving the upright size), so a payload
that still carries an orientation tag must not be turned again, or the crop boxes computed
from the header's size would fall outside the image. The ``mixed`` decoder also runs with
``jpeg_fancy_upsampling=True`` so that its chroma upsampling is libjpeg-turbo's, the CPU
decoder's (DALI's documented way to make the two agree).

GPU memory is bounded: the GPU pipeline uses at most :data:`GPU_THREADS` CPU threads (nvJPEG
keeps one device scratch buffer and two pinned host buffers *per thread*), and those buffers
and the hardware decoder's preallocation are sized from the dataset's recorded image sizes
(:func:`decoder_sizing`), not from a fixed ImageNet example. :func:`memory_estimate` says what
a loader should then hold; ``docs/gpu.md`` explains the figures.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import math
from typing import Any, Callable, Mapping, Sequence

from .errors import DependencyError

DALI_HINT = "pip install nvidia-dali-cuda120 (see https://docs.nvidia.com/deeplearning/dali/)"

#: DALI's own defaults for nvJPEG's per-thread scratch buffers (``device_memory_padding``,
#: ``host_memory_padding``): the floor of :func:`decoder_sizing`, and what a dataset without
#: recorded sizes gets.
DALI_DEVICE_PADDING = 16 << 20
DALI_HOST_PADDING = 8 << 20
#: The most CPU threads a GPU pipeline uses. With ``mixed`` decoding the CPU threads only parse
#: headers and Huffman-decode the share of JPEGs not sent to the hardware decoder; each thread
#: costs one device and two pinned scratch buffers, so all cores (DALI's usual advice for CPU
#: pipelines) would multiply GPU and pinned memory by the core count for no speed.
GPU_THREADS = 4
#: Bytes of nvJPEG scratch per stored pixel: the DCT coefficients (int16) of three
#: full-resolution components, the most a 4:4:4 JPEG needs; 4:2:0 needs half.
SCRATCH_BYTES_PER_PIXEL = 6
_MIB = 1 << 20


def import_dali():
    """Import DALI lazily, with an install hint when it is missing."""
    try:
        import nvidia.dali as dali
        import nvidia.dali.fn as fn
        import nvidia.dali.types as types
    except ImportError as e:
        raise DependencyError(f"NVIDIA DALI is not importable ({e}); {DALI_HINT}") from None
    return dali, fn, types


def find_dali() -> None:
    """Whether DALI is installed, without importing it (an import takes a third of a second): the
    DependencyError of :func:`import_dali` for a missing DALI, before any work."""
    try:
        found = importlib.util.find_spec("nvidia.dali") is not None
    except (ImportError, ValueError):  # no ``nvidia`` package; a module without a spec
        found = False
    if not found:
        raise DependencyError(f"NVIDIA DALI is not importable (no module named 'nvidia.dali'); {DALI_HINT}")


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
    interpolation: str = "bilinear"  # fastload.augment.settings.INTERPOLATIONS: DALI's interp_type of every resize
    # the mixed decoder's buffers (see decoder_sizing); ignored on the CPU
    device_memory_padding: int = DALI_DEVICE_PADDING
    host_memory_padding: int = DALI_HOST_PADDING
    preallocate_width_hint: int = 0
    preallocate_height_hint: int = 0
    # training: the augmentation stage (fastload.augment.stage.GraphStage) between the crop and the normalisation, or None
    stage: Any = None
    # training: torchvision's RandomCrop (fastload.augment.padcrop.PadCrop) in place of the resized crop, or None;
    # pads: the (left, top, right, bottom) padding its non-constant modes build (fastload.augment.padcrop.static_pads)
    pad_crop: Any = None
    pads: tuple[int, int, int, int] = (0, 0, 0, 0)
    channels: int = 3  # 1: the first channel only (grayscale datasets)
    # a multi-view transform: one GraphSpec per view (its crop, interpolation, normalisation, stage), else ()
    views: tuple = ()


@dataclasses.dataclass(frozen=True)
class DecoderSizing:
    """The ``mixed`` decoder's buffer sizes for one dataset (the :class:`GraphSpec` fields of that name)."""

    device_memory_padding: int = DALI_DEVICE_PADDING
    host_memory_padding: int = DALI_HOST_PADDING
    preallocate_width_hint: int = 0
    preallocate_height_hint: int = 0

    def fields(self) -> dict[str, int]:
        """As keyword arguments of :class:`GraphSpec`."""
        return dataclasses.asdict(self)


def _side(stats: Mapping[str, Any], axis: str, key: str) -> int:
    """``stats[axis][key]`` as a positive int, or 0 when absent or not a positive integer."""
    d = stats.get(axis) if isinstance(stats, Mapping) else None
    v = d.get(key) if isinstance(d, Mapping) else None
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        return 0
    return v


def _round_up_mib(n: int) -> int:
    return -(-n // _MIB) * _MIB


def decoder_sizing(stats: Mapping[str, Any] | None, *, max_pixels: int | None = None) -> DecoderSizing:
    """Size the ``mixed`` decoder's buffers from a dataset's recorded image sizes.

    ``stats`` is the manifest's ``stats`` (:class:`fastload.store.HeaderStats` ``.to_json()``:
    ``width``/``height`` with ``min``/``median``/``max`` of the stored images). The largest
    image has at most ``max_width * max_height`` pixels (and at most ``max_pixels``, the pack's
    limit): one nvJPEG scratch buffer of :data:`SCRATCH_BYTES_PER_PIXEL` bytes per such pixel
    never has to grow, so both paddings are that, rounded up to a MiB and never below DALI's
    defaults. The hardware decoder's preallocation hints are the median width and height: a
    batch of typical images fits, and a larger one grows it once.

    A manifest without usable sizes (an empty dataset, a hand-written manifest) gets DALI's
    defaults and no hints. Pure: no DALI, no files.
    """
    st = stats if isinstance(stats, Mapping) else {}
    w_max, h_max = _side(st, "width", "max"), _side(st, "height", "max")
    if not (w_max and h_max):
        return DecoderSizing()
    pixels = w_max * h_max
    if max_pixels is not None and max_pixels > 0:
        pixels = min(pixels, int(max_pixels))
    scratch = _round_up_mib(SCRATCH_BYTES_PER_PIXEL * pixels)
    return DecoderSizing(
        device_memory_padding=max(DALI_DEVICE_PADDING, scratch),
        host_memory_padding=max(DALI_HOST_PADDING, scratch),
        preallocate_width_hint=_side(st, "width", "median"),
        preallocate_height_hint=_side(st, "height", "median"),
    )


def graph_threads(spec: GraphSpec) -> int:
    """The CPU threads the pipeline runs with: ``num_threads``, at most :data:`GPU_THREADS` on a GPU."""
    if spec.device_id is None:
        return spec.num_threads
    return max(1, min(spec.num_threads, GPU_THREADS))


def memory_estimate(spec: GraphSpec, *, typical_pixels: int | None = None, hw_decoder: bool = True) -> dict[str, int]:
    """What a GPU pipeline built from ``spec`` should hold, in bytes (zeros for a CPU pipeline).

    ``device``: one nvJPEG scratch buffer per thread, the hardware decoder's preallocation
    (``batch`` images of the hint size, 3 bytes a pixel) when ``hw_decoder``, and the pipeline's
    ``prefetch`` output sets (decoded images of ``typical_pixels``, default the hint size,
    resized crops, the output tensor). ``pinned``: two nvJPEG host buffers per thread.
    An estimate of DALI's pools, which round up and keep what they allocate; ``benchmarks/
    gpu_check.py`` measures the real figure beside it.
    """
    if spec.device_id is None:
        return {"device": 0, "pinned": 0, "threads": spec.num_threads}
    threads = graph_threads(spec)
    hint = spec.preallocate_width_hint * spec.preallocate_height_hint
    px = hint if typical_pixels is None else max(0, int(typical_pixels))
    out_bytes = {"float32": 4, "float16": 2, "uint8": 1}.get(spec.out_dtype, 4)
    crop_px = spec.crop * spec.crop
    per_set = spec.batch_size * (3 * px + 3 * crop_px + 3 * crop_px * out_bytes)
    device = threads * spec.device_memory_padding + spec.prefetch * per_set
    if hw_decoder:
        device += spec.batch_size * 3 * hint
    return {"device": int(device), "pinned": int(2 * threads * spec.host_memory_padding), "threads": threads}


def decoder_args(spec: GraphSpec) -> dict[str, Any]:
    """The keyword arguments every decoder of ``spec``'s graph gets (also for a peer graph
    built elsewhere, such as ``benchmarks/gpu_check.py``'s ``readers.file`` pipeline)."""
    _, _, types = import_dali()
    # payloads are stored upright: never rotate by EXIF (the crop boxes come from the header's size)
    kw: dict[str, Any] = {"output_type": types.RGB, "adjust_orientation": False}
    if spec.device_id is not None:
        kw.update(
            jpeg_fancy_upsampling=True,  # the CPU decoder's chroma upsampling
            device_memory_padding=spec.device_memory_padding,
            host_memory_padding=spec.host_memory_padding,
            preallocate_width_hint=spec.preallocate_width_hint,
            preallocate_height_hint=spec.preallocate_height_hint,
        )
        if spec.hw_decoder_load is not None:
            kw["hw_decoder_load"] = spec.hw_decoder_load
    return kw


def cpu_samples(batch) -> list:
    """The samples of a DALI ``TensorListCPU`` as NumPy views of its memory, without a copy.

    One view of the whole batch when DALI holds it in one piece (its CPU operators'
    outputs do), sliced per sample: a NumPy slice per sample instead of a DALI
    ``TensorCPU`` per sample. Sample by sample otherwise. The views are valid until the
    pipeline runs again.
    """
    import numpy as np

    shapes = batch.shape()
    sizes = [math.prod(s) for s in shapes]
    try:
        flat = np.asarray(batch.as_reshaped_tensor([sum(sizes)]))
    except RuntimeError:  # not contiguous: one tensor per sample
        return [np.asarray(batch[i]) for i in range(len(shapes))]
    out, pos = [], 0
    for shape, n in zip(shapes, sizes):
        out.append(flat[pos : pos + n].reshape(shape))
        pos += n
    return out


def packed_samples(batch) -> tuple[Any, Any] | None:
    """A DALI ``TensorListCPU`` held in one piece as ``(flat, shapes)``: a 1-D NumPy view of its memory and an int64
    ``(n, ndim)`` array of the sample shapes, the samples laid end to end; None when it is not in one piece (see
    :func:`cpu_samples`). No per-sample Python: what the loader's thread hands the host finish."""
    import numpy as np

    shapes = np.array(batch.shape(), dtype=np.int64)
    try:
        flat = np.asarray(batch.as_reshaped_tensor([int(shapes.prod(axis=1).sum())]))
    except RuntimeError:
        return None
    return flat, shapes


def encoded_batch(payloads: Sequence[Any]):
    """One DALI ``TensorListCPU`` of 1-D uint8 payload arrays, made without copying them.

    ``external_source`` takes it whole, where a list costs it a per-sample check and
    conversion in Python (about 1 us more per sample, measured here); DALI copies the
    bytes into its own buffer when the batch is fed, as it does for a list. The arrays
    must stay alive and unchanged until then (the callback's next call).
    """
    import_dali()  # DependencyError with the install hint when DALI is missing
    from nvidia.dali.tensors import TensorCPU, TensorListCPU

    return TensorListCPU([TensorCPU(p) for p in payloads], None, False)


def _normalise_kw(spec: GraphSpec) -> dict:
    """``crop_mirror_normalize``'s mean, std, dtype and layout for ``spec``."""
    _, _, types = import_dali()
    mean, std = ([0.0, 0.0, 0.0], [1.0, 1.0, 1.0]) if spec.mean is None else (list(spec.mean), list(spec.std))
    mean, std = mean[: spec.channels], std[: spec.channels]
    out_dtype = {"float32": types.FLOAT, "float16": types.FLOAT16, "uint8": types.UINT8}[spec.out_dtype]
    return {"mean": mean, "std": std, "dtype": out_dtype, "output_layout": "HWC" if spec.channels_last else "CHW"}


def _augmented(spec: GraphSpec, img: Any, inputs: Sequence[Any], device: str) -> Any:
    """The stage's operations on the uint8 HWC crops ``img``, normalised, then erased (its ``inputs`` as fed); on the
    CPU the last two in the stage's compiled finish."""
    _, fn, types = import_dali()
    stage = spec.stage
    img = _channels(spec, stage.apply(img, inputs), device)
    kw = _normalise_kw(spec)
    if spec.channels == 3 and spec.out_dtype != "uint8" and stage.finishes_compiled(img):  # one compiled operator
        out = stage.finish(img, inputs, mean=kw["mean"], std=kw["std"], layout=kw["output_layout"])
        return out if spec.out_dtype == "float32" else fn.cast(out, dtype=kw["dtype"])
    value = stage.erasing.value if stage.erasing is not None else ()
    # DALI's arithmetic takes no float16 operand (noise is pasted by an addition): then erased in float32 and cast,
    # which is crop_mirror_normalize's own rounding of its float result
    noisy16 = spec.out_dtype == "float16" and stage.erasing is not None and stage.erasing.noise is not None
    work = types.FLOAT if noisy16 else kw["dtype"]
    img = fn.crop_mirror_normalize(img, device=device, **{**kw, "dtype": work})
    img = stage.erase(img, inputs, layout=kw["output_layout"], value=value, dtype=work)
    return fn.cast(img, dtype=kw["dtype"]) if noisy16 else img


def _channels(spec: GraphSpec, img: Any, device: str) -> Any:
    """The HWC ``img`` with ``spec.channels`` channels (1: the first, which a grayscale image stored as RGB repeats)."""
    if spec.channels == 3:
        return img
    _, fn, _ = import_dali()
    return fn.slice(img, start=[0], shape=[spec.channels], axes=[2], device=device)


def _stage_inputs(spec: GraphSpec) -> tuple[list, list, list]:
    """dtypes, ndims and layouts of the stage's inputs (:meth:`~fastload.augment.stage.GraphStage.feed`)."""
    _, _, types = import_dali()
    kinds = spec.stage.input_kinds("HWC" if spec.channels_last else "CHW")
    dt = {"int32": types.INT32, "float32": types.FLOAT}
    return [dt[k[0]] for k in kinds], [k[1] for k in kinds], [k[2] for k in kinds]


def _resize_kw(spec: GraphSpec) -> dict:
    """``fn.resize``'s filter for ``spec``: torchvision's PIL path, antialiased except nearest (PIL's NEAREST picks)."""
    _, _, types = import_dali()
    interp = {"nearest": types.INTERP_NN, "bilinear": types.INTERP_LINEAR, "bicubic": types.INTERP_CUBIC,
              "lanczos": types.INTERP_LANCZOS3}[spec.interpolation]  # fmt: skip
    return {"interp_type": interp, "antialias": spec.interpolation != "nearest"}


def _view(view: GraphSpec, img: Any, anchor: Any, shape: Any, flip: Any, inputs: Sequence[Any], device: str) -> Any:
    """One view of the decoded images ``img``: its crop window ``anchor`` ``[x, y]`` / ``shape`` ``[w, h]`` cut out,
    resized to its crop, flipped where ``flip``, its stage's operations, normalised (and erased)."""
    _, fn, _ = import_dali()
    img = fn.slice(img, anchor, shape, axis_names="WH", normalized_anchor=False, normalized_shape=False)
    img = fn.resize(img, device=device, size=[view.crop, view.crop], **_resize_kw(view))
    if view.stage is not None:
        img = fn.flip(img, device=device, horizontal=flip, vertical=0)
        return _augmented(view, img, inputs, device)
    return fn.crop_mirror_normalize(img, device=device, mirror=flip, **_normalise_kw(view))


def build_views_pipeline(spec: GraphSpec, source: Callable[[], tuple], *, build: bool = True):
    """The graph of a multi-view transform (``spec.views``): each image decoded once, whole, then per view its own
    window cut out and finished as :func:`_view` does. ``source()`` returns ``(encoded uint8 arrays, *per view: anchors
    float32 [x, y], shapes float32 [w, h], flips int32, the view's stage inputs)``; the pipeline has one output per view.
    With ``spec.host_finish`` (training on the CPU) the graph stops at the windows: ``source()`` gives ``(encoded,
    *per view: anchors, shapes)`` and each output is a view's uint8 HWC windows, finished on the host and then
    augmented and normalised by :func:`build_augment_pipeline`.
    ``build=False``: the pipeline as defined, not built (see :func:`build_pipeline`).
    """
    dali, fn, types = import_dali()
    gpu = spec.device_id is not None
    op_device = "gpu" if gpu else "cpu"
    windows = spec.host_finish and not gpu
    kinds = [_stage_inputs(v) if v.stage is not None and not windows else ([], [], []) for v in spec.views]
    dtypes, ndims, layouts = [types.UINT8], [1], [""]
    per_view = [types.FLOAT, types.FLOAT] if windows else [types.FLOAT, types.FLOAT, types.INT32]
    for d, n, lay in kinds:
        dtypes += [*per_view, *d]
        ndims += [1, 1, 0][: len(per_view)] + list(n)
        layouts += ["", "", ""][: len(per_view)] + list(lay)

    @dali.pipeline_def(batch_size=spec.batch_size, num_threads=graph_threads(spec), device_id=spec.device_id,
                       prefetch_queue_depth=spec.prefetch, seed=0, exec_dynamic=True,
                       enable_conditionals=not windows and any(v.stage is not None for v in spec.views))  # fmt: skip
    def graph():
        enc, *rest = fn.external_source(source=source, num_outputs=len(dtypes), batch=True, dtype=dtypes, ndim=ndims,
                                        layout=layouts)  # fmt: skip
        img = fn.decoders.image(enc, device="mixed" if gpu else "cpu", **decoder_args(spec))
        outs, i = [], 0
        for view, (d, _, _) in zip(spec.views, kinds):
            if windows:
                anchor, shape = rest[i : i + 2]
                i += 2
                outs.append(fn.slice(img, anchor, shape, axis_names="WH", normalized_anchor=False, normalized_shape=False))
                continue
            anchor, shape, flip, *inputs = rest[i : i + 3 + len(d)]
            i += 3 + len(d)
            outs.append(_view(view, img, anchor, shape, flip, inputs, op_device))
        return tuple(outs)

    return defined(graph, build=build)


def defined(graph: Callable[[], Any], *, build: bool = True) -> Any:
    """The pipeline ``graph()`` defines, built when ``build``; a FastloadError raised while DALI defines it comes out
    as itself (DALI's conditionals wrap what the graph's code raises in their own error: a missing dependency, a
    refused step)."""
    from .errors import FastloadError

    try:
        pipe = graph()
        if build:
            pipe.build()
    except FastloadError:
        raise
    except Exception as e:
        inner = e.__cause__ or e.__context__
        while inner is not None:
            if isinstance(inner, FastloadError):
                raise inner from e
            inner = inner.__cause__ or inner.__context__
        raise
    return pipe


def build_pipeline(spec: GraphSpec, source: Callable[[], tuple], *, build: bool = True):
    """Build the DALI pipeline. ``source()`` returns one batch as a tuple of lists,
    ``(encoded uint8 arrays, anchors float32 [x, y], shapes float32 [w, h], flips int32)``
    when training (without the flips when ``host_finish``; followed by the stage's inputs when
    ``spec.stage``) and ``(encoded uint8 arrays, resized sizes float32 [h, w], crop corners
    float32 [x, y])`` for evaluation (see :func:`fastload.augment.eval_params`); with ``spec.pad_crop``
    (torchvision's RandomCrop) the anchors and shapes are the windows of the padded image, decoded
    whole (:func:`fastload.augment.padcrop.pad_window`, not resized); or raises
    ``StopIteration`` at the end of an epoch. Returns the built pipeline, whose single output
    is the image batch (a multi-view ``spec.views``: :func:`build_views_pipeline`, one output per view).
    ``build=False`` returns it defined but not built: its Python graph (each operator's backend and
    argument placement) can then be inspected for a device this machine does not have.
    """
    if spec.views:
        return build_views_pipeline(spec, source, build=build)
    dali, fn, types = import_dali()
    gpu = spec.device_id is not None
    dec_device = "mixed" if gpu else "cpu"
    op_device = "gpu" if gpu else "cpu"
    dec_kw = decoder_args(spec)
    resize_kw = _resize_kw(spec)  # torchvision's PIL path: antialiased except nearest (PIL's NEAREST picks the source pixel)
    staged = spec.train and not spec.host_finish and spec.stage is not None  # (host_finish has no stage)
    extra = _stage_inputs(spec) if staged else ([], [], [])

    @dali.pipeline_def(
        batch_size=spec.batch_size,
        num_threads=graph_threads(spec),
        device_id=spec.device_id,
        prefetch_queue_depth=spec.prefetch,
        seed=0,
        exec_dynamic=True,  # reference-counted outputs: shared with torch without a copy (EpochRun._to_torch)
        enable_conditionals=staged,
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
            enc, anchor, shape, flip, *inputs = fn.external_source(
                source=source,
                num_outputs=4 + len(extra[0]),
                batch=True,
                dtype=[types.UINT8, types.FLOAT, types.FLOAT, types.INT32, *extra[0]],
                ndim=[1, 1, 1, 0, *extra[1]],
                layout=["", "", "", "", *extra[2]],
            )
            if spec.pad_crop is not None:  # torchvision's RandomCrop: a window of the padded image, not resized
                from .augment.padcrop import pad_window

                img = fn.decoders.image(enc, device=dec_device, **dec_kw)
                img = pad_window(img, anchor, shape, pc=spec.pad_crop, pads=spec.pads, device=op_device)
            else:
                img = fn.decoders.image_slice(
                    enc, anchor, shape, device=dec_device, normalized_anchor=False, normalized_shape=False, **dec_kw
                )
                img = fn.resize(img, device=op_device, size=[spec.crop, spec.crop], **resize_kw)
            if staged:  # flipped before the operations, as torchvision's RandomHorizontalFlip comes first
                img = fn.flip(img, device=op_device, horizontal=flip, vertical=0)
                return _augmented(spec, img, inputs, op_device)  # per-sample inputs stay on the CPU
            crop_kw = {"mirror": flip}
        else:  # torchvision's Resize + CenterCrop, exactly: sizes and corners come from the host
            enc, size, corner = fn.external_source(
                source=source, num_outputs=3, batch=True, dtype=[types.UINT8, types.FLOAT, types.FLOAT], ndim=[1, 1, 1]
            )
            img = fn.decoders.image(enc, device=dec_device, **dec_kw)
            img = fn.resize(img, device=op_device, size=size, **resize_kw)  # size is (height, width)
            img = fn.slice(img, corner, [float(spec.crop), float(spec.crop)], normalized_anchor=False, normalized_shape=False)
            crop_kw = {}
        img = _channels(spec, img, op_device)
        return fn.crop_mirror_normalize(img, device=op_device, **_normalise_kw(spec), **crop_kw)

    return defined(graph, build=build)


def build_augment_pipeline(spec: GraphSpec, source: Callable[[], tuple], *, build: bool = True):
    """The stage's graph alone, on the CPU, for training crops finished on the host (``spec.host_finish``):
    ``source()`` gives one batch, the uint8 NHWC crops (resized and flipped) then the stage's inputs (its
    feed, in order); DALI calls it in ``schedule_run()``, in the caller's thread, and runs the batch in its
    own threads until ``outputs()`` (one batch in flight: the caller finishes the next one meanwhile). Its
    operators, normalisation and erasing are the ones the GPU graph runs after its resize (:func:`_augmented`).
    A multi-view ``spec.views``: per view, its crops then its stage's inputs (none for a view without a stage,
    which is normalised only), one output per view."""
    dali, fn, types = import_dali()
    views = spec.views or (spec,)
    kinds = [_stage_inputs(v) if v.stage is not None else ([], [], []) for v in views]
    dtypes, ndims, layouts = [], [], []
    for d, n, lay in kinds:
        dtypes += [types.UINT8, *d]
        ndims += [3, *n]
        layouts += ["HWC", *lay]

    @dali.pipeline_def(batch_size=spec.batch_size, num_threads=graph_threads(spec), device_id=None, prefetch_queue_depth=1,
                       exec_async=True, exec_pipelined=True, exec_dynamic=True, seed=0,
                       enable_conditionals=any(v.stage is not None for v in views))  # fmt: skip
    def graph():
        rest = fn.external_source(source=source, num_outputs=len(dtypes), batch=True, dtype=dtypes, ndim=ndims,
                                  layout=layouts)  # fmt: skip
        outs, i = [], 0
        for view, (d, _, _) in zip(views, kinds):
            img, *inputs = rest[i : i + 1 + len(d)]
            i += 1 + len(d)
            if view.stage is not None:
                outs.append(_augmented(view, img, inputs, "cpu"))
            else:
                outs.append(fn.crop_mirror_normalize(img, device="cpu", **_normalise_kw(view)))
        return tuple(outs)

    return defined(graph, build=build)


#: The inputs of :func:`build_detection_pipeline`, fed by name with ``feed_input`` before each run.
DETECTION_INPUTS = ("encoded", "anchor", "shape", "size", "flip")


def build_detection_pipeline(spec: GraphSpec, *, build: bool = True):
    """Build the detection graph: per sample, the window ``anchor`` ``[x, y]`` / ``shape`` ``[w, h]``
    (the whole image when it is one) decoded alone (``decoders.image_slice``), resized to ``size``
    ``[h, w]`` (antialiased bilinear, as the PIL path), mirrored where ``flip``; uint8 HWC out.

    The host computes every number (``fastload.boxcrops``, ``fastload.detection.Plan``), so the
    boxes moved there are the pixels moved here. Fed with ``feed_input`` by the names of
    :data:`DETECTION_INPUTS`, any batch size up to ``spec.batch_size``; one run at a time.
    ``build=False``: the pipeline as defined, not built (see :func:`build_pipeline`).
    """
    dali, fn, types = import_dali()
    gpu = spec.device_id is not None
    op_device = "gpu" if gpu else "cpu"

    @dali.pipeline_def(batch_size=spec.batch_size, num_threads=graph_threads(spec), device_id=spec.device_id,
                       prefetch_queue_depth=1, exec_async=False, exec_pipelined=False, seed=0)  # fmt: skip
    def graph():
        enc = fn.external_source(name="encoded", dtype=types.UINT8, ndim=1)
        anchor = fn.external_source(name="anchor", dtype=types.FLOAT, ndim=1)
        shape = fn.external_source(name="shape", dtype=types.FLOAT, ndim=1)
        size = fn.external_source(name="size", dtype=types.FLOAT, ndim=1)
        flip = fn.external_source(name="flip", dtype=types.INT32, ndim=0)
        img = fn.decoders.image_slice(enc, anchor, shape, device="mixed" if gpu else "cpu", normalized_anchor=False,
                                      normalized_shape=False, **decoder_args(spec))  # fmt: skip
        img = fn.resize(img, device=op_device, size=size, interp_type=types.INTERP_LINEAR, antialias=True)
        return fn.flip(img, device=op_device, horizontal=flip, vertical=0)

    return defined(graph, build=build)
