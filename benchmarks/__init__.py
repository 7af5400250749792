"""Benchmarks: each script prints its figures (docs/performance.md)."""
