"""The backup bucket from the program's side (talos_proxmox.day_two.backup_target), against the real
versitygw (tests/stand_ins/s3_server.py): the preview's check names a missing bucket, refused credentials
and an endpoint that does not answer, each by its stack key and never with a credential; an uploaded
snapshot is stored under its documented key, encrypted, and decrypts with the identity the program never
sees to exactly what was given."""

from __future__ import annotations

import datetime

import pyrage
import pytest

from talos_proxmox.day_two.backup_target import BackupTarget, target_problems, upload_snapshot
from tests.stand_ins.s3_server import SECRET_KEY
from tests.support.day_two import backup_target, s3  # noqa: F401 - fixture

IDENTITY = pyrage.x25519.Identity.generate()
NOW = datetime.datetime(2026, 12, 7, 13, 5, 9, tzinfo=datetime.timezone.utc)


def target(s3, **changes) -> BackupTarget:
    return backup_target(s3, str(IDENTITY.to_public()), **{"prefix": "lab", **changes})


def test_a_reachable_bucket_with_good_credentials_has_no_problem(s3):
    assert target_problems(target(s3)) == []


def test_a_missing_bucket_wrong_credentials_and_no_server_are_each_named_by_their_key(s3):
    assert target_problems(target(s3, bucket="not-made")) == [
        f"talos-proxmox:backups.bucket: 'not-made' does not exist at {s3.endpoint} (expected a bucket made "
        "beforehand)"]
    wrong = target_problems(target(s3, secret_access_key="not-the-key"))
    assert wrong == [f"talos-proxmox:backups.accessKeyId: the credentials are refused by s3://etcd-backups at "
                     f"{s3.endpoint} (403; check backups.accessKeyId and backups.secretAccessKey)"]
    assert "not-the-key" not in wrong[0] and SECRET_KEY not in repr(target(s3))
    assert target_problems(target(s3, endpoint="http://127.0.0.1:9")) == [
        "talos-proxmox:backups.endpoint: http://127.0.0.1:9 cannot be reached (EndpointConnectionError)"]


def test_a_snapshot_is_stored_encrypted_and_decrypts_to_what_was_given(s3):
    snapshot = b"etcd snapshot bytes \x00\x01" * 1000
    key = upload_snapshot(target(s3), snapshot, cluster="lab", node="cp-1", reason="upgrade", now=NOW)
    assert key == "lab/lab-cp-1-20261207T130509Z-upgrade.snapshot.age"
    stored = s3.objects("etcd-backups")[key]
    assert stored.startswith(b"age-encryption.org/v1\n") and snapshot not in stored
    assert pyrage.decrypt(stored, [IDENTITY]) == snapshot
