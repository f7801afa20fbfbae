"""Benchmark and experiment scripts, sorted by purpose (benchmarks/README.md indexes them)."""
