"""Who may talk to the server, and how much of it one address may take (``docs/protocol.md``,
section "Origins and fairness").

- ``Origins``: a browser's ``Origin`` must be one of the lab page's own origins (the page ports on
  a name or an address of this machine, or the same host the request was sent to), a page served
  from this machine's loopback, or one given with ``--allow-origin`` / ``FLUXO_ALLOW_ORIGINS``;
  and ``Host`` must be an address or a name of this machine, so a page elsewhere can neither
  drive the lab nor reach it by DNS rebinding. A client without ``Origin`` is not a browser.
- ``peer_key``: the address a client is counted under; ``X-Forwarded-For`` (its last entry) is
  believed only from a proxy on this machine's loopback.
- ``Peers``: per-address counters shared by the websocket and HTTP sides: connections, open
  requests, a request-rate bucket, a fair share of the queue, the export budget and the back-off
  after wrong tokens. This machine's own loopback (127.0.0.1, ::1: the page process, the teacher's
  browser and load tools) and presenters are exempt from a student's caps; only the fair share of
  the queue applies to loopback viewers too, so no client fills the class's queue.
- ``alias``: a short stable name for an address, what viewers see instead of it.
- ``ErrorLog``: an unexpected exception a client's message caused (a server bug) is logged with its
  traceback once per kind a minute, with how many like it were not; the sender is answered
  ``internal`` and each one counts heavily against its abuse line (``Peer.internal``), so no
  client can write the teacher's terminal full.
"""

from __future__ import annotations

import hashlib
import ipaddress
import logging
import secrets
import socket
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from engine.server.protocol import TokenBucket

OWN = frozenset({"127.0.0.1", "::1", "::ffff:127.0.0.1"})  # this machine's own loopback
LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})


def ip_of(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        ip = ipaddress.ip_address(text.strip().strip("[]"))
    except ValueError:
        return None
    mapped = getattr(ip, "ipv4_mapped", None)
    return mapped or ip


def is_loopback(address: str) -> bool:
    ip = ip_of(address)
    return bool(ip and ip.is_loopback)


def is_own(key: str) -> bool:
    """The machine's own loopback address: the page process, the teacher's browser, load tools."""
    ip = ip_of(key)
    return ip is not None and str(ip) in OWN


def counted(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> str:
    """An address as one student: IPv4 by itself, IPv6 by its /64 (one host's privacy addresses,
    or a student who picks any of a network's 2**64, are one student; security review 2, L9)."""
    if ip.version == 6 and not ip.is_loopback:
        return str(ipaddress.ip_network(f"{ip}/64", strict=False))
    return str(ip)


def peer_key(direct: str, forwarded: str | None) -> str:
    """The address a client is counted under (``counted``): the direct peer, or the last
    ``X-Forwarded-For`` entry (the one the proxy itself saw) when the direct peer is a proxy on
    this machine."""
    if forwarded and is_loopback(direct):
        last = forwarded.split(",")[-1].strip()
        ip = ip_of(last)
        return counted(ip) if ip else f"unparsed:{last[:40]}"
    ip = ip_of(direct)
    return counted(ip) if ip else direct


def _split_hostport(value: str) -> tuple[str, int | None]:
    """``Host`` header value to (lower-case host, port)."""
    try:
        parts = urlsplit("//" + value.strip())
        return (parts.hostname or "").lower(), parts.port
    except ValueError:
        return "", None


def normalize_origin(origin: str) -> str | None:
    """``scheme://host[:port]`` in lower case with the scheme's default port left out; None for
    what is not an http(s) origin (``null``, ``file://``)."""
    try:
        parts = urlsplit(origin.strip())
        port = parts.port
    except ValueError:
        return None
    scheme, host = parts.scheme.lower(), (parts.hostname or "").lower()
    if scheme not in ("http", "https") or not host:
        return None
    shown = f"[{host}]" if ":" in host else host
    default = {"http": 80, "https": 443}[scheme]
    return f"{scheme}://{shown}" + (f":{port}" if port and port != default else "")


def _machine_names(bind_host: str) -> set[str]:
    names = set(LOOPBACK_NAMES)
    try:
        import psutil

        for addrs in psutil.net_if_addrs().values():
            for a in addrs:
                if a.family in (socket.AF_INET, socket.AF_INET6):
                    names.add(a.address.split("%")[0].lower())
    except Exception:  # noqa: BLE001 - no interface list: the names below still hold
        pass
    try:
        host = socket.gethostname().lower()
        names |= {host, host + ".local", socket.getfqdn().lower()}
    except OSError:
        pass
    if bind_host not in ("", "0.0.0.0", "::"):
        names.add(bind_host.lower().strip("[]"))
    return {n for n in names if n}


@dataclass(slots=True)
class Origins:
    """Which browser origins and ``Host`` values the server answers."""

    page_ports: tuple[int, ...] = (8501,)
    allowed: frozenset[str] = frozenset()  # normalized origins (--allow-origin)
    names: frozenset[str] = frozenset(LOOPBACK_NAMES)  # this machine's names and addresses
    cors_any: bool = False  # --cors-any-origin: any origin on the HTTP port, ACAO: *

    @classmethod
    def build(
        cls,
        bind_host: str = "127.0.0.1",
        page_ports: Iterable[int] = (8501,),
        allow: Iterable[str] = (),
        cors_any: bool = False,
    ) -> Origins:
        allowed = {o for o in (normalize_origin(a) for a in allow if a.strip()) if o}
        names = _machine_names(bind_host) | {urlsplit(o).hostname or "" for o in allowed}
        return cls(tuple(page_ports) or (8501,), frozenset(allowed), frozenset(names), cors_any)

    def host_ok(self, host: str | None) -> bool:
        """``Host`` of a request: absent (HTTP/1.0), an address (DNS rebinding cannot make one),
        a name of this machine (``*.localhost`` too) or of an allowed origin."""
        if host is None:
            return True
        name, _ = _split_hostport(host)
        if not name:
            return False
        return (
            ip_of(name) is not None
            or name in self.names
            or name == "localhost"
            or name.endswith(".localhost")
        )

    def origin_ok(self, origin: str | None, host: str | None) -> bool:
        """A browser's ``Origin`` (None: not a browser, always fine)."""
        if origin is None:
            return True
        norm = normalize_origin(origin)
        if norm is None:
            return False
        if norm in self.allowed:
            return True
        parts = urlsplit(norm)
        name = (parts.hostname or "").lower()
        port = parts.port or {"http": 80, "https": 443}[parts.scheme]
        if name == "localhost" or name.endswith(".localhost") or is_loopback(name):
            return True  # a page served from this machine's loopback: the lab's own, on any port
        if port not in self.page_ports:
            return False
        return name in self.names or name == _split_hostport(host or "")[0]

    def describe(self) -> str:
        extra = f" and {', '.join(sorted(self.allowed))}" if self.allowed else ""
        return f"page ports {', '.join(map(str, self.page_ports))} on this machine{extra}"


# -- per-address counters -----------------------------------------------------------------------
@dataclass(slots=True)
class Peer:
    key: str
    own: bool  # this machine's loopback: exempt from a student's caps
    conns: int = 0  # websocket connections
    http_conns: int = 0
    open: int = 0  # open requests, websocket chats and HTTP completions together
    bucket: TokenBucket = field(default_factory=TokenBucket)
    history_bucket: TokenBucket = field(default_factory=TokenBucket)
    messages: TokenBucket = field(default_factory=TokenBucket)  # every message, all its sockets
    export_at: float = -1e9
    bad_tokens: int = 0
    token_wait_until: float = 0.0
    seen: float = field(default_factory=time.monotonic)
    internal: deque[float] = field(default_factory=deque)  # its internal errors, last 10 s
    wrong_bearers: set[bytes] = field(default_factory=set)  # distinct wrong HTTP bearers (hashes)

    @property
    def idle(self) -> bool:
        return not (self.conns or self.http_conns or self.open)


class Peers:
    """Every address the server has seen lately, by key (``peer_key``)."""

    MAX = 4096  # beyond this many, idle addresses are forgotten

    def __init__(self) -> None:
        self.by_key: dict[str, Peer] = {}
        self._salt = secrets.token_bytes(8)

    def get(self, key: str) -> Peer:
        peer = self.by_key.get(key)
        if peer is None:
            if len(self.by_key) >= self.MAX:
                self.by_key = {k: p for k, p in self.by_key.items() if not p.idle}
            peer = self.by_key[key] = Peer(key, is_own(key))
        peer.seen = time.monotonic()
        return peer

    def fair_share(self, peer: Peer, queue_limit: int, floor: int) -> int:
        """Open requests one address may hold: the queue shared with every address holding some
        and one more still to come, never less than ``floor`` (a student's own limit)."""
        active = sum(1 for p in self.by_key.values() if p.open and p is not peer) + 1
        return max(floor, queue_limit // (active + 1))

    def alias(self, key: str) -> str:
        """A short stable name for an address (per server start): what viewers see."""
        if is_own(key):
            return "local"
        return hashlib.blake2s(key.encode(), key=self._salt, digest_size=3).hexdigest()

    def wrong_token(self, peer: Peer, free: int = 5, most_s: float = 30.0) -> None:
        """A wrong presenter token from this address: after ``free`` of them, each next try waits
        twice as long as the last (up to ``most_s``)."""
        peer.bad_tokens += 1
        if peer.bad_tokens >= free:
            wait = min(most_s, 0.5 * 2 ** (peer.bad_tokens - free))
            peer.token_wait_until = time.monotonic() + wait

    @staticmethod
    def token_wait(peer: Peer) -> float:
        return max(0.0, peer.token_wait_until - time.monotonic())


def recent(times: deque[float], window_s: float = 10.0) -> int:
    """How many of ``times`` fall in the last ``window_s`` (the older ones pruned)."""
    now = time.monotonic()
    while times and now - times[0] > window_s:
        times.popleft()
    return len(times)


def over_line(times: deque[float], line: int, window_s: float = 10.0) -> bool:
    """One more event now in ``times`` (pruned to the last ``window_s``); True past ``line``."""
    times.append(time.monotonic())
    return recent(times, window_s) > line


class ErrorLog:
    """Unexpected exceptions while answering a client, logged with their traceback once per kind
    (where, exception type, the line that raised) every ``every_s``; the others of that kind are
    counted and the count said with the next one logged. At most ``max_kinds`` kinds are tracked
    a window; past that, one line a window says how many went unlogged. A flood of one bug from
    one student writes one traceback a minute, not one a message (security review 2, H2)."""

    def __init__(self, log: logging.Logger, every_s: float = 60.0, max_kinds: int = 32) -> None:
        self.log = log
        self.every_s = every_s
        self.max_kinds = max_kinds
        self.kinds: dict[tuple[str, str, str], list] = {}  # kind -> [logged at, not logged since]
        self.overflow = [0.0, 0]  # [said at, not logged]: kinds past max_kinds

    @staticmethod
    def kind(exc: BaseException, where: str) -> tuple[str, str, str]:
        tb = exc.__traceback__
        while tb is not None and tb.tb_next is not None:
            tb = tb.tb_next
        line = f"{tb.tb_frame.f_code.co_filename}:{tb.tb_lineno}" if tb else "?"
        return where, type(exc).__name__, line

    def exception(self, exc: BaseException, where: str, who: str) -> bool:
        """Log ``exc`` (raised answering ``where`` for ``who``) unless its kind was logged in the
        last ``every_s``; returns whether it was logged."""
        now = time.monotonic()
        key = self.kind(exc, where)
        entry = self.kinds.get(key)
        if entry is not None and now - entry[0] < self.every_s:
            entry[1] += 1
            return False
        if entry is None and len(self.kinds) >= self.max_kinds:
            self.kinds = {k: e for k, e in self.kinds.items() if now - e[0] < self.every_s}
            if len(self.kinds) >= self.max_kinds:
                self.overflow[1] += 1
                if now - self.overflow[0] >= self.every_s:
                    self.log.error(
                        "%d more unexpected errors of other kinds not logged (%d kinds a minute)",
                        self.overflow[1],
                        self.max_kinds,
                    )
                    self.overflow = [now, 0]
                return False
        quiet = entry[1] if entry is not None else 0
        self.kinds[key] = [now, 0]
        more = f" ({quiet} more like it since the last one logged)" if quiet else ""
        self.log.error(
            "error handling %s from %s: %s%s; the same again is logged at most every %g s",
            where,
            who,
            type(exc).__name__,
            more,
            self.every_s,
            exc_info=exc,
        )
        return True


def raise_fd_limit(log: logging.Logger) -> None:
    """Raise this process's soft limit on open files to its hard one (macOS starts at 256, below
    a class's 16 websockets + 32 HTTP connections per student); nothing on a system without
    ``resource`` (Windows)."""
    try:
        import resource
    except ImportError:
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    for want in (hard, 10240):  # macOS: an unlimited hard limit still caps at OPEN_MAX (10240)
        if want == resource.RLIM_INFINITY or (soft != resource.RLIM_INFINITY and soft >= want):
            continue
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
        except (ValueError, OSError):
            continue
        log.info("open files limit raised from %d to %d", soft, want)
        return
