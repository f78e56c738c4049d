from google.protobuf import any_pb2 as _any_pb2
from google.rpc import status_pb2 as _status_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Code(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    FATAL: _ClassVar[Code]
    LOCKED: _ClassVar[Code]
    CANCELED: _ClassVar[Code]

class ContainerDriver(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CONTAINERD: _ClassVar[ContainerDriver]
    CRI: _ClassVar[ContainerDriver]

class ContainerdNamespace(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    NS_UNKNOWN: _ClassVar[ContainerdNamespace]
    NS_SYSTEM: _ClassVar[ContainerdNamespace]
    NS_CRI: _ClassVar[ContainerdNamespace]
FATAL: Code
LOCKED: Code
CANCELED: Code
CONTAINERD: ContainerDriver
CRI: ContainerDriver
NS_UNKNOWN: ContainerdNamespace
NS_SYSTEM: ContainerdNamespace
NS_CRI: ContainerdNamespace

class Error(_message.Message):
    __slots__ = ("code", "message", "details")
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    DETAILS_FIELD_NUMBER: _ClassVar[int]
    code: Code
    message: str
    details: _containers.RepeatedCompositeFieldContainer[_any_pb2.Any]
    def __init__(self, code: _Optional[_Union[Code, str]] = ..., message: _Optional[str] = ..., details: _Optional[_Iterable[_Union[_any_pb2.Any, _Mapping]]] = ...) -> None: ...

class Metadata(_message.Message):
    __slots__ = ("hostname", "error", "status")
    HOSTNAME_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    hostname: str
    error: str
    status: _status_pb2.Status
    def __init__(self, hostname: _Optional[str] = ..., error: _Optional[str] = ..., status: _Optional[_Union[_status_pb2.Status, _Mapping]] = ...) -> None: ...

class Data(_message.Message):
    __slots__ = ("metadata", "bytes")
    METADATA_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    metadata: Metadata
    bytes: bytes
    def __init__(self, metadata: _Optional[_Union[Metadata, _Mapping]] = ..., bytes: _Optional[bytes] = ...) -> None: ...

class DataResponse(_message.Message):
    __slots__ = ("messages",)
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    messages: _containers.RepeatedCompositeFieldContainer[Data]
    def __init__(self, messages: _Optional[_Iterable[_Union[Data, _Mapping]]] = ...) -> None: ...

class Empty(_message.Message):
    __slots__ = ("metadata",)
    METADATA_FIELD_NUMBER: _ClassVar[int]
    metadata: Metadata
    def __init__(self, metadata: _Optional[_Union[Metadata, _Mapping]] = ...) -> None: ...

class EmptyResponse(_message.Message):
    __slots__ = ("messages",)
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    messages: _containers.RepeatedCompositeFieldContainer[Empty]
    def __init__(self, messages: _Optional[_Iterable[_Union[Empty, _Mapping]]] = ...) -> None: ...

class ContainerdInstance(_message.Message):
    __slots__ = ("driver", "namespace")
    DRIVER_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    driver: ContainerDriver
    namespace: ContainerdNamespace
    def __init__(self, driver: _Optional[_Union[ContainerDriver, str]] = ..., namespace: _Optional[_Union[ContainerdNamespace, str]] = ...) -> None: ...
