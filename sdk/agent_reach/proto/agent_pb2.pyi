from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class CallRequest(_message.Message):
    __slots__ = ("request_id", "capability", "payload", "context")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    CAPABILITY_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    capability: str
    payload: bytes
    context: bytes
    def __init__(self, request_id: _Optional[str] = ..., capability: _Optional[str] = ..., payload: _Optional[bytes] = ..., context: _Optional[bytes] = ...) -> None: ...

class BusinessError(_message.Message):
    __slots__ = ("code", "message", "details")
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    DETAILS_FIELD_NUMBER: _ClassVar[int]
    code: str
    message: str
    details: bytes
    def __init__(self, code: _Optional[str] = ..., message: _Optional[str] = ..., details: _Optional[bytes] = ...) -> None: ...

class Usage(_message.Message):
    __slots__ = ("input_tokens", "output_tokens")
    INPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    input_tokens: int
    output_tokens: int
    def __init__(self, input_tokens: _Optional[int] = ..., output_tokens: _Optional[int] = ...) -> None: ...

class CallReply(_message.Message):
    __slots__ = ("request_id", "result", "context_update", "business_error", "usage")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_UPDATE_FIELD_NUMBER: _ClassVar[int]
    BUSINESS_ERROR_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    result: bytes
    context_update: bytes
    business_error: BusinessError
    usage: Usage
    def __init__(self, request_id: _Optional[str] = ..., result: _Optional[bytes] = ..., context_update: _Optional[bytes] = ..., business_error: _Optional[_Union[BusinessError, _Mapping]] = ..., usage: _Optional[_Union[Usage, _Mapping]] = ...) -> None: ...

class Chunk(_message.Message):
    __slots__ = ("seq", "data")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    seq: int
    data: bytes
    def __init__(self, seq: _Optional[int] = ..., data: _Optional[bytes] = ...) -> None: ...

class CallEvent(_message.Message):
    __slots__ = ("chunk", "reply")
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    REPLY_FIELD_NUMBER: _ClassVar[int]
    chunk: Chunk
    reply: CallReply
    def __init__(self, chunk: _Optional[_Union[Chunk, _Mapping]] = ..., reply: _Optional[_Union[CallReply, _Mapping]] = ...) -> None: ...
