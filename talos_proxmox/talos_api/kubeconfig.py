"""Turning the bytes of Talos's Kubeconfig stream into the kubeconfig YAML (pure)."""

from __future__ import annotations

import gzip
import io
import tarfile

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
