"""Hypothesis profiles: CI runs are derandomized (reproducible); ``HYPOTHESIS_PROFILE=explore``
searches further with fresh randomness."""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, settings

from eva import native

settings.register_profile("ci", derandomize=True, deadline=None, print_blob=True,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("explore", deadline=None, max_examples=2000,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def pytest_report_header() -> str:
    return f"evamed engine modules compiled with mypyc: {', '.join(native.compiled()) or 'none'}"


if native.stale():
    pytest.exit(f"compiled modules older than their source: {', '.join(native.stale())}; "
                "run `make native`", returncode=2)
