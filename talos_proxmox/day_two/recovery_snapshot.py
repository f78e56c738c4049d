"""The etcd snapshot `cluster.recoverFrom` names, as bytes to upload: a local file or an object in the stack's
backup bucket (`s3://<backups.bucket>/<key>`), decrypted when it is age-encrypted (as talos-backup's and our
own pre-upgrade snapshots are) with the identities in `cluster.recoverIdentityFile`.

The identity file is read only here, only when a recovery needs it, and only into memory: it is never a
config value, never in the state, never printed. The stack load reads the snapshot once to check it (an etcd
snapshot, of this cluster) and records its sha256; the bootstrap reads it again and uploads it only if it
still has that sha256. No Pulumi here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Optional

from talos_proxmox.day_two import backup_target
from talos_proxmox.day_two.backup_target import BackupTarget

OBJECT_SCHEME = "s3://"
AGE_HEADER = b"age-encryption.org/v1\n"


class RecoverySnapshotError(ValueError):
    """The snapshot cannot be had: one line, naming what is wrong and never a credential or an identity."""


def is_object(source: str) -> bool:
    return source.startswith(OBJECT_SCHEME)


def object_location(source: str) -> tuple[str, str]:
    """`s3://bucket/key` -> (bucket, key)."""
    bucket, _, key = source[len(OBJECT_SCHEME):].partition("/")
    if not bucket or not key:
        raise RecoverySnapshotError("is not an object (expected s3://<backups.bucket>/<key>)")
    return bucket, key


def object_problem(source: str, target: Optional[BackupTarget]) -> Optional[str]:
    """Why an `s3://` source cannot be read with the stack's backup target (None: it can)."""
    try:
        bucket, _key = object_location(source)
    except RecoverySnapshotError as err:
        return str(err)
    if target is None:
        return "names an object, and the stack has no backups section to reach its bucket with"
    if bucket != target.bucket:
        return (f"names bucket {bucket!r}, and the stack's backups.bucket is {target.bucket!r} (an object is read "
                "with the backups section's endpoint and credentials)")
    return None


def _read_identities(identity_file: Optional[str]):
    import pyrage

    if identity_file is None:
        raise RecoverySnapshotError("is age-encrypted, and cluster.recoverIdentityFile is not set (expected the "
                                    "file `age-keygen` wrote, holding the identity of backups.ageRecipient)")
    try:
        lines = Path(identity_file).read_text().splitlines()
    except OSError as err:
        raise RecoverySnapshotError(f"is age-encrypted, and cluster.recoverIdentityFile {identity_file!r} cannot be "
                                    f"read ({err.strerror or err})") from None
    identities = []
    for line in (line.strip() for line in lines):
        if line.startswith("AGE-SECRET-KEY-"):
            try:
                identities.append(pyrage.x25519.Identity.from_str(line))
            except pyrage.IdentityError:
                raise RecoverySnapshotError(f"is age-encrypted, and cluster.recoverIdentityFile {identity_file!r} "
                                            "holds a line that is not an age identity") from None
    if not identities:
        raise RecoverySnapshotError(f"is age-encrypted, and cluster.recoverIdentityFile {identity_file!r} holds no "
                                    "age identity (expected a line AGE-SECRET-KEY-1...)")
    return identities


def decrypted(data: bytes, identity_file: Optional[str]) -> bytes:
    """`data` itself, or its plaintext when it is age-encrypted."""
    if not data.startswith(AGE_HEADER):
        return data
    import pyrage

    identities = _read_identities(identity_file)
    try:
        return pyrage.decrypt(data, identities)
    except pyrage.DecryptError:
        raise RecoverySnapshotError(f"cannot be decrypted with the identities in cluster.recoverIdentityFile "
                                    f"{identity_file!r} (encrypted to another recipient?)") from None


def fetch_object(source: str, target: BackupTarget,
                 client_of: Callable[[BackupTarget], Any] = backup_target._client) -> bytes:
    from botocore.exceptions import BotoCoreError, ClientError

    bucket, key = object_location(source)
    try:
        return client_of(target).get_object(Bucket=bucket, Key=key)["Body"].read()
    except ClientError as exc:
        kind, code = backup_target.s3_answer(exc)
        if kind == "missing":
            raise RecoverySnapshotError(f"is not in {target.where} (no object {key!r})") from None
        if kind == "refused":
            raise RecoverySnapshotError(f"cannot be read: {backup_target.credentials_refused(target, code)}") from None
        raise RecoverySnapshotError(f"cannot be read from {target.where} ({code or 'an error'})") from None
    except BotoCoreError as exc:
        raise RecoverySnapshotError(f"cannot be read: {target.endpoint or 'AWS S3'} cannot be reached "
                                    f"({type(exc).__name__})") from None


def read_recovery_snapshot(source: str, *, target: Optional[BackupTarget], identity_file: Optional[str],
                           client_of: Callable[[BackupTarget], Any] = backup_target._client) -> bytes:
    """The snapshot's bytes as etcd wrote them. `source` is a local path (already resolved) or an object."""
    if is_object(source):
        problem = object_problem(source, target)
        if problem is not None:
            raise RecoverySnapshotError(problem)
        data = fetch_object(source, target, client_of)
    else:
        try:
            data = Path(source).read_bytes()
        except OSError as err:
            raise RecoverySnapshotError(f"cannot be read ({err.strerror or err}: {source}; expected an etcd "
                                        "snapshot file)") from None
    return decrypted(data, identity_file)
