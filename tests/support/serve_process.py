"""``care-retriever serve`` in a real subprocess for the service tests: started on a free port, its
output drained into a log, returned once it answers ``/health``."""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest


class ServeProcess:
    def __init__(self, proc: subprocess.Popen, host: str, port: int, log: list[str]) -> None:
        self.proc, self.host, self.port, self.log = proc, host, port, log
        self.url = f"http://{host}:{port}"

    def text(self) -> str:
        return "".join(self.log)

    def stop(self, timeout: float = 30) -> int:
        """SIGTERM (uvicorn shuts down gracefully, then re-raises the signal it caught); its exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=timeout)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()


def start_serve(model: Path, store: str, *options: str, token: str | None = None) -> ServeProcess:
    """``serve --port 0`` plus ``options`` (no ``--host``: the default must be loopback), one thread per
    forward pass; ``token``: the bearer token, from ``CARE_API_TOKEN`` as in production."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    env.pop("CARE_API_TOKEN", None)
    if token is not None:
        env["CARE_API_TOKEN"] = token
    cmd = [sys.executable, "-m", "care_retriever.cli.main", "serve", "--model", str(model), "--store", store]
    proc = subprocess.Popen(
        [*cmd, "--port", "0", *options], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    lines: queue.Queue[str] = queue.Queue()
    log: list[str] = []

    def drain() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            log.append(line)
            lines.put(line)

    threading.Thread(target=drain, daemon=True).start()
    deadline = time.monotonic() + 90
    address = None
    while address is None and time.monotonic() < deadline and proc.poll() is None:
        try:
            address = re.search(r"listening on http://([\d.]+):(\d+)", lines.get(timeout=1))
        except queue.Empty:
            continue
    if address is None:
        proc.kill()
        pytest.fail(f"server did not start: {''.join(log)[-2000:]}")
    server = ServeProcess(proc, address.group(1), int(address.group(2)), log)
    headers = {"authorization": f"Bearer {token}"} if token else {}
    for _ in range(100):  # the socket is bound before uvicorn starts accepting
        try:
            httpx.get(f"{server.url}/health", headers=headers, timeout=2)
            break
        except httpx.TransportError:
            time.sleep(0.1)
    return server
