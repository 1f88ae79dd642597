"""What a sample's detection fields must satisfy: finite XYXY boxes and one label per box; pure.

``fastload verify`` checks every sample of a dataset with a ``boxes`` field of kind
``float32[][4]`` with :func:`box_problem` (``docs/detection.md``).
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np


def has_boxes(schema: Any) -> bool:
    """Whether a schema has a ``boxes`` field of kind ``float32[][4]`` (detection boxes)."""
    return "boxes" in schema.names and schema["boxes"].kind == "ragged" and schema["boxes"].shape == (4,)


def box_rules(schema: Any, options: Any) -> tuple[bool, int | None]:
    """``(whether to check boxes, the number of categories K or None)`` of a dataset: boxes are
    checked when :func:`has_boxes`; labels against ``1 .. K`` when ``options.coco`` lists categories."""
    coco = options.get("coco") if isinstance(options, dict) else None
    cats = coco.get("categories") if isinstance(coco, dict) else None
    return has_boxes(schema), (len(cats) if isinstance(cats, list) else None)


def box_problem(values: Mapping[str, Any], num_labels: int | None = None) -> str | None:
    """The first thing wrong with one sample's boxes, or None.

    Args:
        values: the sample's field values (``boxes``, and ``labels``/``iscrowd`` when present).
        num_labels: the number of categories K (labels must be ``1 .. K``), or None not to check.

    Returns:
        A description naming the box (``box 2: x2 3.0 < x1 5.0``), or None.
    """
    boxes = np.asarray(values["boxes"], dtype=np.float64).reshape(-1, 4)
    bad = np.flatnonzero(~np.isfinite(boxes).all(axis=1))
    if bad.size:
        return f"box {int(bad[0])} is not finite ({boxes[bad[0]].tolist()})"
    for axis, (lo, hi) in (("x", (0, 2)), ("y", (1, 3))):
        bad = np.flatnonzero(boxes[:, hi] < boxes[:, lo])
        if bad.size:
            k = int(bad[0])
            return f"box {k}: {axis}2 {boxes[k, hi]} < {axis}1 {boxes[k, lo]} (boxes are x1, y1, x2, y2)"
    for name in ("labels", "iscrowd"):
        if name in values and len(values[name]) != len(boxes):
            return f"{len(values[name])} {name} for {len(boxes)} boxes (one per box)"
    if num_labels is not None and "labels" in values and len(values["labels"]):
        labels = np.asarray(values["labels"])
        bad = np.flatnonzero((labels < 1) | (labels > num_labels))
        if bad.size:
            return f"box {int(bad[0])}: label {int(labels[bad[0]])} is outside 1..{num_labels} (the categories)"
    return None


__all__ = ["box_problem", "box_rules", "has_boxes"]
