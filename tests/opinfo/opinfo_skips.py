"""Cases of the OpInfo suite that are not run, each with the reason. This is the only such list.

A key is an op_db entry name (``max.reduction_with_dim``), optionally narrowed by variant
(function, method, inplace), dtype (float32, int64) and direction (forward, backward); None
matches any. Keep reasons specific: what goes wrong, and why it cannot be fixed in turbine now.
"""

from __future__ import annotations

SKIPS: dict[tuple[str, str | None, str | None, str | None], str] = {
    ("as_strided.partial_views", None, None, None): (
        "its samples are views into a larger storage and as_strided reads outside the view; copying a sample "
        "to the device (Tensor.to) copies only the view, as torch does, so the results cannot match"
    ),
    ("tensor_split", None, None, None): (
        "some samples pass indices_or_sections as a tensor, which torch requires on the CPU for every device; "
        "the harness copies every sample tensor to the device"
    ),
    ("addbmm", "inplace", None, "forward"): (
        "torch's CPU kernel resizes a [1] self to the [5, 10] result in place, which torch's meta kernel "
        "(the rule turbine checks calls with) rejects as a broadcast error; turbine follows the meta rule"
    ),
}


def skip_reason(op: str, variant: str, dtype: str, direction: str) -> str | None:
    """The reason a case is skipped, or None when it runs."""
    for (name, want_variant, want_dtype, want_direction), reason in SKIPS.items():
        if name != op:
            continue
        if want_variant not in (None, variant) or want_dtype not in (None, dtype):
            continue
        if want_direction in (None, direction):
            return reason
    return None
