package opjournal

import (
	"context"
	"errors"
	"fmt"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// ErrorDomain is the ErrorInfo domain of every error the opjournal server produces.
const ErrorDomain = "opjournal.dev"

// Error is a failed opjournal call, decoded from the status's google.rpc.ErrorInfo (and
// BadRequest, RetryInfo). Match it with errors.Is against the Err* values below, or read
// Reason; never match on Message. The catalog of reasons is docs/errors.md.
type Error struct {
	// Code is the gRPC status code.
	Code codes.Code
	// Reason is ErrorInfo.reason, e.g. "LEASE_LOST"; empty when the status had no
	// ErrorInfo (a transport failure, a deadline).
	Reason string
	// Domain is ErrorInfo.domain: ErrorDomain for the server's own errors.
	Domain string
	// Metadata is ErrorInfo.metadata, e.g. {"status": "succeeded"}.
	Metadata map[string]string
	// FieldViolations are the BadRequest field violations, field name to description.
	FieldViolations []FieldViolation
	// RetryDelay is RetryInfo.retry_delay; zero when the server suggested none.
	RetryDelay time.Duration
	// Message is the status message, for people.
	Message string
}

// FieldViolation is one google.rpc.BadRequest.FieldViolation.
type FieldViolation struct {
	// Field is the request field, e.g. "operation_key".
	Field string
	// Description says what is wrong with it, for people.
	Description string
}

func (e *Error) Error() string {
	label := e.Code.String()
	if e.Reason != "" {
		label += "/" + e.Reason
	}
	if e.Message != "" {
		return "opjournal: " + label + ": " + e.Message
	}
	return "opjournal: " + label
}

// GRPCStatus lets status.FromError and status.Code see the original code.
func (e *Error) GRPCStatus() *status.Status { return status.New(e.Code, e.Message) }

// Is matches the Err* values: by reason for those that name one, by code for the others
// (ErrInvalidArgument, ErrUnauthenticated, ErrPermissionDenied, ErrJournalUnavailable).
func (e *Error) Is(target error) bool {
	t, ok := target.(*Error)
	if !ok {
		return false
	}
	if t.Reason != "" {
		return e.Reason == t.Reason && (e.Domain == ErrorDomain || e.Domain == "")
	}
	if t == ErrJournalUnavailable {
		return e.Code == codes.Unavailable || e.Code == codes.DeadlineExceeded ||
			e.Code == codes.Canceled || e.Reason == ErrServerOverloaded.Reason
	}
	return e.Code == t.Code
}

// The typed errors, for errors.Is. Each names its gRPC code and ErrorInfo reason.
var (
	// ErrIdempotencyKeyReused is ALREADY_EXISTS/IDEMPOTENCY_KEY_REUSED: the key is bound to
	// another request hash or action type. The provider was not called; a changed request
	// is a new intent and needs a new key.
	ErrIdempotencyKeyReused = &Error{Code: codes.AlreadyExists, Reason: "IDEMPOTENCY_KEY_REUSED"}
	// ErrLeaseLost is ABORTED/LEASE_LOST: this lease was taken over (or, for RenewLease, it
	// ended). Stop calling the provider for this attempt; Begin again to see the state.
	ErrLeaseLost = &Error{Code: codes.Aborted, Reason: "LEASE_LOST"}
	// ErrLeaseExpiredBeforeCall is ABORTED/LEASE_EXPIRED_BEFORE_CALL, returned by Execute on
	// this side (the journal never sends it): Begin's EXECUTE answer arrived after the lease
	// it granted had ended, measured on this side's monotonic clock from when that Begin was
	// sent. Another holder may already hold the operation, so the provider was not called
	// and nothing was reported. Begin the same intent again (same key): it replays, asks for
	// verification, or grants a new lease.
	ErrLeaseExpiredBeforeCall = &Error{Code: codes.Aborted, Reason: "LEASE_EXPIRED_BEFORE_CALL"}
	// ErrConcurrentModification is ABORTED/CONCURRENT_MODIFICATION: repeat the same call
	// after RetryDelay.
	ErrConcurrentModification = &Error{Code: codes.Aborted, Reason: "CONCURRENT_MODIFICATION"}
	// ErrOutcomeAlreadyRecorded is FAILED_PRECONDITION/OUTCOME_ALREADY_RECORDED: this token
	// already recorded another outcome (Metadata["status"]).
	ErrOutcomeAlreadyRecorded = &Error{Code: codes.FailedPrecondition, Reason: "OUTCOME_ALREADY_RECORDED"}
	// ErrOperationNotFound is NOT_FOUND/OPERATION_NOT_FOUND: no such key in the namespace.
	ErrOperationNotFound = &Error{Code: codes.NotFound, Reason: "OPERATION_NOT_FOUND"}
	// ErrOperationNotReconcilable is FAILED_PRECONDITION/OPERATION_NOT_RECONCILABLE: the
	// operation is pending, terminal or under a live lease.
	ErrOperationNotReconcilable = &Error{Code: codes.FailedPrecondition, Reason: "OPERATION_NOT_RECONCILABLE"}
	// ErrReconcileInProgress is FAILED_PRECONDITION/RECONCILE_IN_PROGRESS: someone is
	// looking the operation up right now.
	ErrReconcileInProgress = &Error{Code: codes.FailedPrecondition, Reason: "RECONCILE_IN_PROGRESS"}
	// ErrNoProviderAdapter is FAILED_PRECONDITION/NO_PROVIDER_ADAPTER: the action has no
	// lookup; a person settles it.
	ErrNoProviderAdapter = &Error{Code: codes.FailedPrecondition, Reason: "NO_PROVIDER_ADAPTER"}
	// ErrOperationChanged is FAILED_PRECONDITION/OPERATION_CHANGED: ResolveOperation saw
	// another state than the reviewer did.
	ErrOperationChanged = &Error{Code: codes.FailedPrecondition, Reason: "OPERATION_CHANGED"}
	// ErrKeyDerivationDisabled is FAILED_PRECONDITION/KEY_DERIVATION_DISABLED: the server
	// has no key derivation secret.
	ErrKeyDerivationDisabled = &Error{Code: codes.FailedPrecondition, Reason: "KEY_DERIVATION_DISABLED"}
	// ErrStoreUnavailable is UNAVAILABLE/STORE_UNAVAILABLE: the server cannot reach its
	// database; every call is safe to repeat. It also matches ErrJournalUnavailable.
	ErrStoreUnavailable = &Error{Code: codes.Unavailable, Reason: "STORE_UNAVAILABLE"}
	// ErrInvalidArgument matches every INVALID_ARGUMENT (Reason says which field).
	ErrInvalidArgument = &Error{Code: codes.InvalidArgument}
	// ErrUnauthenticated matches every UNAUTHENTICATED (missing or invalid bearer token).
	ErrUnauthenticated = &Error{Code: codes.Unauthenticated}
	// ErrPermissionDenied matches every PERMISSION_DENIED (role or namespace).
	ErrPermissionDenied = &Error{Code: codes.PermissionDenied}
	// ErrServerOverloaded is RESOURCE_EXHAUSTED/SERVER_OVERLOADED: the server is serving as
	// many calls as it allows and did nothing with this one; repeat it after RetryDelay. It
	// also matches ErrJournalUnavailable.
	ErrServerOverloaded = &Error{Code: codes.ResourceExhausted, Reason: "SERVER_OVERLOADED"}
	// ErrJournalUnavailable matches UNAVAILABLE, DEADLINE_EXCEEDED, CANCELLED (the server's
	// transport ends a call whose deadline passed with a bare CANCELLED, without ErrorInfo)
	// and SERVER_OVERLOADED: the journal could not be reached, did not answer in time or
	// did not take the call. Every opjournal call, Begin and the reports included, is safe
	// to repeat with the same request.
	ErrJournalUnavailable = &Error{Code: codes.Unavailable}
)

// DecodeError turns any error of a gRPC call into an *Error (nil stays nil; an *Error is
// returned as it is). A context error that never reached the wire keeps its code
// (CANCELLED, DEADLINE_EXCEEDED).
func DecodeError(err error) error {
	if err == nil {
		return nil
	}
	var typed *Error
	if errors.As(err, &typed) {
		return typed
	}
	st, ok := status.FromError(err)
	if !ok {
		st = status.FromContextError(err)
	}
	out := &Error{Code: st.Code(), Message: st.Message()}
	for _, detail := range st.Details() {
		switch d := detail.(type) {
		case *errdetails.ErrorInfo:
			if out.Reason == "" {
				out.Reason, out.Domain, out.Metadata = d.GetReason(), d.GetDomain(), d.GetMetadata()
			}
		case *errdetails.BadRequest:
			for _, v := range d.GetFieldViolations() {
				out.FieldViolations = append(out.FieldViolations, FieldViolation{v.GetField(), v.GetDescription()})
			}
		case *errdetails.RetryInfo:
			if delay := d.GetRetryDelay(); delay != nil {
				out.RetryDelay = time.Duration(delay.GetSeconds())*time.Second + time.Duration(delay.GetNanos())
			}
		}
	}
	if out.Domain != "" && out.Domain != ErrorDomain {
		// Another service's reason (a proxy's, say) must not pass for one of ours.
		out.Reason = ""
	}
	return out
}

// isLostAnswer reports whether err means the call's answer may have been lost on the way
// (UNAVAILABLE, CANCELLED, DEADLINE_EXCEEDED), so that repeating it is the way to learn it.
func isLostAnswer(err error) bool {
	var e *Error
	if !errors.As(err, &e) {
		return false
	}
	switch e.Code {
	case codes.Unavailable, codes.Canceled, codes.DeadlineExceeded:
		return true
	}
	return e.Reason == ErrServerOverloaded.Reason
}

// contextErr is the caller's own cancellation, kept apart from a lost answer.
func contextErr(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("opjournal: %w", err)
	}
	return nil
}
