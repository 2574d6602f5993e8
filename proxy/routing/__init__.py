"""Routing: classify the task, keep measured speeds, choose the backend."""
