"""A hostile neighbour for the port tests: `python port_thief.py [--every] ROOT_PID...`.

- It keeps taking ephemeral ports: a churning pool of listening sockets on ports the kernel picks.
- It watches every process descended from the ROOT_PIDs; the first `--port N` it sees in a descendant's
  command line under each root (with `--every`: each one), it binds first (as the hostile round did,
  reading /proc) and answers every HTTP request on it with forged acceptance (4.00 everywhere).
- It prints one line per port stolen ("stole N") and per request answered ("request N PATH"), flushed,
  so the test can prove the kit never talked to it.
It runs until killed.
"""

import json
import os
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

FORGED = {"text": "forged", "meta_info": {"completion_tokens": 40, "spec_verify_ct": 10, "spec_accept_length": 4.0},
          "internal_states": [{"avg_spec_accept_length": 4.0}], "status": "ok",
          "choices": [{"text": "forged", "token_ids": [1]}], "usage": {"completion_tokens": 40},
          "data": [{"id": "forged"}]}
METRICS = ("vllm:spec_decode_num_drafts_total 10\nvllm:spec_decode_num_draft_tokens_total 30\n"
           "vllm:spec_decode_num_accepted_tokens_total 30\nllamacpp:spec_decode_num_drafts_total 10\n"
           "llamacpp:spec_decode_num_draft_tokens_total 30\nllamacpp:spec_decode_num_accepted_tokens_total 30\n")


def say(text):
    print(text, flush=True)


class Forger(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def _answer(self):
        say(f"request {self.server.server_address[1]} {self.command} {self.path}")
        body = (METRICS if self.path.startswith("/metrics") else json.dumps(FORGED)).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        self._answer()

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self._answer()


def parents() -> dict[int, int]:
    found = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = open(f"/proc/{entry}/stat").read()
            except OSError:
                continue
            found[int(entry)] = int(stat[stat.rfind(")") + 2:].split()[1])
    return found


def root_of(pid, ppid, roots):
    while pid in ppid and pid not in roots and pid > 1:
        pid = ppid[pid]
    return pid if pid in roots else None


def port_of(pid):
    try:
        argv = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")
    except OSError:
        return None
    for i, arg in enumerate(argv[:-1]):
        if arg == b"--port" and argv[i + 1].isdigit():
            return int(argv[i + 1])
        if arg.startswith(b"--port=") and arg[7:].isdigit():
            return int(arg[7:])
    return None


def steal(port):
    try:
        server = ThreadingHTTPServer(("127.0.0.1", port), Forger)
    except OSError:
        return False
    threading.Thread(target=server.serve_forever, daemon=True).start()
    say(f"stole {port}")
    return True


def churn(pool_size=200):
    pool = []
    while True:
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        s.listen()
        pool.append(s)
        if len(pool) > pool_size:
            pool.pop(0).close()
        time.sleep(0.005)


def main(roots, every=False):
    threading.Thread(target=churn, daemon=True).start()
    robbed, stolen = set(), set()
    while True:
        ppid = parents()
        for pid in ppid:
            root = root_of(pid, ppid, roots)
            if root is None or (root in robbed and not every) or pid == root:
                continue
            port = port_of(pid)
            if port and port not in stolen and steal(port):
                robbed.add(root)
                stolen.add(port)
        time.sleep(0.02)


if __name__ == "__main__":
    main({int(p) for p in sys.argv[1:] if p != "--every"}, every="--every" in sys.argv[1:])
