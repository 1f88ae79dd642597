"""PIL's global settings while fastload decodes images, when packing and when verifying."""

from __future__ import annotations

import contextlib
import warnings
from typing import Iterator


@contextlib.contextmanager
def pil_settings() -> Iterator[None]:
    """PIL globals fastload needs while packing (restored afterwards).

    PIL's own decompression-bomb check is disabled (fastload checks ``--max-pixels``
    itself and names it), truncated images are never silently accepted, and PIL's
    warnings about odd metadata are muted.
    """
    from PIL import Image, ImageFile

    old = (Image.MAX_IMAGE_PIXELS, ImageFile.LOAD_TRUNCATED_IMAGES)
    Image.MAX_IMAGE_PIXELS = None
    ImageFile.LOAD_TRUNCATED_IMAGES = False
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        Image.MAX_IMAGE_PIXELS, ImageFile.LOAD_TRUNCATED_IMAGES = old

