"""Parts of scripts/overhead_benchmark.py: its load client, its processes and its report."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the repository
