package opjournal_test

// The client against a real server and sandbox (tests/it/go_client.rs starts them and then
// checks the journal rows and the provider's counts itself). Environment:
// OPJOURNAL_TEST_SERVER (host:port), OPJOURNAL_TEST_SANDBOX_URL; without them these tests
// are skipped (`go test -v` says so).

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"

	opjournal "github.com/opjournal/opjournal/clients/go"
	pb "github.com/opjournal/opjournal/clients/go/gen/opjournal/v1"
)

var pay817 = map[string]interface{}{"order_id": "817", "amount_minor": 490000, "currency": "RUB"}

type live struct {
	server, sandbox string
}

func liveEnv(t *testing.T) live {
	t.Helper()
	server, sandbox := os.Getenv("OPJOURNAL_TEST_SERVER"), os.Getenv("OPJOURNAL_TEST_SANDBOX_URL")
	if server == "" || sandbox == "" {
		t.Skip("OPJOURNAL_TEST_SERVER and OPJOURNAL_TEST_SANDBOX_URL are not set: run through tests/it/go_client.rs")
	}
	return live{server: server, sandbox: strings.TrimSuffix(sandbox, "/")}
}

func (l live) dial(t *testing.T, opts opjournal.Options, dialOpts ...grpc.DialOption) *opjournal.Client {
	t.Helper()
	c, err := opjournal.Dial(l.server, opts, append([]grpc.DialOption{grpc.WithInsecure()}, dialOpts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// pay posts one payment to the sandbox under providerKey and returns its id.
func (l live) pay(ctx context.Context, providerKey string) (string, json.RawMessage, error) {
	body, _ := json.Marshal(pay817)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, l.sandbox+"/v1/payments", bytes.NewReader(body))
	if err != nil {
		return "", nil, err
	}
	req.Header.Set("Idempotency-Key", providerKey)
	req.Header.Set("Content-Type", "application/json")
	resp, err := (&http.Client{Timeout: 5 * time.Second}).Do(req)
	if err != nil {
		return "", nil, err
	}
	defer resp.Body.Close()
	answer, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", nil, err
	}
	if resp.StatusCode/100 != 2 {
		return "", nil, &opjournal.HTTPStatusError{StatusCode: resp.StatusCode}
	}
	var payment struct {
		ID string `json:"id"`
	}
	if err := json.Unmarshal(answer, &payment); err != nil {
		return "", nil, err
	}
	return payment.ID, answer, nil
}

func (l live) provider() opjournal.ProviderFunc {
	return func(ctx context.Context, call opjournal.ProviderCall) (opjournal.ProviderResult, error) {
		id, answer, err := l.pay(ctx, call.ProviderKey)
		if err != nil {
			return opjournal.ProviderResult{}, err
		}
		return opjournal.ProviderResult{ExternalID: id, Result: json.RawMessage(answer)}, nil
	}
}

func TestClientDecodesTypedErrors(t *testing.T) {
	l := liveEnv(t)
	c := l.dial(t, opjournal.Options{})
	ctx := context.Background()
	key := "go:errors:conflict"

	out, err := opjournal.Execute(ctx, c, opjournal.Intent{Key: key, ActionType: "create_payment", Payload: pay817}, l.provider())
	if err != nil || out.Kind != opjournal.Succeeded || out.Replayed {
		t.Fatalf("first execute: %+v, %v", out, err)
	}
	other := map[string]interface{}{"order_id": "817", "amount_minor": 590000, "currency": "RUB"}
	called := false
	_, err = opjournal.Execute(ctx, c, opjournal.Intent{Key: key, ActionType: "create_payment", Payload: other},
		func(context.Context, opjournal.ProviderCall) (opjournal.ProviderResult, error) {
			called = true
			return opjournal.ProviderResult{}, nil
		})
	var typed *opjournal.Error
	if !errors.Is(err, opjournal.ErrIdempotencyKeyReused) || !errors.As(err, &typed) {
		t.Fatalf("another payload under the key: %v", err)
	}
	if typed.Code != codes.AlreadyExists || typed.Domain != opjournal.ErrorDomain || called {
		t.Fatalf("conflict: code %v, domain %q, provider called %v", typed.Code, typed.Domain, called)
	}
	if errors.Is(err, opjournal.ErrLeaseLost) || errors.Is(err, opjournal.ErrInvalidArgument) {
		t.Fatalf("the conflict matches other errors too: %v", err)
	}

	_, err = c.Get(ctx, "", "go:errors:missing")
	if !errors.Is(err, opjournal.ErrOperationNotFound) {
		t.Fatalf("get of a missing key: %v", err)
	}

	_, err = c.Begin(ctx, opjournal.Intent{Key: "go:errors:bad-payload", ActionType: "create_payment",
		Payload: json.RawMessage(`{"amount_minor":1,"amount_minor":2}`)})
	if !errors.Is(err, opjournal.ErrInvalidArgument) || !errors.As(err, &typed) {
		t.Fatalf("a duplicate member: %v", err)
	}
	if typed.Reason != "INVALID_PAYLOAD" || typed.Metadata["rule"] != "duplicate_member" {
		t.Fatalf("a duplicate member: reason %q, metadata %v", typed.Reason, typed.Metadata)
	}
	if strings.Contains(err.Error(), "amount_minor\":1") {
		t.Fatalf("the error quotes the payload: %v", err)
	}
}

func TestClientGivesEveryCallADeadline(t *testing.T) {
	l := liveEnv(t)
	c := l.dial(t, opjournal.Options{Timeout: time.Nanosecond})
	_, err := c.Get(context.Background(), "", "go:deadline:any")
	var typed *opjournal.Error
	if !errors.Is(err, opjournal.ErrJournalUnavailable) || !errors.As(err, &typed) || typed.Code != codes.DeadlineExceeded {
		t.Fatalf("a call past its deadline: %v", err)
	}
}

func TestClientRenewsTheLeaseDuringALongCall(t *testing.T) {
	l := liveEnv(t)
	c := l.dial(t, opjournal.Options{})
	ctx := context.Background()
	// create_payment_dedup (on_timeout: retry_with_same_key): an ended lease would be
	// claimed by the next Begin, so IN_PROGRESS below proves the lease was renewed.
	intent := opjournal.Intent{Key: "go:leases:renewed", ActionType: "create_payment_dedup", Payload: pay817, LeaseSeconds: 1}
	out, err := opjournal.Execute(ctx, c, intent, func(ctx context.Context, call opjournal.ProviderCall) (opjournal.ProviderResult, error) {
		time.Sleep(2500 * time.Millisecond)
		other, err := c.Begin(ctx, intent)
		if err != nil {
			return opjournal.ProviderResult{}, err
		}
		if other.GetDecision() != pb.Decision_DECISION_IN_PROGRESS {
			t.Errorf("another Begin 2.5 s into a 1 s lease: %v", other.GetDecision())
		}
		return l.provider()(ctx, call)
	})
	if err != nil || out.Kind != opjournal.Succeeded || out.Operation.GetAttemptCount() != 1 {
		t.Fatalf("execute: %+v, %v", out, err)
	}
}

// A provider call whose renewals do not get through is cancelled when its lease ends;
// its report then meets the holder that took the ended lease over.
func TestClientCancelsTheProviderCallWhenTheLeaseEnds(t *testing.T) {
	l := liveEnv(t)
	ctx := context.Background()
	key := "go:leases:lost"
	intent := opjournal.Intent{Key: key, ActionType: "create_payment_dedup", Payload: pay817, LeaseSeconds: 1}

	// Renewals wait (in the transport, before they are sent) until another holder has
	// taken the ended lease over; then the first of them meets LEASE_LOST.
	takenOver := make(chan struct{})
	var once sync.Once
	hold := func(ctx context.Context, method string, req, reply interface{}, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		if strings.HasSuffix(method, "/RenewLease") {
			select {
			case <-takenOver:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		return invoker(ctx, method, req, reply, cc, opts...)
	}
	c := l.dial(t, opjournal.Options{}, grpc.WithUnaryInterceptor(hold))
	other := l.dial(t, opjournal.Options{})

	var second *pb.BeginOperationResponse
	var sawCancel bool
	var leaseEnded bool
	_, err := opjournal.Execute(ctx, c, intent, func(ctx context.Context, call opjournal.ProviderCall) (opjournal.ProviderResult, error) {
		if _, _, err := l.pay(ctx, call.ProviderKey); err != nil {
			return opjournal.ProviderResult{}, err
		}
		for deadline := time.Now().Add(10 * time.Second); second == nil && time.Now().Before(deadline); {
			begin, err := other.Begin(context.Background(), intent)
			if err != nil {
				return opjournal.ProviderResult{}, err
			}
			if begin.GetDecision() == pb.Decision_DECISION_EXECUTE {
				second = begin
			} else {
				time.Sleep(200 * time.Millisecond)
			}
		}
		once.Do(func() { close(takenOver) })
		select {
		case <-ctx.Done():
			sawCancel = true
			leaseEnded = !time.Now().Before(call.LeaseDeadline())
			return opjournal.ProviderResult{}, ctx.Err()
		case <-time.After(10 * time.Second):
			return opjournal.ProviderResult{}, errors.New("the provider call was not cancelled")
		}
	})
	if !errors.Is(err, opjournal.ErrLeaseLost) {
		t.Fatalf("execute after a takeover: %v", err)
	}
	if !sawCancel || !leaseEnded {
		t.Fatalf("the provider call saw cancellation %v, at its lease's end %v", sawCancel, leaseEnded)
	}
	if second == nil {
		t.Fatal("no other holder took the lease over")
	}
	// The new holder calls the provider with the same key: the provider deduplicates.
	id, answer, err := l.pay(ctx, second.GetOperation().GetProviderKey())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := other.Complete(ctx, second.GetLeaseToken(), id, string(answer)); err != nil {
		t.Fatal(err)
	}
}

type order struct {
	ID          string
	AmountMinor int
	Currency    string
	// Note is not part of the intent (Payload leaves it out).
	Note string
}

func TestClientProtectsAFunction(t *testing.T) {
	l := liveEnv(t)
	c := l.dial(t, opjournal.Options{})
	ctx := context.Background()
	calls := 0
	pay := opjournal.Protected[order]{
		Client:     c,
		ActionType: "create_payment",
		Key: func(_ context.Context, o order) (string, error) {
			return "go:protect:order-" + o.ID, nil
		},
		Payload: func(o order) interface{} {
			return map[string]interface{}{"order_id": o.ID, "amount_minor": o.AmountMinor, "currency": o.Currency}
		},
		Call: func(ctx context.Context, call opjournal.ProviderCall, o order) (opjournal.ProviderResult, error) {
			calls++
			return l.provider()(ctx, call)
		},
	}
	first, err := pay.Run(ctx, order{ID: "817", AmountMinor: 490000, Currency: "RUB", Note: "first try"})
	if err != nil || first.Kind != opjournal.Succeeded || first.Replayed || first.ExternalID == "" {
		t.Fatalf("first run: %+v, %v", first, err)
	}
	again, err := pay.Run(ctx, order{ID: "817", AmountMinor: 490000, Currency: "RUB", Note: "asked again"})
	if err != nil || again.Kind != opjournal.Succeeded || !again.Replayed || again.ExternalID != first.ExternalID {
		t.Fatalf("second run: %+v, %v", again, err)
	}
	text, _ := json.Marshal(again)
	var read map[string]interface{}
	if err := json.Unmarshal(text, &read); err != nil || read["outcome"] != "succeeded" || read["replayed"] != true {
		t.Fatalf("the outcome as JSON: %s", text)
	}
	_, err = pay.Run(ctx, order{ID: "817", AmountMinor: 590000, Currency: "RUB"})
	if !errors.Is(err, opjournal.ErrIdempotencyKeyReused) {
		t.Fatalf("another amount under the same order: %v", err)
	}
	if calls != 1 {
		t.Fatalf("the provider function ran %d times", calls)
	}
}

func TestAuthTheTokenReachesItsNamespaceAndNoOther(t *testing.T) {
	l := liveEnv(t)
	token := os.Getenv("OPJOURNAL_TEST_TOKEN")
	if token == "" {
		t.Skip("OPJOURNAL_TEST_TOKEN is not set: run through tests/it/go_client.rs")
	}
	ctx := context.Background()
	intent := func(namespace string) opjournal.Intent {
		return opjournal.Intent{Namespace: namespace, Key: "go:auth:payment", ActionType: "create_payment", Payload: pay817}
	}
	var typed *opjournal.Error

	_, err := l.dial(t, opjournal.Options{}).Begin(ctx, intent("tenant-a"))
	if !errors.Is(err, opjournal.ErrUnauthenticated) || !errors.As(err, &typed) || typed.Reason != "MISSING_CREDENTIALS" {
		t.Fatalf("without a token: %v", err)
	}
	_, err = l.dial(t, opjournal.Options{Token: "tok-wrong.0000"}).Begin(ctx, intent("tenant-a"))
	if !errors.Is(err, opjournal.ErrUnauthenticated) || !errors.As(err, &typed) || typed.Reason != "INVALID_CREDENTIALS" {
		t.Fatalf("a wrong token: %v", err)
	}

	c := l.dial(t, opjournal.Options{Token: token})
	var providerKeys []string
	out, err := opjournal.Execute(ctx, c, intent("tenant-a"), func(ctx context.Context, call opjournal.ProviderCall) (opjournal.ProviderResult, error) {
		providerKeys = append(providerKeys, call.ProviderKey)
		return l.provider()(ctx, call)
	})
	if err != nil || out.Kind != opjournal.Succeeded {
		t.Fatalf("execute in tenant-a: %+v, %v", out, err)
	}
	if len(providerKeys) != 1 || providerKeys[0] != "tenant-a/go:auth:payment" {
		t.Fatalf("provider keys %v", providerKeys)
	}
	_, err = opjournal.Execute(ctx, c, intent("tenant-b"), func(context.Context, opjournal.ProviderCall) (opjournal.ProviderResult, error) {
		t.Error("the provider was called for tenant-b")
		return opjournal.ProviderResult{}, nil
	})
	if !errors.Is(err, opjournal.ErrPermissionDenied) || !errors.As(err, &typed) || typed.Reason != "NAMESPACE_NOT_ALLOWED" {
		t.Fatalf("tenant-b: %v", err)
	}
}

func TestClientAnswersARefusedSuccessReportWithVerificationRequired(t *testing.T) {
	l := liveEnv(t)
	c := l.dial(t, opjournal.Options{})
	ctx := context.Background()
	intent := opjournal.Intent{Key: "go:refused:external-id", ActionType: "create_payment", Payload: pay817}
	calls := 0
	// The provider charges, but its id is over the journal's 200 characters: the report of
	// the success is refused, and the effect must not read as "nothing happened".
	call := func(ctx context.Context, call opjournal.ProviderCall) (opjournal.ProviderResult, error) {
		calls++
		result, err := l.provider()(ctx, call)
		result.ExternalID = strings.Repeat("p", 300)
		return result, err
	}
	out, err := opjournal.Execute(ctx, c, intent, call)
	if err != nil || out.Kind != opjournal.VerificationRequired || !out.Reported || out.ErrorCode != opjournal.ResultRefused {
		t.Fatalf("execute: %+v, %v", out, err)
	}
	if !errors.Is(out.Cause, opjournal.ErrInvalidArgument) {
		t.Fatalf("cause: %v", out.Cause)
	}
	again, err := opjournal.Execute(ctx, c, intent, call)
	if err != nil || again.Kind != opjournal.VerificationRequired || again.Reported || calls != 1 {
		t.Fatalf("again: %+v, %v, calls %d", again, err, calls)
	}
}

func TestClientCutsOffACallThatOutlivesItsUnrenewedLease(t *testing.T) {
	l := liveEnv(t)
	c := l.dial(t, opjournal.Options{})
	intent := opjournal.Intent{Key: "go:leases:cut-off", ActionType: "create_payment", Payload: pay817, LeaseSeconds: 1}
	var left time.Duration
	started := time.Now()
	out, err := opjournal.Execute(context.Background(), c, intent, func(ctx context.Context, call opjournal.ProviderCall) (opjournal.ProviderResult, error) {
		left = time.Until(call.LeaseDeadline())
		select {
		case <-ctx.Done():
			return opjournal.ProviderResult{}, ctx.Err()
		case <-time.After(30 * time.Second):
			return opjournal.ProviderResult{}, errors.New("not cut off")
		}
	}, opjournal.WithoutLeaseRenewal())
	if err != nil || out.Kind != opjournal.VerificationRequired || !out.Reported || out.ErrorCode != opjournal.LeaseExpired {
		t.Fatalf("execute: %+v, %v", out, err)
	}
	if left <= 0 || left > time.Second {
		t.Fatalf("the call saw %v of its 1 s lease left", left)
	}
	if took := time.Since(started); took > 10*time.Second {
		t.Fatalf("cut off after %v", took)
	}
}
