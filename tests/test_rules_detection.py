"""Rules of detection crops and resume: RandomIoUCrop's strict centre test, and a rank's state its own."""

from __future__ import annotations

import numpy as np
import pytest

from fastload.boxcrops import crop_spec, iou_window
from fastload.detection import DetectionLoader
from fastload.errors import ConfigError
from coco_fixture import pack_painted


def grid_boxes(width: int, height: int) -> np.ndarray:
    """4-pixel boxes centred on every third integer point: many centres land on a window's edge."""
    return np.array([[x - 2, y - 2, x + 2, y + 2] for x in range(3, width - 2, 3) for y in range(3, height - 2, 3)], float)


@pytest.mark.parametrize("width,height,options", [(40, 30, (0.0,)), (33, 47, (0.0, 0.1)), (64, 64, (0.0,))])
def test_iou_crop_keeps_only_boxes_whose_centre_is_strictly_inside(width, height, options):
    """torchvision.transforms.v2.RandomIoUCrop keeps a box when
    ``(left < cx) & (cx < right) & (top < cy) & (cy < bottom)``: a centre on the window's edge is
    outside. Bug: ``<=`` (a centre on the edge kept, its box clipped to a sliver). Expected: that
    rule written out, for every window drawn; and the windows must meet centres on their edges
    often enough for the rule to be tried (counted)."""
    boxes = grid_boxes(width, height)
    cx, cy = (boxes[:, 0] + boxes[:, 2]) / 2, (boxes[:, 1] + boxes[:, 3]) / 2
    spec = crop_spec("iou", iou_options=options)
    on_edge = 0
    for index in range(150):
        w = iou_window(spec, boxes, height, width, seed=11, epoch=0, index=index)
        if w is None:
            continue
        left, top, right, bottom = w.left, w.top, w.left + w.width, w.top + w.height
        rule = (left < cx) & (cx < right) & (top < cy) & (cy < bottom)
        edge = ((cx == left) | (cx == right)) & (top <= cy) & (cy <= bottom) | ((cy == top) | (cy == bottom)) & (left <= cx) & (cx <= right)
        on_edge += int(edge.sum())
        assert w.within.tolist() == rule.tolist(), index
        assert rule.any()  # a window keeps at least one box (torchvision draws again otherwise)
    assert on_edge >= 20


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    root = tmp_path_factory.mktemp("rules_detection")
    pack_painted(root, root / "packed")
    return root / "packed"


@pytest.mark.parametrize("saved,loaded", [((0, 2), (1, 2)), ((1, 2), (0, 2)), ((2, 3), (0, 3)), ((1, 3), (2, 3))])
def test_a_state_saved_on_one_rank_is_refused_by_another(packed, saved, loaded):
    """Rule: each rank serves every world_size-th sample from its rank (DistributedSampler's
    share), so a rank's batches_done says nothing of another rank's share; a state of rank r loaded
    on rank r' would serve r''s samples from the wrong place. Bug: ``rank`` not among the fields
    compared. Expected: a ConfigError naming rank; the same rank loads it."""
    kw = dict(min_size=48, max_size=80, seed=3)
    a = DetectionLoader(packed, 1, rank=saved[0], world_size=saved[1], **kw)
    next(iter(a))
    state = a.state_dict()
    assert state["batches_done"] == 1
    b = DetectionLoader(packed, 1, rank=loaded[0], world_size=loaded[1], **kw)
    with pytest.raises(ConfigError, match=f"rank={saved[0]} was saved, this loader has rank={loaded[0]}"):
        b.load_state_dict(state)
    c = DetectionLoader(packed, 1, rank=saved[0], world_size=saved[1], **kw)
    c.load_state_dict(state)
    assert c.state_dict() == state
