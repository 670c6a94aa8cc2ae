package opjournal_test

// Runs every scenario of clients/scenarios.yaml (the behaviour every client's Execute must
// show; read its header) through this client's Execute, and checks each step's expect and
// the scenario's final rows and provider counts.
//
// Environment (set by tests/it/client_scenarios.rs): OPJOURNAL_TEST_SERVER (host:port),
// OPJOURNAL_TEST_SANDBOX_URL, OPJOURNAL_TEST_CONTROL_URL, OPJOURNAL_SCENARIO_PREFIX;
// OPJOURNAL_SCENARIOS_FILE names another scenario file. Without OPJOURNAL_TEST_SERVER the
// test is skipped (`go test -v` says so).

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"gopkg.in/yaml.v3"

	opjournal "github.com/opjournal/opjournal/clients/go"
)

type scenarioFile struct {
	Version  int `yaml:"version"`
	Defaults struct {
		ActionType string                 `yaml:"action_type"`
		Payload    map[string]interface{} `yaml:"payload"`
	} `yaml:"defaults"`
	Scenarios []scenario `yaml:"scenarios"`
}

type scenario struct {
	Name  string                `yaml:"name"`
	About string                `yaml:"about"`
	Steps []step                `yaml:"steps"`
	Final map[string]finalState `yaml:"final"`
}

type step struct {
	Execute *struct {
		Key              string                 `yaml:"key"`
		ActionType       string                 `yaml:"action_type"`
		Payload          map[string]interface{} `yaml:"payload"`
		PayloadPatch     map[string]interface{} `yaml:"payload_patch"`
		Provider         string                 `yaml:"provider"`
		InProgressWaitMs int                    `yaml:"in_progress_wait_ms"`
		SettleWaitMs     int                    `yaml:"settle_wait_ms"`
		LeaseSeconds     int32                  `yaml:"lease_seconds"`
	} `yaml:"execute"`
	Expect *struct {
		Outcome                string  `yaml:"outcome"`
		Replayed               *bool   `yaml:"replayed"`
		Reported               *bool   `yaml:"reported"`
		ErrorCode              *string `yaml:"error_code"`
		ExternalIDFromProvider bool    `yaml:"external_id_from_provider"`
		DuplicateOf            *string `yaml:"duplicate_of"`
	} `yaml:"expect"`
	Control *struct {
		Path string                 `yaml:"path"`
		Body map[string]interface{} `yaml:"body"`
	} `yaml:"control"`
}

type finalState struct {
	Row          string  `yaml:"row"`
	Status       *string `yaml:"status"`
	AttemptCount *int32  `yaml:"attempt_count"`
	ErrorCode    *string `yaml:"error_code"`
	Requests     *int64  `yaml:"requests"`
	Effects      *int64  `yaml:"effects"`
}

// errProviderCalled: the provider function ran in a step whose provider is `none`.
var errProviderCalled = errors.New("the provider must not be called in this step")

type scenarioEnv struct {
	spec       scenarioFile
	prefix     string
	sandboxURL string
	controlURL string
	client     *opjournal.Client
	http       *http.Client
}

func requireEnv(t *testing.T, name string) string {
	t.Helper()
	value := os.Getenv(name)
	if value == "" {
		t.Fatalf("%s is not set: run the scenarios through tests/it/client_scenarios.rs", name)
	}
	return value
}

func TestScenarios(t *testing.T) {
	server := os.Getenv("OPJOURNAL_TEST_SERVER")
	if server == "" {
		t.Skip("OPJOURNAL_TEST_SERVER is not set: run the scenarios through tests/it/client_scenarios.rs")
	}
	file := os.Getenv("OPJOURNAL_SCENARIOS_FILE")
	if file == "" {
		file = "../scenarios.yaml"
	}
	text, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	env := &scenarioEnv{
		prefix:     requireEnv(t, "OPJOURNAL_SCENARIO_PREFIX"),
		sandboxURL: strings.TrimSuffix(requireEnv(t, "OPJOURNAL_TEST_SANDBOX_URL"), "/"),
		controlURL: strings.TrimSuffix(requireEnv(t, "OPJOURNAL_TEST_CONTROL_URL"), "/"),
		http:       &http.Client{Timeout: 10 * time.Second},
	}
	if err := yaml.Unmarshal(text, &env.spec); err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	if env.spec.Version != 1 {
		t.Fatalf("this runner reads version 1 of the scenario file, not %d", env.spec.Version)
	}
	// Reconnect quickly once the journal is back (the report-while-the-journal-restarts
	// scenario); grpc-go's default first reconnect waits a second and then backs off.
	params := grpc.ConnectParams{Backoff: backoff.DefaultConfig, MinConnectTimeout: time.Second}
	params.Backoff.MaxDelay = 500 * time.Millisecond
	env.client, err = opjournal.Dial(server, opjournal.Options{}, grpc.WithInsecure(), grpc.WithConnectParams(params))
	if err != nil {
		t.Fatal(err)
	}
	defer env.client.Close()

	if len(env.spec.Scenarios) == 0 {
		t.Fatal("the scenario file has no scenarios")
	}
	for _, sc := range env.spec.Scenarios {
		sc := sc
		t.Run(sc.Name, func(t *testing.T) {
			run := &scenarioRun{env: env, sc: sc, paidIDs: map[string]string{}}
			run.payload = copyMap(env.spec.Defaults.Payload)
			run.payload["run"] = env.prefix + ":" + sc.Name
			for i, st := range sc.Steps {
				if st.Control != nil {
					run.control(t, st.Control.Path, st.Control.Body)
				}
				if st.Execute != nil {
					if st.Expect == nil {
						t.Fatalf("step %d of %s has no expect", i+1, sc.Name)
					}
					run.execute(t, st)
				}
			}
			run.checkFinal(t)
		})
	}
}

type scenarioRun struct {
	env     *scenarioEnv
	sc      scenario
	payload map[string]interface{}
	paidIDs map[string]string
}

func (r *scenarioRun) key(stepKey string) string {
	if stepKey == "" {
		stepKey = "main"
	}
	return r.env.prefix + ":" + r.sc.Name + ":" + stepKey
}

func copyMap(m map[string]interface{}) map[string]interface{} {
	out := make(map[string]interface{}, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

func (e *scenarioEnv) post(ctx context.Context, path string, body interface{}) error {
	data, err := json.Marshal(body)
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, e.controlURL+"/"+path, bytes.NewReader(data))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := e.http.Do(req)
	if err != nil {
		return err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("control %s answered %d", path, resp.StatusCode)
	}
	return nil
}

func (r *scenarioRun) control(t *testing.T, path string, body map[string]interface{}) {
	t.Helper()
	out := map[string]interface{}{"action_type": r.env.spec.Defaults.ActionType, "payload": r.payload}
	for k, v := range body {
		if k == "key" {
			out["operation_key"] = r.key(fmt.Sprint(v))
		} else {
			out[k] = v
		}
	}
	if err := r.env.post(context.Background(), path, out); err != nil {
		t.Fatal(err)
	}
}

// provider is the provider function for a behaviour of the file's header.
func (r *scenarioRun) provider(behaviour, stepKey, actionType string, payload map[string]interface{}) opjournal.ProviderFunc {
	return func(ctx context.Context, call opjournal.ProviderCall) (opjournal.ProviderResult, error) {
		switch behaviour {
		case "none":
			return opjournal.ProviderResult{}, errProviderCalled
		case "raise":
			return opjournal.ProviderResult{}, errors.New("an error the classifier does not know")
		}
		body, err := json.Marshal(payload)
		if err != nil {
			return opjournal.ProviderResult{}, err
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, r.env.sandboxURL+"/v1/payments", bytes.NewReader(body))
		if err != nil {
			return opjournal.ProviderResult{}, err
		}
		req.Header.Set("Idempotency-Key", call.ProviderKey)
		req.Header.Set("Content-Type", "application/json")
		switch behaviour {
		case "commit-then-timeout", "fail-before-store", "reject":
			req.Header.Set("X-Sandbox-Fault", behaviour)
		}
		resp, err := (&http.Client{Timeout: time.Second}).Do(req)
		if err != nil {
			return opjournal.ProviderResult{}, err
		}
		defer resp.Body.Close()
		answer, err := io.ReadAll(resp.Body)
		if err != nil {
			return opjournal.ProviderResult{}, err
		}
		if resp.StatusCode == http.StatusPaymentRequired {
			return opjournal.ProviderResult{}, opjournal.Reject("card_declined", nil)
		}
		if resp.StatusCode < 200 || resp.StatusCode > 299 {
			return opjournal.ProviderResult{}, &opjournal.HTTPStatusError{StatusCode: resp.StatusCode}
		}
		var payment struct {
			ID string `json:"id"`
		}
		if err := json.Unmarshal(answer, &payment); err != nil {
			return opjournal.ProviderResult{}, err
		}
		r.paidIDs[stepKey] = payment.ID
		switch behaviour {
		case "ok":
		case "restart_journal":
			if err := r.env.post(context.Background(), "journal/restart", map[string]interface{}{"down_ms": 1500}); err != nil {
				return opjournal.ProviderResult{}, fmt.Errorf("runner: %w", err)
			}
		case "takeover":
			takeover := map[string]interface{}{"operation_key": r.key(stepKey), "action_type": actionType, "payload": payload}
			if err := r.env.post(context.Background(), "lease/takeover", takeover); err != nil {
				return opjournal.ProviderResult{}, fmt.Errorf("runner: %w", err)
			}
		default:
			return opjournal.ProviderResult{}, fmt.Errorf("runner: unknown provider behaviour %q", behaviour)
		}
		return opjournal.ProviderResult{ExternalID: payment.ID, Result: json.RawMessage(answer)}, nil
	}
}

func (r *scenarioRun) execute(t *testing.T, st step) {
	t.Helper()
	ex, want := st.Execute, st.Expect
	stepKey := ex.Key
	if stepKey == "" {
		stepKey = "main"
	}
	actionType := ex.ActionType
	if actionType == "" {
		actionType = r.env.spec.Defaults.ActionType
	}
	payload := copyMap(r.payload)
	if ex.Payload != nil {
		payload = copyMap(ex.Payload)
		payload["run"] = r.payload["run"]
	}
	for k, v := range ex.PayloadPatch {
		payload[k] = v
	}
	intent := opjournal.Intent{Key: r.key(stepKey), ActionType: actionType, Payload: payload, LeaseSeconds: ex.LeaseSeconds}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	out, err := opjournal.Execute(ctx, r.env.client, intent, r.provider(ex.Provider, stepKey, actionType, payload),
		opjournal.WithInProgressWait(time.Duration(ex.InProgressWaitMs)*time.Millisecond),
		opjournal.WithSettleWait(time.Duration(ex.SettleWaitMs)*time.Millisecond))
	if errors.Is(out.Cause, errProviderCalled) {
		t.Fatalf("step %s: %v", stepKey, errProviderCalled)
	}
	kind := string(out.Kind)
	switch {
	case err == nil:
	case errors.Is(err, opjournal.ErrIdempotencyKeyReused):
		kind = "conflict"
	case errors.Is(err, opjournal.ErrLeaseLost):
		kind = "lease_lost"
	case errors.Is(err, opjournal.ErrLeaseExpiredBeforeCall):
		kind = "lease_expired"
	default:
		t.Fatalf("step %s: execute failed: %v", stepKey, err)
	}
	if kind != want.Outcome {
		t.Fatalf("step %s: outcome %q, want %q (error code %q)", stepKey, kind, want.Outcome, out.ErrorCode)
	}
	if err != nil {
		return
	}
	if want.Replayed != nil {
		if out.Kind != opjournal.Succeeded && out.Kind != opjournal.FailedFinal {
			t.Fatalf("step %s: replayed is expected of %s", stepKey, out.Kind)
		}
		if out.Replayed != *want.Replayed {
			t.Errorf("step %s: replayed %v, want %v", stepKey, out.Replayed, *want.Replayed)
		}
	}
	if want.Reported != nil && out.Reported != *want.Reported {
		t.Errorf("step %s: reported %v, want %v", stepKey, out.Reported, *want.Reported)
	}
	if want.ErrorCode != nil && out.ErrorCode != *want.ErrorCode {
		t.Errorf("step %s: error code %q, want %q", stepKey, out.ErrorCode, *want.ErrorCode)
	}
	if want.ExternalIDFromProvider {
		paid := r.paidIDs[stepKey]
		if paid == "" {
			t.Fatalf("step %s: the provider returned no payment id in an earlier step", stepKey)
		}
		if out.ExternalID != paid {
			t.Errorf("step %s: external id %q, want the provider's %q", stepKey, out.ExternalID, paid)
		}
	}
	if want.DuplicateOf != nil && out.DuplicateOf != r.key(*want.DuplicateOf) {
		t.Errorf("step %s: duplicate of %q, want %q", stepKey, out.DuplicateOf, r.key(*want.DuplicateOf))
	}
}

func (r *scenarioRun) checkFinal(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	for stepKey, want := range r.sc.Final {
		key := r.key(stepKey)
		row, err := r.env.client.Get(ctx, "", key)
		if want.Row == "none" {
			if !errors.Is(err, opjournal.ErrOperationNotFound) {
				t.Errorf("%s: no row may exist, got %v (error %v)", stepKey, row.GetStatus(), err)
			}
		} else {
			if err != nil {
				t.Fatalf("%s: GetOperation: %v", stepKey, err)
			}
			status := strings.ToLower(strings.TrimPrefix(row.GetStatus().String(), "OPERATION_STATUS_"))
			if want.Status != nil && status != *want.Status {
				t.Errorf("%s: status %s, want %s", stepKey, status, *want.Status)
			}
			if want.AttemptCount != nil && row.GetAttemptCount() != *want.AttemptCount {
				t.Errorf("%s: attempt_count %d, want %d", stepKey, row.GetAttemptCount(), *want.AttemptCount)
			}
			if want.ErrorCode != nil && row.GetErrorCode() != *want.ErrorCode {
				t.Errorf("%s: error_code %q, want %q", stepKey, row.GetErrorCode(), *want.ErrorCode)
			}
		}
		counts := r.env.effects(t, key)
		if want.Requests != nil && counts.Requests != *want.Requests {
			t.Errorf("%s: provider requests %d, want %d", stepKey, counts.Requests, *want.Requests)
		}
		if want.Effects != nil && counts.Effects != *want.Effects {
			t.Errorf("%s: provider effects %d, want %d", stepKey, counts.Effects, *want.Effects)
		}
	}
}

type effectCounts struct {
	Requests int64 `json:"requests"`
	Effects  int64 `json:"effects"`
	Lookups  int64 `json:"lookups"`
}

// effects reads the sandbox's counts for one provider key (GET /v1/effects/{key}).
func (e *scenarioEnv) effects(t *testing.T, key string) effectCounts {
	t.Helper()
	resp, err := e.http.Get(e.sandboxURL + "/v1/effects/" + url.PathEscape(key))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var counts effectCounts
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /v1/effects answered %d", resp.StatusCode)
	}
	if err := json.NewDecoder(resp.Body).Decode(&counts); err != nil {
		t.Fatal(err)
	}
	return counts
}
