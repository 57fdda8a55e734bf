"""Who listens on which TCP port, read from Linux's /proc: the kit's proof that the server it measures
is the one it started, and that nothing it starts listens beyond loopback.

A port number alone proves nothing: between choosing a free port and the server binding it, any
process (another user's too) can bind it first and answer in its place. So the launcher asks the
kernel instead: every listening socket on the port (`/proc/net/tcp`, `/proc/net/tcp6`, any user's)
must be held by a process of the server's own process group (the socket inodes in their
`/proc/PID/fd`). Another local user cannot make that true; they can only take a port, which the
launcher then sees and retries on another.

No imports from the kit: the launcher, the real-loader children's tests and the test session's
end-of-run check all use it.
"""

from __future__ import annotations

import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc")
LISTEN = "0A"  # the TCP state /proc/net/tcp writes for LISTEN


@dataclass(frozen=True)
class Listener:
    """One listening TCP socket: its local address, port, owner's uid and socket inode."""

    address: str
    port: int
    uid: int
    inode: int

    @property
    def loopback(self) -> bool:
        """Whether only this machine can reach it (127.0.0.0/8, ::1, or IPv4 loopback mapped into IPv6)."""
        address = ipaddress.ip_address(self.address)
        mapped = getattr(address, "ipv4_mapped", None)
        return (mapped or address).is_loopback


def available() -> bool:
    """Whether this system lets the kit see listeners (Linux's /proc)."""
    return (PROC / "net" / "tcp").is_file()


def _address(text: str) -> str:
    """/proc/net/tcp's hex address (32-bit words in host byte order, little-endian here) as text."""
    raw = bytes.fromhex(text)
    words = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    return str(ipaddress.ip_address(words))


def tcp_listeners() -> list[Listener]:
    """Every listening TCP socket in this network namespace, whoever owns it."""
    found = []
    for name in ("tcp", "tcp6"):
        try:
            lines = (PROC / "net" / name).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) < 10 or fields[3] != LISTEN:
                continue
            address, _, port = fields[1].partition(":")
            found.append(Listener(_address(address), int(port, 16), int(fields[7]), int(fields[9])))
    return found


def group_pids(pgid: int) -> list[int]:
    """The processes of process group `pgid` (field 5 of /proc/PID/stat, after the parenthesised name)."""
    pids = []
    for entry in PROC.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2:].split()
        if len(fields) > 2 and int(fields[2]) == pgid:
            pids.append(int(entry.name))
    return pids


def socket_inodes(pids) -> set[int]:
    """The inodes of the sockets the processes `pids` hold open (those of our own user: others' fds are
    not readable, and need not be)."""
    inodes = set()
    for pid in pids:
        try:
            fds = os.listdir(PROC / str(pid) / "fd")
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(PROC / str(pid) / "fd" / fd)
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(int(target[8:-1]))
    return inodes


def group_listeners(pgid: int) -> list[Listener]:
    """The TCP sockets process group `pgid` listens on."""
    held = socket_inodes(group_pids(pgid))
    return [listener for listener in tcp_listeners() if listener.inode in held]


OURS, FOREIGN, NONE, UNKNOWN = "ours", "foreign", "none", "unknown"


def port_holder(port: int, pgid: int) -> str:
    """Who listens on TCP `port`: OURS (every listener on it belongs to process group `pgid`), FOREIGN
    (some listener does not: another process took the port), NONE (nobody listens yet), or UNKNOWN
    (no /proc to ask: not Linux)."""
    if not available():
        return UNKNOWN
    on_port = [listener for listener in tcp_listeners() if listener.port == port]
    if not on_port:
        return NONE
    held = socket_inodes(group_pids(pgid))
    return OURS if all(listener.inode in held for listener in on_port) else FOREIGN


def reachable_from(host: str) -> str | None:
    """What a server bound to `host` is reachable from, when that is more than this machine ("every
    network interface", or the addresses `host` resolves to); None for a loopback address."""
    import socket

    addresses = {info[4][0] for info in socket.getaddrinfo(host, None)}
    if all(ipaddress.ip_address(a.split("%")[0]).is_loopback for a in addresses):
        return None
    if any(ipaddress.ip_address(a.split("%")[0]).is_unspecified for a in addresses):
        return "every network interface"
    return f"{', '.join(sorted(addresses))}, not loopback"
