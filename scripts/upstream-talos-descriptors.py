#!/usr/bin/env python3
"""Write Talos's published API descriptors at a release tag as test data.

    scripts/upstream-talos-descriptors.py <siderolabs/talos checkout> v1.13.7

Compiles api/common/common.proto and api/machine/{machine,image,lifecycle}.proto of that tag with grpcio-tools into a
FileDescriptorSet without source info (names, numbers, types, labels, streaming: no comments) at
tests/data/talos-api/<tag>.pb, which tests/unit/talos_api/test_descriptors.py compares ours against.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
FILES = ("common/common.proto", "machine/machine.proto", "machine/image.proto", "machine/lifecycle.proto")


def main(checkout: str, tag: str) -> None:
    import google.rpc.status_pb2
    import grpc_tools
    from grpc_tools import protoc

    well_known = Path(grpc_tools.__file__).parent / "_proto"
    googleapis = Path(google.rpc.status_pb2.__file__).parent.parent.parent
    out = REPO / "tests" / "data" / "talos-api" / f"{tag}.pb"
    with tempfile.TemporaryDirectory() as tmp:
        for name in FILES:
            text = subprocess.run(["git", "-C", checkout, "show", f"{tag}:api/{name}"], check=True,
                                  capture_output=True, text=True).stdout
            (Path(tmp) / name).parent.mkdir(parents=True, exist_ok=True)
            (Path(tmp) / name).write_text(text)
        if protoc.main(["protoc", f"-I{tmp}", f"-I{well_known}", f"-I{googleapis}",
                        f"--descriptor_set_out={out}", *FILES]) != 0:
            sys.exit(f"protoc failed on {tag}")
    print(f"wrote {out}")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
