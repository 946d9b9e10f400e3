"""Benchmarks: accuracy and speed checks that take longer than the unit tests."""
