"""Shared fixtures of the detection tests."""

from __future__ import annotations

import pytest

from tests.detection.faultbed import record
from tests.detection.simfeed import Recording


@pytest.fixture(scope="session")
def rec() -> Recording:
    """The fault bed, simulated once per test session (a few seconds)."""
    return record()
