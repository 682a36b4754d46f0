"""`python -m cera serve` as a subprocess, for the tests that compare with the native server
(test_server's CLI tests, test_web_api's cera.js tests)."""
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from contextlib import contextmanager


@contextmanager
def cera_serve(tmp_path, *args):
    """`python -m cera serve` as a subprocess on a free port, ready: (base URL, process, log path)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = tmp_path / "serve.log"
    with open(log, "w") as err:
        proc = subprocess.Popen([sys.executable, "-m", "cera", "serve", "--port", str(port), *args],
                                stdout=err, stderr=err)
    url = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.time() + 300
        while True:
            assert proc.poll() is None and time.time() < deadline, log.read_text()
            try:
                urllib.request.urlopen(url + "/models", timeout=5).close()
                break
            except OSError:
                time.sleep(0.2)
        yield url, proc, log
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            proc.wait(30)
