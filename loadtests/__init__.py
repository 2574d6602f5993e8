"""Locust load tests for specproxy: scenarios, a concurrency sweep and its report."""
