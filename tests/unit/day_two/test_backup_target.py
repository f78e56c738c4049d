"""The backup bucket from the program's side (talos_proxmox.day_two.backup_target), against the real
versitygw (tests/stand_ins/s3_server.py): the preview's check names a missing bucket, refused credentials
and an endpoint that does not answer, each by its stack key and never with a credential; an uploaded
snapshot is stored under its documented key, encrypted, and decrypts with the identity the program never
sees to exactly what was given."""

from __future__ import annotations

import datetime

import pyrage
import pytest

from talos_proxmox.day_two.backup_target import (
    BackupTarget,
    lifecycle_rules,
    set_lifecycle_rules,
    target_problems,
    upload_snapshot,
    with_retention,
    without_retention,
)
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


# --- retention: the bucket's lifecycle rule ----------------------------------------------------------------

OTHER_RULE = {"ID": "logs", "Status": "Enabled", "Filter": {"Prefix": "logs/"}, "Expiration": {"Days": 7}}
OUR_RULE = {"ID": "talos-proxmox-retention-lab", "Status": "Enabled", "Filter": {"Prefix": "lab/"},
            "Expiration": {"Days": 30}}


def test_a_server_that_keeps_no_lifecycle_rules_refuses_retention_by_its_key(s3):
    assert target_problems(target(s3, retention_days=30)) == [
        f"talos-proxmox:backups.retentionDays: s3://etcd-backups at {s3.endpoint} does not keep lifecycle rules "
        "(NotImplemented): set the retention on the server itself, and leave backups.retentionDays out"]
    assert target_problems(target(s3)) == []  # without retention it is not asked


def test_our_rule_replaces_our_earlier_one_and_leaves_the_buckets_others(s3):
    longer = {**OUR_RULE, "Expiration": {"Days": 90}}
    assert with_retention([OTHER_RULE, longer], target(s3, retention_days=30)) == [OTHER_RULE, OUR_RULE]
    assert without_retention([OTHER_RULE, OUR_RULE], target(s3, retention_days=30)) == [OTHER_RULE]


def test_the_rule_goes_in_and_out_through_the_buckets_lifecycle_configuration(s3):
    """botocore's Stubber checks each request against S3's API model and answers as scripted: versitygw keeps no
    lifecycle rules (above), so here the requests themselves are what is checked."""
    import boto3
    from botocore.stub import Stubber

    client = boto3.client("s3", region_name="us-east-1", aws_access_key_id="a", aws_secret_access_key="b")
    stub = Stubber(client)
    bucket = {"Bucket": "etcd-backups"}
    stub.add_client_error("get_bucket_lifecycle_configuration", "NoSuchLifecycleConfiguration", expected_params=bucket)
    stub.add_response("put_bucket_lifecycle_configuration", {},
                      {**bucket, "LifecycleConfiguration": {"Rules": [OUR_RULE]}})
    stub.add_response("get_bucket_lifecycle_configuration", {"Rules": [OTHER_RULE, OUR_RULE]}, bucket)
    stub.add_response("put_bucket_lifecycle_configuration", {},
                      {**bucket, "LifecycleConfiguration": {"Rules": [OTHER_RULE]}})
    stub.add_response("get_bucket_lifecycle_configuration", {"Rules": [OUR_RULE]}, bucket)
    stub.add_response("delete_bucket_lifecycle", {}, bucket)
    ours = target(s3, retention_days=30)
    with stub:
        for change in (with_retention, without_retention, without_retention):
            set_lifecycle_rules(ours, change(lifecycle_rules(ours, lambda _t: client), ours), lambda _t: client)
        stub.assert_no_pending_responses()


def test_a_target_read_back_without_its_optional_fields_takes_their_defaults(s3):
    """Through the engine a None in a map is dropped: the target must read back all the same."""
    aws = target(s3, endpoint=None)
    props = {k: v for k, v in aws.props().items() if v is not None}
    assert {"endpoint", "retention_days"}.isdisjoint(props) and BackupTarget.from_props(props) == aws
