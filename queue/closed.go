package queue

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"

	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/api/serviceerror"
	"go.temporal.io/api/workflowservice/v1"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/converter"
)

// HistoryReader reads a workflow's state and history;
// go.temporal.io/sdk/client.Client satisfies it. The dispatcher needs it
// only when a signal meets a closed workflow.
type HistoryReader interface {
	DescribeWorkflowExecution(ctx context.Context, workflowID, runID string) (*workflowservice.DescribeWorkflowExecutionResponse, error)
	GetWorkflowHistory(ctx context.Context, workflowID, runID string, isLongPoll bool, filterType enumspb.HistoryEventFilterType) client.HistoryEventIterator
}

// closedVerdict is what the dispatcher learnt about a workflow that
// answered a signal with NotFound.
type closedVerdict int

const (
	notChecked          closedVerdict = iota // no history reader, or the check failed: NotFound as it came
	notStarted                               // no such workflow (yet): the NotFound grace applies
	running                                  // a run is open again (a new run under the id): send again
	closedWithSignal                         // closed, and its history holds this very signal
	closedWithoutSignal                      // closed without it: a closed run never takes a signal
)

// checkClosed finds out, for a signal that met NotFound, whether the
// workflow exists and, if it has closed, whether it got this message's
// signal. That happens when a send reached Temporal but its "delivered"
// record was lost (Postgres went away before it committed): the re-send
// finds the workflow woken by the first one and completed.
func (d *Dispatcher) checkClosed(ctx context.Context, m claimed) (closedVerdict, error) {
	desc, err := d.history.DescribeWorkflowExecution(ctx, m.Signal.WorkflowID, m.Signal.RunID)
	var notFound *serviceerror.NotFound
	if errors.As(err, &notFound) {
		return notStarted, nil
	}
	if err != nil {
		return notChecked, fmt.Errorf("describe workflow: %w", err)
	}
	info := desc.GetWorkflowExecutionInfo()
	if info.GetStatus() == enumspb.WORKFLOW_EXECUTION_STATUS_RUNNING {
		return running, nil
	}
	// The described run: with no run id in the message, the signal went to
	// the run current at the time — the latest, the one described, or an
	// earlier run of its chain (continued as new, retried, cron) whose
	// next run carried what it received: those are read back to the
	// chain's first run.
	runID := info.GetExecution().GetRunId()
	for hops := 0; runID != "" && hops < maxChainRuns; hops++ {
		got, prev, err := receivedSignalOfRun(ctx, d.history, m.Signal.WorkflowID, runID, m.Signal.Name, m.Payload)
		if err != nil {
			return notChecked, err
		}
		if got {
			return closedWithSignal, nil
		}
		if m.Signal.RunID != "" {
			break // signalled to that run alone
		}
		runID = prev
	}
	return closedWithoutSignal, nil
}

// maxChainRuns bounds the runs of a chain whose histories one check reads.
const maxChainRuns = 20

// receivedSignal reports whether the run's history holds a signal named
// name whose argument is payload. A closed run's history is finite; the
// history API filters only close events, so the signals are picked out
// here.
func receivedSignal(ctx context.Context, h HistoryReader, workflowID, runID, name string, payload json.RawMessage) (bool, error) {
	got, _, err := receivedSignalOfRun(ctx, h, workflowID, runID, name, payload)
	return got, err
}

// receivedSignalOfRun is receivedSignal, also returning the run this one
// continued (its started event's continued_execution_run_id; "" for a
// chain's first run).
func receivedSignalOfRun(ctx context.Context, h HistoryReader, workflowID, runID, name string, payload json.RawMessage) (got bool, prevRunID string, err error) {
	want, err := jsonValue(payload)
	if err != nil {
		return false, "", fmt.Errorf("message payload: %w", err)
	}
	events := h.GetWorkflowHistory(ctx, workflowID, runID, false, enumspb.HISTORY_EVENT_FILTER_TYPE_ALL_EVENT)
	for events.HasNext() {
		e, err := events.Next()
		if err != nil {
			return false, "", fmt.Errorf("read workflow history: %w", err)
		}
		if started := e.GetWorkflowExecutionStartedEventAttributes(); started != nil {
			prevRunID = started.GetContinuedExecutionRunId()
		}
		attrs := e.GetWorkflowExecutionSignaledEventAttributes()
		if e.GetEventType() != enumspb.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED || attrs.GetSignalName() != name {
			continue
		}
		// The dispatcher sends the payload as a json.RawMessage, which the
		// SDK's default converter encodes as its JSON (compacted).
		var raw json.RawMessage
		if err := converter.GetDefaultDataConverter().FromPayloads(attrs.GetInput(), &raw); err != nil || len(raw) == 0 {
			continue // not one of ours
		}
		got, err := jsonValue(raw)
		if err == nil && reflect.DeepEqual(got, want) {
			return true, prevRunID, nil
		}
	}
	return false, prevRunID, nil
}

// jsonValue decodes a JSON document for comparison as a value: key order
// and spacing do not matter; numbers are kept exact.
func jsonValue(doc json.RawMessage) (any, error) {
	if len(doc) == 0 {
		doc = json.RawMessage(`{}`) // as Enqueue stores an empty payload
	}
	dec := json.NewDecoder(bytes.NewReader(doc))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, err
	}
	return v, nil
}
