"""Turning the bytes of Talos's Kubeconfig stream into the kubeconfig YAML, and reading when its client
certificate expires (pure)."""

from __future__ import annotations

import base64
import binascii
import datetime
import gzip
import io
import tarfile
from typing import Optional

import yaml

from talos_proxmox.talos_config import pki

_GZIP_MAGIC = b"\x1f\x8b"
MEMBER_NAME = "kubeconfig"


def extract_kubeconfig(data: bytes) -> str:
    """Talos sends a .tar.gz holding one file named `kubeconfig`; plain YAML is accepted as is.

    Talos closes the gzip stream without closing the tar writer, so the archive lacks the final
    padding and end-of-archive blocks; tarfile's stream mode reads such archives.
    """
    if not data:
        raise ValueError("kubeconfig: the node sent no data")
    if not data.startswith(_GZIP_MAGIC):
        return data.decode("utf-8")
    names: list[str] = []
    try:
        with tarfile.open(fileobj=io.BytesIO(gzip.decompress(data)), mode="r|") as archive:
            while True:
                try:
                    member = archive.next()
                except tarfile.ReadError:
                    if names:  # the missing padding after a member we skipped ends the archive early
                        break
                    raise
                if member is None:
                    break
                names.append(member.name)
                if member.isfile() and member.name.lstrip("./") == MEMBER_NAME:
                    return archive.extractfile(member).read().decode("utf-8")
    except (tarfile.TarError, OSError, EOFError) as exc:
        raise ValueError(f"kubeconfig: the node sent a gzip stream that is not a readable tar archive ({exc})") from None
    raise ValueError(f"kubeconfig: archive has no {MEMBER_NAME!r} file (members: {', '.join(names) or 'none'})")


def client_certificate_expires(kubeconfig: str) -> Optional[datetime.datetime]:
    """When the client certificate of the kubeconfig's first user expires (UTC); None when it has none
    (a token, an exec plugin) or it cannot be read."""
    try:
        users = (yaml.safe_load(kubeconfig) or {}).get("users") or []
        data = ((users[0] or {}).get("user") or {}).get("client-certificate-data") if users else None
        return pki.load_cert(base64.b64decode(data)).not_valid_after_utc if data else None
    except (yaml.YAMLError, AttributeError, binascii.Error, ValueError, pki.PKIError):
        return None
