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
	c, err := client.New("http://localhost:8080", client.WithToken(token))
	if err != nil {
		log.Fatal(err)
	}
	_, err = c.Wakeups.Create(ctx, client.WakeupRequest{AgentID: "agent-1", WorkflowID: "dev-org/wf-1",
		Signal: "wake", Scope: "llm", Cost: 5, Work: client.WakeupWork{Handler: "http", Args: args}})
	var apiErr *client.Error
	if errors.As(err, &apiErr) && apiErr.Status == http.StatusPaymentRequired {
		log.Printf("refused: approval %s", apiErr.ApprovalID) // or client.IsSpendRefused(err)
	}
	for w, err := range c.Wakeups.List(ctx, client.WakeupListParams{Status: "pending"}) {
		log.Println(w.ID, err) // every page
	}
	for ch, err := range c.Streams.Tail(ctx, "run-1", "out", client.TailParams{}) {
		log.Println(ch.Index, err) // live, resumed after a cut
	}
}
