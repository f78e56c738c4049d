import datetime

from ..common import common_pb2 as _common_pb2
from google.protobuf import duration_pb2 as _duration_pb2
from google.protobuf import empty_pb2 as _empty_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ApplyConfigurationRequest(_message.Message):
    __slots__ = ("data", "mode", "dry_run", "try_mode_timeout")
    class Mode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        REBOOT: _ClassVar[ApplyConfigurationRequest.Mode]
        AUTO: _ClassVar[ApplyConfigurationRequest.Mode]
        NO_REBOOT: _ClassVar[ApplyConfigurationRequest.Mode]
        STAGED: _ClassVar[ApplyConfigurationRequest.Mode]
        TRY: _ClassVar[ApplyConfigurationRequest.Mode]
    REBOOT: ApplyConfigurationRequest.Mode
    AUTO: ApplyConfigurationRequest.Mode
    NO_REBOOT: ApplyConfigurationRequest.Mode
    STAGED: ApplyConfigurationRequest.Mode
    TRY: ApplyConfigurationRequest.Mode
    DATA_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    DRY_RUN_FIELD_NUMBER: _ClassVar[int]
    TRY_MODE_TIMEOUT_FIELD_NUMBER: _ClassVar[int]
    data: bytes
    mode: ApplyConfigurationRequest.Mode
    dry_run: bool
    try_mode_timeout: _duration_pb2.Duration
    def __init__(self, data: _Optional[bytes] = ..., mode: _Optional[_Union[ApplyConfigurationRequest.Mode, str]] = ..., dry_run: _Optional[bool] = ..., try_mode_timeout: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class ApplyConfiguration(_message.Message):
    __slots__ = ("metadata", "warnings", "mode", "mode_details")
    METADATA_FIELD_NUMBER: _ClassVar[int]
    WARNINGS_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    MODE_DETAILS_FIELD_NUMBER: _ClassVar[int]
    metadata: _common_pb2.Metadata
    warnings: _containers.RepeatedScalarFieldContainer[str]
    mode: ApplyConfigurationRequest.Mode
    mode_details: str
    def __init__(self, metadata: _Optional[_Union[_common_pb2.Metadata, _Mapping]] = ..., warnings: _Optional[_Iterable[str]] = ..., mode: _Optional[_Union[ApplyConfigurationRequest.Mode, str]] = ..., mode_details: _Optional[str] = ...) -> None: ...

class ApplyConfigurationResponse(_message.Message):
    __slots__ = ("messages",)
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    messages: _containers.RepeatedCompositeFieldContainer[ApplyConfiguration]
    def __init__(self, messages: _Optional[_Iterable[_Union[ApplyConfiguration, _Mapping]]] = ...) -> None: ...

class RebootRequest(_message.Message):
    __slots__ = ("mode",)
    class Mode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        DEFAULT: _ClassVar[RebootRequest.Mode]
        POWERCYCLE: _ClassVar[RebootRequest.Mode]
        FORCE: _ClassVar[RebootRequest.Mode]
    DEFAULT: RebootRequest.Mode
    POWERCYCLE: RebootRequest.Mode
    FORCE: RebootRequest.Mode
    MODE_FIELD_NUMBER: _ClassVar[int]
    mode: RebootRequest.Mode
    def __init__(self, mode: _Optional[_Union[RebootRequest.Mode, str]] = ...) -> None: ...

class Reboot(_message.Message):
    __slots__ = ("metadata", "actor_id")
    METADATA_FIELD_NUMBER: _ClassVar[int]
    ACTOR_ID_FIELD_NUMBER: _ClassVar[int]
    metadata: _common_pb2.Metadata
    actor_id: str
    def __init__(self, metadata: _Optional[_Union[_common_pb2.Metadata, _Mapping]] = ..., actor_id: _Optional[str] = ...) -> None: ...

class RebootResponse(_message.Message):
    __slots__ = ("messages",)
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    messages: _containers.RepeatedCompositeFieldContainer[Reboot]
    def __init__(self, messages: _Optional[_Iterable[_Union[Reboot, _Mapping]]] = ...) -> None: ...

class BootstrapRequest(_message.Message):
    __slots__ = ("recover_etcd", "recover_skip_hash_check")
    RECOVER_ETCD_FIELD_NUMBER: _ClassVar[int]
    RECOVER_SKIP_HASH_CHECK_FIELD_NUMBER: _ClassVar[int]
    recover_etcd: bool
    recover_skip_hash_check: bool
    def __init__(self, recover_etcd: _Optional[bool] = ..., recover_skip_hash_check: _Optional[bool] = ...) -> None: ...

class Bootstrap(_message.Message):
    __slots__ = ("metadata",)
    METADATA_FIELD_NUMBER: _ClassVar[int]
    metadata: _common_pb2.Metadata
    def __init__(self, metadata: _Optional[_Union[_common_pb2.Metadata, _Mapping]] = ...) -> None: ...

class BootstrapResponse(_message.Message):
    __slots__ = ("messages",)
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    messages: _containers.RepeatedCompositeFieldContainer[Bootstrap]
    def __init__(self, messages: _Optional[_Iterable[_Union[Bootstrap, _Mapping]]] = ...) -> None: ...

class ResetPartitionSpec(_message.Message):
    __slots__ = ("label", "wipe")
    LABEL_FIELD_NUMBER: _ClassVar[int]
    WIPE_FIELD_NUMBER: _ClassVar[int]
    label: str
    wipe: bool
    def __init__(self, label: _Optional[str] = ..., wipe: _Optional[bool] = ...) -> None: ...

class ResetRequest(_message.Message):
    __slots__ = ("graceful", "reboot", "system_partitions_to_wipe", "user_disks_to_wipe", "mode")
    class WipeMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        ALL: _ClassVar[ResetRequest.WipeMode]
        SYSTEM_DISK: _ClassVar[ResetRequest.WipeMode]
        USER_DISKS: _ClassVar[ResetRequest.WipeMode]
    ALL: ResetRequest.WipeMode
    SYSTEM_DISK: ResetRequest.WipeMode
    USER_DISKS: ResetRequest.WipeMode
    GRACEFUL_FIELD_NUMBER: _ClassVar[int]
    REBOOT_FIELD_NUMBER: _ClassVar[int]
    SYSTEM_PARTITIONS_TO_WIPE_FIELD_NUMBER: _ClassVar[int]
    USER_DISKS_TO_WIPE_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    graceful: bool
    reboot: bool
    system_partitions_to_wipe: _containers.RepeatedCompositeFieldContainer[ResetPartitionSpec]
    user_disks_to_wipe: _containers.RepeatedScalarFieldContainer[str]
    mode: ResetRequest.WipeMode
    def __init__(self, graceful: _Optional[bool] = ..., reboot: _Optional[bool] = ..., system_partitions_to_wipe: _Optional[_Iterable[_Union[ResetPartitionSpec, _Mapping]]] = ..., user_disks_to_wipe: _Optional[_Iterable[str]] = ..., mode: _Optional[_Union[ResetRequest.WipeMode, str]] = ...) -> None: ...

class Reset(_message.Message):
    __slots__ = ("metadata", "actor_id")
    METADATA_FIELD_NUMBER: _ClassVar[int]
    ACTOR_ID_FIELD_NUMBER: _ClassVar[int]
    metadata: _common_pb2.Metadata
    actor_id: str
    def __init__(self, metadata: _Optional[_Union[_common_pb2.Metadata, _Mapping]] = ..., actor_id: _Optional[str] = ...) -> None: ...

class ResetResponse(_message.Message):
    __slots__ = ("messages",)
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    messages: _containers.RepeatedCompositeFieldContainer[Reset]
    def __init__(self, messages: _Optional[_Iterable[_Union[Reset, _Mapping]]] = ...) -> None: ...

class ShutdownRequest(_message.Message):
    __slots__ = ("force",)
    FORCE_FIELD_NUMBER: _ClassVar[int]
    force: bool
    def __init__(self, force: _Optional[bool] = ...) -> None: ...

class Shutdown(_message.Message):
    __slots__ = ("metadata", "actor_id")
    METADATA_FIELD_NUMBER: _ClassVar[int]
    ACTOR_ID_FIELD_NUMBER: _ClassVar[int]
    metadata: _common_pb2.Metadata
    actor_id: str
    def __init__(self, metadata: _Optional[_Union[_common_pb2.Metadata, _Mapping]] = ..., actor_id: _Optional[str] = ...) -> None: ...

class ShutdownResponse(_message.Message):
    __slots__ = ("messages",)
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    messages: _containers.RepeatedCompositeFieldContainer[Shutdown]
    def __init__(self, messages: _Optional[_Iterable[_Union[Shutdown, _Mapping]]] = ...) -> None: ...

class UpgradeRequest(_message.Message):
    __slots__ = ("image", "preserve", "stage", "force", "reboot_mode")
    class RebootMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        DEFAULT: _ClassVar[UpgradeRequest.RebootMode]
        POWERCYCLE: _ClassVar[UpgradeRequest.RebootMode]
    DEFAULT: UpgradeRequest.RebootMode
    POWERCYCLE: UpgradeRequest.RebootMode
    IMAGE_FIELD_NUMBER: _ClassVar[int]
    PRESERVE_FIELD_NUMBER: _ClassVar[int]
    STAGE_FIELD_NUMBER: _ClassVar[int]
    FORCE_FIELD_NUMBER: _ClassVar[int]
    REBOOT_MODE_FIELD_NUMBER: _ClassVar[int]
    image: str
    preserve: bool
    stage: bool
    force: bool
    reboot_mode: UpgradeRequest.RebootMode
    def __init__(self, image: _Optional[str] = ..., preserve: _Optional[bool] = ..., stage: _Optional[bool] = ..., force: _Optional[bool] = ..., reboot_mode: _Optional[_Union[UpgradeRequest.RebootMode, str]] = ...) -> None: ...

class Upgrade(_message.Message):
    __slots__ = ("metadata", "ack", "actor_id")
    METADATA_FIELD_NUMBER: _ClassVar[int]
    ACK_FIELD_NUMBER: _ClassVar[int]
    ACTOR_ID_FIELD_NUMBER: _ClassVar[int]
    metadata: _common_pb2.Metadata
    ack: str
    actor_id: str
    def __init__(self, metadata: _Optional[_Union[_common_pb2.Metadata, _Mapping]] = ..., ack: _Optional[str] = ..., actor_id: _Optional[str] = ...) -> None: ...

class UpgradeResponse(_message.Message):
    __slots__ = ("messages",)
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    messages: _containers.RepeatedCompositeFieldContainer[Upgrade]
    def __init__(self, messages: _Optional[_Iterable[_Union[Upgrade, _Mapping]]] = ...) -> None: ...

class ImagePullRequest(_message.Message):
    __slots__ = ("namespace", "reference")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    REFERENCE_FIELD_NUMBER: _ClassVar[int]
    namespace: _common_pb2.ContainerdNamespace
    reference: str
    def __init__(self, namespace: _Optional[_Union[_common_pb2.ContainerdNamespace, str]] = ..., reference: _Optional[str] = ...) -> None: ...

class ImagePull(_message.Message):
    __slots__ = ("metadata",)
    METADATA_FIELD_NUMBER: _ClassVar[int]
    metadata: _common_pb2.Metadata
    def __init__(self, metadata: _Optional[_Union[_common_pb2.Metadata, _Mapping]] = ...) -> None: ...

class ImagePullResponse(_message.Message):
    __slots__ = ("messages",)
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    messages: _containers.RepeatedCompositeFieldContainer[ImagePull]
    def __init__(self, messages: _Optional[_Iterable[_Union[ImagePull, _Mapping]]] = ...) -> None: ...

class ServiceList(_message.Message):
    __slots__ = ("metadata", "services")
    METADATA_FIELD_NUMBER: _ClassVar[int]
    SERVICES_FIELD_NUMBER: _ClassVar[int]
    metadata: _common_pb2.Metadata
    services: _containers.RepeatedCompositeFieldContainer[ServiceInfo]
    def __init__(self, metadata: _Optional[_Union[_common_pb2.Metadata, _Mapping]] = ..., services: _Optional[_Iterable[_Union[ServiceInfo, _Mapping]]] = ...) -> None: ...

class ServiceListResponse(_message.Message):
    __slots__ = ("messages",)
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    messages: _containers.RepeatedCompositeFieldContainer[ServiceList]
    def __init__(self, messages: _Optional[_Iterable[_Union[ServiceList, _Mapping]]] = ...) -> None: ...

class ServiceInfo(_message.Message):
    __slots__ = ("id", "state", "events", "health")
    ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    HEALTH_FIELD_NUMBER: _ClassVar[int]
    id: str
    state: str
    events: ServiceEvents
    health: ServiceHealth
    def __init__(self, id: _Optional[str] = ..., state: _Optional[str] = ..., events: _Optional[_Union[ServiceEvents, _Mapping]] = ..., health: _Optional[_Union[ServiceHealth, _Mapping]] = ...) -> None: ...

class ServiceEvents(_message.Message):
    __slots__ = ("events",)
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    events: _containers.RepeatedCompositeFieldContainer[ServiceEvent]
    def __init__(self, events: _Optional[_Iterable[_Union[ServiceEvent, _Mapping]]] = ...) -> None: ...

class ServiceEvent(_message.Message):
    __slots__ = ("msg", "state", "ts")
    MSG_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    TS_FIELD_NUMBER: _ClassVar[int]
    msg: str
    state: str
    ts: _timestamp_pb2.Timestamp
    def __init__(self, msg: _Optional[str] = ..., state: _Optional[str] = ..., ts: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class ServiceHealth(_message.Message):
    __slots__ = ("unknown", "healthy", "last_message", "last_change")
    UNKNOWN_FIELD_NUMBER: _ClassVar[int]
    HEALTHY_FIELD_NUMBER: _ClassVar[int]
    LAST_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    LAST_CHANGE_FIELD_NUMBER: _ClassVar[int]
    unknown: bool
    healthy: bool
    last_message: str
    last_change: _timestamp_pb2.Timestamp
    def __init__(self, unknown: _Optional[bool] = ..., healthy: _Optional[bool] = ..., last_message: _Optional[str] = ..., last_change: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class Version(_message.Message):
    __slots__ = ("metadata", "version", "platform", "features")
    METADATA_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    PLATFORM_FIELD_NUMBER: _ClassVar[int]
    FEATURES_FIELD_NUMBER: _ClassVar[int]
    metadata: _common_pb2.Metadata
    version: VersionInfo
    platform: PlatformInfo
    features: FeaturesInfo
    def __init__(self, metadata: _Optional[_Union[_common_pb2.Metadata, _Mapping]] = ..., version: _Optional[_Union[VersionInfo, _Mapping]] = ..., platform: _Optional[_Union[PlatformInfo, _Mapping]] = ..., features: _Optional[_Union[FeaturesInfo, _Mapping]] = ...) -> None: ...

class VersionResponse(_message.Message):
    __slots__ = ("messages",)
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    messages: _containers.RepeatedCompositeFieldContainer[Version]
    def __init__(self, messages: _Optional[_Iterable[_Union[Version, _Mapping]]] = ...) -> None: ...

class VersionInfo(_message.Message):
    __slots__ = ("tag", "sha", "built", "go_version", "os", "arch")
    TAG_FIELD_NUMBER: _ClassVar[int]
    SHA_FIELD_NUMBER: _ClassVar[int]
    BUILT_FIELD_NUMBER: _ClassVar[int]
    GO_VERSION_FIELD_NUMBER: _ClassVar[int]
    OS_FIELD_NUMBER: _ClassVar[int]
    ARCH_FIELD_NUMBER: _ClassVar[int]
    tag: str
    sha: str
    built: str
    go_version: str
    os: str
    arch: str
    def __init__(self, tag: _Optional[str] = ..., sha: _Optional[str] = ..., built: _Optional[str] = ..., go_version: _Optional[str] = ..., os: _Optional[str] = ..., arch: _Optional[str] = ...) -> None: ...

class PlatformInfo(_message.Message):
    __slots__ = ("name", "mode")
    NAME_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    name: str
    mode: str
    def __init__(self, name: _Optional[str] = ..., mode: _Optional[str] = ...) -> None: ...

class FeaturesInfo(_message.Message):
    __slots__ = ("rbac",)
    RBAC_FIELD_NUMBER: _ClassVar[int]
    rbac: bool
    def __init__(self, rbac: _Optional[bool] = ...) -> None: ...

class EtcdLeaveClusterRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class EtcdLeaveCluster(_message.Message):
    __slots__ = ("metadata",)
    METADATA_FIELD_NUMBER: _ClassVar[int]
    metadata: _common_pb2.Metadata
    def __init__(self, metadata: _Optional[_Union[_common_pb2.Metadata, _Mapping]] = ...) -> None: ...

class EtcdLeaveClusterResponse(_message.Message):
    __slots__ = ("messages",)
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    messages: _containers.RepeatedCompositeFieldContainer[EtcdLeaveCluster]
    def __init__(self, messages: _Optional[_Iterable[_Union[EtcdLeaveCluster, _Mapping]]] = ...) -> None: ...

class EtcdRemoveMemberByIDRequest(_message.Message):
    __slots__ = ("member_id",)
    MEMBER_ID_FIELD_NUMBER: _ClassVar[int]
    member_id: int
    def __init__(self, member_id: _Optional[int] = ...) -> None: ...

class EtcdRemoveMemberByID(_message.Message):
    __slots__ = ("metadata",)
    METADATA_FIELD_NUMBER: _ClassVar[int]
    metadata: _common_pb2.Metadata
    def __init__(self, metadata: _Optional[_Union[_common_pb2.Metadata, _Mapping]] = ...) -> None: ...

class EtcdRemoveMemberByIDResponse(_message.Message):
    __slots__ = ("messages",)
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    messages: _containers.RepeatedCompositeFieldContainer[EtcdRemoveMemberByID]
    def __init__(self, messages: _Optional[_Iterable[_Union[EtcdRemoveMemberByID, _Mapping]]] = ...) -> None: ...

class EtcdSnapshotRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class EtcdRecover(_message.Message):
    __slots__ = ("metadata",)
    METADATA_FIELD_NUMBER: _ClassVar[int]
    metadata: _common_pb2.Metadata
    def __init__(self, metadata: _Optional[_Union[_common_pb2.Metadata, _Mapping]] = ...) -> None: ...

class EtcdRecoverResponse(_message.Message):
    __slots__ = ("messages",)
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    messages: _containers.RepeatedCompositeFieldContainer[EtcdRecover]
    def __init__(self, messages: _Optional[_Iterable[_Union[EtcdRecover, _Mapping]]] = ...) -> None: ...

class EtcdMemberListRequest(_message.Message):
    __slots__ = ("query_local",)
    QUERY_LOCAL_FIELD_NUMBER: _ClassVar[int]
    query_local: bool
    def __init__(self, query_local: _Optional[bool] = ...) -> None: ...

class EtcdMember(_message.Message):
    __slots__ = ("id", "hostname", "peer_urls", "client_urls", "is_learner")
    ID_FIELD_NUMBER: _ClassVar[int]
    HOSTNAME_FIELD_NUMBER: _ClassVar[int]
    PEER_URLS_FIELD_NUMBER: _ClassVar[int]
    CLIENT_URLS_FIELD_NUMBER: _ClassVar[int]
    IS_LEARNER_FIELD_NUMBER: _ClassVar[int]
    id: int
    hostname: str
    peer_urls: _containers.RepeatedScalarFieldContainer[str]
    client_urls: _containers.RepeatedScalarFieldContainer[str]
    is_learner: bool
    def __init__(self, id: _Optional[int] = ..., hostname: _Optional[str] = ..., peer_urls: _Optional[_Iterable[str]] = ..., client_urls: _Optional[_Iterable[str]] = ..., is_learner: _Optional[bool] = ...) -> None: ...

class EtcdMembers(_message.Message):
    __slots__ = ("metadata", "legacy_members", "members")
    METADATA_FIELD_NUMBER: _ClassVar[int]
    LEGACY_MEMBERS_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    metadata: _common_pb2.Metadata
    legacy_members: _containers.RepeatedScalarFieldContainer[str]
    members: _containers.RepeatedCompositeFieldContainer[EtcdMember]
    def __init__(self, metadata: _Optional[_Union[_common_pb2.Metadata, _Mapping]] = ..., legacy_members: _Optional[_Iterable[str]] = ..., members: _Optional[_Iterable[_Union[EtcdMember, _Mapping]]] = ...) -> None: ...

class EtcdMemberListResponse(_message.Message):
    __slots__ = ("messages",)
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    messages: _containers.RepeatedCompositeFieldContainer[EtcdMembers]
    def __init__(self, messages: _Optional[_Iterable[_Union[EtcdMembers, _Mapping]]] = ...) -> None: ...
