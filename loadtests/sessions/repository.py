"""A small application's repository, generated deterministically from a seed."""

from __future__ import annotations

import hashlib
import random

from loadtests.sessions.entities import ENTITIES, PROJECTS
from loadtests.sessions.javascript_files import js_api, js_format, js_routes, js_store
from loadtests.sessions.python_files import (
    py_cache,
    py_cli,
    py_config,
    py_http,
    py_model,
    py_repository,
    py_service,
)


def build_repository(seed: int) -> tuple[dict[str, str], str]:
    """A small application's files (path -> text) and its project description, from a seed."""
    rng = random.Random(f"repo:{seed}")
    project, pkg, purpose = rng.choice(PROJECTS)
    entities = rng.sample(ENTITIES, 2)
    files: dict[str, str] = {}
    for e in entities:
        files[f"{pkg}/models/{e.name}.py"] = py_model(pkg, e, rng)
        files[f"{pkg}/repositories/{e.name}_repository.py"] = py_repository(pkg, e, rng)
        files[f"{pkg}/services/{e.name}_service.py"] = py_service(pkg, e, rng)
        files[f"web/src/api/{e.camel}Api.js"] = js_api(project, e, rng)
        files[f"web/src/routes/{e.plural_camel}.js"] = js_routes(project, e, rng)
        files[f"web/src/store/{e.camel}Store.js"] = js_store(project, e, rng)
    files[f"{pkg}/config.py"] = py_config(pkg, rng)
    files[f"{pkg}/cache.py"] = py_cache(rng)
    files[f"{pkg}/http_client.py"] = py_http(rng)
    files[f"{pkg}/cli.py"] = py_cli(pkg, entities, rng)
    files["web/src/utils/format.js"] = js_format(rng)
    return dict(sorted(files.items())), f"{project}: {purpose}"


def hash_seed(text: str) -> int:
    """A stable integer from a text (Python's hash() changes between processes)."""
    return int(hashlib.sha256(text.encode()).hexdigest()[:12], 16)
