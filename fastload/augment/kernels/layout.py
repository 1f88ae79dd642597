"""Where the kernels read their arguments in a step's float32 parameters, and the compiled step's operation codes
(no numba: the graph side imports it too)."""

#: Where the fill levels start in a geometric step's parameters (after a matrix's six entries in three float32 parts).
FILL_AT = 18

#: Floats of one ColorJitter slot in a step's parameters (kind, 3x3 matrix, then saturation's factor or hue's shift).
SLOT = 11

#: Where ImageEnhance's Color and Sharpness read their factor (after the 3x3 matrix or kernel a GPU graph reads).
FACTOR_AT = 9

#: The compiled step's operations by code (``kernels.steps.step``): a CPU graph's round is one operator whatever
#: each sample drew. Posterize reads its mask, Solarize its first turned level and SolarizeAdd its addend at ``p[0]``;
#: Brightness and Contrast their factor at ``p[0]``, Color and Sharpness at :data:`FACTOR_AT`, BoxBlur its box at
#: :data:`BLUR_AT`.
CODES = (
    "Identity", "Invert", "Posterize", "Solarize", "SolarizeAdd", "Grayscale", "Equalize", "AutoContrast",
    "Brightness", "Contrast", "Color", "Sharpness", "ColorJitter", "BoxBlur",
)  # fmt: skip

#: Where PIL's ``GaussianBlur`` (``BoxBlur``, timm's and the self-supervised recipes') reads its box's integer radius
#: and its two weights over ``2**24`` (after the seven taps a GPU graph reads).
BLUR_AT = 7

#: A warp's code is ``WARP + 3 * matrix + filter``, its matrix one of :data:`MATRICES` (the six entries fed, three
#: float32 parts each; a rotation's cosine and sine, three parts each, about the image's centre; a relative
#: translation's fraction, three parts, times the image's width or height), its filter one of :data:`FILTERS`.
WARP = 16
MATRICES = ("fed", "rotation", "x_rel", "y_rel")
FILTERS = ("nearest", "bilinear", "bicubic")


def code(name: str) -> int:
    """The code of the non-geometric operation ``name`` (one of :data:`CODES`)."""
    return CODES.index(name)


def warp_code(matrix: str, interpolation: str) -> int:
    """The code of a warp by ``matrix`` (one of :data:`MATRICES`) at ``interpolation`` (one of :data:`FILTERS`)."""
    if interpolation not in FILTERS:
        raise ValueError(f"the compiled warp has {FILTERS}, not {interpolation!r}")
    return WARP + 3 * MATRICES.index(matrix) + FILTERS.index(interpolation)

#: Where the compiled finish (``kernels.finish``) reads its spec: a flag (1: the rectangles take the noise fed, 0: the
#: values), the three means, the three reciprocals of the standard deviations, the three values (float32).
NOISE, MEAN, INV, VALUE = 0, 1, 4, 7
