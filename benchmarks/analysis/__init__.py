"""Figures from runs already made: evaluation and training files in, tables out (benchmarks/README.md)."""
