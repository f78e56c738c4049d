"""`cluster.recoverFrom`'s snapshot as the bootstrap uploads it (talos_proxmox.day_two.recovery_snapshot): a local
file or an object of the backup bucket on the real versitygw (tests/stand_ins/s3_server.py), decrypted with
the identities of `cluster.recoverIdentityFile` when it is age-encrypted; and the stack load, which checks
what that gives (an etcd snapshot of this cluster) and names the key and what is wrong, never the identity."""

from __future__ import annotations

import copy
import datetime
import hashlib
from pathlib import Path

import pyrage
import pytest

from talos_proxmox.day_two.backup_target import BackupTarget, upload_snapshot
from talos_proxmox.day_two.recovery_snapshot import RecoverySnapshotError, read_recovery_snapshot
from talos_proxmox.settings.model import SettingsError
from talos_proxmox.settings.stack import stack_file_values
from talos_proxmox.settings.stack_config import StackConfig, load_stack
from tests.paths import REPO
from tests.stand_ins.s3_server import ACCESS_KEY, SECRET_KEY
from tests.support.day_two import backup_target, s3  # noqa: F401 - fixture

SNAPSHOTS = REPO / "tests" / "data" / "etcd"
OTHER = (SNAPSHOTS / "other-cluster.snapshot").read_bytes()  # prod-cp-1's, not a control plane of the dev stack
IDENTITY, STRANGER = pyrage.x25519.Identity.generate(), pyrage.x25519.Identity.generate()
NOW = datetime.datetime(2026, 12, 7, 13, 5, 9, tzinfo=datetime.timezone.utc)


def target(s3, **changes) -> BackupTarget:
    return backup_target(s3, str(IDENTITY.to_public()), **changes)


@pytest.fixture
def identity_file(tmp_path):
    path = tmp_path / "backup.key"
    path.write_text(f"# created: 2026-12-07T13:05:09Z\n# public key: {IDENTITY.to_public()}\n{IDENTITY}\n")
    return str(path)


@pytest.fixture
def encrypted_file(tmp_path):
    path = tmp_path / "other.snapshot.age"
    path.write_bytes(pyrage.encrypt(OTHER, [IDENTITY.to_public()]))
    return str(path)


def test_a_plain_file_is_read_as_it_is(s3):
    assert read_recovery_snapshot(str(SNAPSHOTS / "other-cluster.snapshot"), target=None, identity_file=None) == OTHER


def test_an_encrypted_file_is_decrypted_with_the_identity_file(encrypted_file, identity_file):
    assert read_recovery_snapshot(encrypted_file, target=None, identity_file=identity_file) == OTHER


def test_an_object_of_the_bucket_is_fetched_and_decrypted_to_what_was_uploaded(s3, identity_file):
    key = upload_snapshot(target(s3), OTHER, cluster="dev", node="dev-cp-1", reason="upgrade", now=NOW)
    assert read_recovery_snapshot(f"s3://etcd-backups/{key}", target=target(s3), identity_file=identity_file) == OTHER


def test_what_cannot_be_had_is_named_and_never_shows_the_identity(s3, tmp_path, encrypted_file, identity_file):
    def refused(source, *, identity=identity_file, to=target(s3)) -> str:
        with pytest.raises(RecoverySnapshotError) as err:
            read_recovery_snapshot(source, target=to, identity_file=identity)
        assert str(IDENTITY) not in str(err.value) and SECRET_KEY not in str(err.value)
        return str(err.value)

    assert refused("s3://etcd-backups/dev/none.snap.age") == (
        f"is not in s3://etcd-backups at {s3.endpoint} (no object 'dev/none.snap.age')")
    assert refused("s3://other-bucket/dev/x.snap.age") == (
        "names bucket 'other-bucket', and the stack's backups.bucket is 'etcd-backups' (an object is read with "
        "the backups section's endpoint and credentials)")
    assert refused("s3://etcd-backups/dev/x", to=target(s3, secret_access_key="not-the-key")) == (
        f"cannot be read: the credentials are refused by s3://etcd-backups at {s3.endpoint} (SignatureDoesNotMatch; "
        "check backups.accessKeyId and backups.secretAccessKey)")
    assert refused(encrypted_file, identity=None) == (
        "is age-encrypted, and cluster.recoverIdentityFile is not set (expected the file `age-keygen` wrote, "
        "holding the identity of backups.ageRecipient)")
    missing = str(tmp_path / "missing.key")
    assert refused(encrypted_file, identity=missing) == (
        f"is age-encrypted, and cluster.recoverIdentityFile {missing!r} cannot be read (No such file or directory)")
    empty = tmp_path / "empty.key"
    empty.write_text("# no identity here\n")
    assert refused(encrypted_file, identity=str(empty)) == (
        f"is age-encrypted, and cluster.recoverIdentityFile {str(empty)!r} holds no age identity (expected a line "
        "AGE-SECRET-KEY-1...)")
    stranger = tmp_path / "stranger.key"
    stranger.write_text(f"{STRANGER}\n")
    assert refused(encrypted_file, identity=str(stranger)) == (
        f"cannot be decrypted with the identities in cluster.recoverIdentityFile {str(stranger)!r} (encrypted to "
        "another recipient?)")


# --- the stack load ----------------------------------------------------------------------------------------

def _dev(s3, **cluster) -> StackConfig:
    values = copy.deepcopy(stack_file_values(str(REPO / "stacks" / "Pulumi.dev.yaml")))
    values["talos-proxmox:cluster"] = {**values["talos-proxmox:cluster"], **cluster}
    values["talos-proxmox:backups"] = {"bucket": "etcd-backups", "endpoint": s3.endpoint, "accessKeyId": ACCESS_KEY,
                                       "secretAccessKey": SECRET_KEY, "ageRecipient": str(IDENTITY.to_public())}
    return StackConfig(values, frozenset({"talos-proxmox:backups"}))


def test_the_load_decrypts_an_object_and_checks_it_is_this_clusters(s3, identity_file):
    key = upload_snapshot(target(s3), OTHER, cluster="dev", node="prod-cp-1", reason="upgrade", now=NOW)
    with pytest.raises(SettingsError) as err:
        load_stack(_dev(s3, recoverFrom=f"s3://etcd-backups/{key}", recoverIdentityFile=identity_file), base_dir=REPO)
    # The whole backups section is secret once its key is (`pulumi config set --secret --path`), so every string
    # of it, the bucket's name too, is masked wherever a problem line repeats it.
    assert err.value.problems == [
        f"talos-proxmox:cluster.recoverFrom: 's3://[secret]/{key}' is a snapshot of another cluster: its etcd "
        "members are prod-cp-1 (https://10.20.0.11:2380), and none is a control plane of this stack (dev-cp-1 "
        "(10.10.0.51))"]


def test_the_load_records_the_decrypted_snapshots_sha256_and_where_it_is(s3, identity_file):
    ours = (SNAPSHOTS / "dr-cp-1.snapshot").read_bytes()  # the etcd member dr-cp-1's
    key = upload_snapshot(target(s3), ours, cluster="dev", node="dr-cp-1", reason="upgrade", now=NOW)
    stack = _dev(s3, recoverFrom=f"s3://etcd-backups/{key}", recoverIdentityFile="backup.key")
    stack.values["talos-proxmox:nodes"][0]["name"] = "dr-cp-1"  # its first control plane, by name
    c = load_stack(stack, base_dir=Path(identity_file).parent).cluster
    assert (c.recover_from, c.recover_identity_file) == (f"s3://etcd-backups/{key}", identity_file)
    assert c.recover_from_sha256 == hashlib.sha256(ours).hexdigest()
