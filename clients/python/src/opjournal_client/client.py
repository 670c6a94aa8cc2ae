"""A thin, typed wrapper over the generated ``OperationJournal`` and ``Reconciler`` stubs.

Every method sends the bearer token (when one is given) and a deadline, and raises the
:mod:`opjournal_client.errors` class for the status's ``ErrorInfo.reason`` instead of a
bare ``grpc.RpcError``.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, Callable, Mapping, Optional, Sequence, TypeVar

import grpc

from opjournal.v1 import journal_pb2 as pb
from opjournal.v1 import journal_pb2_grpc as pb_grpc

from .errors import decode_error

if TYPE_CHECKING:
    from .execute import Outcome, ProviderCall, ProviderResult

#: Seconds each call may take before it fails with ``DEADLINE_EXCEEDED``.
DEFAULT_TIMEOUT_SECONDS = 10.0

_Response = TypeVar("_Response")


def to_json_text(value: Any) -> str:
    """``value`` as JSON text: a ``str`` is taken as JSON text already; anything else is
    serialized with :func:`json.dumps` (NaN and infinities refused, as I-JSON requires).

    Raises:
        TypeError / ValueError: when the value cannot be serialized.
    """
    if isinstance(value, str):
        return value
    return json.dumps(value, allow_nan=False, ensure_ascii=False, separators=(",", ":"))


class JournalClient:
    """A client of one opjournal server.

    Build one with :meth:`connect` (or pass your own ``grpc.Channel``); it is safe to share
    between threads. Use it as a context manager, or call :meth:`close`, to close the
    channel it opened.

    Args:
        channel: a gRPC channel to the server.
        token: a bearer token, sent as ``authorization: Bearer <token>`` on every call;
            ``None`` for a server without tokens.
        timeout: seconds each call may take (the gRPC deadline).
    """

    def __init__(
        self,
        channel: grpc.Channel,
        *,
        token: Optional[str] = None,
        timeout: float = DEFAULT_TIMEOUT_SECONDS,
    ) -> None:
        self._channel = channel
        self._metadata: tuple[tuple[str, str], ...] = (
            (("authorization", f"Bearer {token}"),) if token else ()
        )
        self._timeout = timeout
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
        options: Sequence[tuple[str, Any]] = (),
    ) -> "JournalClient":
        """Opens a channel to ``target`` (``host:port``).

        Plaintext unless ``tls`` is true or any PEM is given: ``root_certificates`` trusts
        a private CA (the system roots otherwise), ``private_key`` with
        ``certificate_chain`` is the client certificate for mutual TLS.
        """
        if tls or root_certificates or private_key or certificate_chain:
            credentials = grpc.ssl_channel_credentials(
                root_certificates=root_certificates,
                private_key=private_key,
                certificate_chain=certificate_chain,
            )
            channel = grpc.secure_channel(target, credentials, options=list(options))
        else:
            channel = grpc.insecure_channel(target, options=list(options))
        return cls(channel, token=token, timeout=timeout)

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
    ) -> pb.BeginOperationResponse:
        """BeginOperation: registers the intent and, where the rules allow, claims a lease.

        ``payload`` is the provider request's parameters: a JSON object as text, or a value
        :func:`to_json_text` serializes. Only its SHA-256 (RFC 8785 canonical form) is
        stored. ``lease_seconds`` 0 means the action's default.

        Returns the response; its ``decision`` says what to do (see :func:`execute`).

        Raises:
            IdempotencyKeyReusedError: the key is bound to another payload or action type.
            InvalidArgumentError: a malformed key, payload or field.
        """
        request = pb.BeginOperationRequest(
            namespace=namespace,
            operation_key=operation_key,
            action_type=action_type,
            payload_json=to_json_text(payload),
            lease_seconds=lease_seconds,
            references=dict(references or {}),
            confirm_duplicate_intent=confirm_duplicate_intent,
        )
        return self._call(self.journal.BeginOperation, request)

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
        request = pb.CompleteOperationRequest(
            lease_token=lease_token,
            external_id=external_id,
            result_json="" if result is None else to_json_text(result),
        )
        return self._call(self.journal.CompleteOperation, request).operation

    def fail(self, lease_token: str, error_code: str) -> pb.Operation:
        """FailOperation: records a definitive rejection (no effect happened); returns the
        FAILED_FINAL record. ``error_code``: 1-100 characters of ``[A-Za-z0-9._:-]``.

        Raises:
            LeaseLostError, OutcomeAlreadyRecordedError, InvalidArgumentError.
        """
        request = pb.FailOperationRequest(lease_token=lease_token, error_code=error_code)
        return self._call(self.journal.FailOperation, request).operation

    def report_unknown(self, lease_token: str, error_code: str = "") -> pb.Operation:
        """ReportUnknownOutcome: the effect may or may not have happened; returns the
        UNKNOWN record. ``error_code`` is a short machine code such as ``"timeout"``.

        Raises:
            LeaseLostError, OutcomeAlreadyRecordedError, InvalidArgumentError.
        """
        request = pb.ReportUnknownOutcomeRequest(lease_token=lease_token, error_code=error_code)
        return self._call(self.journal.ReportUnknownOutcome, request).operation

    def renew_lease(self, lease_token: str, lease_seconds: int) -> pb.Operation:
        """RenewLease: extends a live lease to ``lease_seconds`` from now (database clock).

        Raises:
            LeaseLostError: the lease has ended or was taken over.
        """
        request = pb.RenewLeaseRequest(lease_token=lease_token, lease_seconds=lease_seconds)
        return self._call(self.journal.RenewLease, request).operation

    def get(self, operation_key: str, *, namespace: str = "") -> pb.Operation:
        """GetOperation: reads one record.

        Raises:
            OperationNotFoundError: no such key in the namespace.
        """
        request = pb.GetOperationRequest(namespace=namespace, operation_key=operation_key)
        return self._call(self.journal.GetOperation, request).operation

    def derive_key(self, action_type: str, intent_reference: str, *, namespace: str = "") -> str:
        """DeriveOperationKey: an opaque, stable key (``ok_…``) for an intent reference that
        may hold personal data; the reference is never stored.

        Raises:
            KeyDerivationDisabledError: the server has no key derivation secret.
        """
        request = pb.DeriveOperationKeyRequest(
            namespace=namespace, action_type=action_type, intent_reference=intent_reference
        )
        return self._call(self.journal.DeriveOperationKey, request).operation_key

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
        request = pb.ReconcileOperationRequest(namespace=namespace, operation_key=operation_key)
        return self._call(self.reconciler.ReconcileOperation, request)

    def execute(
        self,
        operation_key: str,
        action_type: str,
        payload: Any,
        call: Callable[[ProviderCall], ProviderResult],
        **options: Any,
    ) -> Outcome:
        """:func:`opjournal_client.execute.execute` with this client: runs ``call`` at most
        once per intent. ``options`` are that function's keyword arguments (``namespace``,
        ``lease_seconds``, ``references``, ``renew_lease``, ...)."""
        from .execute import execute

        return execute(self, operation_key, action_type, payload, call, **options)
