"""Are the envs' verdicts right: answer checkers and code harnesses (benchmarks/README.md)."""
