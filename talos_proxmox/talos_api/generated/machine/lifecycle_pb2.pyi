from ..common import common_pb2 as _common_pb2
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class InstallArtifactsSource(_message.Message):
    __slots__ = ("image_name",)
    IMAGE_NAME_FIELD_NUMBER: _ClassVar[int]
    image_name: str
    def __init__(self, image_name: _Optional[str] = ...) -> None: ...

class LifecycleServiceInstallProgress(_message.Message):
    __slots__ = ("message", "exit_code")
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    EXIT_CODE_FIELD_NUMBER: _ClassVar[int]
    message: str
    exit_code: int
    def __init__(self, message: _Optional[str] = ..., exit_code: _Optional[int] = ...) -> None: ...

class LifecycleServiceUpgradeRequest(_message.Message):
    __slots__ = ("containerd", "source")
    CONTAINERD_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    containerd: _common_pb2.ContainerdInstance
    source: InstallArtifactsSource
    def __init__(self, containerd: _Optional[_Union[_common_pb2.ContainerdInstance, _Mapping]] = ..., source: _Optional[_Union[InstallArtifactsSource, _Mapping]] = ...) -> None: ...

class LifecycleServiceUpgradeResponse(_message.Message):
    __slots__ = ("progress",)
    PROGRESS_FIELD_NUMBER: _ClassVar[int]
    progress: LifecycleServiceInstallProgress
    def __init__(self, progress: _Optional[_Union[LifecycleServiceInstallProgress, _Mapping]] = ...) -> None: ...
