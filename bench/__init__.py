"""Benchmarks for vmcp-actors. Run from the repo root: ``.venv/bin/python -m bench.run_all``.

See docs/benchmarks.md for what each one measures, its target and the latest numbers.
"""
