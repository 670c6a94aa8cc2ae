package opjournal

import (
	"context"
	"encoding/json"
	"errors"
	"io/ioutil"
	"net"
	"sync/atomic"
	"testing"

	"github.com/golang/protobuf/ptypes/duration"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/opjournal/opjournal/clients/go/gen/opjournal/v1"
)

// A call whose deadline passes in the server's transport is answered with a bare
// CANCELLED (no ErrorInfo): safe to repeat, like UNAVAILABLE.
func TestABareCancelledFromAPassedDeadlineIsSafeToRepeat(t *testing.T) {
	err := DecodeError(status.Error(codes.Canceled, "Timeout expired"))
	if !errors.Is(err, ErrJournalUnavailable) || !isLostAnswer(err) {
		t.Fatalf("CANCELLED is not classified as safe to repeat: %v", err)
	}
}

func TestAShedCallIsOverloadedWithItsRetryDelay(t *testing.T) {
	err := DecodeError(withDetails(t, codes.ResourceExhausted,
		&errdetails.ErrorInfo{Reason: "SERVER_OVERLOADED", Domain: ErrorDomain},
		&errdetails.RetryInfo{RetryDelay: &duration.Duration{Seconds: 1}},
	))
	var e *Error
	if !errors.As(err, &e) || !errors.Is(err, ErrServerOverloaded) || !errors.Is(err, ErrJournalUnavailable) {
		t.Fatalf("not ErrServerOverloaded: %v", err)
	}
	if e.RetryDelay.Seconds() != 1 || !isLostAnswer(err) {
		t.Fatalf("retry delay %v, lost answer %v", e.RetryDelay, isLostAnswer(err))
	}
}

func TestTheShippedServiceConfigIsTheContracts(t *testing.T) {
	text, err := ioutil.ReadFile("../../proto/opjournal/v1/service_config.json")
	if err != nil {
		t.Fatal(err)
	}
	var shipped, embedded interface{}
	if err := json.Unmarshal(text, &shipped); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal([]byte(ServiceConfig), &embedded); err != nil {
		t.Fatal(err)
	}
	a, _ := json.Marshal(shipped)
	b, _ := json.Marshal(embedded)
	if string(a) != string(b) {
		t.Fatalf("clients/go/service_config.json differs from proto/opjournal/v1/service_config.json")
	}
}

// refusesOnce answers GetOperation UNAVAILABLE on the first attempt, NOT_FOUND afterwards.
type refusesOnce struct {
	pb.UnimplementedOperationJournalServer
	attempts int32
}

func (s *refusesOnce) GetOperation(context.Context, *pb.GetOperationRequest) (*pb.GetOperationResponse, error) {
	if atomic.AddInt32(&s.attempts, 1) == 1 {
		return nil, status.Error(codes.Unavailable, "not yet")
	}
	return nil, status.Error(codes.NotFound, "no such operation")
}

func TestDialRepeatsACallRefusedWithUnavailableByDefault(t *testing.T) {
	listener, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	server := grpc.NewServer()
	refusing := &refusesOnce{}
	pb.RegisterOperationJournalServer(server, refusing)
	go func() { _ = server.Serve(listener) }()
	defer server.Stop()

	client, err := Dial(listener.Addr().String(), Options{}, grpc.WithInsecure())
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	_, err = client.Get(context.Background(), "", "payment:order-817:intent-01")
	if status.Code(err) != codes.NotFound {
		t.Fatalf("want NOT_FOUND after one repeat, got %v", err)
	}
	if got := atomic.LoadInt32(&refusing.attempts); got != 2 {
		t.Fatalf("attempts: %d, want 2 (is GRPC_GO_RETRY=on for grpc-go before 1.40?)", got)
	}
}
