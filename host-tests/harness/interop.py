"""Starts interop_server.py (grpcio's TestService) for a test: the process
and its ports by security, once it listens."""

import json
import os
import subprocess
import sys

from .paths import HOST_TESTS

HERE = os.path.join(HOST_TESTS, "interop")


def start_interop_server(certs):
    """(process, {"plaintext": port, "tls": port, "mtls": port})."""
    proc = subprocess.Popen([sys.executable, os.path.join(HERE, "interop_server.py"), certs],
                            stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    if not line:
        raise RuntimeError(f"the interop server exited with {proc.wait()}")
    return proc, json.loads(line)
