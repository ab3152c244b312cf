package queue

import (
	"context"
	"encoding/json"
	"errors"
	"sync"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/require"
	commonpb "go.temporal.io/api/common/v1"
	enumspb "go.temporal.io/api/enums/v1"
	historypb "go.temporal.io/api/history/v1"
	"go.temporal.io/api/serviceerror"
	workflowpb "go.temporal.io/api/workflow/v1"
	"go.temporal.io/api/workflowservice/v1"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/converter"

	"github.com/reveille/reveille/internal/testkit"
)

// closedWorkflowTemporal stands in for Temporal answering a re-sent signal
// after the workflow it woke has closed. That takes a send Temporal accepted
// whose "delivered" record was then lost (Postgres going away in between):
// a fault the queue's tests cannot cause in-process, so Temporal is faked
// here. internal/e2e covers the same path against a real Temporal server.
type closedWorkflowTemporal struct {
	signalErr   error // what SignalWorkflow answers
	describeErr error
	status      enumspb.WorkflowExecutionStatus
	runID       string                    // of the described run
	events      []*historypb.HistoryEvent // the run's history

	mu          sync.Mutex
	historyRead []string // the run ids whose history was read
}

func (f *closedWorkflowTemporal) SignalWorkflow(context.Context, string, string, string, any) error {
	return f.signalErr
}

func (f *closedWorkflowTemporal) DescribeWorkflowExecution(_ context.Context, workflowID, _ string) (*workflowservice.DescribeWorkflowExecutionResponse, error) {
	if f.describeErr != nil {
		return nil, f.describeErr
	}
	return &workflowservice.DescribeWorkflowExecutionResponse{WorkflowExecutionInfo: &workflowpb.WorkflowExecutionInfo{
		Execution: &commonpb.WorkflowExecution{WorkflowId: workflowID, RunId: f.runID}, Status: f.status,
	}}, nil
}

func (f *closedWorkflowTemporal) GetWorkflowHistory(_ context.Context, _, runID string, _ bool, _ enumspb.HistoryEventFilterType) client.HistoryEventIterator {
	f.mu.Lock()
	f.historyRead = append(f.historyRead, runID)
	f.mu.Unlock()
	return &closedHistory{events: f.events}
}

type closedHistory struct{ events []*historypb.HistoryEvent }

func (h *closedHistory) HasNext() bool { return len(h.events) > 0 }

func (h *closedHistory) Next() (*historypb.HistoryEvent, error) {
	e := h.events[0]
	h.events = h.events[1:]
	return e, nil
}

// signaled is a history's record of a signal, its argument encoded as the
// SDK encodes the dispatcher's json.RawMessage.
func signaled(t *testing.T, name, payload string) *historypb.HistoryEvent {
	t.Helper()
	input, err := converter.GetDefaultDataConverter().ToPayloads(json.RawMessage(payload))
	require.NoError(t, err)
	return &historypb.HistoryEvent{EventType: enumspb.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED,
		Attributes: &historypb.HistoryEvent_WorkflowExecutionSignaledEventAttributes{
			WorkflowExecutionSignaledEventAttributes: &historypb.WorkflowExecutionSignaledEventAttributes{SignalName: name, Input: input},
		}}
}

func historyEvent(kind enumspb.EventType) *historypb.HistoryEvent {
	return &historypb.HistoryEvent{EventType: kind}
}

func TestASignalThatMeetsAClosedWorkflowIsSettledByWhatItsHistoryShows(t *testing.T) {
	const payload = `{"wakeup_id": "w-1", "outcome": "succeeded", "n": 12345678901234567890}`
	completed := serviceerror.NewNotFound("workflow execution already completed")
	tests := []struct {
		name        string
		temporal    *closedWorkflowTemporal
		wantStatus  string
		wantError   string // in last_error
		wantGrace   bool   // not_found_since set: retried within the NotFound grace
		wantMetric  string // the sends counter's result
		wantHistory bool   // the described run's history was read
	}{
		{
			name: "a completed workflow that got this very signal settles it delivered",
			temporal: &closedWorkflowTemporal{signalErr: completed, status: enumspb.WORKFLOW_EXECUTION_STATUS_COMPLETED, runID: "run-1",
				events: []*historypb.HistoryEvent{
					historyEvent(enumspb.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED),
					signaled(t, "wake", `{"wakeup_id":"w-0","outcome":"succeeded","n":12345678901234567890}`),
					signaled(t, "approval", payload),
					// Key order and spacing differ from the stored payload.
					signaled(t, "wake", `{"outcome":"succeeded","n":12345678901234567890,"wakeup_id":"w-1"}`),
					historyEvent(enumspb.EVENT_TYPE_WORKFLOW_EXECUTION_COMPLETED),
				}},
			wantStatus: StatusDelivered, wantMetric: "recovered", wantHistory: true,
		},
		{
			name: "a completed workflow without it makes it undeliverable at once",
			temporal: &closedWorkflowTemporal{signalErr: completed, status: enumspb.WORKFLOW_EXECUTION_STATUS_COMPLETED, runID: "run-1",
				events: []*historypb.HistoryEvent{
					historyEvent(enumspb.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED),
					signaled(t, "wake", `{"wakeup_id":"w-0","outcome":"succeeded","n":12345678901234567890}`),
					signaled(t, "wake", `{"wakeup_id":"w-1","outcome":"succeeded","n":12345678901234567891}`),
					signaled(t, "approval", payload),
					historyEvent(enumspb.EVENT_TYPE_WORKFLOW_EXECUTION_COMPLETED),
				}},
			wantStatus: StatusFailed, wantError: "workflow closed without this signal", wantMetric: "failed", wantHistory: true,
		},
		{
			name: "a timed-out workflow without it makes it undeliverable at once",
			temporal: &closedWorkflowTemporal{signalErr: completed, status: enumspb.WORKFLOW_EXECUTION_STATUS_TIMED_OUT, runID: "run-1",
				events: []*historypb.HistoryEvent{historyEvent(enumspb.EVENT_TYPE_WORKFLOW_EXECUTION_TIMED_OUT)}},
			wantStatus: StatusFailed, wantError: "workflow closed without this signal", wantMetric: "failed", wantHistory: true,
		},
		{
			name: "a workflow not started yet keeps its grace",
			temporal: &closedWorkflowTemporal{signalErr: serviceerror.NewNotFound("workflow not found for ID: o/wf"),
				describeErr: serviceerror.NewNotFound("workflow not found for ID: o/wf")},
			wantStatus: StatusPending, wantError: "workflow not found (yet)", wantGrace: true, wantMetric: "retry",
		},
		{
			name:       "a workflow that cannot be looked into keeps its grace",
			temporal:   &closedWorkflowTemporal{signalErr: completed, describeErr: serviceerror.NewUnavailable("connection refused")},
			wantStatus: StatusPending, wantError: "workflow not found (yet)", wantGrace: true, wantMetric: "retry",
		},
		{
			name:       "a workflow running again under its id is sent again",
			temporal:   &closedWorkflowTemporal{signalErr: completed, status: enumspb.WORKFLOW_EXECUTION_STATUS_RUNNING, runID: "run-2"},
			wantStatus: StatusPending, wantError: "already completed", wantMetric: "retry",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			db := testkit.NewPool(t)
			ctx := context.Background()
			m, _, err := Enqueue(ctx, db, EnqueueParams{OrgID: "o", Queue: "wakeup", IdempotencyKey: "w-1",
				Payload: json.RawMessage(payload), Signal: &Signal{WorkflowID: "o/wf", Name: "wake"}})
			require.NoError(t, err)
			d := NewDispatcher(db, tt.temporal, DispatcherConfig{NotFoundGrace: time.Hour, Logger: testkit.Logger(t)})

			n, err := d.DispatchOnce(ctx)
			require.NoError(t, err)
			require.Equal(t, 1, n)

			var status, lastError string
			var notFoundSince *time.Time
			require.NoError(t, db.QueryRow(ctx, `SELECT status, coalesce(last_error, ''), not_found_since FROM queue_messages WHERE org_id = 'o' AND id = $1`,
				m.ID).Scan(&status, &lastError, &notFoundSince))
			require.Equal(t, tt.wantStatus, status)
			if tt.wantError == "" {
				require.Empty(t, lastError)
			} else {
				require.Contains(t, lastError, tt.wantError)
			}
			require.Equal(t, tt.wantGrace, notFoundSince != nil, "not_found_since: %v", notFoundSince)
			require.Equal(t, 1.0, counterValue(t, d, tt.wantMetric), "sends counted as %s", tt.wantMetric)
			if tt.wantHistory {
				require.Equal(t, []string{tt.temporal.runID}, tt.temporal.historyRead, "the described run's history is read")
			} else {
				require.Empty(t, tt.temporal.historyRead)
			}
		})
	}
}

// counterValue is the sends counter's value for result.
func counterValue(t *testing.T, d *Dispatcher, result string) float64 {
	t.Helper()
	var m dto.Metric
	require.NoError(t, d.metrics.results.WithLabelValues(result).Write(&m))
	return m.GetCounter().GetValue()
}

// A Signaler that cannot read histories (only the wrapped sends of a
// test or benchmark) leaves a closed workflow's NotFound to the grace; a
// HistoryReader in the configuration is used all the same.
func TestTheHistoryReaderComesFromTheConfigurationOrTheSignaler(t *testing.T) {
	temporal := &closedWorkflowTemporal{status: enumspb.WORKFLOW_EXECUTION_STATUS_COMPLETED}
	sendsOnly := signalerOnly{temporal}
	tests := []struct {
		name    string
		signals Signaler
		history HistoryReader
		want    HistoryReader
	}{
		{"a Signaler that reads histories", temporal, nil, temporal},
		{"a Signaler that only sends", sendsOnly, nil, nil},
		{"a configured reader beside a Signaler that only sends", sendsOnly, temporal, temporal},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := NewDispatcher(nil, tt.signals, DispatcherConfig{History: tt.history})
			require.Equal(t, tt.want, d.history)
		})
	}
}

type signalerOnly struct{ s Signaler }

func (s signalerOnly) SignalWorkflow(ctx context.Context, workflowID, runID, name string, arg any) error {
	return s.s.SignalWorkflow(ctx, workflowID, runID, name, arg)
}

// The JSON comparison is of values: a payload that differs only in a
// number's last digit is another payload.
func TestReceivedSignalComparesPayloadsAsJSONValues(t *testing.T) {
	tests := []struct {
		name    string
		sent    string
		stored  string
		matches bool
	}{
		{"same document", `{"a":1,"b":[1,2]}`, `{"a":1,"b":[1,2]}`, true},
		{"other key order and spacing", `{"b":[1,2],"a":1}`, "{\n \"a\": 1, \"b\": [1, 2]\n}", true},
		{"a big number's last digit", `{"n":12345678901234567890}`, `{"n":12345678901234567891}`, false},
		{"another array order", `{"b":[2,1]}`, `{"b":[1,2]}`, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := &closedWorkflowTemporal{events: []*historypb.HistoryEvent{signaled(t, "wake", tt.sent)}}
			got, err := receivedSignal(context.Background(), h, "o/wf", "run", "wake", json.RawMessage(tt.stored))
			require.NoError(t, err)
			require.Equal(t, tt.matches, got)
		})
	}
}

// errHistory is a history that fails midway.
type errHistory struct{}

func (errHistory) HasNext() bool { return true }
func (errHistory) Next() (*historypb.HistoryEvent, error) {
	return nil, errors.New("history: unavailable")
}

type failingHistory struct{ *closedWorkflowTemporal }

func (*failingHistory) GetWorkflowHistory(context.Context, string, string, bool, enumspb.HistoryEventFilterType) client.HistoryEventIterator {
	return errHistory{}
}

func TestAHistoryThatFailsMidwayIsAnErrorNotAVerdict(t *testing.T) {
	_, err := receivedSignal(context.Background(), &failingHistory{}, "o/wf", "run", "wake", json.RawMessage(`{}`))
	require.ErrorContains(t, err, "history: unavailable")
}
