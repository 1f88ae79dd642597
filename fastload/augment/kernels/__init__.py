"""PIL's own arithmetic, per sample, compiled by numba: the kernels of the CPU graph's augmentation operations (all
but torchvision's Gaussian blur) and of its normalisation and erasing (:mod:`fastload.augment.compiled`
runs them in DALI's threads).

One module per job: ``affine`` (the bilinear and bicubic affine filters), ``histogram`` (equalize, autocontrast),
``enhance`` (the ImageEnhance blends and ColorJitter), ``smooth`` (Sharpness), ``blur`` (PIL's GaussianBlur), ``pointwise`` (the lookup tables and
grayscale), ``hsv`` (the hue shift), ``pixel`` (the scalar helpers they share), ``steps`` (the step that runs each
sample's operation by its code), ``entry`` (its C entry point) and ``layout`` (the codes, and where each kernel reads
its arguments). The modules with kernels import numba, so they are imported
only when a CPU graph is built; ``layout`` and this package do not.

numba caches each compiled entry point on disk (beside the package, or under ``NUMBA_CACHE_DIR``) keyed by the
file that defines it (``entry``), not by the files of the kernels it calls: after editing a kernel module, delete
``kernels/__pycache__`` (the tests key their own cache by these sources: ``tests/conftest.py``).
"""
