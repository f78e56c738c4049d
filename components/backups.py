"""`ClusterBackups`: talos-backup as a CronJob taking etcd snapshots on the stack's schedule, encrypting each
to the stack's age recipient and putting it in the stack's bucket; made only with `backups` on.

Three objects (cluster_plan/backup_values.py): the Secret of the S3 credentials (from Pulumi secrets), the
Talos ServiceAccount whose Secret Talos fills with a client certificate of the `os:etcd:backup` role alone,
and the CronJob. The control planes grant that role through the Talos API access of their machine config
(node_patches.talos_api_access_patches), so the ServiceAccount waits for the nodes' configs.
"""

from __future__ import annotations

from typing import Optional, Sequence

import pulumi
import pulumi_kubernetes as k8s

from talos_proxmox.cluster_plan.backup_values import (
    BACKUP_NAMESPACE,
    S3_CREDENTIALS_SECRET,
    backup_cron_job,
    talos_service_account,
)
from providers.backup_retention import BackupRetention
from talos_proxmox.day_two import backup_target
from talos_proxmox.settings.model import Settings


class ClusterBackups(pulumi.ComponentResource):
    """Attributes: `credentials` (Secret), `talos_service_account` (CustomResource), `cron_job`, `retention`
    (the bucket's lifecycle rule, with `backups.retentionDays`, else None)."""

    def __init__(self, name: str, settings: Settings, k8s_provider: k8s.Provider,
                 depends_on: Sequence[pulumi.Resource] = (), opts: Optional[pulumi.ResourceOptions] = None) -> None:
        super().__init__("talos-proxmox:index:ClusterBackups", name, None, opts)
        in_cluster = pulumi.ResourceOptions(parent=self, provider=k8s_provider, depends_on=list(depends_on))
        b = settings.backups
        self.credentials = k8s.core.v1.Secret(
            "backup-credentials", metadata={"name": S3_CREDENTIALS_SECRET, "namespace": BACKUP_NAMESPACE},
            string_data=pulumi.Output.secret({"AWS_ACCESS_KEY_ID": b.access_key_id,
                                              "AWS_SECRET_ACCESS_KEY": b.secret_access_key}),
            opts=in_cluster)
        account = talos_service_account()
        self.talos_service_account = k8s.apiextensions.CustomResource(
            "backup-talos-access", api_version=account["apiVersion"], kind=account["kind"],
            metadata=account["metadata"], spec=account["spec"], opts=in_cluster)
        job = backup_cron_job(settings)
        self.cron_job = k8s.batch.v1.CronJob(
            "backup-cron-job", metadata=job["metadata"], spec=job["spec"],
            opts=pulumi.ResourceOptions.merge(in_cluster, pulumi.ResourceOptions(
                depends_on=[*depends_on, self.credentials, self.talos_service_account])))
        self.retention: Optional[BackupRetention] = None
        if b.retention_days is not None:
            self.retention = BackupRetention("backup-retention", target=backup_target.target_of(settings).props(),
                                             opts=pulumi.ResourceOptions(parent=self))
        self.register_outputs({})
