"""Target policy: metadata and link-local always refused, private only when allowed, deny lists win."""

from __future__ import annotations

import ipaddress

import pytest

from service.notify.urlpolicy import UrlPolicy, UrlRefused, check_url


def fake_dns(table: dict[str, list[str]]):  # type: ignore[no-untyped-def]
    def resolve(host: str, port: int) -> list[ipaddress.IPv4Address | ipaddress.IPv6Address]:
        if host not in table:
            raise OSError("no such host")
        return [ipaddress.ip_address(a) for a in table[host]]
    return resolve


DNS = fake_dns({"hooks.example.com": ["93.184.216.34"], "sneaky.example.com": ["93.184.216.34", "10.1.2.3"],
                "internal.corp": ["10.1.2.3"], "meta.example.com": ["169.254.169.254"]})
OPEN = UrlPolicy()


@pytest.mark.parametrize("url", [
    "http://169.254.169.254/latest/meta-data/", "http://[fe80::1]/", "http://[::ffff:169.254.169.254]/",
    "http://metadata.google.internal/computeMetadata/v1/", "http://meta.example.com/",
    "http://127.0.0.1:8080/", "http://10.0.0.5/", "http://192.168.1.1/", "http://100.64.0.1/", "http://[::1]/",
    "http://0.0.0.0/", "http://sneaky.example.com/", "http://internal.corp/", "ftp://hooks.example.com/",
    "file:///etc/passwd", "http://user:pw@hooks.example.com/", "http:///nohost", "http://nxdomain.example/",
])
def test_refused_by_default(url: str) -> None:
    with pytest.raises(UrlRefused):
        check_url(url, OPEN, resolver=DNS)


def test_public_is_allowed() -> None:
    assert check_url("https://hooks.example.com/x", OPEN, resolver=DNS) == [ipaddress.ip_address("93.184.216.34")]


def test_allow_list_opens_private_but_never_metadata() -> None:
    p = UrlPolicy.from_lists(allow=["127.0.0.1/32", "internal.corp", "169.254.0.0/16"])
    check_url("http://127.0.0.1:9999/h", p, resolver=DNS)
    check_url("http://internal.corp/h", p, resolver=DNS)
    with pytest.raises(UrlRefused):
        check_url("http://127.0.0.2/", p, resolver=DNS)
    with pytest.raises(UrlRefused, match="metadata"):
        check_url("http://169.254.169.254/", p, resolver=DNS)


def test_deny_list_wins() -> None:
    p = UrlPolicy.from_lists(allow=["10.0.0.0/8"], deny=["93.184.216.0/24", "*.corp", "10.9.0.0/16"])
    for url in ("https://hooks.example.com/", "http://internal.corp/", "http://10.9.1.1/"):
        with pytest.raises(UrlRefused, match="deny"):
            check_url(url, p, resolver=DNS)
    check_url("http://10.1.1.1/", p, resolver=DNS)
