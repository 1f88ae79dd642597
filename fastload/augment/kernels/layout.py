"""Where the kernels read their arguments in a step's float32 parameters (no numba: the graph side imports it too)."""

#: Where the fill levels start in a geometric step's parameters (after a matrix's six entries in three float32 parts).
FILL_AT = 18

#: Floats of one ColorJitter slot in a step's parameters (kind, 3x3 matrix, then saturation's factor or hue's shift).
SLOT = 11
