"""Chart sources for the engine tier, served by the test over HTTPS on loopback: an air-gapped site's mirrors.

- `HelmRepository`: a classic Helm chart repository (`index.yaml` and the chart archives), as
  `helm repo index` writes it (apiVersion v1, entries by chart name, each with its digest and URL).
- `OciRegistry`: the part of the OCI distribution API Helm's registry client (ORAS) uses to pull a
  chart: `GET /v2/` (the API version check), `HEAD`/`GET /v2/<name>/manifests/<tag or digest>`,
  `GET`/`HEAD /v2/<name>/blobs/<digest>` and `GET /v2/<name>/tags/list`. A chart is stored as Helm's
  `helm push` stores it: an OCI image manifest whose config blob is the chart's metadata as JSON
  (`application/vnd.cncf.helm.config.v1+json`) and whose one layer is the chart archive
  (`application/vnd.cncf.helm.chart.content.v1.tar+gzip`), every blob named by its sha256 digest.

Both serve TLS with a certificate for 127.0.0.1 issued by a CA the test makes (`ChartCa`): nothing but a
client given that CA trusts them. Every request is recorded as (method, path).
"""

from __future__ import annotations

import datetime
import hashlib
import io
import json
import ssl
import tarfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Callable, Optional

import yaml

from talos_proxmox.talos_config import pki
from talos_proxmox.talos_api.tls_bridge import load_cert_chain
from tests.paths import SHARED

CHARTS = SHARED / "charts"
MANIFEST_MEDIA_TYPE = "application/vnd.oci.image.manifest.v1+json"
HELM_CONFIG_MEDIA_TYPE = "application/vnd.cncf.helm.config.v1+json"
HELM_CHART_MEDIA_TYPE = "application/vnd.cncf.helm.chart.content.v1.tar+gzip"


def chart_metadata(archive: bytes) -> dict:
    """The chart's Chart.yaml (the first member named <chart>/Chart.yaml) of a chart archive."""
    with tarfile.open(fileobj=io.BytesIO(archive), mode="r:gz") as tar:
        for member in tar:
            parts = member.name.split("/")
            if len(parts) == 2 and parts[1] == "Chart.yaml":
                return yaml.safe_load(tar.extractfile(member).read())
    raise ValueError("no <chart>/Chart.yaml in the archive")


def sha256_digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


class ChartCa:
    """A CA of the test's own and a server certificate for 127.0.0.1 it issued; `ca_file` is the PEM path
    a client is given (the stack's chart CA bundle)."""

    def __init__(self, directory: Path):
        self.cert_pem, self.key_pem = pki.new_ca(common_name="engine chart mirrors CA", key_type="ecdsa-p256")
        self.server_cert, self.server_key = pki.issue_certificate(
            self.cert_pem, self.key_pem, common_name="127.0.0.1", ip_addresses=("127.0.0.1",),
            dns_names=("localhost",), key_type="ecdsa-p256", server=True)
        directory.mkdir(parents=True, exist_ok=True)
        self.ca_file = directory / "chart-mirrors-ca.pem"
        self.ca_file.write_bytes(self.cert_pem)

    def server_context(self) -> ssl.SSLContext:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        load_cert_chain(context, self.server_cert, self.server_key)
        return context


class _Server:
    """A ThreadingHTTPServer over TLS on 127.0.0.1:<free port>, answering through `self.answer`."""

    def __init__(self, ca: ChartCa):
        self.requests: list[tuple[str, str]] = []
        owner = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):  # quiet
                pass

            def _serve(self, method: str) -> None:
                owner.requests.append((method, self.path))
                status, headers, body = owner.answer(method, self.path.split("?", 1)[0], dict(self.headers))
                self.send_response(status)
                for key, value in headers.items():
                    self.send_header(key, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if method != "HEAD":
                    self.wfile.write(body)

            def do_GET(self):
                self._serve("GET")

            def do_HEAD(self):
                self._serve("HEAD")

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.server.socket = ca.server_context().wrap_socket(self.server.socket, server_side=True)
        self.port = self.server.server_address[1]
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    answer: Callable[[str, str, dict], tuple[int, dict, bytes]]

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.port}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _not_found(what: str) -> tuple[int, dict, bytes]:
    return 404, {"Content-Type": "application/json"}, json.dumps(
        {"errors": [{"code": "NOT_FOUND", "message": what}]}).encode()


class HelmRepository(_Server):
    """A Helm chart repository at `url` serving `archives` (chart .tgz bytes by file name)."""

    def __init__(self, ca: ChartCa, archives: dict[str, bytes]):
        super().__init__(ca)
        self.url = f"https://{self.host}"
        self.files = dict(archives)
        entries: dict[str, list] = {}
        created = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.000000000Z")
        for file_name, archive in archives.items():
            meta = chart_metadata(archive)
            entries.setdefault(meta["name"], []).append({
                **meta, "created": created, "digest": hashlib.sha256(archive).hexdigest(),
                "urls": [f"{self.url}/{file_name}"]})
        self.files["index.yaml"] = yaml.safe_dump(
            {"apiVersion": "v1", "entries": entries, "generated": created}).encode()

    def answer(self, method: str, path: str, headers: dict) -> tuple[int, dict, bytes]:
        name = path.lstrip("/")
        if name not in self.files:
            return _not_found(path)
        kind = "text/yaml" if name.endswith(".yaml") else "application/gzip"
        return 200, {"Content-Type": kind}, self.files[name]


class OciRegistry(_Server):
    """An OCI registry at `host` holding Helm charts pushed with `push(repository, archive)`; a chart's
    reference is `oci://<host>/<repository>` and its tag the chart's version."""

    def __init__(self, ca: ChartCa):
        super().__init__(ca)
        self.blobs: dict[str, bytes] = {}
        self.manifests: dict[str, dict[str, bytes]] = {}  # repository -> tag or digest -> manifest

    def push(self, repository: str, archive: bytes) -> str:
        """Store `archive` as Helm pushes a chart; returns the oci:// reference (without the tag)."""
        meta = chart_metadata(archive)
        config = json.dumps(meta, separators=(",", ":")).encode()
        for blob in (config, archive):
            self.blobs[sha256_digest(blob)] = blob
        manifest = json.dumps({
            "schemaVersion": 2, "mediaType": MANIFEST_MEDIA_TYPE,
            "config": {"mediaType": HELM_CONFIG_MEDIA_TYPE, "digest": sha256_digest(config), "size": len(config)},
            "layers": [{"mediaType": HELM_CHART_MEDIA_TYPE, "digest": sha256_digest(archive), "size": len(archive)}],
            "annotations": {"org.opencontainers.image.title": meta["name"],
                            "org.opencontainers.image.version": str(meta["version"])},
        }, separators=(",", ":")).encode()
        stored = self.manifests.setdefault(repository, {})
        stored[str(meta["version"])] = stored[sha256_digest(manifest)] = manifest
        return f"oci://{self.host}/{repository}"

    def answer(self, method: str, path: str, headers: dict) -> tuple[int, dict, bytes]:
        api = {"Docker-Distribution-API-Version": "registry/2.0"}
        if path in ("/v2", "/v2/"):
            return 200, {**api, "Content-Type": "application/json"}, b"{}"
        if not path.startswith("/v2/"):
            return _not_found(path)
        rest = path[len("/v2/"):]
        for marker in ("/manifests/", "/blobs/", "/tags/list"):
            if marker in rest:
                repository, reference = rest.rsplit(marker, 1)
                break
        else:
            return _not_found(path)
        if marker == "/tags/list":
            tags = sorted(ref for ref in self.manifests.get(repository, {}) if not ref.startswith("sha256:"))
            if not tags:
                return _not_found(f"repository {repository}")
            return 200, {**api, "Content-Type": "application/json"}, json.dumps(
                {"name": repository, "tags": tags}).encode()
        if marker == "/manifests/":
            manifest: Optional[bytes] = self.manifests.get(repository, {}).get(reference)
            if manifest is None:
                return _not_found(f"manifest {repository}:{reference}")
            return 200, {**api, "Content-Type": MANIFEST_MEDIA_TYPE, "Docker-Content-Digest": sha256_digest(manifest)}, \
                manifest
        blob = self.blobs.get(reference)
        if blob is None or repository not in self.manifests:
            return _not_found(f"blob {repository}@{reference}")
        return 200, {**api, "Content-Type": "application/octet-stream", "Docker-Content-Digest": reference}, blob
