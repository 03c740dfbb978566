"""Benchmarks (`make bench`): figures measured side by side in one run, as ratios."""
