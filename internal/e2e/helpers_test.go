package e2e

import (
	"encoding/json"
	"time"

	"go.temporal.io/sdk/client"

	"github.com/reveille/reveille/api"
	"github.com/reveille/reveille/wakeup"
	"github.com/reveille/reveille/workflows"
)

func withPool(b map[string]any, pool string) map[string]any {
	b["pool"] = pool
	return b
}

func wakeupWork(handler, args string) wakeup.Work {
	return wakeup.Work{Handler: handler, Args: json.RawMessage(args)}
}

func clientOptions(s *stack, id string) client.StartWorkflowOptions {
	return client.StartWorkflowOptions{ID: id, TaskQueue: s.taskQueue}
}

// normalize compacts a wake's result JSON so wakes compare by value.
func normalize(w workflows.Wake) workflows.Wake {
	if len(w.Result) > 0 {
		var v any
		if json.Unmarshal(w.Result, &v) == nil {
			w.Result, _ = json.Marshal(v)
		}
	}
	return w
}

func signBound(orgID, agentID string) (string, error) {
	return api.SignToken(secret, api.TokenSpec{OrgID: orgID, Sub: "bound", Roles: []string{"agent"}, AgentID: agentID, TTL: time.Hour})
}
