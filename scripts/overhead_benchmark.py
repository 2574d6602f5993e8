"""What the proxy adds: requests/s and latency through it, against the same upstream directly.

    .venv/bin/python scripts/overhead_benchmark.py                 # everything (~10 minutes)
    .venv/bin/python scripts/overhead_benchmark.py --clients 1,10 --seconds 5 --streams 1000 \\
        --skip-litellm --out /tmp/overhead.md

The upstream is scripts/instant_upstream.py, a stub of llama-server's HTTP side that answers
instantly (so the numbers are the proxy's cost alone, not a model's). Each target is measured
with closed-loop clients (each sends its next request when the last one is answered, on its
own keep-alive connection) for --seconds after a warm-up, streamed and not:

    direct             the stub itself: the floor, and the check that the client is not the limit
    specproxy (stub)   `specproxy serve` with the stub as its one `url` backend, model pinned
    specproxy (auto)   the same proxy, model `auto` (classified and routed)
    LiteLLM            LiteLLM's proxy (installed into its own venv), the stub as an openai/ model

Then --streams slow streams at once (the stub paces each: --slow-chunks chunks --slow-delay-ms
apart) through a freshly started proxy: how many complete, the wall time against direct, and
the proxy's resident memory per open stream (VmRSS before and at peak, from /proc).

The client runs in its own process (this script's `client` command), on its own CPU when the
machine has two or more (the servers on the rest). Every process this script starts is in its
own process group and killed on exit, Ctrl-C included.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import json
import os
import pstats
import resource
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
STUB = ROOT / "scripts" / "instant_upstream.py"
STUB_MODEL = "stub.gguf"  # what the stub calls its model (scripts/instant_upstream.py)
BACKEND = "stub"  # the specproxy backend name and the LiteLLM model name
PROMPT = [{"role": "user", "content": "Write a haiku about a proxy that adds no latency."}]
TARGETS = ("direct", "specproxy", "litellm")
MODES = ("stream", "json")

# --- the client (its own process: `overhead_benchmark.py client ...`) ------------------------


class HttpConnection(asyncio.Protocol):
    """A bare HTTP/1.1 keep-alive client connection: one request at a time, answers parsed
    just enough (Content-Length or chunked) to know when each ends. Cheaper per request than
    aiohttp's client, so the direct figure measures the stub and not the client."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()
        self.closed = False
        self.must_close = False
        self._done: asyncio.Future[tuple[int, bytes]] | None = None
        self._reset()

    def _reset(self) -> None:
        self.status: int | None = None
        self.length: int | None = None
        self.chunked = False
        self.body = bytearray()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        done = self._done
        if done is not None and not done.done():
            if self.status is not None and self.length is None and not self.chunked:
                done.set_result((self.status, bytes(self.body + self.buf)))  # read to close
            else:
                done.set_exception(ConnectionError(f"connection lost: {exc}"))

    def data_received(self, data: bytes) -> None:
        self.buf += data
        try:
            self._parse()
        except ValueError as exc:
            if self._done is not None and not self._done.done():
                self._done.set_exception(exc)
            if self.transport is not None:
                self.transport.close()

    def _parse(self) -> None:
        buf = self.buf
        if self.status is None:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                return
            lines = bytes(buf[:end]).decode("latin-1").split("\r\n")
            self.status = int(lines[0].split(" ", 2)[1])
            for line in lines[1:]:
                name, _, value = line.partition(":")
                name, value = name.strip().lower(), value.strip().lower()
                if name == "content-length":
                    self.length = int(value)
                elif name == "transfer-encoding" and "chunked" in value:
                    self.chunked = True
                elif name == "connection" and value == "close":
                    self.must_close = True
            del buf[: end + 4]
        if self.length is not None:
            if len(buf) >= self.length:
                body = bytes(buf[: self.length])
                del buf[: self.length]
                self._finish(body)
            return
        if not self.chunked:
            self.body += buf
            buf.clear()
            return  # the body runs to the connection's close
        pos = 0
        while True:
            eol = buf.find(b"\r\n", pos)
            if eol < 0:
                break
            size = int(bytes(buf[pos:eol]).split(b";")[0], 16)
            if size == 0:
                if len(buf) < eol + 4:
                    break
                del buf[: eol + 4]
                self._finish(bytes(self.body))
                return
            if len(buf) < eol + 2 + size + 2:
                break
            self.body += buf[eol + 2 : eol + 2 + size]
            pos = eol + 2 + size + 2
        del buf[:pos]

    def _finish(self, body: bytes) -> None:
        status = self.status or 0
        self._reset()
        if self._done is not None and not self._done.done():
            self._done.set_result((status, body))

    async def request(self, payload: bytes) -> tuple[int, bytes]:
        """Send one request; its status and body (de-chunked)."""
        if self.closed or self.transport is None:
            raise ConnectionError("connection closed")
        self._done = asyncio.get_running_loop().create_future()
        self.transport.write(payload)
        return await self._done

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()


async def connect(host: str, port: int) -> HttpConnection:
    loop = asyncio.get_running_loop()
    _, conn = await loop.create_connection(HttpConnection, host, port)
    sock = conn.transport.get_extra_info("socket") if conn.transport else None
    if sock is not None:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return conn


def request_bytes(host: str, port: int, path: str, body: dict[str, Any]) -> bytes:
    data = json.dumps(body).encode()
    head = (
        f"POST {path} HTTP/1.1\r\n"
        f"Host: {host}:{port}\r\n"
        "Content-Type: application/json\r\n"
        "Accept: */*\r\n"
        "Authorization: Bearer sk-overhead-benchmark\r\n"
        f"Content-Length: {len(data)}\r\n\r\n"
    )
    return head.encode() + data


def answered(stream: bool, status: int, body: bytes) -> bool:
    """Whether the answer is a whole, successful completion of the shape asked for."""
    if status != 200:
        return False
    if stream:
        return body.rstrip().endswith(b"data: [DONE]") and b'"choices"' in body
    return body.startswith(b"{") and b'"choices"' in body


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (0-100) by linear interpolation; nan for no values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


async def closed_loop(
    host: str,
    port: int,
    payload: bytes,
    stream: bool,
    clients: int,
    warmup_s: float,
    seconds: float,
    timeout_s: float,
) -> dict[str, Any]:
    """`clients` loops of request-answer on their own connections; what finished in the window."""
    start = time.perf_counter() + warmup_s
    end = start + seconds
    latencies: list[float] = []
    errors: list[str] = []

    async def loop() -> None:
        conn: HttpConnection | None = None
        try:
            while time.perf_counter() < end:
                try:
                    if conn is None or conn.closed:
                        conn = await asyncio.wait_for(connect(host, port), timeout_s)
                    sent = time.perf_counter()
                    status, body = await asyncio.wait_for(conn.request(payload), timeout_s)
                    got = time.perf_counter()
                    if conn.must_close:
                        conn.close()
                        conn = None
                    if not start <= got <= end:
                        continue
                    if answered(stream, status, body):
                        latencies.append(got - sent)
                    else:
                        errors.append(f"{status}: {body[:200]!r}")
                except (OSError, TimeoutError, ValueError) as exc:
                    if start <= time.perf_counter() <= end:
                        errors.append(f"{exc.__class__.__name__}: {exc}")
                    if conn is not None:
                        conn.close()
                    conn = None
                    await asyncio.sleep(0.01)
        finally:
            if conn is not None:
                conn.close()

    await asyncio.gather(*(loop() for _ in range(clients)))
    return {
        "completed": len(latencies),
        "errors": len(errors),
        "first_errors": errors[:3],
        "rps": len(latencies) / seconds,
        "p50_ms": 1000 * percentile(latencies, 50),
        "p99_ms": 1000 * percentile(latencies, 99),
    }


async def many_streams(
    host: str, port: int, payload: bytes, count: int, connecting: int, timeout_s: float
) -> dict[str, Any]:
    """`count` streams at once, each on its own connection: the connections are opened first
    (at most `connecting` at a time, so a listen backlog never drops one), then every request
    is sent in one go; how many streams finished, and when, from the first request sent."""
    gate = asyncio.Semaphore(connecting)
    durations: list[float] = []
    errors: list[str] = []
    open_now = 0
    peak_open = 0
    ended = 0.0

    async def opened() -> HttpConnection | None:
        try:
            async with gate:
                return await asyncio.wait_for(connect(host, port), timeout_s)
        except (OSError, TimeoutError) as exc:
            errors.append(f"connect: {exc.__class__.__name__}: {exc}")
            return None

    async def one(conn: HttpConnection) -> None:
        nonlocal open_now, peak_open, ended
        try:
            sent = time.perf_counter()
            open_now += 1
            peak_open = max(peak_open, open_now)
            try:
                status, body = await asyncio.wait_for(conn.request(payload), timeout_s)
            finally:
                open_now -= 1
            got = time.perf_counter()
            ended = max(ended, got)
            if answered(True, status, body):
                durations.append(got - sent)
            else:
                errors.append(f"{status}: {body[:200]!r}")
        except (OSError, TimeoutError, ValueError) as exc:
            errors.append(f"{exc.__class__.__name__}: {exc}")
        finally:
            conn.close()

    connecting_since = time.perf_counter()
    conns = [c for c in await asyncio.gather(*(opened() for _ in range(count))) if c]
    began = time.perf_counter()
    await asyncio.gather(*(one(c) for c in conns))
    return {
        "completed": len(durations),
        "errors": len(errors),
        "first_errors": sorted(set(errors))[:3],
        "peak_open": peak_open,
        "connect_s": began - connecting_since,
        "wall_s": (ended or time.perf_counter()) - began,
        "p50_s": percentile(durations, 50),
        "p99_s": percentile(durations, 99),
    }


def client_main(args: argparse.Namespace) -> None:
    """The `client` command: one measurement, its result as one JSON line on stdout."""
    if args.cpus:
        os.sched_setaffinity(0, {int(c) for c in args.cpus.split(",")})
    raise_open_files()
    stream = args.mode == "stream"
    body: dict[str, Any] = {"model": args.model, "messages": PROMPT, "max_tokens": 64}
    if stream:
        body["stream"] = True
    payload = request_bytes(args.host, args.port, "/v1/chat/completions", body)
    if args.streams:
        result = asyncio.run(
            many_streams(args.host, args.port, payload, args.streams, args.connecting, args.timeout)
        )
    else:
        result = asyncio.run(
            closed_loop(
                args.host,
                args.port,
                payload,
                stream,
                args.clients,
                args.warmup,
                args.seconds,
                args.timeout,
            )
        )
    print(json.dumps(result), flush=True)


# --- processes -------------------------------------------------------------------------------


def raise_open_files() -> None:
    """Thousands of streams need thousands of sockets: lift the soft limit to the hard one."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard > soft:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def free_port() -> int:
    """A loopback port nobody listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Children:
    """Every process the benchmark starts, each in its own process group, all ended on exit."""

    def __init__(self) -> None:
        self.processes: list[subprocess.Popen[bytes]] = []

    def spawn(
        self,
        argv: list[str],
        log: Path,
        cpus: set[int] | None = None,
        env: dict[str, str] | None = None,
    ) -> subprocess.Popen[bytes]:
        with log.open("ab") as out:
            process = subprocess.Popen(
                argv,
                cwd=ROOT,
                env={**os.environ, **(env or {})},
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.processes.append(process)
        if cpus:
            # Before it has started any thread or child: those inherit the affinity.
            with contextlib.suppress(OSError):
                os.sched_setaffinity(process.pid, cpus)
        return process

    def stop(self, process: subprocess.Popen[bytes], grace_s: float = 10.0) -> None:
        """SIGTERM to its whole group, SIGKILL after grace_s."""
        if process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(grace_s)
        # Whatever the group still holds (a worker the leader left behind) goes too.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(5)
        if process in self.processes:
            self.processes.remove(process)

    def stop_all(self) -> None:
        for process in reversed(list(self.processes)):
            self.stop(process)


def wait_http(url: str, timeout_s: float, process: subprocess.Popen[bytes], log: Path) -> None:
    """Poll url until it answers 200 (and, for specproxy's /health, status ok)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"{process.args!r} exited:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                body = resp.read()
                if resp.status == 200 and b'"starting"' not in body and b'"loading"' not in body:
                    return
        except OSError:
            pass
        time.sleep(0.2)
    raise SystemExit(f"{url} not ready after {timeout_s:.0f}s:\n{log.read_text()[-3000:]}")


def group_pids(leader: int) -> list[int]:
    """The processes of leader's process group (a server and its workers)."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[2]) == leader:  # fields: state, ppid, pgrp
            pids.append(int(entry))
    return pids or [leader]


def status_kib(pid: int, key: str) -> int:
    """A /proc/<pid>/status figure in KiB (VmRSS, VmHWM); 0 once it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


class RssSampler:
    """The resident memory of a process group, sampled every 50 ms on a thread: its peak."""

    def __init__(self, leader: int) -> None:
        self.leader = leader
        self.pids = group_pids(leader)
        self.before = self.rss()
        self.peak = self.before
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def rss(self) -> int:
        return sum(status_kib(p, "VmRSS") for p in self.pids)

    def _run(self) -> None:
        rescan = time.monotonic() + 2
        while not self._stop.wait(0.05):
            if time.monotonic() > rescan:
                self.pids = group_pids(self.leader)
                rescan = time.monotonic() + 2
            self.peak = max(self.peak, self.rss())

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        if len(self.pids) == 1:  # one process: its high-water mark misses no spike
            self.peak = max(self.peak, status_kib(self.pids[0], "VmHWM"))


# --- the servers under test ------------------------------------------------------------------


@dataclass
class Target:
    """A server the client talks to: where, with which models, and its process (None: the stub
    itself, which the benchmark started once)."""

    name: str
    port: int
    models: list[tuple[str, str]]  # (row label, model the request names)
    process: subprocess.Popen[bytes] | None = None


@dataclass
class Bench:
    args: argparse.Namespace
    children: Children
    work: Path
    client_cpus: set[int] | None
    server_cpus: set[int] | None
    stub_port: int = 0
    slow_port: int = 0
    notes: list[str] = field(default_factory=list)

    def start_stub(self) -> None:
        self.stub_port, self.slow_port = free_port(), free_port()
        log = self.work / "stub.log"
        argv = [
            sys.executable,
            str(STUB),
            "--port",
            str(self.stub_port),
            "--slow-port",
            str(self.slow_port),
            "--slow-chunks",
            str(self.args.slow_chunks),
            "--slow-delay-ms",
            str(self.args.slow_delay_ms),
        ]
        process = self.children.spawn(argv, log, self.server_cpus)
        wait_http(f"http://127.0.0.1:{self.stub_port}/health", 30, process, log)

    def start_specproxy(self, upstream_port: int, tag: str, profile: Path | None = None) -> Target:
        port = free_port()
        config = self.work / f"specproxy-{tag}.yaml"
        config.write_text(
            "# overhead benchmark: one external backend, the instant stub; no calibration\n"
            "host: 127.0.0.1\n"
            f"port: {port}\n"
            "calibration_requests: 0\n"
            "explore_share: 0\n"
            "log_format: json\n"
            f"cache_dir: {self.work / 'cache'}\n"
            f"scoreboard_file: {self.work / f'scoreboard-{tag}.json'}\n"
            "max_queue: 100000\n"
            "backends:\n"
            f"  - name: {BACKEND}\n"
            f"    url: http://127.0.0.1:{upstream_port}\n"
            # The stub keeps connections as specproxy's build does: the relay pools them.
            "    specproxy_build: true\n"
            "    max_concurrency: 100000\n"
        )
        log = self.work / f"specproxy-{tag}.log"
        specproxy = ROOT / ".venv" / "bin" / "specproxy"
        if profile is not None:
            entry = [sys.executable, "-m", "cProfile", "-o", str(profile), "-m", "proxy"]
        elif specproxy.exists():
            entry = [str(specproxy)]
        else:
            entry = [sys.executable, "-m", "proxy"]
        argv = [*entry, "--config", str(config), "serve", "--port", str(port)]
        process = self.children.spawn(argv, log, self.server_cpus)
        wait_http(f"http://127.0.0.1:{port}/health", 60, process, log)
        models = [("specproxy (stub)", BACKEND), ("specproxy (auto)", "auto")]
        return Target("specproxy", port, models, process)

    def litellm_venv(self) -> Path:
        """LiteLLM's proxy in a venv of its own (made once, then reused)."""
        venv = self.args.litellm_venv
        marker = venv / ".specproxy-installed"
        if marker.exists() and (venv / "bin" / "litellm").exists():
            return venv
        print(f"installing LiteLLM's proxy into {venv} (once) ...", file=sys.stderr, flush=True)
        if not (venv / "bin" / "python").exists():
            subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run(
            [str(venv / "bin" / "pip"), "install", "--quiet", "litellm[proxy]"], check=True
        )
        marker.touch()
        return venv

    def start_litellm(self, upstream_port: int, tag: str) -> Target:
        venv = self.litellm_venv()
        port = free_port()
        config = self.work / f"litellm-{tag}.yaml"
        config.write_text(
            "# overhead benchmark: the instant stub as an OpenAI-compatible model\n"
            "model_list:\n"
            f"  - model_name: {BACKEND}\n"
            "    litellm_params:\n"
            f"      model: openai/{STUB_MODEL}\n"
            f"      api_base: http://127.0.0.1:{upstream_port}/v1\n"
            "      api_key: sk-stub\n"
            "litellm_settings:\n"
            "  drop_params: true\n"
            "  telemetry: false\n"
        )
        log = self.work / f"litellm-{tag}.log"
        argv = [
            str(venv / "bin" / "litellm"),
            "--config",
            str(config),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--num_workers",
            "1",
        ]
        env = {
            "LITELLM_LOCAL_MODEL_COST_MAP": "True",  # no fetch of the price list at start
            "LITELLM_DANGEROUSLY_PERMIT_WEAK_OR_UNSET_MASTER_KEY": "true",
            "LITELLM_LOG": "ERROR",
            "LITELLM_TELEMETRY": "False",
            "DISABLE_SCHEMA_UPDATE": "true",
        }
        process = self.children.spawn(argv, log, self.server_cpus, env)
        wait_http(f"http://127.0.0.1:{port}/health/liveliness", 180, process, log)
        return Target("LiteLLM", port, [("LiteLLM", BACKEND)], process)

    def start(self, name: str, slow: bool, tag: str, profile: Path | None = None) -> Target:
        upstream = self.slow_port if slow else self.stub_port
        if name == "direct":
            return Target("direct", upstream, [("direct", STUB_MODEL)])
        if name == "specproxy":
            return self.start_specproxy(upstream, tag, profile)
        return self.start_litellm(upstream, tag)

    def client(
        self, label: str, port: int, model: str, mode: str, **options: Any
    ) -> dict[str, Any]:
        argv = [
            sys.executable,
            str(Path(__file__).resolve()),
            "client",
            "--port",
            str(port),
            "--model",
            model,
            "--mode",
            mode,
        ]
        for key, value in options.items():
            argv += [f"--{key.replace('_', '-')}", str(value)]
        if self.client_cpus:
            argv += ["--cpus", ",".join(map(str, sorted(self.client_cpus)))]
        done = subprocess.run(
            argv, cwd=ROOT, capture_output=True, text=True, timeout=self.args.client_timeout
        )
        if done.returncode != 0:
            raise SystemExit(f"client failed ({done.returncode}):\n{done.stderr[-3000:]}")
        result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
        if result.get("errors"):
            what = (
                f"{options['streams']} streams"
                if options.get("streams")
                else (f"{options.get('clients')} clients {mode}")
            )
            self.notes.append(
                f"{label}, {what}: {result['errors']} errors, e.g. "
                + "; ".join(e[:300] for e in result["first_errors"])
            )
        return result


# --- the run ---------------------------------------------------------------------------------


@dataclass
class LoopRow:
    setting: str
    clients: int
    mode: str
    result: dict[str, Any]


@dataclass
class StreamRow:
    setting: str
    streams: int
    result: dict[str, Any]
    rss_before_kib: int | None = None
    rss_peak_kib: int | None = None


def run_loops(bench: Bench, target: Target) -> list[LoopRow]:
    args = bench.args
    rows = []
    for label, model in target.models:
        for mode in args.modes:
            for clients in args.clients:
                result = bench.client(
                    label,
                    target.port,
                    model,
                    mode,
                    clients=clients,
                    seconds=args.seconds,
                    warmup=args.warmup,
                    timeout=60,
                )
                rows.append(LoopRow(label, clients, mode, result))
                print(
                    f"  {label:18} {clients:>4} clients {mode:6} "
                    f"{result['rps']:9.1f} req/s  p50 {result['p50_ms']:7.2f} ms  "
                    f"p99 {result['p99_ms']:7.2f} ms  errors {result['errors']}",
                    file=sys.stderr,
                    flush=True,
                )
    return rows


def run_streams(bench: Bench, name: str) -> list[StreamRow]:
    rows = []
    for count in bench.args.streams:
        target = bench.start(name, slow=True, tag=f"streams-{count}")
        try:
            label = target.models[0][0]
            model = target.models[0][1]
            # A few requests first, so the baseline is a proxy that has served, not a cold one.
            bench.client(label, target.port, model, "stream", streams=min(count, 10), timeout=60)
            # A stream not done by --stream-timeout counts as not completed.
            options = {"streams": count, "timeout": bench.args.stream_timeout, "connecting": 64}
            if target.process is None:
                result = bench.client(label, target.port, model, "stream", **options)
                row = StreamRow(label, count, result)
            else:
                with RssSampler(target.process.pid) as rss:
                    result = bench.client(label, target.port, model, "stream", **options)
                row = StreamRow(label, count, result, rss.before, rss.peak)
            rows.append(row)
            print(
                f"  {label:18} {count:>5} streams: {result['completed']} completed, "
                f"peak open {result['peak_open']}, wall {result['wall_s']:.2f} s",
                file=sys.stderr,
                flush=True,
            )
        finally:
            if target.process is not None:
                bench.children.stop(target.process)
    return rows


def fmt(value: float | None, digits: int = 1) -> str:
    if value is None or value != value:  # None or nan
        return "—"
    return f"{value:,.{digits}f}"


def loop_table(rows: list[LoopRow]) -> str:
    by = {(r.setting, r.clients, r.mode): r.result for r in rows}
    lines = [
        "| setting | clients | mode | req/s | p50 ms | p99 ms | added p50 ms vs direct "
        "| specproxy / LiteLLM req/s | errors |",
        "|---|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        res = r.result
        direct = by.get(("direct", r.clients, r.mode))
        added = (
            res["p50_ms"] - direct["p50_ms"]
            if direct is not None and r.setting != "direct"
            else None
        )
        litellm = by.get(("LiteLLM", r.clients, r.mode))
        ratio = (
            res["rps"] / litellm["rps"]
            if litellm and litellm["rps"] > 0 and r.setting.startswith("specproxy")
            else None
        )
        mode = "streamed" if r.mode == "stream" else "not streamed"
        lines.append(
            f"| {r.setting} | {r.clients} | {mode} | {fmt(res['rps'])} | {fmt(res['p50_ms'], 2)} "
            f"| {fmt(res['p99_ms'], 2)} | {fmt(added, 2)} | {fmt(ratio, 2)} | {res['errors']} |"
        )
    return "\n".join(lines)


def stream_table(rows: list[StreamRow]) -> str:
    walls = {(r.setting, r.streams): r.result["wall_s"] for r in rows}
    lines = [
        "| setting | streams | completed | peak open | wall s | wall / direct | p50 stream s "
        "| p99 stream s | RSS before MiB | RSS peak MiB | KiB per stream |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        res = r.result
        direct = walls.get(("direct", r.streams))
        vs = res["wall_s"] / direct if direct and r.setting != "direct" else None
        before = r.rss_before_kib / 1024 if r.rss_before_kib is not None else None
        peak = r.rss_peak_kib / 1024 if r.rss_peak_kib is not None else None
        per = (
            (r.rss_peak_kib - r.rss_before_kib) / r.streams
            if r.rss_peak_kib is not None and r.rss_before_kib is not None
            else None
        )
        lines.append(
            f"| {r.setting} | {r.streams} | {res['completed']} | {res['peak_open']} "
            f"| {fmt(res['wall_s'], 2)} | {fmt(vs, 2)} | {fmt(res['p50_s'], 2)} "
            f"| {fmt(res['p99_s'], 2)} | {fmt(before)} | {fmt(peak)} | {fmt(per)} |"
        )
    return "\n".join(lines)


def git_head() -> str:
    try:
        done = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        )
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=ROOT,
            capture_output=True,
            text=True,
        ).stdout.strip()
        return done.stdout.strip() + (" (with uncommitted changes)" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def litellm_version(venv: Path) -> str:
    done = subprocess.run(
        [
            str(venv / "bin" / "python"),
            "-c",
            "import importlib.metadata as m;print(m.version('litellm'))",
        ],
        capture_output=True,
        text=True,
    )
    return done.stdout.strip() or "unknown"


def report(
    bench: Bench, loops: list[LoopRow], streams: list[StreamRow], command: str, took_s: float
) -> str:
    args = bench.args
    if bench.client_cpus:
        pinning = (
            f"client pinned to CPU {','.join(map(str, sorted(bench.client_cpus)))}, servers "
            f"(stub and proxy) to CPU {','.join(map(str, sorted(bench.server_cpus or [])))}"
        )
    else:
        pinning = "no CPU pinning"
    import aiohttp  # the proxy's HTTP stack: its version is part of the result

    versions = f"Python {sys.version.split()[0]}, aiohttp {aiohttp.__version__}"
    if "litellm" in args.targets:
        versions += f", LiteLLM {litellm_version(args.litellm_venv)}"
    parts = [
        "# Proxy overhead (CPU)",
        "",
        f"- date: {datetime.datetime.now().astimezone().isoformat(timespec='seconds')}",
        f"- commit: {git_head()}",
        f"- command: `{command}`",
        f"- machine: {os.cpu_count()} CPUs ({pinning}); {versions}; took {took_s:.0f} s",
        "- upstream: scripts/instant_upstream.py, a stub of llama-server's HTTP side that answers "
        f"instantly (8 tokens; slow streams: {args.slow_chunks} chunks {args.slow_delay_ms:g} ms "
        "apart), not a model",
        "",
        f"## Closed-loop clients ({args.seconds:g} s per cell after {args.warmup:g} s warm-up)",
        "",
        loop_table(loops) if loops else "(none measured)",
        "",
        "## Concurrent slow streams",
        "",
        "Each stream on its own connection, through a freshly started proxy: the client opens "
        "every connection first (64 at a time), then sends all the requests at once; wall time "
        "runs from the first request sent to the last stream's end. A stream not done within "
        f"{args.stream_timeout:g} s counts as not completed. Peak open: streams sent and not "
        "yet answered at one moment. KiB per stream: (RSS peak - RSS before) / streams, the "
        "proxy's whole process group, from /proc (before: after 10 warm-up streams).",
        "",
        stream_table(streams) if streams else "(none measured)",
    ]
    if bench.notes:
        parts += ["", "Errors seen:", ""] + [f"- {n}" for n in bench.notes[:20]]
    return "\n".join(parts) + "\n"


def print_profile(path: Path, top: int = 15) -> None:
    """The proxy's own functions by cumulative time."""
    stats = pstats.Stats(str(path))
    rows = []
    for (filename, line, func), (_cc, nc, _tt, ct, _callers) in stats.stats.items():  # type: ignore[attr-defined]
        if f"{os.sep}proxy{os.sep}" in filename and str(ROOT) in filename:
            rows.append((ct, nc, f"{Path(filename).relative_to(ROOT)}:{line}({func})"))
    rows.sort(reverse=True)
    print(f"\ntop {top} cumulative functions in proxy/ ({path}):", file=sys.stderr)
    for ct, nc, where in rows[:top]:
        print(f"  {ct:8.3f} s  {nc:>9} calls  {where}", file=sys.stderr)


def csv_ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def csv_choice(choices: tuple[str, ...]) -> Callable[[str], list[str]]:
    def parse(text: str) -> list[str]:
        picked = [x.strip() for x in text.split(",") if x.strip()]
        unknown = set(picked) - set(choices)
        if unknown:
            raise argparse.ArgumentTypeError(
                f"unknown {', '.join(sorted(unknown))}; choose from {', '.join(choices)}"
            )
        return picked

    return parse


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "specproxy"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command")
    client = sub.add_parser("client", help="(internal) one measurement; JSON on stdout")
    client.add_argument("--host", default="127.0.0.1")
    client.add_argument("--port", type=int, required=True)
    client.add_argument("--model", required=True)
    client.add_argument("--mode", choices=MODES, default="json")
    client.add_argument("--clients", type=int, default=1)
    client.add_argument("--seconds", type=float, default=5.0)
    client.add_argument("--warmup", type=float, default=1.0)
    client.add_argument("--streams", type=int, default=0)
    client.add_argument("--connecting", type=int, default=64)
    client.add_argument("--timeout", type=float, default=60.0)
    client.add_argument("--cpus")

    parser.add_argument("--clients", type=csv_ints, default=[1, 10, 100])
    parser.add_argument("--seconds", type=float, default=10.0, help="measured per cell")
    parser.add_argument("--warmup", type=float, default=1.0, help="unmeasured, before each cell")
    parser.add_argument("--streams", type=csv_ints, default=[1000, 4000], help="'' for none")
    parser.add_argument(
        "--modes", type=csv_choice(MODES), default=list(MODES), help="stream, json or both"
    )
    parser.add_argument(
        "--targets", type=csv_choice(TARGETS), default=list(TARGETS), help="what to measure"
    )
    parser.add_argument("--skip-litellm", action="store_true", help="no LiteLLM (no install)")
    parser.add_argument("--litellm-venv", type=Path, default=cache_dir() / "litellm-venv")
    parser.add_argument("--slow-chunks", type=int, default=20)
    parser.add_argument("--slow-delay-ms", type=float, default=50.0)
    parser.add_argument(
        "--stream-timeout", type=float, default=120.0, help="a slow stream not done by then fails"
    )
    parser.add_argument("--no-pin", action="store_true", help="do not pin client and servers")
    parser.add_argument(
        "--profile",
        type=Path,
        help="run specproxy under cProfile, write the profile here and print its top functions",
    )
    parser.add_argument("--client-timeout", type=float, default=900.0)
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "overhead-cpu.md")
    args = parser.parse_args(argv)
    if args.command is None and args.skip_litellm and "litellm" in args.targets:
        args.targets.remove("litellm")
    if args.command is None and "direct" not in args.targets:
        args.targets.insert(0, "direct")  # the reference every other row is read against
    return args


def plan_cpus(no_pin: bool) -> tuple[set[int] | None, set[int] | None]:
    """The client on the last CPU, the servers on the others; None when not pinning."""
    cpus = sorted(os.sched_getaffinity(0))
    if no_pin or len(cpus) < 2:
        return None, None
    return {cpus[-1]}, set(cpus[:-1])


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.command == "client":
        client_main(args)
        return
    raise_open_files()
    command = shlex.join(["python", *sys.argv]) if argv is None else shlex.join(argv)
    client_cpus, server_cpus = plan_cpus(args.no_pin)
    if client_cpus:
        os.sched_setaffinity(0, client_cpus)  # this process only waits and samples
    children = Children()

    def ended(signum: int, _frame: object) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, ended)
    began = time.monotonic()
    loops: list[LoopRow] = []
    streams: list[StreamRow] = []
    with tempfile.TemporaryDirectory(prefix="overhead-") as tmp:
        bench = Bench(args, children, Path(tmp), client_cpus, server_cpus)
        try:
            if "litellm" in args.targets:
                bench.litellm_venv()  # the install is not part of any measurement
            bench.start_stub()
            for name in args.targets:
                print(f"{name}:", file=sys.stderr, flush=True)
                if args.clients and args.modes:
                    profile = args.profile if name == "specproxy" else None
                    target = bench.start(name, slow=False, tag="loops", profile=profile)
                    try:
                        loops += run_loops(bench, target)
                    finally:
                        if target.process is not None:
                            bench.children.stop(target.process, grace_s=60)
                streams += run_streams(bench, name)
        except BaseException:
            logs = sorted(Path(tmp).glob("*.log"))
            for log in logs:
                tail = log.read_text(errors="replace")[-1500:]
                print(f"--- {log.name} (tail)\n{tail}", file=sys.stderr)
            raise
        finally:
            children.stop_all()
    text = report(bench, loops, streams, command, time.monotonic() - began)
    print(text)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(f"written to {args.out}", file=sys.stderr)
    if args.profile is not None and args.profile.exists():
        print_profile(args.profile)


if __name__ == "__main__":
    main()
