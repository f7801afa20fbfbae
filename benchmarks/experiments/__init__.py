"""Learning and model experiments (benchmarks/README.md)."""
