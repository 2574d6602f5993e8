"""docs/configuration.md lists every setting the model declares, with its current default (fast
tier)."""

from __future__ import annotations

import pytest
from pydantic.fields import FieldInfo

from proxy.config import Settings
from proxy.config_reference import UndocumentedSettingError, markdown, updated
from tests.helpers import ROOT

DOC = ROOT / "docs" / "configuration.md"


def test_the_documented_reference_is_the_generated_one() -> None:
    text = DOC.read_text()
    assert text == updated(text), "docs/configuration.md is stale: run scripts/references.py"


def test_every_setting_appears_with_its_default() -> None:
    reference = markdown()
    for name in Settings.model_fields:
        assert f"| `{name}` |" in reference
    assert "| `connect_timeout_s` | `5.0` |" in reference
    assert "| `host` | `127.0.0.1` |" in reference


def test_a_setting_without_a_description_stops_the_reference(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fields = dict(Settings.model_fields)
    fields["new_knob"] = FieldInfo.from_field(3)
    monkeypatch.setattr(Settings, "model_fields", fields)
    with pytest.raises(UndocumentedSettingError, match="new_knob"):
        markdown()
