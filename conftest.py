"""Repository-wide pytest settings: benchmarks are run by `./dev bench`, never collected as tests."""

collect_ignore = ["benchmarks"]
