import datetime

from ..common import common_pb2 as _common_pb2
from google.protobuf import duration_pb2 as _duration_pb2
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ImageServicePullRequest(_message.Message):
    __slots__ = ("containerd", "image_ref")
    CONTAINERD_FIELD_NUMBER: _ClassVar[int]
    IMAGE_REF_FIELD_NUMBER: _ClassVar[int]
    containerd: _common_pb2.ContainerdInstance
    image_ref: str
    def __init__(self, containerd: _Optional[_Union[_common_pb2.ContainerdInstance, _Mapping]] = ..., image_ref: _Optional[str] = ...) -> None: ...

class ImageServicePullResponse(_message.Message):
    __slots__ = ("name", "pull_progress")
    NAME_FIELD_NUMBER: _ClassVar[int]
    PULL_PROGRESS_FIELD_NUMBER: _ClassVar[int]
    name: str
    pull_progress: ImageServicePullProgress
    def __init__(self, name: _Optional[str] = ..., pull_progress: _Optional[_Union[ImageServicePullProgress, _Mapping]] = ...) -> None: ...

class ImageServicePullLayerProgress(_message.Message):
    __slots__ = ("status", "elapsed", "offset", "total")
    class Status(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        DOWNLOADING: _ClassVar[ImageServicePullLayerProgress.Status]
        DOWNLOAD_COMPLETE: _ClassVar[ImageServicePullLayerProgress.Status]
        EXTRACTING: _ClassVar[ImageServicePullLayerProgress.Status]
        EXTRACT_COMPLETE: _ClassVar[ImageServicePullLayerProgress.Status]
        ALREADY_EXISTS: _ClassVar[ImageServicePullLayerProgress.Status]
    DOWNLOADING: ImageServicePullLayerProgress.Status
    DOWNLOAD_COMPLETE: ImageServicePullLayerProgress.Status
    EXTRACTING: ImageServicePullLayerProgress.Status
    EXTRACT_COMPLETE: ImageServicePullLayerProgress.Status
    ALREADY_EXISTS: ImageServicePullLayerProgress.Status
    STATUS_FIELD_NUMBER: _ClassVar[int]
    ELAPSED_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    TOTAL_FIELD_NUMBER: _ClassVar[int]
    status: ImageServicePullLayerProgress.Status
    elapsed: _duration_pb2.Duration
    offset: int
    total: int
    def __init__(self, status: _Optional[_Union[ImageServicePullLayerProgress.Status, str]] = ..., elapsed: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., offset: _Optional[int] = ..., total: _Optional[int] = ...) -> None: ...

class ImageServicePullProgress(_message.Message):
    __slots__ = ("layer_id", "progress")
    LAYER_ID_FIELD_NUMBER: _ClassVar[int]
    PROGRESS_FIELD_NUMBER: _ClassVar[int]
    layer_id: str
    progress: ImageServicePullLayerProgress
    def __init__(self, layer_id: _Optional[str] = ..., progress: _Optional[_Union[ImageServicePullLayerProgress, _Mapping]] = ...) -> None: ...
