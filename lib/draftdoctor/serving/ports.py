"""Which port a server gets: one free now, drawn outside the kernel's ephemeral range and its reserved
ports for a server that binds its own `--port` (the kernel hands ports of that range to every outbound
connection and every bind to port 0 on the host, so a port found free there is soon someone's), or a
listening socket the launcher holds from the start for a server that inherits it (its port is never
free for another process to take)."""

from __future__ import annotations

import socket
from pathlib import Path



def port_is_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


LINUX_EPHEMERAL = (32768, 60999)  # the kernel's default ip_local_port_range
UNPRIVILEGED = 1024


def ephemeral_range(proc: Path = Path("/proc/sys/net/ipv4")) -> tuple[int, int]:
    """The ports the kernel picks itself (`ip_local_port_range`: for a bind to port 0 and for every
    outbound connection), both ends included."""
    try:
        low, high = map(int, (proc / "ip_local_port_range").read_text().split())
    except (OSError, ValueError):
        return LINUX_EPHEMERAL
    return low, high


def reserved_ports(proc: Path = Path("/proc/sys/net/ipv4")) -> set[int]:
    """Ports the administrator reserved for known services (`ip_local_reserved_ports`: "8080,9000-9010")."""
    found = set()
    try:
        text = (proc / "ip_local_reserved_ports").read_text().strip()
    except OSError:
        return found
    for part in filter(None, text.split(",")):
        low, _, high = part.partition("-")
        if low.strip().isdigit() and (high or low).strip().isdigit():
            found.update(range(int(low), int(high or low) + 1))
    return found


def choose_port(host: str = "127.0.0.1", tries: int = 200) -> int:
    """A port free now on `host` for a server that binds its own `--port`: drawn at random from the
    unprivileged ports outside the kernel's ephemeral range and its reserved ports, which only a process
    that names the port can take. Where the ephemeral range leaves none, a port the kernel picks."""
    import random

    low, high = ephemeral_range()
    ports = [*range(UNPRIVILEGED, max(low, UNPRIVILEGED)), *range(max(high + 1, UNPRIVILEGED), 65536)]
    reserved, draw = reserved_ports(), random.SystemRandom()
    for _ in range(tries if ports else 0):
        port = draw.choice(ports)
        if port not in reserved and port_is_free(host, port):
            return port
    return free_port(host)


def listening_socket(host: str, port: int) -> socket.socket:
    """A socket bound to `port` on `host` (0: one the kernel picks) and listening, for a server to inherit:
    held from the moment its port is known, so no other process can take it (it binds and listens at
    once: two sockets with SO_REUSEADDR may share a port until one listens). OSError if the port is taken."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server would: a TIME_WAIT port is fine
        sock.bind((host, port))
        sock.listen(128)
    except BaseException:
        sock.close()
        raise
    return sock
