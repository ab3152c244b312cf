package client_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"net/http"
	"time"

	"github.com/reveille/reveille/client"
)

// The README's example: spend from an agent's mandate, and tell a refusal
// (a typed *client.Error, 402, naming the approval request) from other
// errors.
func Example() {
	if err := spend(context.Background(), "<JWT>"); err != nil {
		log.Fatal(err)
	}
}

// spend is the README's example, word for word between its first and last
// lines (TestTheREADMEsExampleIsCompiledHere).
func spend(ctx context.Context, token string) error {
	c, err := client.New("http://localhost:8080", client.WithToken(token))
	if err != nil {
		return err
	}
	res, err := c.Mandates.Spend(ctx, client.SpendRequest{AgentID: "agent-1", Scope: "llm", Cost: 5})
	var apiErr *client.Error
	if errors.As(err, &apiErr) && apiErr.Status == http.StatusPaymentRequired { // or client.IsSpendRefused(err)
		return fmt.Errorf("over budget: approval %s requested", apiErr.ApprovalID)
	} else if err != nil {
		return err
	}
	log.Printf("spent 5; %d left", res.Remaining)
	return nil
}

// A longer round trip: ask for a wake-up, tell a refusal from other
// errors, page through the pending ones, follow a stream live for a
// minute at most (a tail of a stream never closed ends with its context).
func Example_wakeAndFollow() {
	ctx, token, args := context.Background(), "<JWT>", map[string]string{"url": "https://example.com"}
	if err := wakeAndFollow(ctx, token, args); err != nil {
		log.Fatal(err)
	}
}

func wakeAndFollow(ctx context.Context, token string, args any) error {
	c, err := client.New("http://localhost:8080", client.WithToken(token))
	if err != nil {
		return err
	}
	w, err := c.Wakeups.Create(ctx, client.WakeupRequest{AgentID: "agent-1", WorkflowID: "dev-org/wf-1",
		Signal: "wake", Scope: "llm", Cost: 5, Work: client.WakeupWork{Handler: "http", Args: args}})
	switch {
	case client.IsSpendRefused(err):
		var apiErr *client.Error
		errors.As(err, &apiErr)
		log.Printf("refused: approval %s", apiErr.ApprovalID)
	case err != nil:
		return err
	default:
		log.Printf("wake-up %s", w.ID)
	}
	for w, err := range c.Wakeups.List(ctx, client.WakeupListParams{Status: "pending"}) { // every page
		if err != nil {
			return err
		}
		log.Printf("pending: %s", w.ID)
	}
	tailCtx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	for ch, err := range c.Streams.Tail(tailCtx, "run-1", "out", client.TailParams{}) { // live, resumed
		if errors.Is(err, context.DeadlineExceeded) {
			break // the minute is up; the stream is not closed yet
		} else if err != nil {
			return err
		}
		log.Printf("chunk %d: %s", ch.Index, ch.Data)
	}
	return nil
}
