"""Engines' cached prompts kept across restarts: saved to disk when idle, brought back at start.

An agent's first turn on a CPU is minutes of prompt processing (its system prompt and tools),
and llama-server's RAM prompt cache dies with its process. So after a long prompt the keeper
saves the slot that holds it (llama-server's slot files, `--slot-save-path`), and when the
engine's process (re)starts it restores the newest files and pushes them into the RAM cache,
where the next session's first request finds them by prefix as if the process had never gone.

Why slot files and not recomputing: restoring 10 k tokens reads ~280 MB (a fraction of a
second, docs/agents.md "Warm sessions") where recomputing them takes minutes on two cores.

When: a save runs only while the engine has no request in flight or queued (llama-server
saves on its one main loop, so a request sent meanwhile waits for it), and only for a prompt
that is not mostly in a kept file already: an agent's next turn extends its last by a few
percent, so one session is saved again only once it has grown by a tenth. Engines with a
draft model are not kept: slot files hold the target's KV only.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from proxy.backends.launch import LaunchSpec
from proxy.backends.prompt_store import Fingerprint, PromptStore, StoredPrompt
from proxy.backends.supervisor import SupervisedEngine
from proxy.log import get_logger
from proxy.provision.pypi import sha256_of
from proxy.routing.prefixes import PromptPrefix

log = get_logger("prompt-keeper")
# A prompt that shares this much of its characters with a kept one adds too little to write.
_NEW_ENOUGH = 0.9
# How long a saved prompt may wait for its engine to go idle before it is dropped: a request
# that starts meanwhile moves the slot's prompt to the RAM cache, where no save can reach it.
_IDLE_WAIT_S = 30.0
_POLL_S = 0.2
# How long a stopping proxy waits for the saves it was offered: a user who stops it right after
# an agent's first turn expects to find that turn's prompt after the restart.
DRAIN_S = 15.0
# llama-server's --cache-ram default (MiB), when the config sets none.
_LLAMA_CACHE_RAM_MIB = 8192
_TIMEOUT = aiohttp.ClientTimeout(total=300)
Restored = Callable[[str, PromptPrefix, str, int], None]


def keeps_prompts(spec: LaunchSpec) -> bool:
    """Whether an engine's prompts can be kept: a process of ours with no draft context (slot
    files hold the target's KV only, so a draft model would restore out of step)."""
    return spec.binary is not None and spec.draft_path is None and spec.config.kind != "draft-mtp"


def _file_digest(path: Path, memo: Path) -> str:
    """sha256 of a (model or binary) file, memoised by path, size and mtime in `memo`."""
    stat = path.stat()
    key = f"{path.resolve()} {stat.st_size} {stat.st_mtime_ns}"
    try:
        known: dict[str, str] = json.loads(memo.read_text())
    except (OSError, ValueError):
        known = {}
    if key not in known:
        known[key] = sha256_of(path)
        memo.write_text(json.dumps(known))
    return known[key]


def fingerprint_of(spec: LaunchSpec, memo: Path) -> Fingerprint:
    """What the engine's slot files depend on (blocking: hashes the model once)."""
    assert spec.model_path is not None and spec.binary is not None
    cfg = spec.config
    return Fingerprint(
        {
            "model_sha256": _file_digest(spec.model_path, memo),
            "llama_server_sha256": _file_digest(spec.binary, memo),
            "ctx_size": str(cfg.ctx_size),
            "parallel": str(cfg.parallel),
            "kv_unified": str(cfg.kv_unified),
            "gpu_layers": str(cfg.gpu_layers),
            # Cache types, flash attention and the like, where the config passes them.
            "extra_args": " ".join(cfg.extra_args),
        }
    )


@dataclass(frozen=True)
class Offer:
    """A finished request's prompt, which the slot that served it holds until the next starts."""

    prefix: PromptPrefix
    tokens: int  # prompt and answer: what the slot holds
    at: float = field(default_factory=time.monotonic)


class PromptKeeper:
    """Keeps one engine's long prompts on disk and brings them back when its process starts."""

    def __init__(
        self,
        engine: SupervisedEngine,
        root: Path,
        limit_bytes: int,
        min_tokens: int,
        on_restored: Restored,
    ) -> None:
        self.engine = engine
        self.root = root
        self.limit_bytes = limit_bytes
        self.min_tokens = min_tokens
        self._on_restored = on_restored
        self._offers: asyncio.Queue[Offer] = asyncio.Queue(maxsize=16)
        self.store: PromptStore | None = None
        self.saved = 0
        self.restored = 0
        self._pending = 0  # offered and not yet saved or dropped
        self._settled = asyncio.Event()  # set while nothing is pending
        self._settled.set()

    def offer(self, prefix: PromptPrefix, tokens: int) -> None:
        """A request on this engine finished with this prompt; keep it if it is worth keeping.
        Never waits: a full queue drops the offer."""
        if tokens < self.min_tokens or not prefix.fingerprints:
            return
        with contextlib.suppress(asyncio.QueueFull):
            self._offers.put_nowait(Offer(prefix, tokens))
            self._pending += 1
            self._settled.clear()

    async def run(self) -> None:
        """Restore at every start of the engine's process; save offers while it runs."""
        spec = self.engine.spec
        self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
        fingerprint = await asyncio.to_thread(fingerprint_of, spec, self.root / "digests.json")
        store = PromptStore(self.root, self.engine.name, fingerprint, self.limit_bytes)
        await asyncio.to_thread(store.load)
        self.store = store
        served = ""
        while True:
            await self.engine.wait_ready()
            if self.engine.base_url != served:
                served = self.engine.base_url
                await self._restore(store, served)
            try:
                offer = await asyncio.wait_for(self._offers.get(), timeout=1.0)
            except TimeoutError:
                continue
            try:
                await self._save(store, offer)
            finally:
                self._pending -= 1
                if not self._pending:
                    self._settled.set()

    async def drain(self, deadline: float) -> None:
        """Wait until the offered prompts are saved (or dropped), or until `deadline`."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._settled.wait(), max(0.0, deadline - time.monotonic()))

    async def _api(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        """One call to the engine's llama-server; its JSON answer, or an exception."""
        async with self.engine.session.request(
            method, f"{self.engine.base_url}{path}", json=body, timeout=_TIMEOUT
        ) as resp:
            data = await resp.json(content_type=None)
            if resp.status != 200:
                raise RuntimeError(f"HTTP {resp.status}: {data}")
            return data

    def _idle(self) -> bool:
        return self.engine.ready and self.engine.in_flight == 0 and self.engine.queued == 0

    async def _save(self, store: PromptStore, offer: Offer) -> None:
        """Write the slot holding the offered prompt to disk, if it is new enough and the engine
        goes idle before another request could take the prompt out of the slot."""
        kept, shared = store.covering(offer.prefix)
        if kept is not None and shared >= _NEW_ENOUGH * offer.prefix.chars:
            await asyncio.to_thread(store.touch, kept)
            return
        while not self._idle():
            if time.monotonic() - offer.at > _IDLE_WAIT_S:
                return
            await asyncio.sleep(_POLL_S)
        try:
            slots = await self._api("GET", "/slots")
            slot = _holding(slots, offer.tokens)
            if slot is None:
                log.debug("no idle slot holds the prompt", engine=store.engine)
                return
            name = store.new_name()
            started = time.monotonic()
            answer = await self._api(
                "POST", f"/slots/{slot}?action=save", {"filename": store.path_of(name).name}
            )
            saved_s = time.monotonic() - started
            tokens = int(answer.get("n_saved", 0))
            if tokens < self.min_tokens:
                store.remove(name)  # the slot moved on before the save reached it
                return
            entry = await asyncio.to_thread(store.add, name, offer.prefix, tokens)
        except (aiohttp.ClientError, TimeoutError, RuntimeError, ValueError, OSError) as exc:
            log.warning("could not keep a prompt", engine=store.engine, error=str(exc))
            return
        self.saved += 1
        log.info(
            "prompt kept on disk",
            engine=store.engine,
            tokens=entry.tokens,
            mib=round(entry.size / 2**20, 1),
            save_s=round(saved_s, 3),
            kept=len(store.entries()),
        )

    async def _restore(self, store: PromptStore, url: str) -> None:
        """Bring the newest kept prompts into the new process's RAM cache, oldest first, as much
        as its RAM cache holds."""
        cfg = self.engine.spec.config
        budget = (cfg.cache_ram_mib or _LLAMA_CACHE_RAM_MIB) * 2**20
        chosen: list[StoredPrompt] = []
        for entry in reversed(store.entries()):  # newest first
            if entry.tokens < cfg.ctx_size and sum(e.size for e in chosen) + entry.size <= budget:
                chosen.append(entry)
        if not chosen:
            return
        started = time.monotonic()
        try:
            slots = await self._api("GET", "/slots")
        except (aiohttp.ClientError, TimeoutError, RuntimeError, ValueError) as exc:
            log.warning("could not restore kept prompts", engine=store.engine, error=str(exc))
            return
        ids = [int(s["id"]) for s in slots if isinstance(s, dict) and "id" in s]
        per_slot = int(slots[0].get("n_ctx", cfg.ctx_size)) if slots else cfg.ctx_size
        # One slot stays free: a one-token request there moves the restored slots into the RAM
        # cache (llama-server saves idle slots there when a task starts), making room for more.
        spare, seats = ids[-1], ids[:-1] or ids
        capacity = cfg.ctx_size if cfg.kv_unified else per_slot * len(ids)
        batch: list[int] = []
        held = 0
        tokens = 0
        for entry in reversed(chosen):  # oldest first: the newest is freshest in the RAM cache
            if entry.tokens > per_slot:
                continue
            if len(batch) == len(seats) or held + entry.tokens > capacity:
                await self._flush(spare)
                batch, held = [], 0
            seat = seats[len(batch)]
            try:
                await self._api("POST", f"/slots/{seat}?action=erase")
                await self._api(
                    "POST", f"/slots/{seat}?action=restore", {"filename": entry.filename}
                )
            except (aiohttp.ClientError, TimeoutError, RuntimeError, ValueError) as exc:
                log.warning(
                    "kept prompt refused by llama-server and deleted",
                    engine=store.engine,
                    file=entry.filename,
                    why=str(exc),
                )
                store.remove(entry.name)
                continue
            batch.append(seat)
            held += entry.tokens
            tokens += entry.tokens
            self.restored += 1
            self._on_restored(store.engine, entry.prefix, url, entry.tokens)
        log.info(
            "kept prompts restored",
            engine=store.engine,
            prompts=self.restored,
            tokens=tokens,
            seconds=round(time.monotonic() - started, 3),
        )

    async def _flush(self, spare: int) -> None:
        """Start a one-token request on the spare slot, so idle slots go to the RAM cache."""
        with contextlib.suppress(aiohttp.ClientError, TimeoutError, RuntimeError, ValueError):
            await self._api(
                "POST",
                "/completion",
                {"prompt": " ", "n_predict": 1, "id_slot": spare, "cache_prompt": False},
            )


def _holding(slots: Any, tokens: int) -> int | None:
    """The idle slot whose prompt has (about) this many tokens: the one a request just left."""
    best: tuple[int, int] | None = None
    if not isinstance(slots, list):
        return None
    for slot in slots:
        if not isinstance(slot, dict) or slot.get("is_processing"):
            continue
        held = int(slot.get("n_prompt_tokens") or 0)
        off = abs(held - tokens)
        if off <= max(16, tokens // 50) and (best is None or off < best[0]):
            best = (off, int(slot["id"]))
    return best[1] if best is not None else None


def _log_failure(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("prompt keeper stopped", task=task.get_name(), error=repr(task.exception()))


class PromptKeepers:
    """The keepers of every engine whose prompts are kept, by engine name."""

    def __init__(self, keepers: Sequence[PromptKeeper]) -> None:
        self._by_engine = {k.engine.name: k for k in keepers}
        self._tasks: list[asyncio.Task[None]] = []

    def offer(self, engine: str, prefix: PromptPrefix, tokens: int) -> None:
        """A finished request's prompt, for the keeper of the engine that served it."""
        keeper = self._by_engine.get(engine)
        if keeper is not None:
            keeper.offer(prefix, tokens)

    def start(self) -> None:
        """Run every keeper in the background."""
        self._tasks = [
            asyncio.create_task(k.run(), name=f"keep-prompts-{k.engine.name}")
            for k in self._by_engine.values()
        ]
        for task in self._tasks:
            task.add_done_callback(_log_failure)

    async def stop(self, drain_s: float = DRAIN_S) -> None:
        """Stop the keepers once their offered prompts are saved, within `drain_s` (a save
        still in progress then is abandoned; its file has no manifest)."""
        deadline = time.monotonic() + drain_s
        running = [
            k for k, t in zip(self._by_engine.values(), self._tasks, strict=False) if not t.done()
        ]
        await asyncio.gather(*(k.drain(deadline) for k in running))
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def __iter__(self) -> Any:
        return iter(self._by_engine.values())
