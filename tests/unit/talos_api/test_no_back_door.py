"""While a Talos client is open, no other local process or user can use its os:admin identity.

The client does TLS through a relay (grpcio cannot do Ed25519). A relay on a 127.0.0.1 TCP port forwarded
any local connection over our mutual-TLS session: another user could call Version, then Reset, on the node
as os:admin. The relay now listens on a Unix socket in a 0700 directory of ours, removed on close.
"""

from __future__ import annotations

import os
import pwd
import socket
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from talos_proxmox.talos_api.client import TalosClient
from tests.stand_ins.talos_api import client_credentials, configured_node, shared_bundle  # noqa: F401 - fixture

# A process of another user dials the relay and, if it gets through, speaks HTTP/2 to the node behind it.
FOREIGN_DIAL = r"""
import os, socket, sys
target = sys.argv[1]
os.setgid(int(sys.argv[3])); os.setuid(int(sys.argv[2]))
try:
    if target.startswith("unix:"):
        s = socket.socket(socket.AF_UNIX); s.connect(target[5:])
    else:
        host, port = target.rsplit(":", 1); s = socket.create_connection((host, int(port)), timeout=5)
    s.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00")
    s.settimeout(5)
    print("reached:", s.recv(9).hex())
except OSError as exc:
    print("refused:", type(exc).__name__)
"""


def _listening_tcp_inodes() -> set[str]:
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A":  # LISTEN
                inodes.add(fields[9])
    return inodes


def _own_socket_inodes() -> set[str]:
    own = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            link = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:["):
            own.add(link[8:-1])
    return own


def _own_tcp_listeners() -> set[str]:
    return _listening_tcp_inodes() & _own_socket_inodes()


@pytest.mark.skipif(not hasattr(os, "setuid") or os.geteuid() != 0, reason="needs root to act as another user")
def test_another_local_user_cannot_reach_the_node_through_an_open_client(configured_node):
    nobody = pwd.getpwnam("nobody")
    listeners_before = _own_tcp_listeners()
    with TalosClient([configured_node.endpoint], credentials=client_credentials(shared_bundle())) as client:
        assert client.version()  # the session is up and working
        connection = next(iter(client._connections.values()))
        address = connection.bridge.address
        assert _own_tcp_listeners() == listeners_before  # no TCP port at all
        assert address.startswith("unix:")
        path = Path(address[5:])
        directory = path.parent.stat()
        assert directory.st_uid == os.geteuid() and stat.S_IMODE(directory.st_mode) == 0o700
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        calls_before = len(configured_node.calls)
        dial = subprocess.run([sys.executable, "-c", FOREIGN_DIAL, address, str(nobody.pw_uid), str(nobody.pw_gid)],
                              capture_output=True, text=True, timeout=30)
        assert dial.stdout.strip() == "refused: PermissionError", dial.stderr
        assert len(configured_node.calls) == calls_before
    assert not path.parent.exists()  # removed on close


def test_the_relay_is_gone_when_the_client_closes(configured_node):
    with TalosClient([configured_node.endpoint], credentials=client_credentials(shared_bundle())) as client:
        client.version()
        path = Path(next(iter(client._connections.values())).bridge.address[5:])
        assert path.exists()
    with pytest.raises(FileNotFoundError):
        socket.socket(socket.AF_UNIX).connect(str(path))
