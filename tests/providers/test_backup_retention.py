"""BackupRetention (providers/backup_retention.py): the S3 requests it makes for each step, as botocore's Stubber
checks them against S3's API model (versitygw, the tests' S3 server, keeps no lifecycle rules), and a state
without the credentials."""

from __future__ import annotations

import boto3
import pytest
from botocore.stub import Stubber

from providers.backup_retention import BackupRetentionProvider
from talos_proxmox.day_two import backup_target
from talos_proxmox.day_two.backup_target import BackupTarget

TARGET = BackupTarget(bucket="etcd-backups", endpoint="https://s3.lab.local:9000", region="us-east-1",
                      path_style=True, prefix="lab", age_recipient="age1" + "q" * 58, access_key_id="backup",
                      secret_access_key="s3-secret-key-of-the-stack", retention_days=30)
BUCKET = {"Bucket": "etcd-backups"}
OTHERS = {"ID": "logs", "Status": "Enabled", "Filter": {"Prefix": "logs/"}, "Expiration": {"Days": 7}}


def rule(prefix: str, days: int) -> dict:
    return {"ID": f"talos-proxmox-retention-{prefix}", "Status": "Enabled", "Filter": {"Prefix": f"{prefix}/"},
            "Expiration": {"Days": days}}


@pytest.fixture
def s3(monkeypatch):
    client = boto3.client("s3", region_name="us-east-1", aws_access_key_id="a", aws_secret_access_key="b")
    stub = Stubber(client)
    monkeypatch.setattr(backup_target, "_client", lambda _target: client)
    with stub:
        yield stub
        stub.assert_no_pending_responses()


def props(target: BackupTarget) -> dict:
    return {"target": target.props()}


def test_create_puts_the_rule_beside_the_buckets_others_and_records_no_credential(s3):
    s3.add_response("get_bucket_lifecycle_configuration", {"Rules": [OTHERS]}, BUCKET)
    s3.add_response("put_bucket_lifecycle_configuration", {},
                    {**BUCKET, "LifecycleConfiguration": {"Rules": [OTHERS, rule("lab", 30)]}})
    created = BackupRetentionProvider().create(props(TARGET))
    assert created.id == "talos-proxmox-retention-lab"
    assert created.outs == {"bucket": "etcd-backups", "endpoint": "https://s3.lab.local:9000", "prefix": "lab",
                            "retention_days": 30, "rule_id": "talos-proxmox-retention-lab"}


def test_a_new_prefix_takes_the_old_rule_out_and_puts_the_new_one(s3):
    provider = BackupRetentionProvider()
    olds = {"bucket": "etcd-backups", "endpoint": "https://s3.lab.local:9000", "prefix": "lab", "retention_days": 30}
    moved = BackupTarget(**{**TARGET.props(), "prefix": "lab2", "retention_days": 14})
    assert provider.diff("id", olds, props(moved)).changes is True
    assert provider.diff("id", olds, props(TARGET)).changes is False
    s3.add_response("get_bucket_lifecycle_configuration", {"Rules": [OTHERS, rule("lab", 30)]}, BUCKET)
    s3.add_response("put_bucket_lifecycle_configuration", {}, {**BUCKET, "LifecycleConfiguration": {"Rules": [OTHERS]}})
    s3.add_response("get_bucket_lifecycle_configuration", {"Rules": [OTHERS]}, BUCKET)
    s3.add_response("put_bucket_lifecycle_configuration", {},
                    {**BUCKET, "LifecycleConfiguration": {"Rules": [OTHERS, rule("lab2", 14)]}})
    assert provider.update("id", olds, props(moved)).outs["rule_id"] == "talos-proxmox-retention-lab2"


def test_delete_takes_the_rule_out_and_the_configuration_with_it_when_nothing_else_is_left(s3):
    s3.add_response("get_bucket_lifecycle_configuration", {"Rules": [rule("lab", 30)]}, BUCKET)
    s3.add_response("delete_bucket_lifecycle", {}, BUCKET)
    BackupRetentionProvider().delete("id", {"bucket": "etcd-backups", "endpoint": "https://s3.lab.local:9000",
                                            "prefix": "lab", **props(TARGET)})
