from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Metadata(_message.Message):
    __slots__ = ("namespace", "type", "id", "version", "phase")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    PHASE_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    type: str
    id: str
    version: str
    phase: str
    def __init__(self, namespace: _Optional[str] = ..., type: _Optional[str] = ..., id: _Optional[str] = ..., version: _Optional[str] = ..., phase: _Optional[str] = ...) -> None: ...

class Spec(_message.Message):
    __slots__ = ("proto_spec", "yaml_spec")
    PROTO_SPEC_FIELD_NUMBER: _ClassVar[int]
    YAML_SPEC_FIELD_NUMBER: _ClassVar[int]
    proto_spec: bytes
    yaml_spec: str
    def __init__(self, proto_spec: _Optional[bytes] = ..., yaml_spec: _Optional[str] = ...) -> None: ...

class Resource(_message.Message):
    __slots__ = ("metadata", "spec")
    METADATA_FIELD_NUMBER: _ClassVar[int]
    SPEC_FIELD_NUMBER: _ClassVar[int]
    metadata: Metadata
    spec: Spec
    def __init__(self, metadata: _Optional[_Union[Metadata, _Mapping]] = ..., spec: _Optional[_Union[Spec, _Mapping]] = ...) -> None: ...

class GetRequest(_message.Message):
    __slots__ = ("namespace", "type", "id", "options")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    OPTIONS_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    type: str
    id: str
    options: GetOptions
    def __init__(self, namespace: _Optional[str] = ..., type: _Optional[str] = ..., id: _Optional[str] = ..., options: _Optional[_Union[GetOptions, _Mapping]] = ...) -> None: ...

class GetOptions(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetResponse(_message.Message):
    __slots__ = ("resource",)
    RESOURCE_FIELD_NUMBER: _ClassVar[int]
    resource: Resource
    def __init__(self, resource: _Optional[_Union[Resource, _Mapping]] = ...) -> None: ...

class ListRequest(_message.Message):
    __slots__ = ("namespace", "type", "options")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    OPTIONS_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    type: str
    options: ListOptions
    def __init__(self, namespace: _Optional[str] = ..., type: _Optional[str] = ..., options: _Optional[_Union[ListOptions, _Mapping]] = ...) -> None: ...

class ListOptions(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListResponse(_message.Message):
    __slots__ = ("resource",)
    RESOURCE_FIELD_NUMBER: _ClassVar[int]
    resource: Resource
    def __init__(self, resource: _Optional[_Union[Resource, _Mapping]] = ...) -> None: ...
