"""Benchmarks: programs that print a table."""
