"""BackupRetention: the backup bucket's lifecycle rule that expires the stack's snapshots after
`backups.retentionDays` (talos_proxmox.day_two.backup_target: the rule, kept beside the bucket's others).

- create/update: put the rule in the bucket's lifecycle configuration (read first, the other rules kept; a rule
  of ours for an earlier bucket or prefix is taken out first).
- delete: take the rule out (the bucket's lifecycle configuration goes when nothing else is left in it).
The preview's bucket check (NodeChanges) refuses a server that keeps no lifecycle rules before this runs.
State: the bucket, endpoint, prefix, days and rule ID; never the credentials.
"""

from __future__ import annotations

from typing import Any, Optional

import pulumi
import pulumi.dynamic as dynamic

from talos_proxmox.day_two import backup_target
from talos_proxmox.day_two.backup_target import BackupTarget
from talos_proxmox.day_two.progress import note

RECORDED = ("bucket", "endpoint", "prefix", "retention_days")


def _outputs(target: BackupTarget) -> dict[str, Any]:
    return {"bucket": target.bucket, "endpoint": target.endpoint, "prefix": target.prefix,
            "retention_days": target.retention_days, "rule_id": backup_target.retention_rule_id(target)}


def _target(props: dict[str, Any]) -> BackupTarget:
    return BackupTarget.from_props(props["target"])


class BackupRetentionProvider(dynamic.ResourceProvider):
    def create(self, props: dict[str, Any]) -> dynamic.CreateResult:
        target = _target(props)
        rules = backup_target.with_retention(backup_target.lifecycle_rules(target), target)
        backup_target.set_lifecycle_rules(target, rules)
        note("backups", f"{target.where}: objects under {target.prefix}/ expire after {target.retention_days} days "
                        f"(lifecycle rule {backup_target.retention_rule_id(target)})")
        return dynamic.CreateResult(id_=backup_target.retention_rule_id(target), outs=_outputs(target))

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> dynamic.DiffResult:
        new = _target(news)
        changed = [key for key in RECORDED if olds.get(key) != getattr(new, key)]
        return dynamic.DiffResult(changes=bool(changed), replaces=[], stables=[], delete_before_replace=False)

    def update(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> dynamic.UpdateResult:
        new = _target(news)
        if (olds.get("bucket"), olds.get("endpoint"), olds.get("prefix")) != (new.bucket, new.endpoint, new.prefix):
            self.delete(_id, {**olds, "target": news["target"]})
        return dynamic.UpdateResult(outs=self.create(news).outs)

    def delete(self, _id: str, props: dict[str, Any]) -> None:
        # The recorded bucket and prefix, reached with the credentials the stack has now.
        target = BackupTarget.from_props({**props["target"], **{key: props[key] for key in ("bucket", "endpoint",
                                                                                           "prefix")}})
        backup_target.set_lifecycle_rules(target, backup_target.without_retention(
            backup_target.lifecycle_rules(target), target))


class BackupRetention(dynamic.Resource):
    """Expire the backup target's objects after its `retention_days` (`target`: BackupTarget.props())."""

    def __init__(self, name: str, *, target: dict, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__(BackupRetentionProvider(), name, {
            "target": pulumi.Output.secret(target), **{key: None for key in (*RECORDED, "rule_id")}}, opts)
