"""The stack's backup bucket (`backups`) from the program's side: checked in the preview (it exists, and the
credentials may write to it), and where the etcd snapshots taken before a control plane's upgrade or removal
also go, age-encrypted as talos-backup's are. No Pulumi here.

Objects are named `<prefix>/<cluster>-<node>-<UTC time>-<reason>.snapshot.age`, beside talos-backup's
`<prefix>/<cluster>-<time>.snap.age`. Only the recipient is ever given: what is uploaded cannot be read here.

Retention (`backups.retentionDays`) is the bucket's own: a lifecycle rule of ours (one per prefix, by ID) that
expires the prefix's objects, beside whatever rules the bucket has. talos-backup deletes nothing, and the
server keeps the rule when no `pulumi up` runs for months.
"""

from __future__ import annotations

import datetime
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Mapping, Optional

from talos_proxmox.settings.model import Settings

CALL_TIMEOUT = 20.0  # seconds per S3 call: a preview must not hang on an unreachable endpoint


@dataclass(frozen=True)
class BackupTarget:
    bucket: str
    endpoint: Optional[str]
    region: str
    path_style: bool
    prefix: str
    age_recipient: str
    access_key_id: str = field(repr=False)
    secret_access_key: str = field(repr=False)
    retention_days: Optional[int] = None

    def props(self) -> dict[str, Any]:
        """As a dynamic resource's input (to be wrapped as a Pulumi secret: it holds the credentials)."""
        return asdict(self)

    @classmethod
    def from_props(cls, props: Optional[Mapping[str, Any]]) -> Optional["BackupTarget"]:
        # the engine drops None values from maps (an AWS target's endpoint, no retention): absent is None
        return cls(**{k: props.get(k) for k in cls.__dataclass_fields__}) if props else None

    @property
    def where(self) -> str:
        return f"s3://{self.bucket} at {self.endpoint or f'AWS S3 ({self.region})'}"


def target_of(settings: Settings) -> Optional[BackupTarget]:
    b = settings.backups
    if not b.enabled:
        return None
    return BackupTarget(bucket=b.bucket, endpoint=b.endpoint, region=b.region, path_style=b.path_style,
                        prefix=b.prefix or settings.cluster.name, age_recipient=b.age_recipient,
                        access_key_id=b.access_key_id, secret_access_key=b.secret_access_key,
                        retention_days=b.retention_days)


def _client(target: BackupTarget):
    import boto3  # imported here: rendering and settings never need it
    from botocore.config import Config

    return boto3.client(
        "s3", endpoint_url=target.endpoint, region_name=target.region,
        aws_access_key_id=target.access_key_id, aws_secret_access_key=target.secret_access_key,
        config=Config(s3={"addressing_style": "path" if target.path_style else "virtual"},
                      connect_timeout=CALL_TIMEOUT, read_timeout=CALL_TIMEOUT, retries={"max_attempts": 2}))


# S3's answers that mean the credentials are not accepted, and those that mean the bucket is not there.
REFUSED_CODES = {"403", "InvalidAccessKeyId", "SignatureDoesNotMatch", "AccessDenied", "InvalidToken",
            "ExpiredToken"}
MISSING_CODES = {"404", "NoSuchBucket", "NoSuchKey", "NotFound"}


def s3_answer(error: Any) -> tuple[str, str]:
    """(kind, code) of S3's answer in a botocore ClientError: kind "missing", "refused" or "other"."""
    code = str(error.response.get("Error", {}).get("Code", ""))
    return ("missing" if code in MISSING_CODES else "refused" if code in REFUSED_CODES else "other"), code


def credentials_refused(target: BackupTarget, code: str) -> str:
    return (f"the credentials are refused by {target.where} ({code}; check backups.accessKeyId and "
            "backups.secretAccessKey)")


def target_problems(target: BackupTarget, client_of: Callable[[BackupTarget], Any] = _client) -> list[str]:
    """What stops snapshots from reaching the target, one line each naming the stack key (never a credential)."""
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        client_of(target).head_bucket(Bucket=target.bucket)
    except ClientError as exc:
        kind, code = s3_answer(exc)
        if kind == "missing":
            return [f"talos-proxmox:backups.bucket: {target.bucket!r} does not exist at "
                    f"{target.endpoint or 'AWS S3'} (expected a bucket made beforehand)"]
        if kind == "refused":
            return [f"talos-proxmox:backups.accessKeyId: {credentials_refused(target, code)}"]
        return [f"talos-proxmox:backups.bucket: {target.where} answered {code or 'an error'}"]
    except BotoCoreError as exc:
        return [f"talos-proxmox:backups.endpoint: {target.endpoint or 'AWS S3'} cannot be reached "
                f"({type(exc).__name__})"]
    if target.retention_days is not None:
        try:
            lifecycle_rules(target, client_of)
        except ClientError as exc:
            kind, code = s3_answer(exc)
            if kind == "refused":
                return [f"talos-proxmox:backups.retentionDays: the credentials may not read the lifecycle rules of "
                        f"{target.where} ({code}; retention needs s3:GetLifecycleConfiguration and "
                        "s3:PutLifecycleConfiguration on the bucket)"]
            return [f"talos-proxmox:backups.retentionDays: {target.where} does not keep lifecycle rules ({code}): "
                    "set the retention on the server itself, and leave backups.retentionDays out"]
    return []


def retention_rule_id(target: BackupTarget) -> str:
    return f"talos-proxmox-retention-{target.prefix.strip('/')}"[:255]


def with_retention(rules: list[dict], target: BackupTarget) -> list[dict]:
    """The bucket's lifecycle rules with ours for the target's prefix (expiring its objects after
    `retention_days`) in place of any earlier one of ours; the bucket's other rules as they were."""
    ours = {"ID": retention_rule_id(target), "Status": "Enabled",
            "Filter": {"Prefix": f"{target.prefix.strip('/')}/"}, "Expiration": {"Days": target.retention_days}}
    return [rule for rule in rules if rule.get("ID") != ours["ID"]] + [ours]


def without_retention(rules: list[dict], target: BackupTarget) -> list[dict]:
    return [rule for rule in rules if rule.get("ID") != retention_rule_id(target)]


def lifecycle_rules(target: BackupTarget, client_of: Optional[Callable[[BackupTarget], Any]] = None) -> list[dict]:
    """The bucket's lifecycle rules ([] when it has none); ClientError when the server does not keep any."""
    from botocore.exceptions import ClientError

    try:
        return list((client_of or _client)(target).get_bucket_lifecycle_configuration(Bucket=target.bucket).get("Rules") or [])
    except ClientError as exc:
        if str(exc.response.get("Error", {}).get("Code", "")) == "NoSuchLifecycleConfiguration":
            return []
        raise


def set_lifecycle_rules(target: BackupTarget, rules: list[dict],
                        client_of: Optional[Callable[[BackupTarget], Any]] = None) -> None:
    client = (client_of or _client)(target)
    if rules:
        client.put_bucket_lifecycle_configuration(Bucket=target.bucket, LifecycleConfiguration={"Rules": rules})
    else:
        client.delete_bucket_lifecycle(Bucket=target.bucket)


def object_key(target: BackupTarget, cluster: str, node: str, reason: str, now: datetime.datetime) -> str:
    return (f"{target.prefix.strip('/')}/{cluster}-{node}-"
            f"{now.astimezone(datetime.timezone.utc):%Y%m%dT%H%M%SZ}-{reason}.snapshot.age")


def encrypt(data: bytes, recipient: str) -> bytes:
    import pyrage

    return pyrage.encrypt(data, [pyrage.x25519.Recipient.from_str(recipient)])


def upload_snapshot(target: BackupTarget, data: bytes, *, cluster: str, node: str, reason: str,
                    now: datetime.datetime, client_of: Callable[[BackupTarget], Any] = _client) -> str:
    """Encrypt `data` to the target's recipient and put it in the bucket; returns the object's key."""
    key = object_key(target, cluster, node, reason, now)
    client_of(target).put_object(Bucket=target.bucket, Key=key, Body=encrypt(data, target.age_recipient),
                                 ContentType="application/octet-stream")
    return key
