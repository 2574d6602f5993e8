"""A test's tier is the folder it lives in: tests/integration/ is marked `integration`."""

from __future__ import annotations

from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
# Real llama-server processes, provisioned models, agents, containers: `pytest -m integration`.
INTEGRATION = TESTS / "integration"
# In-process, no llama-server and no model, seconds: `pytest -m "not integration"`.
FAST = TESTS / "fast"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test under tests/integration/; a test module outside both tiers is an error."""
    for item in items:
        where = item.path.parents
        if INTEGRATION in where:
            item.add_marker(pytest.mark.integration)
        elif TESTS in where and FAST not in where:
            # Otherwise `-m "not integration"` would quietly take it, whatever it starts.
            raise pytest.UsageError(
                f"{item.path.relative_to(TESTS.parent)}: a test module lives in tests/fast/ "
                "(in-process, no llama-server) or tests/integration/ (real backends, models)"
            )
