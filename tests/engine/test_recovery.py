"""Disaster recovery with the real CLI: every control plane lost, new VMs, `pulumi up` with
`cluster.recoverFrom`; and the scheduled backups that stack turns on (`backups`), as the real API server
holds them.

A new stack of one control plane and one worker (as after the loss: new VMs, the stack's state gone or
refreshed away) on the real Proxmox provider and the Talos stand-ins. First with a snapshot of another
cluster (tests/data/etcd/other-cluster.snapshot, made by the real etcd): refused in the preview, before
any PVE request or node call. Then with this cluster's snapshot (dr-cp-1.snapshot, a real etcd member
`dr-cp-1` at the stack's first control plane) as talos-backup leaves it: an object of the backup bucket,
age-encrypted to the operator's recipient. With an identity file that is not the recipient's it is refused
in the preview the same way; with the right one the first control plane receives exactly the decrypted
snapshot through EtcdRecover, then one Bootstrap with `recover_etcd`, and etcd is restored from it; a next
up with the same stack recovers nothing again. The recovered stack also runs talos-backup: its CronJob, the Talos
ServiceAccount of the `os:etcd:backup` role and the Secret of the S3 credentials (set with `pulumi config
set --secret --path`) are read back from the API server, and the credentials appear nowhere else.
"""

from __future__ import annotations

import base64

import boto3
import pyrage
import pytest
import yaml

from tests.engine.cluster import engine_cluster, engine_stack
from tests.engine.test_addons import _get, deploy
from tests.paths import REPO
from tests.stand_ins.s3_server import ACCESS_KEY, SECRET_KEY, serve_s3

pytestmark = pytest.mark.engine

NODES = [("dr-cp-1", "controlplane", "127.0.0.122"), ("dr-worker-1", "worker", "127.0.0.123")]
TALOS = "v1.13.7"
SNAPSHOTS = REPO / "tests" / "data" / "etcd"
OURS, OTHER = SNAPSHOTS / "dr-cp-1.snapshot", SNAPSHOTS / "other-cluster.snapshot"
IDENTITY = pyrage.x25519.Identity.generate()  # the operator's: the program only ever sees the recipient
RECIPIENT = str(IDENTITY.to_public())
UPGRADE = "v1.13.8"
BACKUP = "dev/dev-20261207T130509Z.snap.age"  # where talos-backup puts a snapshot: <prefix>/<cluster>-<time>.snap.age
OBJECT = f"s3://etcd-backups/{BACKUP}"


@pytest.fixture(scope="module")
def recovery(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("recovery")
    with engine_cluster(tmp, NODES, TALOS) as (cluster, project), serve_s3(tmp) as s3:
        s3.make_bucket("etcd-backups")
        boto3.client("s3", endpoint_url=s3.endpoint, region_name="us-east-1", aws_access_key_id=ACCESS_KEY,
                     aws_secret_access_key=SECRET_KEY).put_object(
            Bucket="etcd-backups", Key=BACKUP, Body=pyrage.encrypt(OURS.read_bytes(), [IDENTITY.to_public()]))
        identity_file, stranger_file = tmp / "backup.key", tmp / "stranger.key"
        identity_file.write_text(f"# public key: {RECIPIENT}\n{IDENTITY}\n")
        stranger_file.write_text(f"{pyrage.x25519.Identity.generate()}\n")

        def encrypted_key(value: str) -> dict:
            """The S3 key as a user sets it (`pulumi config set --secret --path`): its ciphertext in the stack file."""
            project.cli("config", "set", "--secret", "--path", "talos-proxmox:backups.secretAccessKey", value,
                        "--stack", project.stack)
            return yaml.safe_load(project.stack_file.read_text())["config"]["talos-proxmox:backups"]

        wrong_key, right_key = encrypted_key("not-the-bucket-key"), encrypted_key(SECRET_KEY)

        def config(snapshot=OBJECT, key=right_key, talos=TALOS, identity=identity_file):
            stack = engine_stack(cluster, NODES, talos, tmp / "secrets.yaml")
            stack["cluster"].update(recoverFrom=str(snapshot), recoverIdentityFile=str(identity))
            stack["backups"] = {"bucket": "etcd-backups", "endpoint": s3.endpoint, "accessKeyId": ACCESS_KEY,
                                "ageRecipient": RECIPIENT, **key}
            return stack
        refused = cluster.deploy(project, config(OTHER), tmp / "render-refused", fails=True)
        # from the local copy, so that it is the preview's bucket check that meets the refused key
        refused_key = cluster.deploy(project, config(OURS, key=wrong_key), tmp / "render-refused-key", fails=True)
        refused_identity = cluster.deploy(project, config(identity=stranger_file), tmp / "render-refused-identity",
                                          fails=True)
        recovered = deploy(cluster, project, config(), tmp / "render-recovered")
        backups = {"cron job": _get(cluster, "/apis/batch/v1/namespaces/kube-system/cronjobs/talos-backup"),
                   "talos access": _get(cluster, "/apis/talos.dev/v1alpha1/namespaces/kube-system/serviceaccounts/"
                                                 "talos-backup-secrets"),
                   "credentials": _get(cluster, "/api/v1/namespaces/kube-system/secrets/talos-backup-s3")}
        again = deploy(cluster, project, config(), tmp / "render-again")
        upgraded = deploy(cluster, project, config(talos=UPGRADE), tmp / "render-upgraded")
        yield {"refused": refused, "refused key": refused_key, "refused identity": refused_identity,
               "identity file": stranger_file, "recovered": recovered, "again": again,
               "upgraded": upgraded, "bucket": s3.objects("etcd-backups"), "s3 endpoint": s3.endpoint,
               "cluster": cluster, "backups": backups}


def test_a_snapshot_of_another_cluster_is_refused_before_any_pve_request_or_node_call(recovery):
    refused = recovery["refused"]
    assert refused.stopped_in_preview
    assert refused.pve_requests == 0
    assert all(calls == [] for calls in refused.calls.values()), refused.calls
    printed = refused.preview.stdout + refused.preview.stderr
    assert (f"talos-proxmox:cluster.recoverFrom: '{OTHER}' is a snapshot of another cluster: its etcd members are "
            "prod-cp-1 (https://10.20.0.11:2380), and none is a control plane of this stack (dr-cp-1 (127.0.0.122))"
            in printed), printed[-2000:]


def test_the_first_control_plane_gets_exactly_that_snapshot_then_one_recovering_bootstrap(recovery):
    cluster, recovered = recovery["cluster"], recovery["recovered"]
    first = recovered.calls["dr-cp-1"]
    recovery_calls = [(c.rpc, c.request) for c in first if c.rpc in ("EtcdRecover", "Bootstrap")]
    assert [rpc for rpc, _ in recovery_calls] == ["EtcdRecover", "Bootstrap"]
    assert recovery_calls[0][1].bytes == OURS.read_bytes()
    bootstrap = recovery_calls[1][1]
    assert (bootstrap.recover_etcd, bootstrap.recover_skip_hash_check) == (True, False)
    assert cluster.nodes["dr-cp-1"].etcd_restored_from == OURS.read_bytes()
    assert not [c for c in recovered.calls["dr-worker-1"] if c.rpc in ("EtcdRecover", "Bootstrap")]
    printed = "".join(recovered.up.diagnostics("info#err")) + recovered.up.stdout
    assert f"recovering etcd on 127.0.0.122 from {OBJECT} ({OURS.stat().st_size} bytes)" in printed


def test_an_identity_that_cannot_decrypt_the_object_is_refused_before_any_pve_request_or_node_call(recovery):
    refused = recovery["refused identity"]
    assert refused.stopped_in_preview and refused.pve_requests == 0
    assert all(calls == [] for calls in refused.calls.values()), refused.calls
    printed = refused.preview.stdout + refused.preview.stderr
    assert (f"talos-proxmox:cluster.recoverFrom: 's3://[secret]/{BACKUP}' cannot be decrypted with the identities "
            f"in cluster.recoverIdentityFile '{recovery['identity file']}' (encrypted to another recipient?)"
            in printed), printed[-2000:]
    assert "AGE-SECRET-KEY" not in printed


def test_a_next_up_with_the_same_snapshot_recovers_nothing_again(recovery):
    again, recovered = recovery["again"], recovery["recovered"]
    assert not [c for c in again.new_calls(recovered, "dr-cp-1") if c.rpc in ("EtcdRecover", "Bootstrap")]
    assert "bootstrap" not in again.up.changes()


def test_the_backup_cron_job_its_talos_access_and_credentials_as_the_api_server_holds_them(recovery):
    backups = recovery["backups"]
    job = backups["cron job"]["spec"]
    assert job["schedule"] == "0 */6 * * *" and job["concurrencyPolicy"] == "Forbid"
    pod = job["jobTemplate"]["spec"]["template"]["spec"]
    [container] = pod["containers"]
    assert container["image"] == "ghcr.io/siderolabs/talos-backup:v0.1.0-beta.3"
    env = {e["name"]: e.get("value") or e["valueFrom"]["secretKeyRef"]["name"] for e in container["env"]}
    assert env == {"BUCKET": "etcd-backups", "AWS_REGION": "us-east-1", "USE_PATH_STYLE": "true",
                   "CLUSTER_NAME": "dev", "S3_PREFIX": "dev", "AGE_X25519_PUBLIC_KEY": RECIPIENT,
                   "CUSTOM_S3_ENDPOINT": recovery["s3 endpoint"],
                   "AWS_ACCESS_KEY_ID": "talos-backup-s3", "AWS_SECRET_ACCESS_KEY": "talos-backup-s3"}
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert mounts["talos-secrets"] == "/var/run/secrets/talos.dev"
    assert {v["name"]: v.get("secret", {}).get("secretName") for v in pod["volumes"]}["talos-secrets"] == (
        "talos-backup-secrets")
    assert backups["talos access"]["spec"] == {"roles": ["os:etcd:backup"]}
    data = {k: base64.b64decode(v).decode() for k, v in backups["credentials"]["data"].items()}
    assert data == {"AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY}
    recovered = recovery["recovered"]
    assert SECRET_KEY not in recovered.up.stdout + recovered.up.stderr + recovered.preview.stdout
    assert SECRET_KEY not in repr(recovered.state), "the S3 key is in the state export in plain text"


def test_refused_bucket_credentials_stop_the_preview_before_any_pve_request_or_node_call(recovery):
    refused = recovery["refused key"]
    assert refused.stopped_in_preview and refused.pve_requests == 0
    assert all(calls == [] for calls in refused.calls.values()), refused.calls
    printed = refused.preview.stdout + refused.preview.stderr
    assert "talos-proxmox:backups.accessKeyId: the credentials are refused by s3://etcd-backups at http://127.0.0.1:" \
        in printed, printed[-2000:]
    assert "not-the-bucket-key" not in printed


def test_the_snapshot_before_the_control_plane_s_upgrade_lands_encrypted_in_the_bucket(recovery):
    cluster, upgraded = recovery["cluster"], recovery["upgraded"]
    assert cluster.nodes["dr-cp-1"].version_tag == UPGRADE
    [(key, stored)] = [(k, v) for k, v in recovery["bucket"].items() if k.startswith("dev/dev-dr-cp-1-")]
    assert key.endswith("-upgrade.snapshot.age")
    assert stored.startswith(b"age-encryption.org/v1\n")
    assert pyrage.decrypt(stored, [IDENTITY]) == cluster.nodes["dr-cp-1"].etcd_snapshot_data
    printed = "".join(upgraded.up.diagnostics("info#err"))
    assert f"s3://etcd-backups/{key} (encrypted)" in printed
