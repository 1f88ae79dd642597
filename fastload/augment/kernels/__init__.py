"""PIL's own arithmetic, per sample, compiled by numba: the kernels of the CPU graph's operations that DALI has no
exact operator for (:mod:`fastload.augment.compiled` runs each in DALI's threads).

One module per job: ``affine`` (the bilinear and bicubic affine filters), ``histogram`` (equalize, autocontrast),
``enhance`` (the ImageEnhance blends and ColorJitter), ``hsv`` (the hue shift), ``pixel`` (the scalar helpers they
share) and ``layout`` (where each reads its arguments). The modules with kernels import numba, so they are imported
only when a CPU graph is built; ``layout`` and this package do not.
"""
