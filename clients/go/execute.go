package opjournal

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"regexp"
	"strconv"
	"sync"
	"syscall"
	"time"

	pb "github.com/opjournal/opjournal/clients/go/gen/opjournal/v1"
)

// ProviderCall is what the provider function gets.
type ProviderCall struct {
	// ProviderKey is the idempotency key to send to the provider (Operation.provider_key:
	// the key itself in the "default" namespace, "namespace/key" elsewhere).
	ProviderKey string
	// Operation is the journal record as Begin left it (IN_PROGRESS).
	Operation *pb.Operation

	lease *leaseRenewal
}

// LeaseErr is nil while the lease may be live, and the typed LEASE_LOST *Error once a
// renewal was refused: another holder may now call the provider. The provider function's
// context is cancelled at that moment.
func (p ProviderCall) LeaseErr() error {
	if p.lease == nil {
		return nil
	}
	return p.lease.lostErr()
}

// LeaseDeadline is when the lease ends unless it is renewed: Begin's send time plus the
// length granted (both lengths come from the journal's database clock, the instants from
// this process's monotonic clock), moved on by each renewal. The provider function's
// context is cancelled at that moment if no renewal came in time, and its outcome is then
// recorded unknown (LeaseExpired). Bound the provider request by it.
func (p ProviderCall) LeaseDeadline() time.Time {
	if p.lease == nil {
		return time.Time{}
	}
	return p.lease.deadline()
}

// LeaseExpired is the error code of the unknown outcome recorded when the provider call
// failed after its context was cancelled at the end of its unrenewed lease.
const LeaseExpired = "lease_expired"

// ProviderResult is what the provider function returns on a confirmed success.
type ProviderResult struct {
	// ExternalID is the provider's id of the effect (payment id, message id); up to 200
	// characters; empty when there is none.
	ExternalID string
	// Result is the provider's answer to keep and replay: a value for encoding/json, or
	// json.RawMessage; nil for no result body. The journal keeps only what the action's
	// policy allows (result.keep) and never card numbers, tokens or secrets.
	Result interface{}
}

// ProviderFunc calls the provider once. It must send call.ProviderKey as the provider's
// idempotency key and stop when ctx is cancelled (the caller's cancellation, or a lost
// lease: see ProviderCall.LeaseErr). It returns a ProviderResult on a confirmed success,
// an error made by Reject on a confirmed rejection; every other error (and a panic) is an
// unknown outcome.
type ProviderFunc func(ctx context.Context, call ProviderCall) (ProviderResult, error)

var errorCodePattern = regexp.MustCompile(`^[A-Za-z0-9._:-]{1,100}$`)

// RejectedError is a confirmed rejection: the provider proved that no effect happened and
// none will (a declined card, a validation error before anything was stored). A timeout, a
// reset connection, a 5xx or a proxy's odd answer is never one.
type RejectedError struct {
	// Code is a short machine code such as "card_declined".
	Code string
	// Err is the provider's error, if any.
	Err error
}

func (e *RejectedError) Error() string { return "provider rejected the request: " + e.Code }

// Unwrap returns the provider's error.
func (e *RejectedError) Unwrap() error { return e.Err }

// Reject makes the error a ProviderFunc returns on a confirmed rejection. code is 1-100
// characters of [A-Za-z0-9._:-]; an invalid code makes the outcome unknown (code
// "invalid_error_code") rather than failed.
func Reject(code string, cause error) error { return &RejectedError{Code: code, Err: cause} }

// UnknownOutcomeError reports an uncertain outcome with the caller's own code (e.g.
// "http_502"). Any other error is reported as unknown too, with DefaultUnknownCode's code.
type UnknownOutcomeError struct {
	// Code is the short machine code recorded (1-100 characters of [A-Za-z0-9._:-]).
	Code string
	// Err is the provider's error, if any.
	Err error
}

func (e *UnknownOutcomeError) Error() string { return "provider outcome unknown: " + e.Code }

// Unwrap returns the provider's error.
func (e *UnknownOutcomeError) Unwrap() error { return e.Err }

// UnknownOutcome makes an error that reports an unknown outcome with code.
func UnknownOutcome(code string, cause error) error {
	return &UnknownOutcomeError{Code: code, Err: cause}
}

// HTTPStatusError is an HTTP answer that proves nothing about the effect (a 5xx, an odd
// status from a proxy); DefaultUnknownCode reports it as "http_<status>".
type HTTPStatusError struct {
	// StatusCode is the HTTP status the provider (or a proxy) answered.
	StatusCode int
}

func (e *HTTPStatusError) Error() string {
	return "provider answered HTTP " + strconv.Itoa(e.StatusCode)
}

// DefaultRejection is the default rejection classifier: the code of a RejectedError.
func DefaultRejection(err error) (code string, rejected bool) {
	var r *RejectedError
	if errors.As(err, &r) {
		return r.Code, true
	}
	return "", false
}

// DefaultUnknownCode is the default code of an unknown outcome, from the error's kind and
// never from its message (which may quote payloads): the code of an UnknownOutcomeError,
// "http_<status>" for an HTTPStatusError, "timeout", "connection_reset",
// "connection_error", "canceled", else "exception".
func DefaultUnknownCode(err error) string {
	var unknown *UnknownOutcomeError
	var httpStatus *HTTPStatusError
	var netErr net.Error
	var opErr *net.OpError
	switch {
	case errors.As(err, &unknown):
		return unknown.Code
	case errors.As(err, &httpStatus):
		return "http_" + strconv.Itoa(httpStatus.StatusCode)
	case errors.Is(err, context.DeadlineExceeded), errors.As(err, &netErr) && netErr.Timeout():
		return "timeout"
	case errors.Is(err, syscall.ECONNRESET), errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, io.EOF):
		return "connection_reset"
	case errors.As(err, &opErr):
		return "connection_error"
	case errors.Is(err, context.Canceled):
		return "canceled"
	}
	return "exception"
}

// ResultRefused is the error code recorded when the journal refused the report of a
// success: the effect happened, so the outcome is VerificationRequired, not an error.
const ResultRefused = "result_refused"

// OutcomeKind names what Execute came to.
type OutcomeKind string

// The kinds of Outcome.
const (
	// Succeeded: the effect happened (now, or before: Replayed).
	Succeeded OutcomeKind = "succeeded"
	// FailedFinal: the provider proved no effect happened; the operation is terminal.
	FailedFinal OutcomeKind = "failed_final"
	// VerificationRequired: the outcome is unknown; the provider must not be called until
	// the operation is reconciled (by the reconcile worker, Client.Reconcile or a
	// reviewer). Calling Execute again with the same key is always safe.
	VerificationRequired OutcomeKind = "verification_required"
	// InProgress: another holder's lease is live; the provider was not called.
	InProgress OutcomeKind = "in_progress"
	// DuplicateIntentSuspected: the action's duplicate-intent policy held the request; the
	// same payload is registered under DuplicateOf. Nothing was registered.
	DuplicateIntentSuspected OutcomeKind = "duplicate_intent_suspected"
)

// Outcome is what Execute came to; switch on Kind. It encodes as JSON for an agent to read
// (the operation, the provider's own answer and the cause are left out).
type Outcome struct {
	Kind OutcomeKind `json:"outcome"`
	// Key is the operation key.
	Key string `json:"operation_key"`
	// ExternalID is the provider's id of the effect, when recorded (Succeeded).
	ExternalID string `json:"external_id,omitempty"`
	// Result is the stored (sanitized) result as JSON text; the same on every replay; nil
	// when no result was recorded (Succeeded).
	Result json.RawMessage `json:"result,omitempty"`
	// Replayed is true when the provider was not called now (Succeeded, FailedFinal).
	Replayed bool `json:"replayed"`
	// Reported is true when this call reported the unknown outcome, false when Begin found
	// it unknown (VerificationRequired).
	Reported bool `json:"reported,omitempty"`
	// ErrorCode is the recorded code (FailedFinal; VerificationRequired when Reported).
	ErrorCode string `json:"error_code,omitempty"`
	// RetryAfter is how long until the other holder's lease ends (InProgress).
	RetryAfter time.Duration `json:"-"`
	// RetryAfterMs is RetryAfter in milliseconds, for JSON readers.
	RetryAfterMs int64 `json:"retry_after_ms,omitempty"`
	// DuplicateOf is the key the same request is registered under (DuplicateIntentSuspected).
	DuplicateOf string `json:"duplicate_of_operation_key,omitempty"`
	// Operation is the journal record behind the outcome (nil for DuplicateIntentSuspected
	// when the server sent none).
	Operation *pb.Operation `json:"-"`
	// ProviderResult is what the provider function returned this time (nil on a replay).
	ProviderResult *ProviderResult `json:"-"`
	// Cause is the provider function's error behind FailedFinal or VerificationRequired.
	Cause error `json:"-"`
}

// UnexpectedDecisionError: Begin answered a decision (or a shape) this client does not know.
type UnexpectedDecisionError struct {
	// Detail says what was unexpected (never a payload or a token).
	Detail string
}

func (e *UnexpectedDecisionError) Error() string { return "opjournal: unexpected answer: " + e.Detail }

type executeConfig struct {
	inProgressWait time.Duration
	settleWait     time.Duration
	renew          bool
	rejection      func(error) (string, bool)
	unknownCode    func(error) string
}

// ExecuteOption configures Execute.
type ExecuteOption func(*executeConfig)

// WithInProgressWait waits up to d while another holder's lease is live (Begin answers
// IN_PROGRESS): Begin is asked again with a backoff of 200 ms doubling to 2 s, never
// longer than retry_after, and the stored outcome is returned once that holder reports.
// Zero (the default) answers InProgress at once.
func WithInProgressWait(d time.Duration) ExecuteOption {
	return func(c *executeConfig) { c.inProgressWait = d }
}

// WithSettleWait waits up to d for an operation that Begin found unknown
// (VERIFICATION_REQUIRED) to be settled by the reconciler: Begin is asked again with a
// backoff of 200 ms doubling to 2 s, and what it then answers is followed (a replay of the
// settled outcome, or EXECUTE when the reconciler proved the effect absent). An unknown
// outcome this call reported itself is answered at once. Zero (the default): at once.
func WithSettleWait(d time.Duration) ExecuteOption {
	return func(c *executeConfig) { c.settleWait = d }
}

// WithoutLeaseRenewal turns off the lease renewal (every third of the granted lease) that
// runs while the provider function does.
func WithoutLeaseRenewal() ExecuteOption {
	return func(c *executeConfig) { c.renew = false }
}

// WithRejectionClassifier replaces DefaultRejection: f names the error code of a confirmed
// rejection, or says the error proves nothing.
func WithRejectionClassifier(f func(error) (code string, rejected bool)) ExecuteOption {
	return func(c *executeConfig) { c.rejection = f }
}

// WithUnknownCode replaces DefaultUnknownCode: f gives the short code recorded for an
// unknown outcome (1-100 characters of [A-Za-z0-9._:-]; another is recorded as
// "exception").
func WithUnknownCode(f func(error) string) ExecuteOption {
	return func(c *executeConfig) { c.unknownCode = f }
}

// Execute runs call at most once per intent, and only when the journal says so.
//
// Begin registers the intent. Only DECISION_EXECUTE lets call run, with the operation's
// provider key, while the lease is renewed in the background. Its answer is then reported:
// a ProviderResult -> CompleteOperation -> Succeeded; a confirmed rejection (Reject) ->
// FailOperation -> FailedFinal; anything else (a timeout, a reset, a 5xx, a panic) ->
// ReportUnknownOutcome -> VerificationRequired, never a failure. A report whose answer was
// lost is repeated with the same token and outcome (Options.ReportRetry), and a Begin whose
// answer was lost with the same attempt id (Options.BeginRetry). The other
// decisions are outcomes too: REPLAY gives the stored outcome with Replayed, and
// InProgress, VerificationRequired and DuplicateIntentSuspected say why call did not run.
//
// The provider is called only inside the lease: when Begin's EXECUTE answer arrives after
// the lease it grants has ended (measured from when the Begin was sent), call does not run
// and Execute returns ErrLeaseExpiredBeforeCall; while call runs, its context is cancelled
// at the lease's end unless a renewal moved it, and an error it then returns is recorded
// unknown (LeaseExpired).
//
// Errors (no Outcome): ErrIdempotencyKeyReused (the key is bound to another payload; call
// did not run); ErrLeaseExpiredBeforeCall (see above); ErrLeaseLost (another holder took the lease over before the report; call's
// context was cancelled if that was seen during the call); ErrInvalidArgument (a malformed
// intent; a success whose report the journal refuses is instead reported unknown with
// ResultRefused and answered VerificationRequired); ErrJournalUnavailable (calling Execute again with the
// same key is safe: an unreported lease ends as unknown); the context's error.
//
// A panic in call is reported as unknown ("panic") and then re-raised.
func Execute(ctx context.Context, c *Client, in Intent, call ProviderFunc, opts ...ExecuteOption) (Outcome, error) {
	cfg := executeConfig{renew: true, rejection: DefaultRejection, unknownCode: DefaultUnknownCode}
	for _, opt := range opts {
		opt(&cfg)
	}
	// One attempt id for every Begin of this call: it runs call at most once, after the one
	// EXECUTE it receives, so a repeat that gets a lease back only ever stands in for an
	// answer that never arrived.
	if in.AttemptID == "" {
		in.AttemptID = NewAttemptID()
	}
	start := time.Now()
	delay := newBackoff(200*time.Millisecond, 2*time.Second)
	for {
		// A repeat after a lost answer gets the lease granted to the first send of this
		// Begin (Begin repeats it itself): its lease is measured from here.
		sentAt := time.Now()
		begin, err := c.Begin(ctx, in)
		if err != nil {
			return Outcome{}, err
		}
		op := begin.GetOperation()
		switch begin.GetDecision() {
		case pb.Decision_DECISION_EXECUTE:
			if op == nil || begin.GetLeaseToken() == "" {
				return Outcome{}, &UnexpectedDecisionError{"EXECUTE without an operation or a lease token"}
			}
			return c.run(ctx, begin, sentAt, call, &cfg)
		case pb.Decision_DECISION_REPLAY:
			return replay(op)
		case pb.Decision_DECISION_IN_PROGRESS:
			retryAfter := begin.GetRetryAfter().AsDuration()
			if pause, ok := delay.within(start, cfg.inProgressWait, retryAfter); ok {
				if err := sleep(ctx, pause); err != nil {
					return Outcome{}, err
				}
				continue
			}
			return Outcome{
				Kind: InProgress, Key: op.GetOperationKey(), Operation: op,
				RetryAfter: retryAfter, RetryAfterMs: retryAfter.Milliseconds(),
			}, nil
		case pb.Decision_DECISION_VERIFICATION_REQUIRED:
			if pause, ok := delay.within(start, cfg.settleWait, 0); ok {
				if err := sleep(ctx, pause); err != nil {
					return Outcome{}, err
				}
				continue
			}
			return Outcome{Kind: VerificationRequired, Key: op.GetOperationKey(), Operation: op}, nil
		case pb.Decision_DECISION_DUPLICATE_INTENT_SUSPECTED:
			return Outcome{
				Kind: DuplicateIntentSuspected, Key: in.Key, Operation: op,
				DuplicateOf: begin.GetDuplicateOfOperationKey(),
			}, nil
		default:
			return Outcome{}, &UnexpectedDecisionError{"decision " + begin.GetDecision().String()}
		}
	}
}

// run calls the provider under the lease and reports what happened. sentAt is when the
// Begin that was granted the lease was first sent.
func (c *Client) run(ctx context.Context, begin *pb.BeginOperationResponse, sentAt time.Time, call ProviderFunc, cfg *executeConfig) (Outcome, error) {
	held := begin.GetOperation()
	token := begin.GetLeaseToken()
	length := grantedLease(held)
	if !time.Now().Before(sentAt.Add(length)) {
		// The answer came after the lease it grants had ended: another holder may have it
		// by now. Call nothing, report nothing.
		return Outcome{}, &Error{
			Code: ErrLeaseExpiredBeforeCall.Code, Reason: ErrLeaseExpiredBeforeCall.Reason, Domain: ErrorDomain,
			Message: fmt.Sprintf("the Begin answer arrived after its lease of %v had ended; the provider was not called: begin the same intent again to see where it stands", length),
		}
	}
	callCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	lease := &leaseRenewal{client: c, token: token, seconds: grantedLeaseSeconds(held), cancel: cancel, end: sentAt.Add(length)}
	lease.watchExpiry()
	if cfg.renew {
		lease.start()
	}
	result, callErr, panicked := protectedCall(callCtx, call, ProviderCall{ProviderKey: held.GetProviderKey(), Operation: held, lease: lease})
	lease.stop()
	if callErr != nil && lease.hasExpired() {
		// Cut off at the lease's end: whatever the call says of its error, the effect may
		// have happened.
		op, err := c.report(func(rctx context.Context) (*pb.Operation, error) { return c.ReportUnknown(rctx, token, LeaseExpired) })
		if err != nil {
			return Outcome{}, err
		}
		return Outcome{Kind: VerificationRequired, Key: op.GetOperationKey(), Reported: true, ErrorCode: LeaseExpired, Operation: op, Cause: callErr}, nil
	}

	if panicked != nil {
		_, _ = c.report(func(rctx context.Context) (*pb.Operation, error) { return c.ReportUnknown(rctx, token, "panic") })
		panic(panicked)
	}
	if callErr != nil {
		if code, rejected := cfg.rejection(callErr); rejected && errorCodePattern.MatchString(code) {
			op, err := c.report(func(rctx context.Context) (*pb.Operation, error) { return c.Fail(rctx, token, code) })
			if err != nil {
				return Outcome{}, err
			}
			return Outcome{Kind: FailedFinal, Key: op.GetOperationKey(), ErrorCode: code, Operation: op, Cause: callErr}, nil
		}
		code := cfg.unknownCode(callErr)
		if _, rejected := cfg.rejection(callErr); rejected {
			code = "invalid_error_code"
		} else if !errorCodePattern.MatchString(code) {
			code = "exception"
		}
		op, err := c.report(func(rctx context.Context) (*pb.Operation, error) { return c.ReportUnknown(rctx, token, code) })
		if err != nil {
			return Outcome{}, err
		}
		return Outcome{Kind: VerificationRequired, Key: op.GetOperationKey(), Reported: true, ErrorCode: code, Operation: op, Cause: callErr}, nil
	}

	resultJSON := ""
	if result.Result != nil {
		text, err := jsonText(result.Result)
		if err != nil || !json.Valid([]byte(text)) {
			// The effect happened but cannot be recorded as given: leave it to reconciliation.
			_, _ = c.report(func(rctx context.Context) (*pb.Operation, error) {
				return c.ReportUnknown(rctx, token, "result_not_serializable")
			})
			return Outcome{}, fmt.Errorf("opjournal: the provider result is not JSON: %w", errNotJSON)
		}
		resultJSON = text
	}
	op, err := c.report(func(rctx context.Context) (*pb.Operation, error) {
		return c.Complete(rctx, token, result.ExternalID, resultJSON)
	})
	if err != nil {
		if !errors.Is(err, ErrInvalidArgument) {
			return Outcome{}, err
		}
		// The effect happened but the journal refused this report of it (a result over the
		// action's limit, a malformed external id): it must be verified, never taken for
		// "nothing happened". Recorded unknown; reconciliation settles it.
		op, reportErr := c.report(func(rctx context.Context) (*pb.Operation, error) {
			return c.ReportUnknown(rctx, token, ResultRefused)
		})
		if reportErr != nil {
			return Outcome{}, reportErr
		}
		return Outcome{Kind: VerificationRequired, Key: op.GetOperationKey(), Reported: true, ErrorCode: ResultRefused, Operation: op, Cause: err}, nil
	}
	out := succeeded(op, false)
	out.ProviderResult = &result
	return out, nil
}

// report runs one report, repeating it while its answer was lost (or the row was busy),
// for up to the client's ReportRetry. It is detached from the caller's context: an effect
// that may have happened must be recorded even when the caller has given up.
func (c *Client) report(f func(context.Context) (*pb.Operation, error)) (*pb.Operation, error) {
	deadline := time.Now().Add(c.reportRetry)
	delay := 100 * time.Millisecond
	for {
		op, err := f(context.Background())
		if err == nil || c.reportRetry < 0 {
			return op, err
		}
		if !isLostAnswer(err) && !errors.Is(err, ErrConcurrentModification) {
			return op, err
		}
		if time.Now().Add(delay).After(deadline) {
			return op, err
		}
		time.Sleep(delay)
		if delay *= 2; delay > 2*time.Second {
			delay = 2 * time.Second
		}
	}
}

// protectedCall runs call, turning a panic into its value so that it can be reported first.
func protectedCall(ctx context.Context, call ProviderFunc, pc ProviderCall) (result ProviderResult, err error, panicked interface{}) {
	defer func() {
		if r := recover(); r != nil {
			panicked = r
		}
	}()
	result, err = call(ctx, pc)
	return result, err, nil
}

func replay(op *pb.Operation) (Outcome, error) {
	switch op.GetStatus() {
	case pb.OperationStatus_OPERATION_STATUS_SUCCEEDED:
		return succeeded(op, true), nil
	case pb.OperationStatus_OPERATION_STATUS_FAILED_FINAL:
		return Outcome{Kind: FailedFinal, Key: op.GetOperationKey(), ErrorCode: op.GetErrorCode(), Replayed: true, Operation: op}, nil
	}
	return Outcome{}, &UnexpectedDecisionError{"REPLAY of a non-terminal operation (" + op.GetStatus().String() + ")"}
}

func succeeded(op *pb.Operation, replayed bool) Outcome {
	out := Outcome{Kind: Succeeded, Key: op.GetOperationKey(), ExternalID: op.GetExternalId(), Replayed: replayed, Operation: op}
	if op.ResultJson != nil {
		out.Result = json.RawMessage(op.GetResultJson())
	}
	return out
}

// grantedLease is the exact length of a granted lease, from two database-clock timestamps
// (zero when either is missing).
func grantedLease(op *pb.Operation) time.Duration {
	until, at := op.GetLeaseUntil(), op.GetUpdatedAt()
	if until == nil || at == nil {
		return 0
	}
	if granted := until.AsTime().Sub(at.AsTime()); granted > 0 {
		return granted
	}
	return 0
}

// grantedLeaseSeconds is the length of the lease Begin granted, by the server's clock (at
// least 1 s).
func grantedLeaseSeconds(op *pb.Operation) int32 {
	until, at := op.GetLeaseUntil(), op.GetUpdatedAt()
	if until == nil || at == nil {
		return 1
	}
	granted := until.AsTime().Sub(at.AsTime())
	secs := int32((granted + time.Second - 1) / time.Second)
	if secs < 1 {
		return 1
	}
	return secs
}

// leaseRenewal renews a lease every third of its length until stopped, and cancels the
// provider function's context when a renewal is refused with LEASE_LOST, or when the lease
// ends (end, moved on by each renewal) with no renewal in time.
type leaseRenewal struct {
	client  *Client
	token   string
	seconds int32
	cancel  context.CancelFunc

	mu      sync.Mutex
	lost    error
	end     time.Time
	expired bool
	timer   *time.Timer
	stopped bool
	quit    context.CancelFunc
	done    chan struct{}
}

// watchExpiry arms the timer for the lease's end; at that end, unless a renewal moved it,
// the lease has expired and the provider function's context is cancelled.
func (l *leaseRenewal) watchExpiry() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.stopped || l.expired {
		return
	}
	if l.timer != nil {
		l.timer.Stop()
	}
	left := time.Until(l.end)
	if left <= 0 {
		l.expired = true
		l.cancel()
		return
	}
	l.timer = time.AfterFunc(left, l.watchExpiry)
}

// renewed moves the lease's end to sentAt plus the length the renewal granted.
func (l *leaseRenewal) renewed(sentAt time.Time, op *pb.Operation) {
	l.mu.Lock()
	l.end = sentAt.Add(grantedLease(op))
	l.mu.Unlock()
	l.watchExpiry()
}

func (l *leaseRenewal) deadline() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.end
}

func (l *leaseRenewal) hasExpired() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.expired
}

func (l *leaseRenewal) start() {
	ctx, quit := context.WithCancel(context.Background())
	l.quit = quit
	l.done = make(chan struct{})
	go func() {
		defer close(l.done)
		every := time.Duration(l.seconds) * time.Second / 3
		ticker := time.NewTicker(every)
		defer ticker.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-ticker.C:
			}
			sentAt := time.Now()
			renewed, err := l.client.RenewLease(ctx, l.token, l.seconds)
			if err == nil {
				l.renewed(sentAt, renewed)
				continue
			}
			if errors.Is(err, ErrLeaseLost) {
				l.mu.Lock()
				l.lost = err
				l.mu.Unlock()
				l.cancel()
				return
			}
			// Anything else is transient (the journal unreachable): the lease may be live.
		}
	}()
}

func (l *leaseRenewal) stop() {
	l.mu.Lock()
	l.stopped = true
	if l.timer != nil {
		l.timer.Stop()
	}
	l.mu.Unlock()
	if l.quit == nil {
		return
	}
	l.quit() // also ends a renewal in flight: the report that follows decides
	<-l.done
}

func (l *leaseRenewal) lostErr() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.lost
}

// backoff is a pause doubling from min to max.
type backoff struct {
	next, max time.Duration
}

func newBackoff(min, max time.Duration) *backoff { return &backoff{next: min, max: max} }

// within gives the next pause when waiting may go on: wait is the whole allowance from
// start; the pause is never longer than what is left of it, nor than limit (if positive).
func (b *backoff) within(start time.Time, wait, limit time.Duration) (time.Duration, bool) {
	left := wait - time.Since(start)
	if wait <= 0 || left <= 0 {
		return 0, false
	}
	pause := b.next
	if b.next *= 2; b.next > b.max {
		b.next = b.max
	}
	if limit > 0 && pause > limit {
		pause = limit
	}
	if pause > left {
		pause = left
	}
	return pause, true
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return contextErr(ctx)
	case <-t.C:
		return nil
	}
}
