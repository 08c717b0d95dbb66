"""Benchmarks: a baseline plus one change, medians, results saved with their environment."""
