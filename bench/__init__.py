"""Topicbase benchmarks: ``python -m bench.run --suite full|quick [--only NAME]``."""
