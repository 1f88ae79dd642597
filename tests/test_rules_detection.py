"""Rules of detection crops and resume: RandomIoUCrop's strict centre test, and a state resuming every rank at its own share."""

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
def test_a_state_saved_on_one_rank_resumes_every_rank_at_its_own_share(packed, saved, loaded):
    """Rule: the state is FastLoader's, a description of the epoch (every rank moves in step under DDP), not of
    one rank: a state rank r saved after k batches, loaded on rank r', serves r''s own share from batch k on,
    exactly what an uninterrupted r' serves there (DistributedSampler's share: every world_size-th sample from
    its rank). Bugs: the saving rank's share served, or the resumed rank starting from its first batch."""
    kw = dict(fields=("image", "boxes", "image_id"), min_size=48, max_size=80, seed=3)
    a = DetectionLoader(packed, 1, rank=saved[0], world_size=saved[1], **kw)
    next(iter(a))
    state = a.state_dict()
    assert state["batches_done"] == 1
    ids = lambda ld: [int(t["image_id"]) for _, ts in ld for t in ts]  # noqa: E731
    whole = ids(DetectionLoader(packed, 1, rank=loaded[0], world_size=loaded[1], **kw))
    b = DetectionLoader(packed, 1, rank=loaded[0], world_size=loaded[1], **kw)
    b.load_state_dict(state)
    assert ids(b) == whole[1:]
