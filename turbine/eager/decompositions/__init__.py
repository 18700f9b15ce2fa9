"""turbine's own decompositions: ops IREE 3.13 cannot compile, written with ops it can.

torch's decomposition tables stop short for these: they either have no entry, or their entry
(a ``torch._refs`` function) traces into ``prims`` ops that IREE's importer does not take. Each
function here computes what torch's CPU kernel computes, to float precision, from elementwise
math, reductions and views that IREE lowers; the OpInfo suite (tests/opinfo) and
tests/test_decompositions.py compare them with torch.

The special functions use textbook methods (series, recurrences, continued fractions,
asymptotic expansions, Newton's and Halley's methods) rather than torch's fitted
coefficients. Each is declared in the op registry (eager/registry.py) when this package is imported.
"""

from turbine.eager.decompositions import accumulation, activations, amp, arctangent, bessel, bisection, bits, chebyshev, convolution, distances, erf, gamma, histogram, integers, linalg, logarithms, logits, margins, membership, moments, normalization, order, padding, pooling, powers, recurrent, resampling, sampling, scans, scatter, trigonometric, vjp, widening
from turbine.eager.decompositions._common import register_shape_rules
from turbine.eager.decompositions.pooling import adaptive_max_pool_nd
from turbine.eager.decompositions.scans import logcumsumexp

__all__ = ["adaptive_max_pool_nd", "register_shape_rules", "logcumsumexp", "accumulation", "activations", "amp", "arctangent", "bessel", "bisection", "bits", "chebyshev", "convolution", "distances", "erf", "gamma", "histogram", "integers", "linalg", "logarithms", "logits", "margins", "membership", "moments", "normalization", "order", "padding", "pooling", "powers", "recurrent", "resampling", "sampling", "scans", "scatter", "trigonometric", "vjp", "widening"]
