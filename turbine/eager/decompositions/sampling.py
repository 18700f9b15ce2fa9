"""3-D grid sampling (``grid_sampler_3d``), which torch has no decomposition of and IREE 3.13
cannot lower: volumetric spatial transformers and 3-D registration fell back.

It follows torch's kernels (GridSampler.h): grid coordinates in [-1, 1] are unnormalised to input
places (``align_corners`` says whether -1 and 1 are the corner places' centres or their outer
edges), brought inside by the padding mode (zeros: places outside read 0; border: clipped;
reflection: mirrored at the edges, then clipped), and read trilinearly (the 8 places around,
weighted by their nearness) or at the nearest place (halves rounded to even, as C's nearbyint).
"""

from __future__ import annotations

import torch

from turbine.eager.decompositions._common import registers

aten = torch.ops.aten

BILINEAR, NEAREST = 0, 1
ZEROS, BORDER, REFLECTION = 0, 1, 2


def _unnormalised(coordinate: torch.Tensor, size: int, align_corners: bool) -> torch.Tensor:
    if align_corners:
        return (coordinate + 1) / 2 * (size - 1)
    return ((coordinate + 1) * size - 1) / 2


def _reflected(coordinate: torch.Tensor, twice_low: int, twice_high: int) -> torch.Tensor:
    """torch's ``reflect_coordinates``: the coordinate mirrored into [low, high]."""
    if twice_low == twice_high:
        return torch.zeros_like(coordinate)
    low, span = twice_low / 2, (twice_high - twice_low) / 2
    distance = (coordinate - low).abs()
    extra = torch.fmod(distance, span)
    flips = torch.floor(distance / span)
    return torch.where(torch.remainder(flips, 2) == 0, extra + low, span - extra + low)


def _source(coordinate: torch.Tensor, size: int, padding_mode: int, align_corners: bool) -> torch.Tensor:
    """torch's ``grid_sampler_compute_source_index``."""
    place = _unnormalised(coordinate, size, align_corners)
    if padding_mode == REFLECTION:
        place = _reflected(place, 0, 2 * (size - 1)) if align_corners else _reflected(place, -1, 2 * size - 1)
    if padding_mode in (BORDER, REFLECTION):
        place = place.clamp(0, size - 1)
    return place


def _read(planes: torch.Tensor, sizes: list[int], places: list[torch.Tensor]) -> torch.Tensor:
    """planes [N, C, D*H*W] read at integer places (z, y, x: [N, P] each); 0 outside the input."""
    inside = torch.ones_like(places[0], dtype=torch.bool)
    flat = torch.zeros_like(places[0])
    for place, size in zip(places, sizes):
        inside = inside & (place >= 0) & (place < size)
        flat = flat * size + place.clamp(0, size - 1)
    index = flat.unsqueeze(1).expand(-1, planes.shape[1], -1)
    values = torch.gather(planes, 2, index)
    return torch.where(inside.unsqueeze(1), values, torch.zeros_like(values))


@registers(aten.grid_sampler_3d.default)
def grid_sampler_3d(input: torch.Tensor, grid: torch.Tensor, interpolation_mode: int, padding_mode: int, align_corners: bool) -> torch.Tensor:
    """Trilinear or nearest 3-D grid sampling with zeros, border or reflection padding."""
    if interpolation_mode not in (BILINEAR, NEAREST):
        raise NotImplementedError("torch samples 3-D grids trilinearly or at the nearest place only")
    n, c, depth, height, width = input.shape
    out = grid.shape[1:4]
    planes = input.reshape(n, c, depth * height * width)
    sizes = [depth, height, width]
    points = grid.reshape(n, -1, 3)
    # the grid's last dim is (x, y, z): width, height, depth
    sources = [_source(points[..., 2 - d], size, padding_mode, align_corners) for d, size in enumerate(sizes)]
    if interpolation_mode == NEAREST:
        result = _read(planes, sizes, [torch.round(s).to(torch.int64) for s in sources])
    else:
        lows = [torch.floor(s) for s in sources]
        fractions = [s - low for s, low in zip(sources, lows)]
        lows = [low.to(torch.int64) for low in lows]
        result = torch.zeros((n, c, points.shape[1]), dtype=input.dtype, device=input.device)
        for corner in range(8):
            steps = [(corner >> (2 - d)) & 1 for d in range(3)]
            weight = torch.ones_like(fractions[0])
            for step, fraction in zip(steps, fractions):
                weight = weight * (fraction if step else 1 - fraction)
            places = [low + step for low, step in zip(lows, steps)]
            result = result + _read(planes, sizes, places) * weight.unsqueeze(1)
    return result.reshape(n, c, *out)
