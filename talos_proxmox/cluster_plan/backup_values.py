"""What the scheduled etcd backups are made of: talos-backup's CronJob, the Talos ServiceAccount that gets
it a Talos API client certificate with only the `os:etcd:backup` role, the Secret of its S3 credentials,
and the Talos API access each control plane grants. No Pulumi here.

Facts from siderolabs/talos-backup (v0.1.0-beta.3) and Talos's Kubernetes access feature: a
`talos.dev/v1alpha1` ServiceAccount makes Talos write a Secret of the same name and namespace (key
`config`: a talosconfig with the ServiceAccount's roles), which talos-backup reads at
/var/run/secrets/talos.dev; Talos refuses to manage a Secret of that name that exists first, so the program
never makes it. talos-backup takes its target from BUCKET, AWS_REGION, CUSTOM_S3_ENDPOINT, USE_PATH_STYLE,
S3_PREFIX and CLUSTER_NAME, its credentials from AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, and encrypts
each snapshot to AGE_X25519_PUBLIC_KEY; objects are `<prefix>/<cluster>-<RFC 3339 time>.snap.age`.
"""

from __future__ import annotations

from typing import Any, Optional

from talos_proxmox.settings.model import Settings

BACKUP_NAMESPACE = "kube-system"  # the namespace the CCM's Talos access already allows
BACKUP_NAME = "talos-backup"
TALOS_SECRETS = "talos-backup-secrets"  # the Talos ServiceAccount, and the Secret Talos makes for it
S3_CREDENTIALS_SECRET = "talos-backup-s3"
TALOS_SECRETS_MOUNT = "/var/run/secrets/talos.dev"
BACKUP_ROLE = "os:etcd:backup"
CCM_ROLE = "os:reader"


def talos_api_access(settings: Settings) -> Optional[dict[str, Any]]:
    """`machine.features.kubernetesTalosAPIAccess` of the control planes: the roles workloads of the cluster
    may hold (the CCM reads; talos-backup takes snapshots), in kube-system only. None: no workload needs it."""
    roles = [role for role, wanted in ((CCM_ROLE, settings.ccm.enabled), (BACKUP_ROLE, settings.backups.enabled))
             if wanted]
    if not roles:
        return None
    return {"enabled": True, "allowedRoles": roles, "allowedKubernetesNamespaces": [BACKUP_NAMESPACE]}


def talos_service_account() -> dict[str, Any]:
    return {"apiVersion": "talos.dev/v1alpha1", "kind": "ServiceAccount",
            "metadata": {"name": TALOS_SECRETS, "namespace": BACKUP_NAMESPACE},
            "spec": {"roles": [BACKUP_ROLE]}}


def backup_environment(settings: Settings) -> list[dict[str, Any]]:
    """talos-backup's environment: the target and the recipient in plain values, the credentials by
    reference to their Secret (never in the CronJob)."""
    b = settings.backups
    plain = {"BUCKET": b.bucket, "AWS_REGION": b.region, "USE_PATH_STYLE": "true" if b.path_style else "false",
             "CLUSTER_NAME": settings.cluster.name, "S3_PREFIX": b.prefix or settings.cluster.name,
             "AGE_X25519_PUBLIC_KEY": b.age_recipient}
    if b.endpoint:
        plain["CUSTOM_S3_ENDPOINT"] = b.endpoint
    env = [{"name": name, "value": value} for name, value in plain.items()]
    env += [{"name": name, "valueFrom": {"secretKeyRef": {"name": S3_CREDENTIALS_SECRET, "key": name}}}
            for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")]
    return env


def backup_cron_job(settings: Settings) -> dict[str, Any]:
    """The CronJob of talos-backup's sample, on a control plane, one run at a time."""
    container = {
        "name": BACKUP_NAME, "image": settings.backups.image, "imagePullPolicy": "IfNotPresent",
        "command": ["/talos-backup"], "workingDir": "/tmp", "env": backup_environment(settings),
        "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"},
                         {"name": "talos-secrets", "mountPath": TALOS_SECRETS_MOUNT}],
        "securityContext": {"runAsUser": 1000, "runAsGroup": 1000, "runAsNonRoot": True,
                            "allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]},
                            "seccompProfile": {"type": "RuntimeDefault"}},
    }
    pod = {
        "restartPolicy": "OnFailure", "containers": [container],
        "volumes": [{"name": "tmp", "emptyDir": {}}, {"name": "talos-secrets", "secret": {"secretName": TALOS_SECRETS}}],
        # Talos's API answers the `os:etcd:backup` role on control planes (etcd runs there).
        "nodeSelector": {"node-role.kubernetes.io/control-plane": ""},
        "tolerations": [{"key": "node-role.kubernetes.io/control-plane", "operator": "Exists", "effect": "NoSchedule"}],
    }
    return {"apiVersion": "batch/v1", "kind": "CronJob",
            "metadata": {"name": BACKUP_NAME, "namespace": BACKUP_NAMESPACE},
            "spec": {"schedule": settings.backups.schedule, "concurrencyPolicy": "Forbid",
                     "successfulJobsHistoryLimit": 3, "failedJobsHistoryLimit": 3,
                     "jobTemplate": {"spec": {"backoffLimit": 3, "template": {"spec": pod}}}}}
