"""The GPU form of every graph the loader builds, defined (not run) here without a GPU: each operator exists on
the backend it is placed on, per-sample arguments stay on the CPU, and nothing goes from the device to the host.

DALI checks an argument's placement when the graph is defined, and an operator's backend only when the
pipeline is built (which needs CUDA). So each loader below is made on the CPU, its settings are moved
to device 0 (:meth:`fastload.core.Core.graph_spec`), the graph is defined with ``build=False``, and
every operator is looked up in DALI's registry of the backend it was placed on.
"""

from __future__ import annotations

import dataclasses

import pytest
import torchvision
import torchvision.transforms as T

import fastload
from fastload.pipeline import GraphSpec, build_detection_pipeline, build_pipeline

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def _on_gpu(spec: GraphSpec) -> GraphSpec:
    """``spec`` as a loader on ``cuda:0`` would build it (no host finish there)."""
    views = tuple(dataclasses.replace(v, device_id=0, host_finish=False) for v in spec.views)
    return dataclasses.replace(spec, device_id=0, host_finish=False, views=views)


def _operators(pipe) -> list[tuple[str, str, list[str]]]:
    """``(schema, device, devices of its inputs)`` of every operator of ``pipe``'s graph, defined, not built."""
    pipe._build_graph()
    return [(getattr(op._op, "schema_name", type(op._op).__name__), op._op.device, [i.device for i in op.inputs]) for op in pipe._ops]


#: Host operators that read a device node's shape, never its data.
_METADATA = {"_Shape", "Shapes"}


def _check(ops: list[tuple[str, str, list[str]]]) -> None:
    from nvidia.dali.ops import _registry

    known = {"cpu": _registry.cpu_ops(), "gpu": _registry.gpu_ops(), "mixed": _registry.mixed_ops()}
    missing = sorted({f"{name} on {dev}" for name, dev, _ in ops if name not in known[dev]})
    assert not missing, f"operators with no implementation on the backend they are placed on: {missing}"
    back = sorted({name for name, dev, ins in ops if dev in ("cpu", "mixed") and "gpu" in ins and name not in _METADATA})
    assert not back, f"operators reading device data on the host: {back}"
    compiled = sorted({name for name, _, _ in ops if "Numba" in name})
    assert not compiled, f"the CPU graph's compiled kernels in a GPU graph: {compiled}"


def _graph(folder, transform, **kw) -> list[tuple[str, str, list[str]]]:
    ds = torchvision.datasets.ImageFolder(str(folder), transform=transform)
    with fastload.FastLoader(ds, 4, device="cpu", progress=False, **kw) as loader:
        spec = _on_gpu(loader._core.graph_spec())
        ops = _operators(build_pipeline(spec, lambda: (), build=False))
    _check(ops)
    return ops


def _deit(**kw):
    from timm.data import create_transform

    return create_transform(224, is_training=True, auto_augment="rand-m9-mstd0.5-inc1", interpolation="bicubic", **kw)


def _chain(size: int = 224) -> T.Compose:
    """SimCLR's / MoCo v2's view: the colour steps in the written order, after the crop."""
    return T.Compose([
        T.RandomResizedCrop(size, scale=(0.2, 1.0)), T.RandomHorizontalFlip(),
        T.RandomApply([T.ColorJitter(0.4, 0.4, 0.4, 0.1)], p=0.8), T.RandomGrayscale(0.2),
        T.RandomApply([T.GaussianBlur(23, (0.1, 2.0))], p=0.5), T.RandomSolarize(128, p=0.2),
        T.ToTensor(), T.Normalize(MEAN, STD),
    ])  # fmt: skip


def _tv(*ops) -> T.Compose:
    return T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(), *ops, T.ToTensor(), T.Normalize(MEAN, STD)])


def _timm_autoaugment():
    from timm.data import create_transform

    return create_transform(224, is_training=True, auto_augment="original-mstd0.5", interpolation="bilinear")


#: Transform -> operators its GPU graph must run on the GPU (so the check above is not of an empty stage).
RECIPES = {
    "crop+flip": (lambda: _tv(), {"Resize", "CropMirrorNormalize"}),
    "eval": (lambda: T.Compose([T.Resize(256), T.CenterCrop(224), T.ToTensor(), T.Normalize(MEAN, STD)]), {"Resize", "Slice"}),
    "deit pixel erasing": (lambda: _deit(re_prob=0.25, re_mode="pixel"), {"WarpAffine", "_conditional__Split", "Erase"}),
    "deit const erasing": (lambda: _deit(re_prob=0.25, re_mode="const", re_count=2), {"WarpAffine", "Erase"}),
    "timm autoaugment": (_timm_autoaugment, {"WarpAffine", "Equalize"}),
    "ta_wide": (lambda: T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.TrivialAugmentWide(), T.ToTensor(),
                                   T.Normalize(MEAN, STD), T.RandomErasing(0.1)]), {"WarpAffine", "Erase"}),
    "randaugment": (lambda: _tv(T.RandAugment(2, 9)), {"WarpAffine", "BrightnessContrast"}),
    "colour chain": (lambda: _chain(), {"CoordTransform", "GaussianBlur", "ColorSpaceConversion"}),
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_the_gpu_graph_of_each_recipe_is_defined_on_backends_that_have_its_operators(name, make_folder):
    transform, expected = RECIPES[name]
    ops = _graph(make_folder(classes=2, per_class=2, size=(80, 60)), transform())
    on_gpu = {n for n, dev, _ in ops if dev == "gpu"}
    assert expected <= on_gpu, f"{name}: {sorted(expected - on_gpu)} not on the GPU; it has {sorted(on_gpu)}"
    assert any(dev == "mixed" and n.startswith("decoders__") for n, dev, _ in ops), "the decoder is not the mixed one"


#: What the CPU graph keeps in DALI's operators (every other operation runs in the compiled step): torchvision's blur.
UNCOMPILED = {("torchvision", "GaussianBlur")}


def _compiled_runs(stage) -> int:
    """Runs of consecutive rounds (tables of two or more operations) whose every operation is compiled."""
    runs, inside = 0, False
    for table in stage.tables:
        ops = [stage.ops[k] for k in table]
        compiled = len(ops) > 1 and not any((op.library, op.name) in UNCOMPILED for op in ops)
        runs += compiled and not inside
        inside = compiled
    return runs


@pytest.mark.parametrize("name", ["deit pixel erasing", "colour chain", "timm autoaugment"])
def test_the_cpu_graph_runs_pils_compiled_kernels_where_the_gpu_graph_runs_dalis(name, make_folder):
    """The same recipe's CPU stage graph (host finish) runs its rounds in compiled steps (numba_function), consecutive
    rounds of compiled operations in one, and its normalisation and erasing in one more; only a round holding a
    torchvision blur is DALI's conditional select. Its GPU graph has none of them (above)."""
    from fastload.pipeline import build_augment_pipeline

    ds = torchvision.datasets.ImageFolder(str(make_folder(classes=2, per_class=2, size=(80, 60))), transform=RECIPES[name][0]())
    with fastload.FastLoader(ds, 4, device="cpu", progress=False) as loader:
        stage = loader._core.stage
        spec = loader._core.graph_spec()
        ops = _operators(build_augment_pipeline(spec, lambda: (), build=False))
    names = [n for n, _, _ in ops]
    assert sum("Numba" in n for n in names) == _compiled_runs(stage) + 1
    assert not any(n in ("CropMirrorNormalize", "Erase") for n in names)
    assert any("Split" in n for n in names) == any(
        len(t) > 1 and any((stage.ops[k].library, stage.ops[k].name) in UNCOMPILED for k in t) for t in stage.tables)
    assert all(dev == "cpu" for _, dev, _ in ops)


def test_the_gpu_graph_of_a_multi_view_transform_is_defined(make_folder):
    """DINO's two global crops and a local one: each view its own operators on the GPU, one decoder."""
    views = [_chain(224), _chain(224), _chain(96)]
    ops = _graph(make_folder(classes=2, per_class=2, size=(80, 60)), views)
    names = [n for n, dev, _ in ops if dev == "gpu"]
    assert names.count("Resize") == 3 and "CoordTransform" in names
    assert sum(dev == "mixed" for _, dev, _ in ops) == 1


def test_the_gpu_graph_of_a_padded_random_crop_is_defined(make_folder):
    """CIFAR's ``RandomCrop(32, padding=4, padding_mode="reflect")`` on images of one size."""
    tf = T.Compose([T.RandomCrop(32, padding=4, padding_mode="reflect"), T.RandomHorizontalFlip(), T.ToTensor()])
    ops = _graph(make_folder(classes=2, per_class=2, size=(32, 32)), tf)
    assert any(dev == "gpu" for _, dev, _ in ops)


def test_the_gpu_detection_graph_is_defined():
    spec = GraphSpec(batch_size=4, num_threads=2, device_id=0, train=True, crop=0, resize=0, mean=None, std=None,
                     out_dtype="uint8", channels_last=True, prefetch=1, hw_decoder_load=None)  # fmt: skip
    ops = _operators(build_detection_pipeline(spec, build=False))
    _check(ops)
    assert {"Resize", "Flip"} <= {n for n, dev, _ in ops if dev == "gpu"}


def test_the_check_sees_an_operator_placed_where_it_has_no_implementation():
    """The registry lookup is real: DALI's random_bbox_crop has no GPU backend, so a graph placing it there is
    caught, while the same graph on the CPU passes."""
    from nvidia.dali import fn, pipeline_def, types

    def make(device_id):
        @pipeline_def(batch_size=2, num_threads=1, device_id=device_id)
        def pipe():
            boxes = fn.external_source(name="boxes", dtype=types.FLOAT, ndim=2)
            return fn.random_bbox_crop(boxes.gpu() if device_id is not None else boxes, bbox_layout="xyXY")[0]

        return pipe()

    _check(_operators(make(None)))
    with pytest.raises(AssertionError, match="RandomBBoxCrop on gpu"):
        _check(_operators(make(0)))
