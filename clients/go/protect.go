package opjournal

import (
	"context"
	"errors"
)

// Protected turns a provider function of typed arguments A into one that runs through
// Execute: at most one effect per intent, however often it is called.
//
// The key always comes from the orchestrator's code — a function of the arguments, a run
// or intent id taken from the context, or Client.DeriveKey (see DerivedKey) — never from a
// model's output. The payload hashed for the key is the arguments, or the subset that
// Payload declares.
//
//	pay := opjournal.Protected[Order]{
//		Client: c, ActionType: "create_payment",
//		Key:  func(_ context.Context, o Order) (string, error) { return "order-" + o.ID + "/payment", nil },
//		Call: func(ctx context.Context, call opjournal.ProviderCall, o Order) (opjournal.ProviderResult, error) { ... },
//	}
//	outcome, err := pay.Run(ctx, order)
type Protected[A any] struct {
	// Client is the journal client.
	Client *Client
	// ActionType is the action as named in the server's policy.
	ActionType string
	// Namespace is the tenant namespace; empty means "default".
	Namespace string
	// Key gives the idempotency key of one call's intent.
	Key func(ctx context.Context, args A) (string, error)
	// Payload gives the request parameters that name the intent (a value encoding as a
	// JSON object); nil means the arguments themselves.
	Payload func(args A) interface{}
	// References gives business links kept with the record (not hashed); may be nil.
	References func(args A) map[string]string
	// LeaseSeconds is the lease to ask for; 0 means the action's default.
	LeaseSeconds int32
	// Options are passed to Execute (waits, classifiers).
	Options []ExecuteOption
	// Call calls the provider once, sending call.ProviderKey as its idempotency key (see
	// ProviderFunc).
	Call func(ctx context.Context, call ProviderCall, args A) (ProviderResult, error)
}

// errIncomplete: a Protected without its client, action, key or call.
var errIncomplete = errors.New("opjournal: Protected needs Client, ActionType, Key and Call")

// Run executes the protected function for args: the Outcome of Execute, or its errors (and
// Key's error, unchanged).
func (p Protected[A]) Run(ctx context.Context, args A) (Outcome, error) {
	if p.Client == nil || p.ActionType == "" || p.Key == nil || p.Call == nil {
		return Outcome{}, errIncomplete
	}
	key, err := p.Key(ctx, args)
	if err != nil {
		return Outcome{}, err
	}
	var payload interface{} = args
	if p.Payload != nil {
		payload = p.Payload(args)
	}
	var references map[string]string
	if p.References != nil {
		references = p.References(args)
	}
	intent := Intent{
		Namespace: p.Namespace, Key: key, ActionType: p.ActionType, Payload: payload,
		LeaseSeconds: p.LeaseSeconds, References: references,
	}
	return Execute(ctx, p.Client, intent, func(ctx context.Context, call ProviderCall) (ProviderResult, error) {
		return p.Call(ctx, call, args)
	}, p.Options...)
}

// DerivedKey is a Protected.Key that asks the server (DeriveOperationKey) for an opaque key
// of the intent reference that ref gives, which may hold personal data: it is never stored
// or logged. Errors: ErrKeyDerivationDisabled, ErrInvalidArgument.
func DerivedKey[A any](c *Client, namespace, actionType string, ref func(ctx context.Context, args A) string) func(context.Context, A) (string, error) {
	return func(ctx context.Context, args A) (string, error) {
		return c.DeriveKey(ctx, namespace, actionType, ref(ctx, args))
	}
}
