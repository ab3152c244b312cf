// Package client is the typed Go client of Reveille's REST API.
//
// One method per route, grouped by resource (c.Wakeups, c.Mandates,
// c.MandateApprovals, c.Pools, c.Work, c.Streams, c.ToolApprovals,
// c.ToolPolicies, c.ApprovalWebhooks, c.Approvals — the approvals inbox's
// live events — and c.Whoami), each taking a context and typed request
// structs whose JSON names are the API's:
//
//	c, err := client.New("http://localhost:8080", client.WithToken(token))
//	w, err := c.Wakeups.Create(ctx, client.WakeupRequest{
//		AgentID: "agent-1", WorkflowID: "my-org/wf-1", Signal: "wake",
//		Scope: "llm", Cost: 5, Work: client.WakeupWork{Handler: "http", Args: args},
//	})
//	for w, err := range c.Wakeups.List(ctx, client.WakeupListParams{Status: "pending"}) {
//		...
//	}
//
// Errors. A non-2xx answer is an *Error carrying the RFC 9457 problem:
// Status, Type, Title, Detail, the offending fields (Errors, Field) and the
// extension members (ApprovalID and WakeupID of a refused spend or
// wake-up). Use errors.As, or IsNotFound, IsSpendRefused and the like. A
// redirect fails the call at once, naming its status and Location: the API
// redirects no call, so the base URL or something in front of the API is
// wrong, and the client follows none (unless WithHTTPClient gives it an
// http.Client with a CheckRedirect of its own — and not even then a 307 or
// 308 to a call that must not act twice unseen: see WithHTTPClient). An
// empty id or name where a route's path needs one (Wakeups.Get(ctx, ""),
// Streams.Tail with no run id, …) is an *ArgumentError naming the method
// and the argument, and nothing is sent.
//
// Retries. Calls that may be repeated are retried after a connection
// error, a 408, a 429 (after its Retry-After, and up to a quarter of it
// more at random, so that clients refused together spread: one longer than
// RetryPolicy.MaxRetryAfter, or ending past the context's deadline, is not
// waited for — the answer's *Error is returned at once) or a 5xx, with
// exponential backoff and jitter, up to RetryPolicy.MaxAttempts: GETs, PUTs, DELETEs,
// POSTs idempotent by nature (cancels) and POSTs the server deduplicates
// by Idempotency-Key. Every create, spend, append and answer carries such
// a key — the caller's (WithIdempotencyKey) or one generated (UUIDv7) once
// per call — so a retry after a lost answer acts once. A call that fails
// after an attempt lost its answer (none came, or one cut inside its body)
// or was answered a 5xx (but 501 and 505: a gateway's 502 or 504 after it
// forwarded the request, the API's 503 after a commit whose outcome it
// lost) is a *MaybeAppliedError, naming the key to retry it under: the server
// may have acted, whatever the last attempt's error says — a refused
// connection, a 503, a 401 to a retry whose token expired meanwhile. A
// delete (ToolPolicies.Delete, ApprovalWebhooks.Delete) whose retry is
// answered 404 after an attempt that got no answer at all (or a success
// cut short) succeeds: that attempt deleted the object; a 404 otherwise is IsNotFound (after a 5xx
// or an error answer cut inside its body — its status line came, perhaps
// from a proxy that forwarded nothing — a *MaybeAppliedError too).
//
// Lists are iterators over every page (range-over-func), and have a Page
// method for one page at a time. Each range of an iterator starts again
// from its params, on its own: one may be ranged again, or by several
// goroutines at once. Streams.Tail follows a stream live over
// Server-Sent Events and resumes a cut connection with Last-Event-ID,
// yielding every chunk exactly once; Approvals.Events follows the
// approvals inbox so. These live readers reconnect by a ReconnectPolicy of
// their own (WithReconnect), not the calls' RetryPolicy: backoff from
// 100 ms doubling to 5 s, jittered (never less than a reconnection time
// the stream set with a retry field), or a 429's or 503's Retry-After
// (spread as the calls', never past MaxOutage), until their context ends — a restart of the service is ridden out — unless
// its MaxOutage bounds the time without a healthy connection. An answer
// retrying cannot change (400, 401, 403, 404, 410 …), or an error of the
// token function (WithTokenFunc), ends them at once.
package client
