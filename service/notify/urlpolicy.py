"""Which webhook targets may be called: checked at subscription time, at delivery, and on every redirect hop.

Rules, in order:
1. scheme http/https, a host, no user:password in the URL;
2. cloud metadata and link-local addresses (169.254.0.0/16, fe80::/10, fd00:ec2::254, ...) are always refused;
3. anything in the deny list (CIDRs or host names, `*.suffix` allowed) is refused;
4. addresses that are not globally routable (loopback, RFC 1918, CGNAT, ULA, ...) are refused
   unless the address or the host name is in the allow list;
5. unspecified and multicast addresses are always refused.
Every address a name resolves to must pass (so a name with one public and one private A record fails).
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from urllib.parse import urlsplit

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

ALWAYS_DENY_NETS: tuple[IPNetwork, ...] = tuple(ipaddress.ip_network(n) for n in (
    "169.254.0.0/16",       # link-local, incl. 169.254.169.254 (AWS/GCP/Azure/OpenStack metadata)
    "fe80::/10",            # IPv6 link-local
    "fd00:ec2::254/128",    # AWS IMDS over IPv6
    "100.100.100.200/32",   # Alibaba Cloud metadata
))
ALWAYS_DENY_HOSTS = ("metadata.google.internal", "metadata.goog", "metadata")


class UrlRefused(ValueError):
    """The target is not allowed; the message says why (and never echoes the URL path)."""


@dataclass(frozen=True, slots=True)
class UrlPolicy:
    allow_nets: tuple[IPNetwork, ...] = ()
    allow_hosts: tuple[str, ...] = ()
    deny_nets: tuple[IPNetwork, ...] = ()
    deny_hosts: tuple[str, ...] = ()

    @classmethod
    def from_lists(cls, allow: Iterable[str] = (), deny: Iterable[str] = ()) -> UrlPolicy:
        a_nets, a_hosts = _split(allow)
        d_nets, d_hosts = _split(deny)
        return cls(a_nets, a_hosts, d_nets, d_hosts)


def _split(entries: Iterable[str]) -> tuple[tuple[IPNetwork, ...], tuple[str, ...]]:
    nets: list[IPNetwork] = []
    hosts: list[str] = []
    for e in entries:
        e = e.strip().lower()
        if not e:
            continue
        try:
            nets.append(ipaddress.ip_network(e, strict=False))
        except ValueError:
            hosts.append(e.rstrip("."))
    return tuple(nets), tuple(hosts)


def _host_matches(host: str, patterns: Iterable[str]) -> bool:
    for p in patterns:
        if p.startswith("*."):
            if host.endswith(p[1:]):
                return True
        elif host == p:
            return True
    return False


def _in(ip: IPAddress, nets: Iterable[IPNetwork]) -> bool:
    return any(ip.version == n.version and ip in n for n in nets)


Resolver = Callable[[str, int], list[IPAddress]]


def resolve(host: str, port: int) -> list[IPAddress]:
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return sorted({ipaddress.ip_address(i[4][0].split("%")[0]) for i in infos}, key=str)


def check_url(url: str, policy: UrlPolicy, resolver: Resolver = resolve) -> list[IPAddress]:
    """Raise UrlRefused unless `url` may be called; return the addresses it resolved to."""
    try:
        parts = urlsplit(url)
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError as exc:
        raise UrlRefused(f"malformed URL: {exc}") from None
    if parts.scheme not in ("http", "https"):
        raise UrlRefused(f"scheme {parts.scheme!r} is not allowed (use http or https)")
    host = (parts.hostname or "").rstrip(".").lower()
    if not host:
        raise UrlRefused("URL has no host")
    if parts.username is not None or parts.password is not None:
        raise UrlRefused("credentials in the URL are not allowed (use the subscription secret)")
    if _host_matches(host, ALWAYS_DENY_HOSTS) or _host_matches(host, policy.deny_hosts):
        raise UrlRefused(f"host {host} is deny-listed")
    try:
        addrs = [ipaddress.ip_address(host)]
    except ValueError:
        try:
            addrs = resolver(host, port)
        except (OSError, UnicodeError) as exc:
            raise UrlRefused(f"cannot resolve {host}: {exc}") from None
    if not addrs:
        raise UrlRefused(f"{host} resolves to no address")
    host_allowed = _host_matches(host, policy.allow_hosts)
    for ip in addrs:
        if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped
        if _in(ip, ALWAYS_DENY_NETS):
            raise UrlRefused(f"{ip} is link-local or a cloud metadata address")
        if _in(ip, policy.deny_nets):
            raise UrlRefused(f"{ip} is deny-listed")
        if ip.is_unspecified or ip.is_multicast:
            raise UrlRefused(f"{ip} is not a unicast address")
        if not ip.is_global and not (host_allowed or _in(ip, policy.allow_nets)):
            raise UrlRefused(f"{ip} is a private or reserved address and not in the allow list")
    return addrs
