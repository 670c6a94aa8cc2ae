// Package opjournal is the Go client of the opjournal operation journal: a typed wrapper
// over the generated gRPC stubs (package gen/opjournal/v1) and Execute, which makes one
// side-effecting provider call safe to retry.
//
// Every call carries a deadline (Options.Timeout unless the context has an earlier one)
// and fails with an *Error decoded from the status's google.rpc.ErrorInfo; match it with
// errors.Is(err, opjournal.ErrLeaseLost) and the other Err* values.
package opjournal

import (
	"context"
	"crypto/rand"
	_ "embed"
	"encoding/hex"
	"encoding/json"
	"errors"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	pb "github.com/opjournal/opjournal/clients/go/gen/opjournal/v1"
)

// Version is the version of this client, of the server and of the proto it speaks.
const Version = "0.2.0"

// DefaultTimeout is how long each call may take when Options.Timeout is zero.
const DefaultTimeout = 10 * time.Second

// DefaultReportRetry is how long a report whose answer was lost is repeated when
// Options.ReportRetry is zero.
const DefaultReportRetry = 30 * time.Second

// DefaultBeginRetry is how long a Begin whose answer was lost is repeated when
// Options.BeginRetry is zero.
const DefaultBeginRetry = 10 * time.Second

// Options configure a Client. The zero value is usable.
type Options struct {
	// Timeout is the deadline of each call (DefaultTimeout when zero). A context with an
	// earlier deadline keeps it. A call that runs out fails with DEADLINE_EXCEEDED
	// (errors.Is(err, ErrJournalUnavailable)).
	Timeout time.Duration
	// ReportRetry is how long Execute repeats a report (Complete, Fail,
	// ReportUnknownOutcome) whose answer was lost (UNAVAILABLE, CANCELLED,
	// DEADLINE_EXCEEDED), with the same lease token and the same outcome and a backoff of
	// 100 ms doubling to 2 s. DefaultReportRetry when zero; negative: never repeat. The
	// journal answers a repeated report with the record of the first, so it is safe.
	ReportRetry time.Duration
	// BeginRetry is how long Begin repeats a BeginOperation whose answer was lost
	// (UNAVAILABLE, CANCELLED, DEADLINE_EXCEEDED), with the same attempt id and the same
	// backoff. DefaultBeginRetry when zero; negative: never repeat. The journal answers the
	// repeat with the lease it granted to the first, so the provider is still called once.
	BeginRetry time.Duration
	// Token, when set, is sent as "authorization: Bearer <Token>" on every call.
	Token string
}

// Client is a client of one opjournal server. It is safe for concurrent use.
type Client struct {
	// Journal is the generated OperationJournal client, for calls not wrapped here; its
	// errors are raw statuses (see DecodeError).
	Journal pb.OperationJournalClient
	// Reconciler is the generated Reconciler client, for calls not wrapped here.
	Reconciler pb.ReconcilerClient

	timeout     time.Duration
	reportRetry time.Duration
	beginRetry  time.Duration
	token       string
	conn        *grpc.ClientConn
}

// New wraps an existing connection (the caller closes it).
func New(conn grpc.ClientConnInterface, opts Options) *Client {
	c := &Client{
		Journal:     pb.NewOperationJournalClient(conn),
		Reconciler:  pb.NewReconcilerClient(conn),
		timeout:     opts.Timeout,
		reportRetry: opts.ReportRetry,
		beginRetry:  opts.BeginRetry,
		token:       opts.Token,
	}
	if c.timeout <= 0 {
		c.timeout = DefaultTimeout
	}
	if c.reportRetry == 0 {
		c.reportRetry = DefaultReportRetry
	}
	if c.beginRetry == 0 {
		c.beginRetry = DefaultBeginRetry
	}
	return c
}

// ServiceConfig is the gRPC service config shipped with the server's contract
// (proto/opjournal/v1/service_config.json; a test in the repository keeps this copy equal to
// it): calls whose RPC is safe to repeat are retried by grpc-go on UNAVAILABLE, at most 4
// attempts, throttled while most calls fail. The same request is sent again, so a retried
// Begin carries the same key. grpc-go applies retry policies by default from v1.40; older
// releases (Debian bookworm's 1.33) need GRPC_GO_RETRY=on in the environment.
//
//go:embed service_config.json
var ServiceConfig string

// Dial connects to target ("host:port") with ServiceConfig as the default service config
// (a dial option of the caller's, such as grpc.WithDefaultServiceConfig or
// grpc.WithDisableRetry, comes after it and wins). Pass grpc.WithInsecure() for a plaintext
// server, or transport credentials for TLS; Close releases the connection.
func Dial(target string, opts Options, dialOpts ...grpc.DialOption) (*Client, error) {
	dialOpts = append([]grpc.DialOption{grpc.WithDefaultServiceConfig(ServiceConfig)}, dialOpts...)
	conn, err := grpc.Dial(target, dialOpts...)
	if err != nil {
		return nil, err
	}
	c := New(conn, opts)
	c.conn = conn
	return c, nil
}

// Close closes the connection Dial opened (nothing for New).
func (c *Client) Close() error {
	if c.conn == nil {
		return nil
	}
	return c.conn.Close()
}

// call gives ctx the client's deadline (unless it has an earlier one) and the token.
func (c *Client) call(ctx context.Context) (context.Context, context.CancelFunc) {
	if c.token != "" {
		ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+c.token)
	}
	return context.WithTimeout(ctx, c.timeout)
}

// Intent is one business intent: the fields of BeginOperation.
type Intent struct {
	// Namespace is the tenant namespace; empty means "default".
	Namespace string
	// Key is the idempotency key naming the business intent (not the network attempt),
	// chosen by the orchestrator's code: 1-200 characters. See Client.DeriveKey.
	Key string
	// ActionType is the action as named in the server's policy, e.g. "create_payment".
	ActionType string
	// Payload is the provider request's parameters: a value for encoding/json that
	// encodes as a JSON object, or json.RawMessage. Only its SHA-256 (RFC 8785 canonical
	// form) is stored; the same key with another payload is IDEMPOTENCY_KEY_REUSED.
	Payload interface{}
	// LeaseSeconds is the lease to ask for; 0 means the action's default.
	LeaseSeconds int32
	// References are business links kept with the record (not hashed).
	References map[string]string
	// ConfirmDuplicateIntent proceeds after DUPLICATE_INTENT_SUSPECTED: this really is a
	// new intent.
	ConfirmDuplicateIntent bool
	// AttemptID names this Begin intent: 16-64 characters of [A-Za-z0-9_-]. Empty: Begin
	// draws a new one (NewAttemptID) for each call, and Execute one for each Execute,
	// kept for all its Begins. Set it only to repeat one intent's Begin yourself; never
	// reuse one for another intent.
	AttemptID string
}

// NewAttemptID is a new random attempt id: 128 random bits in hex (32 characters).
func NewAttemptID() string {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic("opjournal: no randomness for an attempt id: " + err.Error())
	}
	return hex.EncodeToString(b[:])
}

// errNotJSON: a payload or result cannot be encoded as JSON; nothing was sent.
var errNotJSON = errors.New("opjournal: the value cannot be encoded as JSON")

func jsonText(v interface{}) (string, error) {
	switch t := v.(type) {
	case json.RawMessage:
		return string(t), nil
	case []byte:
		return string(t), nil
	}
	b, err := json.Marshal(v)
	if err != nil {
		return "", errNotJSON
	}
	return string(b), nil
}

// Begin registers the intent and, where the rules allow, claims a lease
// (BeginOperation), under in.AttemptID (a new one when empty). A Begin whose answer was
// lost (UNAVAILABLE, CANCELLED, DEADLINE_EXCEEDED: the journal may have granted a lease)
// is repeated with the same attempt id for up to Options.BeginRetry, with a backoff of
// 100 ms doubling to 2 s; the journal answers the repeat with the lease it granted to the
// first instead of IN_PROGRESS against it. Errors: ErrIdempotencyKeyReused,
// ErrInvalidArgument (INVALID_ATTEMPT_ID among others), ErrJournalUnavailable, ...
func (c *Client) Begin(ctx context.Context, in Intent) (*pb.BeginOperationResponse, error) {
	payload, err := jsonText(in.Payload)
	if err != nil {
		return nil, err
	}
	if in.AttemptID == "" {
		in.AttemptID = NewAttemptID()
	}
	request := &pb.BeginOperationRequest{
		Namespace:              in.Namespace,
		OperationKey:           in.Key,
		ActionType:             in.ActionType,
		PayloadJson:            payload,
		LeaseSeconds:           in.LeaseSeconds,
		References:             in.References,
		ConfirmDuplicateIntent: in.ConfirmDuplicateIntent,
		AttemptId:              in.AttemptID,
	}
	deadline := time.Now().Add(c.beginRetry)
	delay := 100 * time.Millisecond
	for {
		resp, err := c.beginOnce(ctx, request)
		if err == nil || c.beginRetry < 0 || !isLostAnswer(err) || ctx.Err() != nil {
			return resp, err
		}
		if time.Now().Add(delay).After(deadline) {
			return resp, err
		}
		if err := sleep(ctx, delay); err != nil {
			return nil, err
		}
		if delay *= 2; delay > 2*time.Second {
			delay = 2 * time.Second
		}
	}
}

// beginOnce sends one BeginOperation with the client's deadline.
func (c *Client) beginOnce(ctx context.Context, request *pb.BeginOperationRequest) (*pb.BeginOperationResponse, error) {
	ctx, cancel := c.call(ctx)
	defer cancel()
	resp, err := c.Journal.BeginOperation(ctx, request)
	return resp, DecodeError(err)
}

// Complete records a confirmed success (CompleteOperation): -> SUCCEEDED. resultJSON is
// JSON text (empty: no result body). Errors: ErrLeaseLost, ErrOutcomeAlreadyRecorded,
// ErrInvalidArgument (RESULT_TOO_LARGE, INVALID_RESULT, ...).
func (c *Client) Complete(ctx context.Context, leaseToken, externalID, resultJSON string) (*pb.Operation, error) {
	ctx, cancel := c.call(ctx)
	defer cancel()
	resp, err := c.Journal.CompleteOperation(ctx, &pb.CompleteOperationRequest{
		LeaseToken: leaseToken, ExternalId: externalID, ResultJson: resultJSON,
	})
	return resp.GetOperation(), DecodeError(err)
}

// Fail records a confirmed rejection (FailOperation): -> FAILED_FINAL. errorCode is a
// short machine code (1-100 characters of [A-Za-z0-9._:-]). Errors: ErrLeaseLost,
// ErrOutcomeAlreadyRecorded, ErrInvalidArgument.
func (c *Client) Fail(ctx context.Context, leaseToken, errorCode string) (*pb.Operation, error) {
	ctx, cancel := c.call(ctx)
	defer cancel()
	resp, err := c.Journal.FailOperation(ctx, &pb.FailOperationRequest{LeaseToken: leaseToken, ErrorCode: errorCode})
	return resp.GetOperation(), DecodeError(err)
}

// ReportUnknown records that the outcome is not known (ReportUnknownOutcome): -> UNKNOWN.
// Errors: ErrLeaseLost, ErrOutcomeAlreadyRecorded, ErrInvalidArgument.
func (c *Client) ReportUnknown(ctx context.Context, leaseToken, errorCode string) (*pb.Operation, error) {
	ctx, cancel := c.call(ctx)
	defer cancel()
	resp, err := c.Journal.ReportUnknownOutcome(ctx, &pb.ReportUnknownOutcomeRequest{LeaseToken: leaseToken, ErrorCode: errorCode})
	return resp.GetOperation(), DecodeError(err)
}

// RenewLease extends a live lease to leaseSeconds from now. Errors: ErrLeaseLost when the
// lease was taken over or has ended.
func (c *Client) RenewLease(ctx context.Context, leaseToken string, leaseSeconds int32) (*pb.Operation, error) {
	ctx, cancel := c.call(ctx)
	defer cancel()
	resp, err := c.Journal.RenewLease(ctx, &pb.RenewLeaseRequest{LeaseToken: leaseToken, LeaseSeconds: leaseSeconds})
	return resp.GetOperation(), DecodeError(err)
}

// Get reads one operation. Errors: ErrOperationNotFound.
func (c *Client) Get(ctx context.Context, namespace, key string) (*pb.Operation, error) {
	ctx, cancel := c.call(ctx)
	defer cancel()
	resp, err := c.Journal.GetOperation(ctx, &pb.GetOperationRequest{Namespace: namespace, OperationKey: key})
	return resp.GetOperation(), DecodeError(err)
}

// DeriveKey derives an opaque, stable key ("ok_" + 52 characters of [a-z2-7]) for an
// intent reference that may hold personal data (never stored or logged). Errors:
// ErrKeyDerivationDisabled, ErrInvalidArgument.
func (c *Client) DeriveKey(ctx context.Context, namespace, actionType, intentReference string) (string, error) {
	ctx, cancel := c.call(ctx)
	defer cancel()
	resp, err := c.Journal.DeriveOperationKey(ctx, &pb.DeriveOperationKeyRequest{
		Namespace: namespace, ActionType: actionType, IntentReference: intentReference,
	})
	return resp.GetOperationKey(), DecodeError(err)
}

// Reconcile asks the action's provider adapter now what happened to an UNKNOWN operation
// (ReconcileOperation). Errors: ErrOperationNotFound, ErrOperationNotReconcilable,
// ErrReconcileInProgress, ErrNoProviderAdapter.
func (c *Client) Reconcile(ctx context.Context, namespace, key string) (*pb.ReconcileOperationResponse, error) {
	ctx, cancel := c.call(ctx)
	defer cancel()
	resp, err := c.Reconciler.ReconcileOperation(ctx, &pb.ReconcileOperationRequest{Namespace: namespace, OperationKey: key})
	return resp, DecodeError(err)
}
