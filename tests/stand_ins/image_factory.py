"""A stand-in for the Image Factory on 127.0.0.1: POST /schematics, and the images of the schematics it
knows (`/image/<id>/<version>/<file>`: headers only, as Proxmox's query-url-metadata asks for them; an
unknown schematic is a 404, as on the real factory). Schematic requests are kept in `requests`, image
requests in `image_requests`, each in order."""

from __future__ import annotations

import hashlib
import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


# The seed walkthrough's schematic and the id the public factory answered for it; the empty schematic's id.
SEED_ID = "e142ceb080fb243141b5b6891cfcf0c60bc9430d69be0adf803999d2b62dc885"
EMPTY_ID = "376567988ad370138ad8b2698212367b8edcb69b5fd68c80be1f2ec7d603b4ba"
SEED_SCHEMATIC = {
    "customization": {
        "systemExtensions": {"officialExtensions": [
            "siderolabs/iscsi-tools", "siderolabs/nfs-utils",
            "siderolabs/qemu-guest-agent", "siderolabs/util-linux-tools"]},
        "extraKernelArgs": ["net.ifnames=0"],
    }
}


IMAGE_SIZE = 104_857_600  # what the factory's Content-Length says an ISO is (its bytes are never sent)


class StandInFactory:
    """Answers POST /schematics like the factory would, or with the failure a test asks for."""

    def __init__(self, mode: str = "ok", delay: float = 0.0):
        self.mode, self.delay = mode, delay
        self.requests: list[tuple[str, str, dict, bytes]] = []
        self.image_requests: list[tuple[str, str]] = []
        self.schematic_ids: set[str] = set()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - http.server's naming
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                outer.requests.append(("POST", self.path, dict(self.headers), body))
                time.sleep(outer.delay)
                status, payload = outer.answer(self.path, body)
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json" if status < 300 else "text/plain")
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (timeout test)

            def do_GET(self):  # noqa: N802
                if self.path.startswith("/image/"):
                    return self.do_HEAD()  # the image's bytes are never needed: fakepve stores a stand-in file
                outer.requests.append(("GET", self.path, dict(self.headers), b""))
                self.send_response(404)
                self.end_headers()

            def do_HEAD(self):  # noqa: N802
                outer.image_requests.append((self.command, self.path))
                parts = self.path.split("/")  # "", "image", id, version, file
                known = len(parts) == 5 and parts[1] == "image" and parts[2] in outer.schematic_ids
                self.send_response(200 if known else 404)
                self.send_header("Content-Type", "application/octet-stream" if known else "text/plain")
                self.send_header("Content-Length", str(IMAGE_SIZE if known else 0))
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)

    def answer(self, path: str, body: bytes) -> tuple[int, bytes]:
        if path != "/schematics":
            return 404, b"not found\n"
        sid = hashlib.sha256(body).hexdigest()
        if self.mode == "ok":
            self.schematic_ids.add(sid)
            return 201, json.dumps({"id": sid, "schematic": body.decode()}).encode()
        if self.mode == "400":
            return 400, (b"yaml: unmarshal errors:\n  line 2: field systemExtension not found "
                         b"in type schematic.Customization\n")
        if self.mode == "500":
            return 500, b"internal server error: " + b"x" * 2000 + b"\n"
        if self.mode == "mismatch":
            return 201, json.dumps({"id": "0" * 64, "schematic": "owner: alice\ncustomization: {}\n"}).encode()
        if self.mode == "html":
            return 200, b"<html><body>proxy login</body></html>"
        if self.mode == "no-id":
            return 201, json.dumps({"schematic": body.decode()}).encode()
        raise AssertionError(self.mode)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()


def closed_port_url() -> str:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    return f"http://127.0.0.1:{port}"
