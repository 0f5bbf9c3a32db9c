"""HOST:PORT of the rollout producer's link (rl.producer_address, `rloo produce address=`), parsed
and checked without the network: what the trainer listens at and the producer connects to.

Accepted: `name:port` (a DNS name or `localhost`), `1.2.3.4:port`, `[::1]:port` (an IPv6 address
in brackets, as in URLs); port 1-65535. Refused in one line: a scheme (`http://`), spaces or other
characters no host name holds, an IPv4 address with a part above 255 (`256.1.1.1`), an unbracketed
IPv6 or a second colon (`localhost:29511:1` once passed as host `localhost:29511`, port 1), a name
longer than DNS allows (253 characters, 63 per label). Whether the name resolves, and for the
trainer whether it is this machine's, is checked before the run by rloo.runtime.link.address."""

from __future__ import annotations

import ipaddress
import re

EXAMPLE = "expected HOST:PORT such as 10.0.0.2:29511, localhost:29511 or [::1]:29511"
_LABEL = re.compile(r"[A-Za-z0-9_]([A-Za-z0-9_-]*[A-Za-z0-9_])?")


def split_address(address: str) -> tuple[str, int]:
    """'host:port' -> (host, port) (an IPv6 host without its brackets); ValueError saying what is wrong."""
    if "://" in address:
        raise ValueError(f"no scheme such as http:// before the host; {EXAMPLE}")
    if any(c.isspace() or not c.isprintable() for c in address):
        raise ValueError(f"a space or control character is not part of a host name; {EXAMPLE}")
    if address.startswith("["):
        host, sep, port = address[1:].partition("]:")
        _check_ipv6(host)
    else:
        host, sep, port = address.rpartition(":")
        if ":" in host:
            raise ValueError(f"one colon, before the port (an IPv6 host goes in brackets); {EXAMPLE}")
        _check_host(host)
    if not sep or not port.isascii() or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"the port is a number from 1 to 65535; {EXAMPLE}")
    return host, int(port)


def _check_ipv6(host: str) -> None:
    try:
        ipaddress.IPv6Address(host)
    except ValueError:
        raise ValueError(f"[{host}] is not an IPv6 address; {EXAMPLE}") from None


def _check_host(host: str) -> None:
    if not host:
        raise ValueError(f"the host is missing; {EXAMPLE}")
    if re.fullmatch(r"[0-9.]+", host):  # all digits and dots: meant as an IPv4 address
        try:
            ipaddress.IPv4Address(host)
        except ValueError:
            raise ValueError(f"{host} is not an IPv4 address (four numbers 0-255)") from None
        return
    if len(host) > 253:
        raise ValueError(f"the host name is {len(host)} characters long, more than DNS allows (253)")
    labels = host.removesuffix(".").split(".")
    if not all(len(label) <= 63 and _LABEL.fullmatch(label) for label in labels):
        raise ValueError(
            f"{host[:60]!r} is not a host name (letters, digits and hyphens in dot-separated parts of "
            f"at most 63 characters)"
        )


def check_address(v: str | None) -> str | None:
    """The field validator of an address setting (None: unset)."""
    if v is not None:
        split_address(v)
    return v
