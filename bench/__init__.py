"""Performance benchmarks of issue 8 (not tests): see bench/README.md."""
