"""Benchmarks printing ratios measured side by side in one run; see README.md."""
