import datetime

from google.protobuf import duration_pb2 as _duration_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class OperationStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    OPERATION_STATUS_UNSPECIFIED: _ClassVar[OperationStatus]
    OPERATION_STATUS_PENDING: _ClassVar[OperationStatus]
    OPERATION_STATUS_IN_PROGRESS: _ClassVar[OperationStatus]
    OPERATION_STATUS_UNKNOWN: _ClassVar[OperationStatus]
    OPERATION_STATUS_SUCCEEDED: _ClassVar[OperationStatus]
    OPERATION_STATUS_FAILED_FINAL: _ClassVar[OperationStatus]

class Decision(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    DECISION_UNSPECIFIED: _ClassVar[Decision]
    DECISION_EXECUTE: _ClassVar[Decision]
    DECISION_REPLAY: _ClassVar[Decision]
    DECISION_IN_PROGRESS: _ClassVar[Decision]
    DECISION_VERIFICATION_REQUIRED: _ClassVar[Decision]
    DECISION_DUPLICATE_INTENT_SUSPECTED: _ClassVar[Decision]

class ObservationOutcome(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    OBSERVATION_OUTCOME_UNSPECIFIED: _ClassVar[ObservationOutcome]
    OBSERVATION_OUTCOME_SUCCEEDED: _ClassVar[ObservationOutcome]
    OBSERVATION_OUTCOME_FAILED: _ClassVar[ObservationOutcome]
    OBSERVATION_OUTCOME_PENDING: _ClassVar[ObservationOutcome]
    OBSERVATION_OUTCOME_NOT_FOUND: _ClassVar[ObservationOutcome]
    OBSERVATION_OUTCOME_DEFINITIVELY_ABSENT: _ClassVar[ObservationOutcome]
    OBSERVATION_OUTCOME_LOOKUP_FAILED: _ClassVar[ObservationOutcome]

class ReconcileAction(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    RECONCILE_ACTION_UNSPECIFIED: _ClassVar[ReconcileAction]
    RECONCILE_ACTION_MARKED_SUCCEEDED: _ClassVar[ReconcileAction]
    RECONCILE_ACTION_MARKED_FAILED: _ClassVar[ReconcileAction]
    RECONCILE_ACTION_RELEASED_FOR_RETRY: _ClassVar[ReconcileAction]
    RECONCILE_ACTION_KEPT_UNKNOWN: _ClassVar[ReconcileAction]
    RECONCILE_ACTION_SUPERSEDED: _ClassVar[ReconcileAction]
    RECONCILE_ACTION_ESCALATED: _ClassVar[ReconcileAction]

class ActorKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ACTOR_KIND_UNSPECIFIED: _ClassVar[ActorKind]
    ACTOR_KIND_CLIENT: _ClassVar[ActorKind]
    ACTOR_KIND_WORKER: _ClassVar[ActorKind]
    ACTOR_KIND_REVIEWER: _ClassVar[ActorKind]
OPERATION_STATUS_UNSPECIFIED: OperationStatus
OPERATION_STATUS_PENDING: OperationStatus
OPERATION_STATUS_IN_PROGRESS: OperationStatus
OPERATION_STATUS_UNKNOWN: OperationStatus
OPERATION_STATUS_SUCCEEDED: OperationStatus
OPERATION_STATUS_FAILED_FINAL: OperationStatus
DECISION_UNSPECIFIED: Decision
DECISION_EXECUTE: Decision
DECISION_REPLAY: Decision
DECISION_IN_PROGRESS: Decision
DECISION_VERIFICATION_REQUIRED: Decision
DECISION_DUPLICATE_INTENT_SUSPECTED: Decision
OBSERVATION_OUTCOME_UNSPECIFIED: ObservationOutcome
OBSERVATION_OUTCOME_SUCCEEDED: ObservationOutcome
OBSERVATION_OUTCOME_FAILED: ObservationOutcome
OBSERVATION_OUTCOME_PENDING: ObservationOutcome
OBSERVATION_OUTCOME_NOT_FOUND: ObservationOutcome
OBSERVATION_OUTCOME_DEFINITIVELY_ABSENT: ObservationOutcome
OBSERVATION_OUTCOME_LOOKUP_FAILED: ObservationOutcome
RECONCILE_ACTION_UNSPECIFIED: ReconcileAction
RECONCILE_ACTION_MARKED_SUCCEEDED: ReconcileAction
RECONCILE_ACTION_MARKED_FAILED: ReconcileAction
RECONCILE_ACTION_RELEASED_FOR_RETRY: ReconcileAction
RECONCILE_ACTION_KEPT_UNKNOWN: ReconcileAction
RECONCILE_ACTION_SUPERSEDED: ReconcileAction
RECONCILE_ACTION_ESCALATED: ReconcileAction
ACTOR_KIND_UNSPECIFIED: ActorKind
ACTOR_KIND_CLIENT: ActorKind
ACTOR_KIND_WORKER: ActorKind
ACTOR_KIND_REVIEWER: ActorKind

class Operation(_message.Message):
    __slots__ = ("namespace", "operation_key", "action_type", "request_hash", "status", "attempt_count", "external_id", "result_json", "error_code", "lease_until", "created_at", "updated_at", "references", "next_check_at", "reconcile_attempts", "review_required_at", "review_reason", "provider_key")
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
    REQUEST_HASH_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_COUNT_FIELD_NUMBER: _ClassVar[int]
    EXTERNAL_ID_FIELD_NUMBER: _ClassVar[int]
    RESULT_JSON_FIELD_NUMBER: _ClassVar[int]
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    LEASE_UNTIL_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    UPDATED_AT_FIELD_NUMBER: _ClassVar[int]
    REFERENCES_FIELD_NUMBER: _ClassVar[int]
    NEXT_CHECK_AT_FIELD_NUMBER: _ClassVar[int]
    RECONCILE_ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    REVIEW_REQUIRED_AT_FIELD_NUMBER: _ClassVar[int]
    REVIEW_REASON_FIELD_NUMBER: _ClassVar[int]
    PROVIDER_KEY_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    operation_key: str
    action_type: str
    request_hash: str
    status: OperationStatus
    attempt_count: int
    external_id: str
    result_json: str
    error_code: str
    lease_until: _timestamp_pb2.Timestamp
    created_at: _timestamp_pb2.Timestamp
    updated_at: _timestamp_pb2.Timestamp
    references: _containers.ScalarMap[str, str]
    next_check_at: _timestamp_pb2.Timestamp
    reconcile_attempts: int
    review_required_at: _timestamp_pb2.Timestamp
    review_reason: str
    provider_key: str
    def __init__(self, namespace: _Optional[str] = ..., operation_key: _Optional[str] = ..., action_type: _Optional[str] = ..., request_hash: _Optional[str] = ..., status: _Optional[_Union[OperationStatus, str]] = ..., attempt_count: _Optional[int] = ..., external_id: _Optional[str] = ..., result_json: _Optional[str] = ..., error_code: _Optional[str] = ..., lease_until: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., updated_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., references: _Optional[_Mapping[str, str]] = ..., next_check_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., reconcile_attempts: _Optional[int] = ..., review_required_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., review_reason: _Optional[str] = ..., provider_key: _Optional[str] = ...) -> None: ...

class BeginOperationRequest(_message.Message):
    __slots__ = ("namespace", "operation_key", "action_type", "payload_json", "lease_seconds", "references", "confirm_duplicate_intent", "attempt_id")
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
    PAYLOAD_JSON_FIELD_NUMBER: _ClassVar[int]
    LEASE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    REFERENCES_FIELD_NUMBER: _ClassVar[int]
    CONFIRM_DUPLICATE_INTENT_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_ID_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    operation_key: str
    action_type: str
    payload_json: str
    lease_seconds: int
    references: _containers.ScalarMap[str, str]
    confirm_duplicate_intent: bool
    attempt_id: str
    def __init__(self, namespace: _Optional[str] = ..., operation_key: _Optional[str] = ..., action_type: _Optional[str] = ..., payload_json: _Optional[str] = ..., lease_seconds: _Optional[int] = ..., references: _Optional[_Mapping[str, str]] = ..., confirm_duplicate_intent: _Optional[bool] = ..., attempt_id: _Optional[str] = ...) -> None: ...

class BeginOperationResponse(_message.Message):
    __slots__ = ("decision", "operation", "lease_token", "retry_after", "duplicate_of_operation_key")
    DECISION_FIELD_NUMBER: _ClassVar[int]
    OPERATION_FIELD_NUMBER: _ClassVar[int]
    LEASE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    RETRY_AFTER_FIELD_NUMBER: _ClassVar[int]
    DUPLICATE_OF_OPERATION_KEY_FIELD_NUMBER: _ClassVar[int]
    decision: Decision
    operation: Operation
    lease_token: str
    retry_after: _duration_pb2.Duration
    duplicate_of_operation_key: str
    def __init__(self, decision: _Optional[_Union[Decision, str]] = ..., operation: _Optional[_Union[Operation, _Mapping]] = ..., lease_token: _Optional[str] = ..., retry_after: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., duplicate_of_operation_key: _Optional[str] = ...) -> None: ...

class CompleteOperationRequest(_message.Message):
    __slots__ = ("lease_token", "external_id", "result_json")
    LEASE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    EXTERNAL_ID_FIELD_NUMBER: _ClassVar[int]
    RESULT_JSON_FIELD_NUMBER: _ClassVar[int]
    lease_token: str
    external_id: str
    result_json: str
    def __init__(self, lease_token: _Optional[str] = ..., external_id: _Optional[str] = ..., result_json: _Optional[str] = ...) -> None: ...

class CompleteOperationResponse(_message.Message):
    __slots__ = ("operation",)
    OPERATION_FIELD_NUMBER: _ClassVar[int]
    operation: Operation
    def __init__(self, operation: _Optional[_Union[Operation, _Mapping]] = ...) -> None: ...

class FailOperationRequest(_message.Message):
    __slots__ = ("lease_token", "error_code")
    LEASE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    lease_token: str
    error_code: str
    def __init__(self, lease_token: _Optional[str] = ..., error_code: _Optional[str] = ...) -> None: ...

class FailOperationResponse(_message.Message):
    __slots__ = ("operation",)
    OPERATION_FIELD_NUMBER: _ClassVar[int]
    operation: Operation
    def __init__(self, operation: _Optional[_Union[Operation, _Mapping]] = ...) -> None: ...

class ReportUnknownOutcomeRequest(_message.Message):
    __slots__ = ("lease_token", "error_code")
    LEASE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    lease_token: str
    error_code: str
    def __init__(self, lease_token: _Optional[str] = ..., error_code: _Optional[str] = ...) -> None: ...

class ReportUnknownOutcomeResponse(_message.Message):
    __slots__ = ("operation",)
    OPERATION_FIELD_NUMBER: _ClassVar[int]
    operation: Operation
    def __init__(self, operation: _Optional[_Union[Operation, _Mapping]] = ...) -> None: ...

class RenewLeaseRequest(_message.Message):
    __slots__ = ("lease_token", "lease_seconds")
    LEASE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    LEASE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    lease_token: str
    lease_seconds: int
    def __init__(self, lease_token: _Optional[str] = ..., lease_seconds: _Optional[int] = ...) -> None: ...

class RenewLeaseResponse(_message.Message):
    __slots__ = ("operation",)
    OPERATION_FIELD_NUMBER: _ClassVar[int]
    operation: Operation
    def __init__(self, operation: _Optional[_Union[Operation, _Mapping]] = ...) -> None: ...

class GetOperationRequest(_message.Message):
    __slots__ = ("namespace", "operation_key")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    OPERATION_KEY_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    operation_key: str
    def __init__(self, namespace: _Optional[str] = ..., operation_key: _Optional[str] = ...) -> None: ...

class GetOperationResponse(_message.Message):
    __slots__ = ("operation",)
    OPERATION_FIELD_NUMBER: _ClassVar[int]
    operation: Operation
    def __init__(self, operation: _Optional[_Union[Operation, _Mapping]] = ...) -> None: ...

class ListOperationsRequest(_message.Message):
    __slots__ = ("namespace", "status", "action_type", "page_size", "page_token")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    ACTION_TYPE_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    status: OperationStatus
    action_type: str
    page_size: int
    page_token: str
    def __init__(self, namespace: _Optional[str] = ..., status: _Optional[_Union[OperationStatus, str]] = ..., action_type: _Optional[str] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListOperationsResponse(_message.Message):
    __slots__ = ("operations", "next_page_token")
    OPERATIONS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    operations: _containers.RepeatedCompositeFieldContainer[Operation]
    next_page_token: str
    def __init__(self, operations: _Optional[_Iterable[_Union[Operation, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class DeriveOperationKeyRequest(_message.Message):
    __slots__ = ("namespace", "action_type", "intent_reference")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    ACTION_TYPE_FIELD_NUMBER: _ClassVar[int]
    INTENT_REFERENCE_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    action_type: str
    intent_reference: str
    def __init__(self, namespace: _Optional[str] = ..., action_type: _Optional[str] = ..., intent_reference: _Optional[str] = ...) -> None: ...

class DeriveOperationKeyResponse(_message.Message):
    __slots__ = ("operation_key",)
    OPERATION_KEY_FIELD_NUMBER: _ClassVar[int]
    operation_key: str
    def __init__(self, operation_key: _Optional[str] = ...) -> None: ...

class ReconcileOperationRequest(_message.Message):
    __slots__ = ("namespace", "operation_key")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    OPERATION_KEY_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    operation_key: str
    def __init__(self, namespace: _Optional[str] = ..., operation_key: _Optional[str] = ...) -> None: ...

class Observation(_message.Message):
    __slots__ = ("outcome", "external_id", "detail_code")
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    EXTERNAL_ID_FIELD_NUMBER: _ClassVar[int]
    DETAIL_CODE_FIELD_NUMBER: _ClassVar[int]
    outcome: ObservationOutcome
    external_id: str
    detail_code: str
    def __init__(self, outcome: _Optional[_Union[ObservationOutcome, str]] = ..., external_id: _Optional[str] = ..., detail_code: _Optional[str] = ...) -> None: ...

class ReconcileOperationResponse(_message.Message):
    __slots__ = ("operation", "observation", "action")
    OPERATION_FIELD_NUMBER: _ClassVar[int]
    OBSERVATION_FIELD_NUMBER: _ClassVar[int]
    ACTION_FIELD_NUMBER: _ClassVar[int]
    operation: Operation
    observation: Observation
    action: ReconcileAction
    def __init__(self, operation: _Optional[_Union[Operation, _Mapping]] = ..., observation: _Optional[_Union[Observation, _Mapping]] = ..., action: _Optional[_Union[ReconcileAction, str]] = ...) -> None: ...

class ListOperationsForReviewRequest(_message.Message):
    __slots__ = ("namespace", "page_size", "page_token")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    page_size: int
    page_token: str
    def __init__(self, namespace: _Optional[str] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListOperationsForReviewResponse(_message.Message):
    __slots__ = ("operations", "next_page_token")
    OPERATIONS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    operations: _containers.RepeatedCompositeFieldContainer[Operation]
    next_page_token: str
    def __init__(self, operations: _Optional[_Iterable[_Union[Operation, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class ResolveSucceeded(_message.Message):
    __slots__ = ("external_id", "result_json")
    EXTERNAL_ID_FIELD_NUMBER: _ClassVar[int]
    RESULT_JSON_FIELD_NUMBER: _ClassVar[int]
    external_id: str
    result_json: str
    def __init__(self, external_id: _Optional[str] = ..., result_json: _Optional[str] = ...) -> None: ...

class ResolveFailedFinal(_message.Message):
    __slots__ = ("error_code",)
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    error_code: str
    def __init__(self, error_code: _Optional[str] = ...) -> None: ...

class ResolveReleaseForRetry(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ResolveOperationRequest(_message.Message):
    __slots__ = ("namespace", "operation_key", "expected_attempt_count", "reviewer", "reason", "succeeded", "failed_final", "release_for_retry")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    OPERATION_KEY_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_ATTEMPT_COUNT_FIELD_NUMBER: _ClassVar[int]
    REVIEWER_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    SUCCEEDED_FIELD_NUMBER: _ClassVar[int]
    FAILED_FINAL_FIELD_NUMBER: _ClassVar[int]
    RELEASE_FOR_RETRY_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    operation_key: str
    expected_attempt_count: int
    reviewer: str
    reason: str
    succeeded: ResolveSucceeded
    failed_final: ResolveFailedFinal
    release_for_retry: ResolveReleaseForRetry
    def __init__(self, namespace: _Optional[str] = ..., operation_key: _Optional[str] = ..., expected_attempt_count: _Optional[int] = ..., reviewer: _Optional[str] = ..., reason: _Optional[str] = ..., succeeded: _Optional[_Union[ResolveSucceeded, _Mapping]] = ..., failed_final: _Optional[_Union[ResolveFailedFinal, _Mapping]] = ..., release_for_retry: _Optional[_Union[ResolveReleaseForRetry, _Mapping]] = ...) -> None: ...

class ResolveOperationResponse(_message.Message):
    __slots__ = ("operation",)
    OPERATION_FIELD_NUMBER: _ClassVar[int]
    operation: Operation
    def __init__(self, operation: _Optional[_Union[Operation, _Mapping]] = ...) -> None: ...

class OperationEvent(_message.Message):
    __slots__ = ("event_id", "from_status", "to_status", "attempt_count", "review_required", "actor_kind", "actor", "reason", "occurred_at")
    EVENT_ID_FIELD_NUMBER: _ClassVar[int]
    FROM_STATUS_FIELD_NUMBER: _ClassVar[int]
    TO_STATUS_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_COUNT_FIELD_NUMBER: _ClassVar[int]
    REVIEW_REQUIRED_FIELD_NUMBER: _ClassVar[int]
    ACTOR_KIND_FIELD_NUMBER: _ClassVar[int]
    ACTOR_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    OCCURRED_AT_FIELD_NUMBER: _ClassVar[int]
    event_id: int
    from_status: OperationStatus
    to_status: OperationStatus
    attempt_count: int
    review_required: bool
    actor_kind: ActorKind
    actor: str
    reason: str
    occurred_at: _timestamp_pb2.Timestamp
    def __init__(self, event_id: _Optional[int] = ..., from_status: _Optional[_Union[OperationStatus, str]] = ..., to_status: _Optional[_Union[OperationStatus, str]] = ..., attempt_count: _Optional[int] = ..., review_required: _Optional[bool] = ..., actor_kind: _Optional[_Union[ActorKind, str]] = ..., actor: _Optional[str] = ..., reason: _Optional[str] = ..., occurred_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class GetOperationHistoryRequest(_message.Message):
    __slots__ = ("namespace", "operation_key", "page_size", "page_token")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    OPERATION_KEY_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    operation_key: str
    page_size: int
    page_token: str
    def __init__(self, namespace: _Optional[str] = ..., operation_key: _Optional[str] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class GetOperationHistoryResponse(_message.Message):
    __slots__ = ("events", "next_page_token")
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    events: _containers.RepeatedCompositeFieldContainer[OperationEvent]
    next_page_token: str
    def __init__(self, events: _Optional[_Iterable[_Union[OperationEvent, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...
