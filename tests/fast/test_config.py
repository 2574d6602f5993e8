"""Configuration: the embedded default, env overrides, and errors that name the field and fix."""

from __future__ import annotations

from pathlib import Path
from typing import cast

import pytest

from proxy.api.background import calibration_requests
from proxy.backend_config import BackendConfig
from proxy.config import ConfigError, load_settings
from proxy.routing.aliases import ModelAliases
from tests.helpers import ROOT


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(text)
    return path


def test_embedded_default_is_the_cpu_trio_on_loopback() -> None:
    settings = load_settings()
    assert settings.host == "127.0.0.1"
    assert [(b.name, b.kind, b.spec_type) for b in settings.backends] == [
        ("plain", "plain", None),
        ("draft", "draft-simple", "draft-simple"),
        ("ngram", "ngram", "ngram-mod"),
    ]
    assert {b.model for b in settings.backends} == {"qwen2.5-coder-1.5b"}
    assert settings.backends[1].draft_model == "qwen2.5-coder-0.5b"
    assert settings.log_prompts is False


def test_environment_overrides_the_file(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPECPROXY_PORT", "9191")
    monkeypatch.setenv("SPECPROXY_LLAMA_SERVER", "/opt/llama/bin/llama-server")
    settings = load_settings()
    assert settings.port == 9191
    assert settings.llama_server == Path("/opt/llama/bin/llama-server")


def test_overrides_beat_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPECPROXY_PORT", "9191")
    assert load_settings(port=7000).port == 7000


def test_external_backend_by_url(tmp_path: Path) -> None:
    cfg = write(tmp_path, "backends:\n  - {name: remote, url: 'http://10.0.0.5:8080/'}\n")
    backend = load_settings(cfg).backends[0]
    assert backend.url == "http://10.0.0.5:8080" and not backend.supervised


@pytest.mark.parametrize(
    ("yaml", "expected"),
    [
        ("backends:\n  - {name: d, kind: draft-simple, model: m}\n", "needs `draft_model`"),
        ("backends:\n  - {name: p}\n", "set `model`"),
        ("backends:\n  - {name: auto, model: m}\n", "reserved"),
        ("backends:\n  - {name: 'bad name', model: m}\n", "must be 1-64 characters"),
        ("backends:\n  - {name: a, model: m}\n  - {name: a, model: m}\n", "repeated: a"),
        ("backends:\n  - {name: a, model: m, kind: mtp}\n", "backends.0.kind"),
        ("backends:\n  - {name: a, model: m, draft_n_max: 0}\n", "backends.0.draft_n_max"),
        ("backends:\n  - {name: a, model: m, ngram_variant: ngram-foo}\n", "ngram-mod"),
        ("backends:\n  - {name: a, model: m, draft_model: m}\n", "uses no draft model"),
        ("backends:\n  - {name: a, model: m, tokens: 3}\n", "backends.0.tokens"),
        ("backends: []\n", "backends"),
        ("port: -1\nbackends:\n  - {name: a, model: m}\n", "port"),
        (
            "model_aliases: {gpt-4o: b}\nbackends:\n  - {name: a, model: m}\n",
            "'gpt-4o' -> 'b': the target must be one of auto, auto-code",
        ),
        (
            "model_aliases: {a: auto}\nbackends:\n  - {name: a, model: m}\n",
            "'a' is already a model id",
        ),
    ],
)
def test_invalid_config_names_field_and_fix(tmp_path: Path, yaml: str, expected: str) -> None:
    with pytest.raises(ConfigError) as exc:
        load_settings(write(tmp_path, yaml))
    assert expected in str(exc.value)


def test_missing_config_file_says_so(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_settings(tmp_path / "nope.yaml")


def test_model_aliases_exact_names_then_patterns_in_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    text = (
        "model_aliases:\n  'claude-*': auto\n  claude-haiku-4-5: a\n  'claude-h*': auto-code\n"
        "backends:\n  - {name: a, model: m}\n"
    )
    aliases = ModelAliases(load_settings(write(tmp_path, text)).model_aliases)
    assert aliases.resolve("claude-haiku-4-5") == "a", "an exact name beats every pattern"
    assert aliases.resolve("claude-haiku-3") == "auto", "patterns in the order the file lists"
    assert aliases.resolve("Claude-x") is None and aliases.resolve("mistral-7b") is None
    monkeypatch.setenv("SPECPROXY_MODEL_ALIASES", '{"gpt-*": "auto-prose"}')
    merged = load_settings(write(tmp_path, text)).model_aliases
    assert merged["gpt-*"] == "auto-prose" and merged["claude-*"] == "auto", "env adds aliases"


ENGINE = """
backends:
  - {name: plain, kind: plain, engine: coder, model: a.gguf, ctx_size: 8192}
  - {name: ngram, kind: ngram, engine: coder, model: a.gguf, ctx_size: 8192}
  - {name: draft, kind: draft-simple, engine: coder, model: a.gguf, draft_model: b.gguf,
     draft_n_max: 6, ctx_size: 8192}
"""


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (("ctx_size: 8192}", "ctx_size: 4096}", 1), "`ctx_size` differs between them"),
        (("engine: coder, model: a.gguf", "engine: plain, model: a.gguf", 3), "a backend's name"),
        (("engine: coder, model: a.gguf, ctx", "engine: coder, url: 'http://h:1', ctx", 1), "only"),
    ],
)
def test_backends_sharing_an_engine_must_agree_on_the_process(
    tmp_path: Path, change: tuple[str, str, int], expected: str
) -> None:
    old, new, count = change
    with pytest.raises(ConfigError, match=expected):
        load_settings(write(tmp_path, ENGINE.replace(old, new, count)))


def test_an_engine_is_one_command_line_with_every_speculator(tmp_path: Path) -> None:
    from proxy.backends.launch import LaunchSpec, engine_spec

    settings = load_settings(write(tmp_path, ENGINE))
    members = [
        LaunchSpec(
            config=b,
            binary=Path("/bin/llama-server"),
            model_path=Path("/m/a.gguf"),
            draft_path=Path("/m/b.gguf") if b.draft_model else None,
            our_build=True,
        )
        for b in settings.engines()["coder"]
    ]
    argv = engine_spec("coder", members).argv("127.0.0.1", 9000)
    assert argv[argv.index("--spec-type") + 1] == "ngram-mod,draft-simple"
    assert argv[argv.index("--spec-draft-model") + 1] == "/m/b.gguf"
    assert argv[argv.index("--spec-draft-n-max") + 1] == "6"
    assert argv.count("--model") == 1 and argv[argv.index("--alias") + 1] == "coder"


def test_the_small_cpu_config_is_the_default_engine_without_draft() -> None:
    """deploy/cpu-small.yaml, which the README gives a machine with less memory: the default's
    `coder` engine as it is, only its prompt cache smaller, and no draft process."""
    small = load_settings(ROOT / "deploy" / "cpu-small.yaml")
    default = {b.name: b for b in load_settings().backends}
    assert list(small.engines()) == ["coder"]
    for b in small.backends:
        assert b.cache_ram_mib == 2048
        assert b.model_copy(update={"cache_ram_mib": None}) == default[b.name].model_copy(
            update={"cache_ram_mib": None}
        )
    assert {b.name for b in small.backends} == {"plain", "ngram"}
    assert small.model_aliases == load_settings().model_aliases


def test_the_gpu_example_is_two_engines_each_one_process() -> None:
    from proxy.backends.launch import LaunchSpec, engine_spec

    settings = load_settings(ROOT / "deploy" / "gpu.yaml")
    engines = settings.engines()
    assert {name: [m.kind for m in ms] for name, ms in engines.items()} == {
        "coder": ["plain", "draft-simple", "ngram", "draft-ngram", "ngram"],
        "gemma": ["plain", "draft-mtp"],
    }
    coder = [
        LaunchSpec(
            config=m,
            binary=Path("/bin/llama-server"),
            model_path=Path(str(m.model)),
            draft_path=Path(m.draft_model) if m.draft_model else None,
            our_build=True,
        )
        for m in engines["coder"]
    ]
    argv = engine_spec("coder", coder).argv("127.0.0.1", 9000)
    # One copy of the target and of the draft, each speculator once.
    assert argv.count("--model") == 1 and argv.count("--spec-draft-model") == 1
    speculators = sorted(argv[argv.index("--spec-type") + 1].split(","))
    assert speculators == ["copy-json", "draft-simple", "ngram-mod"]
    # Each strategy's longest draft, under which auto chooses each request's.
    assert {m.name: m.draft_cap for m in engines["coder"]} == {
        "coder-plain": 0,
        "coder-draft": 8,
        "coder-ngram": 64,
        "coder-draft-ngram": 64,
        "coder-copy": 64,
    }


def test_draft_ngram_drafts_with_both_and_needs_a_draft_model(tmp_path: Path) -> None:
    settings = load_settings(
        write(
            tmp_path,
            "backends:\n  - {name: both, kind: draft-ngram, model: a.gguf, draft_model: b.gguf}\n",
        )
    )
    assert settings.backends[0].speculators == ["ngram-mod", "draft-simple"]
    with pytest.raises(ConfigError, match="kind draft-ngram needs `draft_model`"):
        load_settings(write(tmp_path, "backends:\n  - {name: b, kind: draft-ngram, model: a}\n"))


def test_a_config_without_aliases_still_serves_the_agents_names(tmp_path: Path) -> None:
    bare = load_settings(write(tmp_path, "backends:\n  - {name: a, model: m}\n"))
    aliases = ModelAliases(bare.model_aliases)
    for name in ("claude-opus-4-8", "gpt-5.2-codex", "o4-mini", "qwen3-coder-plus"):
        assert aliases.resolve(name) == "auto", name


# What Claude Code, Qwen Code and Continue send when nobody named a model (docs/agents.md).
AGENT_NAMES = ("claude-opus-4-8", "qwen3.5-plus", "gpt-4o")


def test_aliases_in_the_environment_add_to_the_agents_names(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SPECPROXY_MODEL_ALIASES", '{"my-model": "plain"}')
    aliases = ModelAliases(load_settings().model_aliases)
    assert aliases.resolve("my-model") == "plain"
    for name in AGENT_NAMES:
        assert aliases.resolve(name) == "auto", name


def test_aliases_in_a_config_add_to_the_agents_names_and_null_removes_one(
    tmp_path: Path,
) -> None:
    text = (
        "model_aliases:\n  gpt-4o-mini: a\n  'qwen2.5-coder:*': auto-code\n  'codex-*': null\n"
        "backends:\n  - {name: a, model: m}\n"
    )
    aliases = ModelAliases(load_settings(write(tmp_path, text)).model_aliases)
    for name in AGENT_NAMES:
        assert aliases.resolve(name) == "auto", name
    assert aliases.resolve("gpt-4o-mini") == "a", "an exact name beats the agents' patterns"
    assert aliases.resolve("qwen2.5-coder:7b") == "auto-code", "the config's patterns come first"
    assert aliases.resolve("codex-mini") is None, "null takes an agent's name out"


def test_one_requests_context_is_the_whole_cache_when_slots_share_it() -> None:
    # Calibration sizes its prompts by this (proxy/api/background.py): a test model's 4 k
    # cache shared by 4 slots holds the workload's whole-file edits, where a quarter of it
    # would have left calibration one search/replace edit for the class.
    unified = BackendConfig(name="a", model="m.gguf", ctx_size=4096, parallel=4, kv_unified=True)
    split = BackendConfig(name="b", model="m.gguf", ctx_size=4096, parallel=4)
    assert unified.request_context == 4096
    assert split.request_context == 1024
    roomy = calibration_requests("echo", 3, unified.request_context - 256)
    tight = calibration_requests("echo", 3, split.request_context - 256)
    assert [r.kind for r in roomy].count("whole-file edit") == 2
    assert [r.kind for r in tight] == ["search/replace edit"]


def test_copy_json_is_named_by_every_request_even_on_an_engine_of_its_own(
    tmp_path: Path,
) -> None:
    """copy-json drafts only for requests naming it (its patch), so its strategy always names
    it; ngram-mod on a process of its own runs for every request unnamed, as upstream."""
    from proxy.backends.engine import Engine
    from proxy.backends.launch import LaunchSpec
    from proxy.backends.strategy import Strategy

    settings = load_settings(
        write(
            tmp_path,
            "backends:\n"
            "  - {name: copy, kind: ngram, ngram_variant: copy-json, model: a.gguf}\n"
            "  - {name: ngram, kind: ngram, model: a.gguf}\n",
        )
    )
    # The speculation fields are the config's alone: no engine is asked.
    copy, ngram = (
        Strategy(LaunchSpec(config=b, our_build=True), cast(Engine, None))
        for b in settings.backends
    )
    assert copy.speculation == {"speculative.types": ["copy-json"]}
    assert ngram.speculation == {}
