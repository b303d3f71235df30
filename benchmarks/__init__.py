"""Helpers for benchmark.py and other measurement scripts."""
