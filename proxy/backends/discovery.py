"""Replica discovery: a backend's `urls`, each host name standing for every address it has."""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import urllib.parse
from collections.abc import Sequence
from typing import Protocol


class Resolver(Protocol):
    """Turns a host name into the addresses of the servers behind it."""

    async def addresses(self, host: str, port: int) -> list[str]:
        """Every address `host` has now; raises OSError when it cannot be resolved."""
        ...


class SystemResolver:
    """The operating system's resolver (getaddrinfo): the IPv4 addresses, else the IPv6 ones.

    A Kubernetes headless Service answers with one A record per ready pod. IPv4 is preferred so
    that `localhost` (127.0.0.1 and ::1, one server) does not count as two replicas.
    """

    async def addresses(self, host: str, port: int) -> list[str]:
        """Every address `host` resolves to now, sorted."""
        infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
        v4 = {str(info[4][0]) for info in infos if info[0] == socket.AF_INET}
        v6 = {str(info[4][0]) for info in infos if info[0] == socket.AF_INET6}
        return sorted(v4 or v6)


def names_a_host(url: str) -> bool:
    """Whether this URL's host is a name to resolve (http), not an address or an https name.

    An https URL keeps its name: the server's certificate is issued for the name, not for each
    address behind it.
    """
    parts = urllib.parse.urlsplit(url)
    if parts.scheme != "http" or not parts.hostname:
        return False
    try:
        ipaddress.ip_address(parts.hostname)
    except ValueError:
        return True
    return False


def with_address(url: str, address: str) -> str:
    """`url` with its host replaced by `address` (port and path kept)."""
    parts = urllib.parse.urlsplit(url)
    host = f"[{address}]" if ":" in address else address
    port = parts.port or 80
    return urllib.parse.urlunsplit((parts.scheme, f"{host}:{port}", parts.path, "", ""))


async def discover(urls: Sequence[str], resolver: Resolver) -> dict[str, list[str] | str]:
    """Per configured URL: the replica URLs it stands for now, or why it could not be resolved."""
    found: dict[str, list[str] | str] = {}
    for url in urls:
        if not names_a_host(url):
            found[url] = [url]
            continue
        parts = urllib.parse.urlsplit(url)
        host = parts.hostname or ""
        try:
            addresses = await resolver.addresses(host, parts.port or 80)
        except (OSError, UnicodeError) as exc:  # UnicodeError: a name IDNA cannot encode
            found[url] = f"cannot resolve {host}: {exc}"
            continue
        found[url] = [with_address(url, a) for a in addresses]
    return found
