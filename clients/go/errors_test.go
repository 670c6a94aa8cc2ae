package opjournal

import (
	"context"
	"errors"
	"fmt"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/golang/protobuf/ptypes/duration"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func withDetails(t *testing.T, code codes.Code, details ...interface{}) error {
	t.Helper()
	st := status.New(code, "for people")
	for _, d := range details {
		var err error
		switch m := d.(type) {
		case *errdetails.ErrorInfo:
			st, err = st.WithDetails(m)
		case *errdetails.BadRequest:
			st, err = st.WithDetails(m)
		case *errdetails.RetryInfo:
			st, err = st.WithDetails(m)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	return st.Err()
}

func TestDecodeErrorReadsTheDetails(t *testing.T) {
	err := DecodeError(withDetails(t, codes.Aborted,
		&errdetails.ErrorInfo{Reason: "CONCURRENT_MODIFICATION", Domain: ErrorDomain, Metadata: map[string]string{"status": "in_progress"}},
		&errdetails.RetryInfo{RetryDelay: &duration.Duration{Nanos: 250_000_000}},
	))
	var e *Error
	if !errors.As(err, &e) || !errors.Is(err, ErrConcurrentModification) || errors.Is(err, ErrLeaseLost) {
		t.Fatalf("decoded %v", err)
	}
	if e.Code != codes.Aborted || e.Metadata["status"] != "in_progress" || e.RetryDelay != 250*time.Millisecond {
		t.Fatalf("decoded %+v", e)
	}
	if status.Code(err) != codes.Aborted {
		t.Fatalf("status.Code of the decoded error: %v", status.Code(err))
	}

	err = DecodeError(withDetails(t, codes.InvalidArgument,
		&errdetails.ErrorInfo{Reason: "INVALID_OPERATION_KEY", Domain: ErrorDomain},
		&errdetails.BadRequest{FieldViolations: []*errdetails.BadRequest_FieldViolation{{Field: "operation_key", Description: "too long"}}},
	))
	if !errors.As(err, &e) || !errors.Is(err, ErrInvalidArgument) || len(e.FieldViolations) != 1 || e.FieldViolations[0].Field != "operation_key" {
		t.Fatalf("decoded %+v", err)
	}

	// Another service's reason never passes for one of the journal's.
	err = DecodeError(withDetails(t, codes.Aborted, &errdetails.ErrorInfo{Reason: "LEASE_LOST", Domain: "proxy.example"}))
	if errors.Is(err, ErrLeaseLost) {
		t.Fatalf("a foreign LEASE_LOST matched: %v", err)
	}

	// Lost answers, and the caller's own context errors, keep their codes.
	for _, code := range []codes.Code{codes.Unavailable, codes.Canceled, codes.DeadlineExceeded} {
		if !isLostAnswer(DecodeError(status.Error(code, ""))) {
			t.Errorf("%v is not a lost answer", code)
		}
	}
	if isLostAnswer(DecodeError(withDetails(t, codes.Aborted, &errdetails.ErrorInfo{Reason: "LEASE_LOST", Domain: ErrorDomain}))) {
		t.Error("LEASE_LOST is a lost answer")
	}
	if !errors.Is(DecodeError(context.DeadlineExceeded), ErrJournalUnavailable) {
		t.Error("a context deadline is not ErrJournalUnavailable")
	}
	if DecodeError(nil) != nil {
		t.Error("DecodeError(nil) is not nil")
	}
}

type timeoutErr struct{}

func (timeoutErr) Error() string   { return "i/o timeout" }
func (timeoutErr) Timeout() bool   { return true }
func (timeoutErr) Temporary() bool { return true }

func TestDefaultClassifiersNeverCallAnUncertainAnswerAFailure(t *testing.T) {
	cases := []struct {
		err  error
		code string
	}{
		{fmt.Errorf("post: %w", timeoutErr{}), "timeout"},
		{context.DeadlineExceeded, "timeout"},
		{&net.OpError{Op: "read", Err: syscall.ECONNRESET}, "connection_reset"},
		{&net.OpError{Op: "dial", Err: syscall.ECONNREFUSED}, "connection_error"},
		{&HTTPStatusError{StatusCode: 503}, "http_503"},
		{UnknownOutcome("http_502", nil), "http_502"},
		{context.Canceled, "canceled"},
		{errors.New("anything else"), "exception"},
	}
	for _, c := range cases {
		if got := DefaultUnknownCode(c.err); got != c.code {
			t.Errorf("DefaultUnknownCode(%v) = %q, want %q", c.err, got, c.code)
		}
		if _, rejected := DefaultRejection(c.err); rejected {
			t.Errorf("%v was taken for a confirmed rejection", c.err)
		}
	}
	if code, rejected := DefaultRejection(fmt.Errorf("wrapped: %w", Reject("card_declined", nil))); !rejected || code != "card_declined" {
		t.Errorf("a wrapped rejection: %q %v", code, rejected)
	}
}

func TestWaitsStayWithinTheirAllowance(t *testing.T) {
	b := newBackoff(200*time.Millisecond, 2*time.Second)
	start := time.Now()
	if _, ok := b.within(start, 0, 0); ok {
		t.Fatal("no allowance, yet a wait")
	}
	total := time.Duration(0)
	for i := 0; i < 10; i++ {
		pause, ok := b.within(start.Add(-total), 3*time.Second, time.Second)
		if !ok {
			break
		}
		if pause > time.Second {
			t.Fatalf("pause %v is longer than retry_after", pause)
		}
		total += pause
	}
	if total > 3*time.Second+50*time.Millisecond {
		t.Fatalf("waited %v of a 3 s allowance", total)
	}
}
