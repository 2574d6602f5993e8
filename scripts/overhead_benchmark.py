"""What the proxy adds: requests/s and latency through it, against the same upstream directly.

    .venv/bin/python scripts/overhead_benchmark.py                 # everything (~10 minutes)
    .venv/bin/python scripts/overhead_benchmark.py --clients 1,10 --seconds 5 --streams 1000 \\
        --skip-litellm --out /tmp/overhead.md

The upstream is proxy/testing/instant_upstream.py, a stub of llama-server's HTTP side that
answers instantly (so the numbers are the proxy's cost alone, not a model's). Each target is
measured with closed-loop clients (each sends its next request when the last one is answered, on
its own keep-alive connection) for --seconds after a warm-up, streamed and not:

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
import datetime
import json
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent  # the repository
sys.path.insert(0, str(ROOT))  # scripts.overhead and the proxy package, from a checkout

from proxy.testing.llama_shapes import MODEL as STUB_MODEL  # noqa: E402
from scripts.overhead.client import closed_loop, many_streams, request_bytes  # noqa: E402
from scripts.overhead.processes import (  # noqa: E402
    Children,
    RssSampler,
    free_port,
    raise_open_files,
    wait_http,
)
from scripts.overhead.report import (  # noqa: E402
    LoopRow,
    StreamRow,
    git_head,
    litellm_version,
    loop_table,
    print_profile,
    stream_table,
)

STUB = "proxy.testing.instant_upstream"  # the upstream, run as `python -m`
BACKEND = "stub"  # the specproxy backend name and the LiteLLM model name
PROMPT = [{"role": "user", "content": "Write a haiku about a proxy that adds no latency."}]
TARGETS = ("direct", "specproxy", "litellm")
MODES = ("stream", "json")


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
            "-m",
            STUB,
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
        venv: Path = self.args.litellm_venv
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
        "- upstream: proxy/testing/instant_upstream.py, a stub of llama-server's HTTP side that "
        f"answers instantly (8 tokens; slow streams: {args.slow_chunks} chunks "
        f"{args.slow_delay_ms:g} ms apart), not a model",
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
