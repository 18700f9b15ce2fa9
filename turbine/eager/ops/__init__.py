"""The op registry's declarations, by family (see eager/registry.py). Importing this package fills it."""

from turbine.eager.ops import attention, bounds, corrections, ctc, grouped, indexing, kernels, layouts, linalg, movement, normalization, random, recurrent, selection, shapes

__all__ = ["attention", "bounds", "corrections", "ctc", "grouped", "indexing", "kernels", "layouts", "linalg", "movement", "normalization", "random", "recurrent", "selection", "shapes"]
