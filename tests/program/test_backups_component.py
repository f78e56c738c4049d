"""Scheduled etcd backups as the program registers them (Pulumi mocks): the S3 credentials only in a Secret
sent as a secret, the Talos ServiceAccount of the `os:etcd:backup` role, and talos-backup's CronJob reading
both; refused at load: a schedule Kubernetes would refuse, a missing bucket, a recipient that is no age key,
a secret access key in plain text. The objects as the real API server holds them: tests/engine/test_recovery.py."""

from __future__ import annotations

import pytest

from talos_proxmox.settings.model import SettingsError
from talos_proxmox.settings.stack import load_settings
from tests.program.mocked_program import run_program, stack_config
from tests.program.test_storage_component import PROXMOX, plain

SECRET, CRON_JOB = "kubernetes:core/v1:Secret", "kubernetes:batch/v1:CronJob"
DYNAMIC = "pulumi-python:dynamic:Resource"
TALOS_SA = "kubernetes:talos.dev/v1alpha1:ServiceAccount"
RECIPIENT = "age1ql3z7hjy54pw3hyww5ayyfg7zqgvc7w3j2elw8zmrj2kg5sfn9aqmcac8p"
BACKUPS = {"schedule": "15 */6 * * *", "bucket": "etcd-backups", "endpoint": "https://s3.lab.local:9000",
           "accessKeyId": "talos-backup", "secretAccessKey": "s3-secret-value-0123456789", "ageRecipient": RECIPIENT}


def unwrapped_plain(value):
    """`value` with every secret-wrapped part left out: what would reach the state in plain text."""
    if isinstance(value, dict):
        if plain(value) is not value:
            return "[secret]"
        return {k: unwrapped_plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [unwrapped_plain(v) for v in value]
    return value


def test_the_credentials_secret_the_talos_service_account_and_the_cron_job():
    config = stack_config("test-cluster")
    config["backups"] = BACKUPS
    run = run_program(config, other_config=PROXMOX, secret_keys=["talos-proxmox:backups"])
    credentials = run.one(SECRET, "backup-credentials").inputs
    assert plain(credentials["stringData"]) != credentials["stringData"], "the credentials are sent as a secret"
    assert plain(credentials["stringData"]) == {"AWS_ACCESS_KEY_ID": "talos-backup",
                                                "AWS_SECRET_ACCESS_KEY": "s3-secret-value-0123456789"}
    assert not any("s3-secret-value" in repr(unwrapped_plain(r.inputs)) for r in run.registrations), \
        "the S3 key is sent outside a secret"
    account = run.one(TALOS_SA, "backup-talos-access").inputs
    assert (account["metadata"], account["spec"]) == ({"name": "talos-backup-secrets", "namespace": "kube-system"},
                                                      {"roles": ["os:etcd:backup"]})
    job = run.one(CRON_JOB, "backup-cron-job")
    assert job.inputs["spec"]["schedule"] == "15 */6 * * *"
    container = job.inputs["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}
    assert env == {"BUCKET": "etcd-backups", "AWS_REGION": "us-east-1", "USE_PATH_STYLE": "true",
                   "CLUSTER_NAME": "test-cluster", "S3_PREFIX": "test-cluster", "AGE_X25519_PUBLIC_KEY": RECIPIENT,
                   "CUSTOM_S3_ENDPOINT": "https://s3.lab.local:9000",
                   "AWS_ACCESS_KEY_ID": {"secretKeyRef": {"name": "talos-backup-s3", "key": "AWS_ACCESS_KEY_ID"}},
                   "AWS_SECRET_ACCESS_KEY": {"secretKeyRef": {"name": "talos-backup-s3",
                                                              "key": "AWS_SECRET_ACCESS_KEY"}}}
    assert {run.one(SECRET, "backup-credentials").urn, run.one(TALOS_SA, "backup-talos-access").urn} <= set(
        job.dependencies)


def test_the_preview_check_and_each_control_plane_s_lifecycle_get_the_bucket_as_a_secret():
    config = stack_config("test-cluster")
    config["backups"] = BACKUPS
    run = run_program(config, other_config=PROXMOX, secret_keys=["talos-proxmox:backups"])
    [changes] = [r for r in run.named("node-changes") if r.type == DYNAMIC]
    target = changes.inputs["backup_target"]
    assert plain(target) != target, "the bucket's credentials are sent as a secret"
    assert plain(target) == {"bucket": "etcd-backups", "endpoint": "https://s3.lab.local:9000", "region": "us-east-1",
                             "path_style": True, "prefix": "test-cluster", "age_recipient": RECIPIENT,
                             "access_key_id": "talos-backup", "secret_access_key": "s3-secret-value-0123456789"}
    lifecycle = run.one(DYNAMIC, "lifecycle-master-1").inputs["etcd_snapshots"]
    assert plain(lifecycle) != lifecycle and plain(lifecycle)["target"] == plain(target)
    assert plain(lifecycle)["directory"] == "etcd-snapshots"


def test_retention_is_the_buckets_lifecycle_rule_made_with_the_target_as_a_secret():
    config = stack_config("test-cluster")
    config["backups"] = {**BACKUPS, "retentionDays": 30}
    run = run_program(config, other_config=PROXMOX, secret_keys=["talos-proxmox:backups"])
    target = run.one(DYNAMIC, "backup-retention").inputs["target"]
    assert plain(target) != target, "the bucket's credentials are sent as a secret"
    assert (plain(target)["prefix"], plain(target)["retention_days"]) == ("test-cluster", 30)
    without = run_program({**config, "backups": BACKUPS}, other_config=PROXMOX, secret_keys=["talos-proxmox:backups"])
    assert not without.named("backup-retention")


def test_without_backups_nothing_of_them_is_made():
    run = run_program(stack_config("test-cluster"), other_config=PROXMOX)
    assert not run.of_type(CRON_JOB) and not run.of_type(TALOS_SA)
    [changes] = [r for r in run.named("node-changes") if r.type == DYNAMIC]
    assert changes.inputs.get("backup_target") is None
    assert "target" not in run.one(DYNAMIC, "lifecycle-master-1").inputs["etcd_snapshots"]


@pytest.mark.parametrize("change, message", [
    ({"schedule": "0 */6 * *"}, "talos-proxmox:backups.schedule: '0 */6 * *' is not a schedule Kubernetes takes: "
                                "has 4 fields (expected 5: minute hour day-of-month month day-of-week, or e.g. @daily)"),
    ({"schedule": "0 25 * * *"}, "talos-proxmox:backups.schedule: '0 25 * * *' is not a schedule Kubernetes takes: "
                                 "hour '25': '25' is outside 0-23"),
    ({"bucket": None}, "talos-proxmox:backups.bucket: is required: an S3 bucket name (3-63 lowercase letters, "
                       "digits, '.' and '-')"),
    ({"ageRecipient": "AGE-SECRET-KEY-1QQQ"}, "talos-proxmox:backups.ageRecipient: 'AGE-SECRET-KEY-1QQQ' is not an "
                                              "age X25519 recipient (expected age1... as `age-keygen -y` prints it; "
                                              "the identity stays with you)"),
    ({"endpoint": "s3.lab.local:9000"}, "talos-proxmox:backups.endpoint: 's3.lab.local:9000' is not an http(s) URL "
                                        "of an S3-compatible endpoint (expected e.g. https://s3.lab.local:9000)"),
    ({"retentionDays": 0}, "talos-proxmox:backups.retentionDays: 0 is not a number of days (expected 1-36500)"),
], ids=["four-fields", "hour-25", "no-bucket", "identity-not-recipient", "endpoint-without-scheme", "no-days"])
def test_a_bad_backups_section_is_refused_at_load_naming_the_key(change, message):
    raw = stack_config("test-cluster")
    raw["backups"] = {k: v for k, v in {**BACKUPS, **change}.items() if v is not None}
    with pytest.raises(SettingsError) as err:
        load_settings(raw, secret_keys=())
    assert err.value.problems == [message]
