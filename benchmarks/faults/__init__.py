"""Misbehaving servers, dead engines, hostile outputs and long soaks (benchmarks/README.md)."""
