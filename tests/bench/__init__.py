"""Benchmarks: run with `make bench`; they print figures and assert nothing."""
