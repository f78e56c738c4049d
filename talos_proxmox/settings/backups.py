"""The `backups` section: etcd snapshots on a schedule to an S3-compatible bucket, encrypted to an age
recipient, by Sidero Labs' talos-backup as a CronJob. No Pulumi here."""

from __future__ import annotations

import re
from typing import Any, Optional

from talos_proxmox.settings.image import _http_base_url
from talos_proxmox.settings.model import DEFAULT_TALOS_BACKUP_IMAGE, BackupSettings
from talos_proxmox.settings.values import _Reader, _bool, _int_in, _matching, _string

# S3 bucket names (AWS's rules, which S3-compatible servers follow): 3-63 of a-z 0-9 . -, alphanumeric ends.
_BUCKET = re.compile(r"^(?=.{3,63}$)[a-z0-9][a-z0-9.-]*[a-z0-9]$")
_REGION = re.compile(r"^[a-z0-9-]{1,32}$")
_PREFIX = re.compile(r"^[A-Za-z0-9!_.*'()/-]{1,200}$")
# An age X25519 recipient: Bech32 with the `age` prefix, 58 data characters.
_AGE_RECIPIENT = re.compile(r"^age1[02-9ac-hj-np-z]{58}$")
_IMAGE = re.compile(r"^[a-z0-9.-]+(:[0-9]+)?/[a-z0-9._/-]+(:[A-Za-z0-9._-]+|@sha256:[0-9a-f]{64})$")

# The CronJob's schedule as Kubernetes parses it (robfig/cron's standard parser): five fields or a descriptor.
_CRON_DESCRIPTORS = ("@yearly", "@annually", "@monthly", "@weekly", "@daily", "@midnight", "@hourly")
_CRON_FIELDS = (("minute", 0, 59, ()), ("hour", 0, 23, ()), ("day of month", 1, 31, ()),
                ("month", 1, 12, ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec")),
                ("day of week", 0, 6, ("sun", "mon", "tue", "wed", "thu", "fri", "sat")))


def cron_problem(schedule: str) -> Optional[str]:
    """Why Kubernetes would refuse `schedule` as a CronJob's (None: it takes it)."""
    text = schedule.strip()
    if text in _CRON_DESCRIPTORS:
        return None
    fields = text.split()
    if len(fields) != 5:
        return f"has {len(fields)} fields (expected 5: minute hour day-of-month month day-of-week, or e.g. @daily)"
    for value, (name, low, high, names) in zip(fields, _CRON_FIELDS):
        for item in value.split(","):
            problem = _cron_item_problem(item.lower(), low, high, names, allow_any=name.startswith("day"))
            if problem:
                return f"{name} {value!r}: {problem}"
    return None


def _cron_item_problem(item: str, low: int, high: int, names: tuple[str, ...], allow_any: bool) -> Optional[str]:
    span, _, step = item.partition("/")
    if step and (not step.isdigit() or int(step) == 0):
        return f"step {step!r} is not a positive number"
    if span == "*" or (span == "?" and allow_any):
        return None

    def number(part: str) -> Optional[int]:
        if part in names:
            return names.index(part) + low
        return int(part) if part.isdigit() else None

    bounds = [number(part) for part in span.split("-", 1)]
    if any(b is None for b in bounds):
        return f"{span!r} is not a number in {low}-{high}"
    if any(not low <= b <= high for b in bounds) or (len(bounds) == 2 and bounds[0] > bounds[1]):
        return f"{span!r} is outside {low}-{high}"
    return None


def _schedule(v: Any) -> str:
    if not isinstance(v, str) or cron_problem(v) is not None:
        raise ValueError
    return v.strip()


def _read_backups(r: _Reader, raw: Any) -> BackupSettings:
    s = r.section(raw, "backups", ("enabled", "schedule", "bucket", "endpoint", "region", "pathStyle", "prefix",
                                   "accessKeyId", "secretAccessKey", "ageRecipient", "image",
                                   "retentionDays"))
    enabled = r.value(s, "enabled", "backups.enabled", _bool, "is not true or false", default=bool(s))
    if isinstance(s.get("schedule"), str) and (problem := cron_problem(s["schedule"])):
        r.fail("backups.schedule", s["schedule"], f"is not a schedule Kubernetes takes: {problem}")
        s = {k: v for k, v in s.items() if k != "schedule"}
    required = ... if enabled else ""
    return BackupSettings(
        enabled=enabled,
        schedule=r.value(s, "schedule", "backups.schedule", _schedule, "is not a cron schedule (expected e.g. "
                         "'0 */6 * * *' or @daily)", default="0 */6 * * *"),
        bucket=r.value(s, "bucket", "backups.bucket", _matching(_BUCKET),
                       "is not an S3 bucket name (3-63 lowercase letters, digits, '.' and '-')", default=required),
        endpoint=r.value(s, "endpoint", "backups.endpoint", _http_base_url,
                         "is not an http(s) URL of an S3-compatible endpoint (expected e.g. https://s3.lab.local:9000)",
                         default=None),
        region=r.value(s, "region", "backups.region", _matching(_REGION), "is not a region name (expected e.g. "
                       "us-east-1)", default="us-east-1"),
        path_style=r.value(s, "pathStyle", "backups.pathStyle", _bool, "is not true or false", default=True),
        prefix=r.value(s, "prefix", "backups.prefix", _matching(_PREFIX), "is not an object key prefix",
                       default=None),
        access_key_id=r.value(s, "accessKeyId", "backups.accessKeyId", _string, "is not an access key id",
                              default=required),
        secret_access_key=r.value(s, "secretAccessKey", "backups.secretAccessKey", _string,
                                  "is not a secret access key (set it with `pulumi config set --secret --path "
                                  "talos-proxmox:backups.secretAccessKey`)", default=required),
        age_recipient=r.value(s, "ageRecipient", "backups.ageRecipient", _matching(_AGE_RECIPIENT),
                              "is not an age X25519 recipient (expected age1... as `age-keygen -y` prints it; "
                              "the identity stays with you)", default=required),
        image=r.value(s, "image", "backups.image", _matching(_IMAGE), "is not an image reference (expected "
                      "registry/repository:tag)", default=DEFAULT_TALOS_BACKUP_IMAGE),
        retention_days=r.value(s, "retentionDays", "backups.retentionDays", _int_in(1, 36500),
                               "is not a number of days (expected 1-36500)", default=None),
    )
