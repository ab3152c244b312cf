package client_test

import (
	"context"
	"errors"
	"log"
	"net/http"

	"github.com/reveille/reveille/client"
)

// The README's example: ask for a wake-up, tell a refusal from other
// errors, page through the pending ones, follow a stream live.
func Example() {
	ctx, token, args := context.Background(), "<JWT>", map[string]string{"url": "https://example.com"}
	if err := wakeAndFollow(ctx, token, args); err != nil {
		log.Fatal(err)
	}
}

// wakeAndFollow is the README's example, word for word between its first
// and last lines.
func wakeAndFollow(ctx context.Context, token string, args any) error {
	c, err := client.New("http://localhost:8080", client.WithToken(token))
	if err != nil {
		return err
	}
	w, err := c.Wakeups.Create(ctx, client.WakeupRequest{AgentID: "agent-1", WorkflowID: "dev-org/wf-1",
		Signal: "wake", Scope: "llm", Cost: 5, Work: client.WakeupWork{Handler: "http", Args: args}})
	var apiErr *client.Error
	switch {
	case errors.As(err, &apiErr) && apiErr.Status == http.StatusPaymentRequired: // or client.IsSpendRefused(err)
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
	for ch, err := range c.Streams.Tail(ctx, "run-1", "out", client.TailParams{}) { // live, resumed
		if err != nil {
			return err
		}
		log.Printf("chunk %d: %s", ch.Index, ch.Data)
	}
	return nil
}
