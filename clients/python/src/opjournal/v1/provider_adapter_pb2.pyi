from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class LookupOutcome(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    LOOKUP_OUTCOME_UNSPECIFIED: _ClassVar[LookupOutcome]
    LOOKUP_OUTCOME_SUCCEEDED: _ClassVar[LookupOutcome]
    LOOKUP_OUTCOME_FAILED: _ClassVar[LookupOutcome]
    LOOKUP_OUTCOME_PENDING: _ClassVar[LookupOutcome]
    LOOKUP_OUTCOME_NOT_FOUND: _ClassVar[LookupOutcome]
LOOKUP_OUTCOME_UNSPECIFIED: LookupOutcome
LOOKUP_OUTCOME_SUCCEEDED: LookupOutcome
LOOKUP_OUTCOME_FAILED: LookupOutcome
LOOKUP_OUTCOME_PENDING: LookupOutcome
LOOKUP_OUTCOME_NOT_FOUND: LookupOutcome

class LookupOperationRequest(_message.Message):
    __slots__ = ("namespace", "operation_key", "action_type", "external_id", "references", "provider_key")
    class ReferencesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    OPERATION_KEY_FIELD_NUMBER: _ClassVar[int]
    ACTION_TYPE_FIELD_NUMBER: _ClassVar[int]
    EXTERNAL_ID_FIELD_NUMBER: _ClassVar[int]
    REFERENCES_FIELD_NUMBER: _ClassVar[int]
    PROVIDER_KEY_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    operation_key: str
    action_type: str
    external_id: str
    references: _containers.ScalarMap[str, str]
    provider_key: str
    def __init__(self, namespace: _Optional[str] = ..., operation_key: _Optional[str] = ..., action_type: _Optional[str] = ..., external_id: _Optional[str] = ..., references: _Optional[_Mapping[str, str]] = ..., provider_key: _Optional[str] = ...) -> None: ...

class LookupOperationResponse(_message.Message):
    __slots__ = ("outcome", "external_id", "result_json", "error_code", "search_complete")
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    EXTERNAL_ID_FIELD_NUMBER: _ClassVar[int]
    RESULT_JSON_FIELD_NUMBER: _ClassVar[int]
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    SEARCH_COMPLETE_FIELD_NUMBER: _ClassVar[int]
    outcome: LookupOutcome
    external_id: str
    result_json: str
    error_code: str
    search_complete: bool
    def __init__(self, outcome: _Optional[_Union[LookupOutcome, str]] = ..., external_id: _Optional[str] = ..., result_json: _Optional[str] = ..., error_code: _Optional[str] = ..., search_complete: _Optional[bool] = ...) -> None: ...
