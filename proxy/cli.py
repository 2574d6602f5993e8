"""The `specproxy` command: serve, provision, models."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ipaddress
import os
import signal
import sys
from pathlib import Path

import uvloop
from aiohttp import web

from proxy.api.app import build_app
from proxy.api.state import POOL
from proxy.backends.launch import BackendConfigError, prepare_backends
from proxy.bench.command import bench
from proxy.config import ConfigError, Settings, load_settings
from proxy.llamacpp import DRAFT_N_MAX_SWEEP
from proxy.log import configure_logging, get_logger
from proxy.preflight import PreflightError, bind_listener, check_files
from proxy.prompts import BENCH_TASKS
from proxy.provision.models import CATALOG, GENERATED, resolve_model
from proxy.provision.pypi import ProvisionError

log = get_logger("specproxy")


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def ready_banner(settings: Settings, port: int, backends: list[str]) -> str:
    """What to paste into a client once the proxy is up."""
    base = f"http://{settings.host}:{port}/v1"
    return f"""
specproxy is ready at {base}  (backends: {", ".join(backends)}; model "auto" routes)

  from openai import OpenAI
  client = OpenAI(base_url="{base}", api_key="unused")
  stream = client.chat.completions.create(
      model="auto", stream=True,
      messages=[{{"role": "user", "content": "Write a Python LRU cache class."}}],
  )
  for chunk in stream:
      print(chunk.choices[0].delta.content or "", end="", flush=True)

  curl -s {base}/models   |   curl -s http://{settings.host}:{port}/health
"""


async def serve(settings: Settings) -> None:
    """Run the proxy until SIGINT/SIGTERM, then stop backends in order."""
    check_files(settings)
    # The port first: a taken one must fail before minutes of building and loading models.
    listener = bind_listener(settings.host, settings.port)
    try:
        specs = prepare_backends(settings)
    except BaseException:
        listener.close()
        raise
    app = build_app(settings, specs)
    runner = web.AppRunner(
        app,
        access_log=None,
        shutdown_timeout=settings.drain_timeout_s,
        # A client that hangs up cancels its request, which closes the upstream connection and
        # frees the llama-server slot instead of generating for nobody.
        handler_cancellation=True,
    )
    await runner.setup()
    site = web.SockSite(runner, listener)
    await site.start()
    port = runner.addresses[0][1] if runner.addresses else settings.port
    if not _is_loopback(settings.host) and not settings.accepted_keys():
        log.warning(
            "LISTENING BEYOND LOOPBACK WITHOUT API KEYS: anyone who can reach this port can use "
            "your models; set SPECPROXY_API_KEYS='[\"<key>\"]' or api_keys_file",
            host=settings.host,
        )
    log.info("listening; backends loading", url=f"http://{settings.host}:{port}", see="/health")
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    pool = app[POOL]
    waiter = asyncio.create_task(pool.wait_ready())
    stopper = asyncio.create_task(stop.wait())
    done, _ = await asyncio.wait({waiter, stopper}, return_when=asyncio.FIRST_COMPLETED)
    if waiter in done:
        print(ready_banner(settings, port, pool.names), flush=True)
        await stopper
    waiter.cancel()
    log.info("shutting down")
    await runner.cleanup()


def fetch_model(name: str, settings: Settings) -> Path:
    """Fetch one catalog model into the cache."""
    return resolve_model(name, settings.cache_dir / "models", settings.pypi_index)


def _load(args: argparse.Namespace) -> Settings:
    return load_settings(
        args.config, host=getattr(args, "host", None), port=getattr(args, "port", None)
    )


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `specproxy` console script."""
    parser = argparse.ArgumentParser(prog="specproxy", description=__doc__)
    parser.add_argument(
        "--config",
        type=Path,
        default=Path(os.environ["SPECPROXY_CONFIG"])
        if os.environ.get("SPECPROXY_CONFIG")
        else None,
        help="YAML config file (default: the embedded CPU config; env SPECPROXY_CONFIG)",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    p_serve = sub.add_parser("serve", help="start the backends and the proxy")
    p_serve.add_argument("--host", help="bind address (default 127.0.0.1)")
    p_serve.add_argument("--port", type=int, help="port (default 8080; 0 picks a free one)")
    p_prov = sub.add_parser("provision", help="build llama-server and fetch the configured models")
    p_prov.add_argument("extra_models", nargs="*", metavar="MODEL", help="more catalog models")
    sub.add_parser("models", help="list the model catalog")
    p_bench = sub.add_parser("bench", help="measure the lab's table on the configured backends")
    p_bench.add_argument("--out", type=Path, default=Path("bench-results"))
    p_bench.add_argument("--tokens", type=int, default=150, help="tokens generated per run")
    p_bench.add_argument("--repeats", type=int, default=1, help="runs per cell (median)")
    p_bench.add_argument(
        "--tasks",
        default=",".join(BENCH_TASKS),
        help="prose, code, echo (a short rewrite), edit (a whole-file edit of a real module)",
    )
    p_bench.add_argument("--temperatures", default="0,1")
    p_bench.add_argument(
        "--n-max", default=",".join(map(str, DRAFT_N_MAX_SWEEP)), help="draft n-max sweep"
    )
    args = parser.parse_args(argv)

    if args.command == "models":
        for name, model in CATALOG.items():
            print(f"{name:22} {model.size / 1e6:7.0f} MB  {model.note}")
        for name, note in GENERATED.items():
            print(f"{name:22} {'':>7}     {note}")
        return 0
    try:
        settings = _load(args)
        configure_logging(settings.log_format, settings.log_level)
        if args.command == "provision":
            check_files(settings)
            for name in args.extra_models:
                print(f"{name}: {fetch_model(name, settings)}")
            for spec in prepare_backends(settings):
                print(
                    f"{spec.config.name}: {spec.binary} {spec.model_path} {spec.draft_path or ''}"
                )
            return 0
        if args.command == "bench":
            unknown = set(args.tasks.split(",")) - set(BENCH_TASKS)
            if unknown:
                print(
                    f"specproxy bench: unknown task {', '.join(sorted(unknown))}; "
                    f"--tasks takes a comma-separated list of {', '.join(BENCH_TASKS)}",
                    file=sys.stderr,
                )
                return 2
            summary = asyncio.run(
                bench(
                    settings,
                    args.out,
                    tasks=args.tasks.split(","),
                    temperatures=[float(t) for t in args.temperatures.split(",")],
                    tokens=args.tokens,
                    repeats=args.repeats,
                    n_max_sweep=tuple(int(n) for n in args.n_max.split(",") if n),
                )
            )
            print(summary)
            return 0
        # uvloop: the event loop and its sockets in C, a good share of what a relayed request
        # costs the proxy (docs/overhead.md).
        with (
            contextlib.suppress(KeyboardInterrupt),
            asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner,
        ):
            runner.run(serve(settings))
    except (ConfigError, BackendConfigError, ProvisionError, PreflightError) as exc:
        print(f"specproxy: {exc}", file=sys.stderr)
        return 2
    return 0
