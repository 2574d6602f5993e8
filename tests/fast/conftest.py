"""The fast tier's one rule: the caller's SPECPROXY_* variables do not reach its tests."""

from __future__ import annotations

import pytest

from tests.helpers import remove_specproxy_env


@pytest.fixture(autouse=True)
def _no_callers_specproxy_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fast tier runs as if no SPECPROXY_* variable were set, whatever the caller's shell has:
    the in-process proxy's Settings read them, and so do the CLI runs that inherit os.environ.
    (Module-scoped fixtures start before this one: tests/inprocess.py removes them itself.)

    Integration tests keep the caller's environment, for the few knobs of the harness itself
    (SPECPROXY_IMAGE_BASE, the llama-server of tests/integration/test_mtp_model.py); the proxies
    they spawn get `clean_env()`, without SPECPROXY_* unless the test sets them.
    """
    remove_specproxy_env(monkeypatch)
