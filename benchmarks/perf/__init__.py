"""Speed and memory of the project's parts (benchmarks/README.md)."""
