"""`make lab` (python -m draftdoctor.lab): Lab on loopback, its address with the token, a clean stop."""

import re
import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _start(tmp_path, *args):
    return subprocess.Popen([sys.executable, "-m", "draftdoctor.lab", "--root", str(ROOT), "--log", str(tmp_path / "lab.log"),
                             *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_prints_an_address_with_its_token_and_stops_on_ctrl_c(tmp_path):
    lab = _start(tmp_path)
    try:
        while not (found := re.search(r"http://127\.0\.0\.1:(\d+)/lab/tree/notebooks\?token=(\w+)", lab.stdout.readline())):
            assert lab.poll() is None, lab.stderr.read()
        url, port, token = found.group(0), int(found.group(1)), found.group(2)
        with urllib.request.urlopen(url, timeout=10) as page:
            assert page.status == 200 and b"JupyterLab" in page.read()
        try:  # the token is needed
            urllib.request.urlopen(f"http://127.0.0.1:{port}/api/contents/notebooks", timeout=10)
            raise AssertionError("Lab answered without the token")
        except urllib.error.HTTPError as e:
            assert e.code == 403
        listing = urllib.request.urlopen(urllib.request.Request(
            f"http://127.0.0.1:{port}/api/contents/notebooks", headers={"Authorization": f"token {token}"}), timeout=10)
        assert b"01-dump-keys.ipynb" in listing.read()
        lab.send_signal(signal.SIGINT)
        assert lab.wait(timeout=30) == 0
        with socket.socket() as s:  # Lab itself stopped, not only the wrapper
            assert s.connect_ex(("127.0.0.1", port)) != 0
    finally:
        lab.kill()
        lab.wait()


def test_a_busy_port_is_refused_in_one_line(tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        lab = _start(tmp_path, "--port", str(busy.getsockname()[1]))
        out, err = lab.communicate(timeout=60)
    assert lab.returncode == 1 and "already in use" in err and "Traceback" not in err
