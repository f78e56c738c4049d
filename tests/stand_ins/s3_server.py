"""An S3-compatible server for the backup tests: the real versitygw (.tools/bin/versitygw, scripts/tools.sh)
with its posix backend in a directory of the test's, on loopback, over plain HTTP, with one root access
key. It checks SigV4 signatures as S3 does (wrong credentials: 403), answers a missing bucket with 404 and
keeps each object as a file under `<directory>/<bucket>/<key>`.

`serve_s3(directory)` yields an `S3Server`; `make_bucket(name)` makes a bucket as an operator would
beforehand; `objects(bucket)` reads what was stored, by key.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import pytest

from tests.paths import REPO

VERSITYGW = REPO / ".tools" / "bin" / "versitygw"
ACCESS_KEY = "engine-backup-access"
SECRET_KEY = "engine-backup-secret-4f7e1a"  # a stand-in's key, not a credential


@dataclass
class S3Server:
    endpoint: str
    root: Path

    def make_bucket(self, name: str) -> None:
        (self.root / name).mkdir()

    def objects(self, bucket: str) -> dict[str, bytes]:
        base = self.root / bucket
        return {str(p.relative_to(base)): p.read_bytes() for p in sorted(base.rglob("*"))
                if p.is_file() and not p.name.startswith(".")}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def serve_s3(directory: Path) -> Iterator[S3Server]:
    if not os.access(VERSITYGW, os.X_OK):
        pytest.fail(f"the backup tests need {VERSITYGW}: run `bash scripts/tools.sh`")
    root = directory / "s3"
    root.mkdir(parents=True)
    port = _free_port()
    log = open(directory / "versitygw.log", "wb")
    process = subprocess.Popen([str(VERSITYGW), "--access", ACCESS_KEY, "--secret", SECRET_KEY,
                                "--port", f"127.0.0.1:{port}", "posix", str(root)],
                               stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        while True:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"versitygw did not start: {(directory / 'versitygw.log').read_text()[-500:]}")
            time.sleep(0.1)
        yield S3Server(f"http://127.0.0.1:{port}", root)
    finally:
        process.terminate()
        process.wait(timeout=30)
        log.close()
