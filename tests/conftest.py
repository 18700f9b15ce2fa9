"""Shared fixtures. Tests compare turbine with torch on the CPU, on random data."""

from __future__ import annotations

import pytest
import torch

import turbine

DEVICE = "turbine:cpu"


@pytest.fixture
def device() -> str:
    return DEVICE


@pytest.fixture
def stats():
    """Counters zeroed at the start of the test; call it to read them."""
    turbine.reset_stats()
    return turbine.stats


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(1234)
