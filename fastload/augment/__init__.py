"""What is done to an image: the seeded draws, and the graph operators that carry them out.

``fastload.augment`` re-exports the public names of its modules, as ``fastload.store`` does:

* :mod:`fastload.augment.draws`: crop boxes, flips, erasing rectangles, colour and
  TrivialAugmentWide draws as pure functions of (seed, epoch, position), and of the view
  (:func:`~fastload.augment.draws.view_seed`) for a multi-view transform.
"""

from .draws import (
    BOX_SALT, COLOR_SALT, COUNT_SALT, ERASE_SALT, NOISE_SALT, TRIVIAL_OPS, TRIVIAL_SALT, color_params, erase_boxes,
    erase_params, eval_params, noise_seeds, random_resized_crop, train_params, trivial_magnitudes, trivial_params,
    uniforms, view_seed, VIEW_SALT,
)  # fmt: skip

__all__ = [
    "BOX_SALT", "COLOR_SALT", "COUNT_SALT", "ERASE_SALT", "NOISE_SALT", "TRIVIAL_OPS", "TRIVIAL_SALT", "color_params",
    "erase_boxes", "erase_params", "eval_params", "noise_seeds", "random_resized_crop", "train_params",
    "trivial_magnitudes", "trivial_params", "uniforms", "view_seed", "VIEW_SALT",
]  # fmt: skip
