"""A thin, typed wrapper over the generated ``OperationJournal`` and ``Reconciler`` stubs.

Every method sends the bearer token (when one is given) and a deadline, and raises the
:mod:`opjournal_client.errors` class for the status's ``ErrorInfo.reason`` instead of a
bare ``grpc.RpcError``.
"""

from __future__ import annotations

from importlib import resources
from typing import TYPE_CHECKING, Any, Callable, Mapping, Optional, Sequence, TypeVar

import grpc

from opjournal.v1 import journal_pb2 as pb
from opjournal.v1 import journal_pb2_grpc as pb_grpc

from . import _core
from ._core import (
    DEFAULT_BEGIN_RETRY_SECONDS,
    DEFAULT_REPORT_RETRY_SECONDS,
    DEFAULT_TIMEOUT_SECONDS,
    to_json_text,
)
from .errors import decode_error

if TYPE_CHECKING:
    from .outcomes import Classifier, Outcome, ProviderCall, ProviderResult

__all__ = [
    "DEFAULT_BEGIN_RETRY_SECONDS",
    "DEFAULT_REPORT_RETRY_SECONDS",
    "DEFAULT_TIMEOUT_SECONDS",
    "JournalClient",
    "to_json_text",
]

_Response = TypeVar("_Response")

#: The gRPC service config shipped with the server's contract
#: (``proto/opjournal/v1/service_config.json``): calls whose RPC is safe to repeat are
#: retried by gRPC itself on ``UNAVAILABLE`` (at most 4 attempts, backoff from 0.1 s to 2 s,
#: throttled when most calls fail). The same request is sent again, so a retried Begin
#: carries the same key.
SERVICE_CONFIG: str = (
    resources.files("opjournal_client").joinpath("service_config.json").read_text(encoding="utf-8")
)

#: Channel options every client channel gets unless the caller passes them: reconnect
#: within a few seconds of a journal coming back (gRPC's default backoff grows to 120 s),
#: and :data:`SERVICE_CONFIG` (pass ``("grpc.service_config", ...)`` to replace it, or
#: ``("grpc.enable_retries", 0)`` to turn retries off).
DEFAULT_CHANNEL_OPTIONS: tuple[tuple[str, Any], ...] = (
    ("grpc.initial_reconnect_backoff_ms", 200),
    ("grpc.min_reconnect_backoff_ms", 200),
    ("grpc.max_reconnect_backoff_ms", 2000),
    ("grpc.service_config", SERVICE_CONFIG),
    ("grpc.enable_retries", 1),
)


def channel_options(options: Sequence[tuple[str, Any]]) -> list[tuple[str, Any]]:
    """``options`` with :data:`DEFAULT_CHANNEL_OPTIONS` for the names it does not set."""
    given = {name for name, _ in options}
    return list(options) + [o for o in DEFAULT_CHANNEL_OPTIONS if o[0] not in given]


class JournalClient:
    """A client of one opjournal server.

    Build one with :meth:`connect` (or pass your own ``grpc.Channel``); it is safe to share
    between threads. Use it as a context manager, or call :meth:`close`, to close the
    channel it opened.

    Args:
        channel: a gRPC channel to the server.
        token: a bearer token, sent as ``authorization: Bearer <token>`` on every call;
            ``None`` for a server without tokens.
        timeout: seconds each call may take (the gRPC deadline); every call has one.
        report_retry_seconds: how long ``execute`` repeats a report (Complete, Fail,
            ReportUnknown) whose answer was lost (``UNAVAILABLE``, ``CANCELLED``,
            ``DEADLINE_EXCEEDED``), with the same token and outcome, with backoff.
        begin_retry_seconds: how long ``execute`` repeats a Begin whose answer was lost
            (the same codes), with the same attempt id, with backoff: the journal answers
            the repeat with the lease it granted, so the provider is still called once.
    """

    def __init__(
        self,
        channel: grpc.Channel,
        *,
        token: Optional[str] = None,
        timeout: float = DEFAULT_TIMEOUT_SECONDS,
        report_retry_seconds: float = DEFAULT_REPORT_RETRY_SECONDS,
        begin_retry_seconds: float = DEFAULT_BEGIN_RETRY_SECONDS,
    ) -> None:
        self._channel = channel
        self._metadata: tuple[tuple[str, str], ...] = (
            (("authorization", f"Bearer {token}"),) if token else ()
        )
        self._timeout = timeout
        #: Seconds ``execute`` repeats a report whose answer was lost.
        self.report_retry_seconds = report_retry_seconds
        #: Seconds ``execute`` repeats a Begin whose answer was lost (same attempt id).
        self.begin_retry_seconds = begin_retry_seconds
        #: The generated OperationJournal stub, for calls this class does not wrap.
        self.journal = pb_grpc.OperationJournalStub(channel)
        #: The generated Reconciler stub, for calls this class does not wrap.
        self.reconciler = pb_grpc.ReconcilerStub(channel)

    @classmethod
    def connect(
        cls,
        target: str,
        *,
        token: Optional[str] = None,
        tls: bool = False,
        root_certificates: Optional[bytes] = None,
        private_key: Optional[bytes] = None,
        certificate_chain: Optional[bytes] = None,
        timeout: float = DEFAULT_TIMEOUT_SECONDS,
        report_retry_seconds: float = DEFAULT_REPORT_RETRY_SECONDS,
        begin_retry_seconds: float = DEFAULT_BEGIN_RETRY_SECONDS,
        options: Sequence[tuple[str, Any]] = (),
    ) -> "JournalClient":
        """Opens a channel to ``target`` (``host:port``).

        Plaintext unless ``tls`` is true or any PEM is given: ``root_certificates`` trusts
        a private CA (the system roots otherwise), ``private_key`` with
        ``certificate_chain`` is the client certificate for mutual TLS. ``options`` are gRPC
        channel options; :data:`DEFAULT_CHANNEL_OPTIONS` fill in the reconnect backoff.
        """
        if tls or root_certificates or private_key or certificate_chain:
            credentials = grpc.ssl_channel_credentials(
                root_certificates=root_certificates,
                private_key=private_key,
                certificate_chain=certificate_chain,
            )
            channel = grpc.secure_channel(target, credentials, options=channel_options(options))
        else:
            channel = grpc.insecure_channel(target, options=channel_options(options))
        return cls(
            channel,
            token=token,
            timeout=timeout,
            report_retry_seconds=report_retry_seconds,
            begin_retry_seconds=begin_retry_seconds,
        )

    def close(self) -> None:
        """Closes the channel."""
        self._channel.close()

    def __enter__(self) -> "JournalClient":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _call(self, method: Callable[..., _Response], request: Any) -> _Response:
        try:
            return method(request, timeout=self._timeout, metadata=self._metadata)
        except grpc.RpcError as error:
            raise decode_error(error) from error

    def _invoke(self, method: str, request: Any) -> Any:
        """Calls the ``OperationJournal`` method named ``method`` (``execute``'s steps)."""
        return self._call(getattr(self.journal, method), request)

    # OperationJournal

    def begin(
        self,
        operation_key: str,
        action_type: str,
        payload: Any,
        *,
        namespace: str = "",
        lease_seconds: int = 0,
        references: Optional[Mapping[str, str]] = None,
        confirm_duplicate_intent: bool = False,
        attempt_id: Optional[str] = None,
    ) -> pb.BeginOperationResponse:
        """BeginOperation: registers the intent and, where the rules allow, claims a lease.

        ``payload`` is the provider request's parameters: a JSON object as text, or a value
        :func:`to_json_text` serializes. Only its SHA-256 (RFC 8785 canonical form) is
        stored. ``lease_seconds`` 0 means the action's default.

        ``attempt_id`` names this Begin intent (16-64 characters of ``[A-Za-z0-9_-]``; a
        new random UUID when ``None``, ``""`` for none): send the same one when you repeat
        this Begin because its answer was lost, and the journal answers with the lease it
        granted to the first instead of ``DECISION_IN_PROGRESS``. Never reuse one for
        another intent. This method sends the Begin once; :func:`execute` repeats it.

        Returns the response; its ``decision`` says what to do (see :func:`execute`).

        Raises:
            IdempotencyKeyReusedError: the key is bound to another payload or action type.
            InvalidArgumentError: a malformed key, payload, attempt id or field.
        """
        request = _core.begin_request(
            operation_key,
            action_type,
            payload,
            namespace=namespace,
            lease_seconds=lease_seconds,
            references=references,
            confirm_duplicate_intent=confirm_duplicate_intent,
            attempt_id=attempt_id,
        )
        response: pb.BeginOperationResponse = self._call(self.journal.BeginOperation, request)
        return response

    def complete(
        self, lease_token: str, *, external_id: str = "", result: Any = None
    ) -> pb.Operation:
        """CompleteOperation: records a confirmed success; returns the SUCCEEDED record.

        ``result`` (JSON text or a serializable value; ``None`` for no result body) is
        sanitized by the server's policy before it is stored and replayed.

        Raises:
            LeaseLostError: the lease was taken over.
            OutcomeAlreadyRecordedError: this token already recorded another outcome.
            InvalidArgumentError: e.g. ``RESULT_TOO_LARGE``, ``INVALID_EXTERNAL_ID``.
        """
        request = _core.complete_request(lease_token, external_id=external_id, result=result)
        operation: pb.Operation = self._call(self.journal.CompleteOperation, request).operation
        return operation

    def fail(self, lease_token: str, error_code: str) -> pb.Operation:
        """FailOperation: records a definitive rejection (no effect happened); returns the
        FAILED_FINAL record. ``error_code``: 1-100 characters of ``[A-Za-z0-9._:-]``.

        Raises:
            LeaseLostError, OutcomeAlreadyRecordedError, InvalidArgumentError.
        """
        request = _core.fail_request(lease_token, error_code)
        operation: pb.Operation = self._call(self.journal.FailOperation, request).operation
        return operation

    def report_unknown(self, lease_token: str, error_code: str = "") -> pb.Operation:
        """ReportUnknownOutcome: the effect may or may not have happened; returns the
        UNKNOWN record. ``error_code`` is a short machine code such as ``"timeout"``.

        Raises:
            LeaseLostError, OutcomeAlreadyRecordedError, InvalidArgumentError.
        """
        request = _core.report_unknown_request(lease_token, error_code)
        operation: pb.Operation = self._call(self.journal.ReportUnknownOutcome, request).operation
        return operation

    def renew_lease(self, lease_token: str, lease_seconds: int) -> pb.Operation:
        """RenewLease: extends a live lease to ``lease_seconds`` from now (database clock).

        Raises:
            LeaseLostError: the lease has ended or was taken over.
        """
        request = _core.renew_request(lease_token, lease_seconds)
        operation: pb.Operation = self._call(self.journal.RenewLease, request).operation
        return operation

    def get(self, operation_key: str, *, namespace: str = "") -> pb.Operation:
        """GetOperation: reads one record.

        Raises:
            OperationNotFoundError: no such key in the namespace.
        """
        request = _core.get_request(operation_key, namespace)
        operation: pb.Operation = self._call(self.journal.GetOperation, request).operation
        return operation

    def derive_key(self, action_type: str, intent_reference: str, *, namespace: str = "") -> str:
        """DeriveOperationKey: an opaque, stable key (``ok_…``) for an intent reference that
        may hold personal data; the reference is never stored.

        Raises:
            KeyDerivationDisabledError: the server has no key derivation secret.
        """
        request = _core.derive_request(action_type, intent_reference, namespace)
        key: str = self._call(self.journal.DeriveOperationKey, request).operation_key
        return key

    # Reconciler

    def reconcile(
        self, operation_key: str, *, namespace: str = ""
    ) -> pb.ReconcileOperationResponse:
        """ReconcileOperation: asks the provider now what happened to an UNKNOWN operation
        (or one whose lease expired) and applies the answer.

        Raises:
            OperationNotFoundError, OperationNotReconcilableError, ReconcileInProgressError,
            NoProviderAdapterError.
        """
        request = _core.reconcile_request(operation_key, namespace)
        response: pb.ReconcileOperationResponse = self._call(
            self.reconciler.ReconcileOperation, request
        )
        return response

    def execute(
        self,
        operation_key: str,
        action_type: str,
        payload: Any,
        call: Callable[[ProviderCall], ProviderResult],
        *,
        namespace: str = "",
        lease_seconds: int = 0,
        references: Optional[Mapping[str, str]] = None,
        confirm_duplicate_intent: bool = False,
        renew_lease: bool = True,
        classify: Optional[Classifier] = None,
        in_progress_wait: float = 0.0,
        settle_wait: float = 0.0,
        is_confirmed_rejection: Optional[Callable[[BaseException], Optional[str]]] = None,
        unknown_error_code: Optional[Callable[[BaseException], str]] = None,
    ) -> Outcome:
        """:func:`opjournal_client.execute.execute` with this client: runs ``call`` at most
        once per intent. The keyword arguments are that function's (see there)."""
        from .execute import execute

        return execute(
            self,
            operation_key,
            action_type,
            payload,
            call,
            namespace=namespace,
            lease_seconds=lease_seconds,
            references=references,
            confirm_duplicate_intent=confirm_duplicate_intent,
            renew_lease=renew_lease,
            classify=classify,
            in_progress_wait=in_progress_wait,
            settle_wait=settle_wait,
            is_confirmed_rejection=is_confirmed_rejection,
            unknown_error_code=unknown_error_code,
        )
