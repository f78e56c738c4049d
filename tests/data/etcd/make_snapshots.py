"""Make this directory's etcd snapshots with the real etcd (.tools/bin/etcd, scripts/tools.sh): one single-member
etcd per snapshot, advertising the peer address of the stack's control plane it stands for, a key put, and the
snapshot taken through etcd's own maintenance API (its JSON gateway), hash included, as Talos and etcdctl get it.

Run from the repository root:  .venv/bin/python tests/data/etcd/make_snapshots.py
"""

from __future__ import annotations

import base64
import json
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import requests

HERE = Path(__file__).resolve().parent
ETCD = HERE.parents[2] / ".tools" / "bin" / "etcd"
# file -> (member name, advertised peer URL): the engine tier's recovery stack, and a cluster that is not it.
SNAPSHOTS = {"dr-cp-1.snapshot": ("dr-cp-1", "https://127.0.0.122:2380"),
             "other-cluster.snapshot": ("prod-cp-1", "https://10.20.0.11:2380")}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def snapshot(name: str, peer_url: str) -> bytes:
    client, peer = _free_port(), _free_port()
    with tempfile.TemporaryDirectory() as data:
        etcd = subprocess.Popen([str(ETCD), "--name", name, "--data-dir", data,
                                 "--listen-client-urls", f"http://127.0.0.1:{client}",
                                 "--advertise-client-urls", f"http://127.0.0.1:{client}",
                                 "--listen-peer-urls", f"http://127.0.0.1:{peer}",
                                 "--initial-advertise-peer-urls", peer_url,
                                 "--initial-cluster", f"{name}={peer_url}"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            url = f"http://127.0.0.1:{client}/v3"
            deadline = time.monotonic() + 30
            while True:
                try:
                    requests.post(f"{url}/kv/put", json={"key": base64.b64encode(b"/registry/recovered").decode(),
                                                         "value": base64.b64encode(name.encode()).decode()},
                                  timeout=2).raise_for_status()
                    break
                except requests.RequestException:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.2)
            reply = requests.post(f"{url}/maintenance/snapshot", json={}, stream=True, timeout=30)
            return b"".join(base64.b64decode(json.loads(line)["result"]["blob"])
                            for line in reply.iter_lines() if line)
        finally:
            etcd.terminate()
            etcd.wait(timeout=30)


if __name__ == "__main__":
    for file, (member, peer_url) in SNAPSHOTS.items():
        (HERE / file).write_bytes(snapshot(member, peer_url))
        print(HERE / file)
