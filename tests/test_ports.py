"""Ports: a server the kit starts is measured only once the kernel says the port is that server's.

Between choosing a free port and the server binding it, another process can take the port: it then
either makes the server fail to start, or answers in its place. The launcher gives a chosen port up
for another (`PORT_ATTEMPTS`), refuses a port the user gave, and never sends a request to a port
another process holds. Fake servers here bind late on purpose, so the race is won by the test's thief
every time; the last test runs real benches on every CPU backend beside a hostile neighbour process.

Reliability IV item 13: on a busy host every outbound connection draws a port from the kernel's
ephemeral range, so a port chosen there (bind port 0, close) is soon someone else's. The kit's own
server is started on a socket the launcher already holds; a server that takes `--port` gets one from
outside that range.
"""

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from conftest import require_release

from draftdoctor import listeners
from draftdoctor.serving.launcher import PORT_ATTEMPTS, READY_LINE, PortBusy, Server
from draftdoctor.serving.ports import choose_port, ephemeral_range, reserved_ports

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "data" / "demo"

# binds its port after a pause (the window the thief uses); on a taken port it says so and exits,
# or, `stubborn`, logs and goes on running as some servers do
LATE = """
import socket, sys, time
time.sleep(0.5)
s = socket.socket()
try:
    s.bind(("127.0.0.1", int(sys.argv[1])))
except OSError as e:
    print("bind failed:", e, flush=True)
    if sys.argv[2] == "exit":
        sys.exit(1)
    time.sleep(600)
s.listen()
print(%r, flush=True)
time.sleep(600)
""" % READY_LINE


class Thief:
    """Takes the port a Server chose (each new one, or only the first) and answers HTTP on it,
    counting the requests it gets."""

    def __init__(self, server: Server, every: bool):
        self.server, self.every, self.stolen, self.requests = server, every, [], []
        self.running = True
        self.http = []
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        thief = self

        class Forger(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                thief.requests.append(self.path)
                self.send_response(200)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"OK")

        while self.running:
            port = self.server.port
            if port and port not in self.stolen and (self.every or not self.stolen):
                try:
                    http = ThreadingHTTPServer(("127.0.0.1", port), Forger)
                except OSError:
                    pass
                else:
                    threading.Thread(target=http.serve_forever, daemon=True).start()
                    self.stolen.append(port)
                    self.http.append(http)
            time.sleep(0.005)

    def stop(self):
        self.running = False
        self.thread.join()
        for http in self.http:
            http.shutdown()
            http.server_close()


def _late_server(tmp_path, on_taken="exit", **kwargs):
    script = tmp_path / "late_server.py"
    script.write_text(LATE)
    return Server(lambda port: [sys.executable, str(script), str(port), on_taken], tmp_path / "server.log",
                  "127.0.0.1", 0, health_path="/health", hang_timeout=30, **kwargs)


@pytest.mark.parametrize("on_taken", ["exit", "stubborn"])
def test_a_chosen_port_taken_first_is_given_up_for_another(tmp_path, on_taken):
    """The thief takes the first chosen port before the server binds it and answers 200 to everything:
    the server either dies on it or runs on without a port; the launcher never asks the thief anything
    and starts the server again on another port."""
    server = _late_server(tmp_path, on_taken)
    thief = Thief(server, every=False)
    try:
        with server:
            assert server.attempts == 2 and server.port != thief.stolen[0]
            assert server.holder() == listeners.OURS and server.still_ours()
        assert thief.requests == []
    finally:
        server.stop()
        thief.stop()


def test_a_port_taken_every_time_is_refused_clearly(tmp_path):
    server = _late_server(tmp_path)
    thief = Thief(server, every=True)
    try:
        with pytest.raises(PortBusy, match=f"{PORT_ATTEMPTS} chosen ports were each taken by another process"):
            with server:
                pass
        assert server.process is None and thief.requests == []
    finally:
        thief.stop()


def test_a_port_the_user_gave_is_not_swapped_for_another(tmp_path):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    script = tmp_path / "late_server.py"
    script.write_text(LATE)
    server = Server([sys.executable, str(script), str(port), "stubborn"], tmp_path / "server.log", "127.0.0.1", port,
                    health_path="/health", hang_timeout=30)
    thief = Thief(server, every=True)
    try:
        with pytest.raises(PortBusy, match=f"port {port} on 127.0.0.1 .*pick another with --port"):
            with server:
                pass
        assert server.attempts == 1 and thief.requests == []
    finally:
        server.stop()
        thief.stop()


def test_a_server_that_loses_its_port_is_no_longer_trusted(tmp_path):
    """After a measurement bench asks again: a server that died, its port now someone else's, is not."""
    server = _late_server(tmp_path)
    with server:
        assert server.still_ours()
        port = server.port
        os.killpg(server.process.pid, signal.SIGKILL)
        server.process.wait()
        with socket.socket() as taker:
            taker.bind(("127.0.0.1", port))
            taker.listen()
            assert server.holder() == listeners.FOREIGN and not server.still_ours()


def test_a_port_chosen_for_a_server_is_outside_the_kernels_ephemeral_range():
    """What `--port` servers (vLLM, llama-server, SGLang, JupyterLab) are given: never a port the kernel
    hands to outbound connections or binds to port 0, never a reserved one, free when chosen."""
    low, high = ephemeral_range()
    chosen = {choose_port("127.0.0.1") for _ in range(300)}
    assert [p for p in chosen if low <= p <= high or p < 1024 or p in reserved_ports()] == []
    assert len(chosen) > 250  # drawn at random, not one port every time


def test_the_ranges_are_read_as_the_kernel_writes_them(tmp_path):
    (tmp_path / "ip_local_port_range").write_text("40000\t50000\n")
    (tmp_path / "ip_local_reserved_ports").write_text("8080,9000-9002\n")
    assert ephemeral_range(tmp_path) == (40000, 50000)
    assert reserved_ports(tmp_path) == {8080, 9000, 9001, 9002}
    assert ephemeral_range(tmp_path / "absent") == (32768, 60999)  # Linux's default


def test_the_reference_server_serves_on_a_port_no_one_else_can_take(tmp_path):
    """Reliability IV item 13: a neighbour that churns ephemeral ports and binds every `--port` it sees
    in the bench's servers' command lines (it had taken each of the five the kit chose, bench exit 1):
    the launcher binds the port and hands the listening socket to the server, so the thief never holds it,
    is never asked, and the bench measures on its first server."""
    bench = _bench("reference", tmp_path / "out")
    thief = subprocess.Popen([sys.executable, str(Path(__file__).with_name("port_thief.py")), "--every",
                              str(bench.pid)], stdout=subprocess.PIPE, text=True)
    try:
        out, err = bench.communicate(timeout=600)
    finally:
        thief.send_signal(signal.SIGKILL)
        said = thief.communicate()[0].splitlines()
    assert bench.returncode == 0, err[-3000:]
    assert said == [], said  # nothing stolen, nothing asked
    log = (tmp_path / "out" / "server-d.log").read_text()
    assert log.count("listening on http://127.0.0.1:") == 1, log  # one start: its port was never taken


# a draft each backend serves as it is: the story's for SGLang 0.5.10's emulation, speculators' for the real engines
DRAFTS = {"reference": "draft-story", "vllm": "draft-speculators", "llamacpp": "draft-speculators"}


def _bench(backend, out, *extra):
    return subprocess.Popen([sys.executable, "-m", "draftdoctor.cli", "bench", "--backend", backend, "--target",
                             str(DEMO / "target"), "--draft", f"d={DEMO / DRAFTS[backend]}", "--out", str(out),
                             "--num-prompts", "3", "--max-new-tokens", "16", *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_benches_on_every_cpu_backend_beside_a_port_thief(tmp_path):
    """`bench` on the reference backend, real vLLM and real llama.cpp at once, while a neighbour keeps
    taking ephemeral ports and binds the first `--port` each bench's server is given before that
    server does, answering with forged acceptance. Every bench measures its own server: the thief is
    never asked anything, the reference backend (served on a socket the launcher holds, so its port
    is never the thief's) measures what it measures alone, and the ports the real servers were given
    lie outside the kernel's ephemeral range."""
    require_release("0.32.0", "vllm")
    require_release("0.3.36", "llamacpp")
    alone = _bench("reference", tmp_path / "alone")
    assert alone.wait(timeout=300) == 0, alone.stderr.read()[-3000:]
    benches = {backend: _bench(backend, tmp_path / backend) for backend in ("reference", "vllm", "llamacpp")}
    thief = subprocess.Popen([sys.executable, str(Path(__file__).with_name("port_thief.py")),
                              *(str(p.pid) for p in benches.values())], stdout=subprocess.PIPE, text=True)
    try:
        for backend, proc in benches.items():
            out, err = proc.communicate(timeout=900)
            assert proc.returncode == 0, f"{backend}: {err[-3000:]}"
    finally:
        thief.send_signal(signal.SIGKILL)
        said = thief.communicate()[0].splitlines()
    assert [line for line in said if line.startswith("request")] == []
    stolen = [int(line.split()[1]) for line in said if line.startswith("stole")]
    low, high = ephemeral_range()
    assert stolen and not [port for port in stolen if low <= port <= high], said
    results = {b: json.loads((tmp_path / b / "results.json").read_text())["runs"][0] for b in benches}
    reference = json.loads((tmp_path / "alone" / "results.json").read_text())["runs"][0]
    assert results["reference"]["accept_length"] == reference["accept_length"]
    assert all(1.0 <= r["accept_length"] < 4.0 for r in results.values())
