package e2e

import (
	"context"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/cdproto/fetch"
	"github.com/chromedp/chromedp"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// storedOverruns stores n overruns of the test's org in state (pending:
// expiring in a day; otherwise resolved by bob), as the API leaves them,
// created over the last days in id order.
func (s *stack) storedOverruns(n int, state string) {
	s.t.Helper()
	old := time.Now().Add(-72 * time.Hour)
	rows := make([][]any, 0, n)
	for i := range n {
		at := old.Add(time.Duration(i) * 10 * time.Second)
		row := []any{uuid.Must(uuid.NewV7()), org, agent, scope, int64(5), "stored", state, "runtime", "no_mandate",
			at.Add(time.Hour), at, at.Add(time.Minute), "bob"}
		if state == "pending" {
			row[9], row[11], row[12] = time.Now().Add(24*time.Hour), nil, nil
		}
		rows = append(rows, row)
	}
	_, err := s.db.CopyFrom(context.Background(), pgx.Identifier{"mandate_approvals"},
		[]string{"id", "org_id", "agent_id", "scope", "cost", "reason", "state", "requested_by", "refusal", "expires_at", "created_at", "resolved_at", "resolved_by"},
		pgx.CopyFromRows(rows))
	require.NoError(s.t, err)
}

// An org with more overruns in a state than a tab holds (10,000 a list):
// the overrun list is in creation order, and the page kept the oldest
// 10,000, so the one refused (or denied) a moment ago was in neither tab.
// It keeps the newest, and reads only them (order=newest). And a redraw of that many items finds each item's
// card in one pass over the list: looked up one by one in the document, a
// redraw — at every live event, filter change or answer — took over a
// minute at 10,000 items.
func TestInboxShowsTheNewestRequestsOfAnOrgWithMoreThanATabHolds(t *testing.T) {
	s := newStack(t)
	s.fund(2)
	agentTok := token(t, org, "agent")
	s.storedOverruns(10_000, "pending")
	s.storedOverruns(11_000, "denied")
	body := wakeupBody(s.workflowID(), "echo", map[string]any{"x": 1})
	body["cost"] = 5
	denied := s.overrun(agentTok, body)
	r := s.call(http.MethodPost, "/v1/mandate-approvals/"+denied+"/deny", signedToken(t, "bob", "approver"), map[string]any{"note": "just now"})
	require.Equal(t, http.StatusOK, r.status, string(r.raw))
	pending := s.overrun(agentTok, body)

	b := newBrowser(t)
	b.openInbox(s.http.URL, signedToken(t, "alice", "approver"))
	b.waitFor("the overrun refused a moment ago, in Pending", itemJS(pending, "true"))
	var cutShown bool
	b.eval(`!document.getElementById('cut').hidden && document.getElementById('cut').textContent.includes('nearest to expiring')`, &cutShown)
	require.True(t, cutShown, "Pending says it shows only the newest")
	var count string
	b.eval(`document.getElementById('count-pending').textContent`, &count)
	require.Equal(t, "10000+", count)
	b.run(chromedp.Click(chromedp.CSS(`#tab-resolved`)))
	b.waitFor("the overrun denied a moment ago, in Resolved", itemJS(denied, "true")+` && document.getElementById('loading').hidden`)
	var shown int
	b.eval(`document.querySelectorAll('#list > li.item').length`, &shown)
	require.Equal(t, 10_000, shown, "the newest 10,000 of the 11,001 denied")
	b.eval(`!document.getElementById('cut').hidden && document.getElementById('cut').textContent.includes('answered requests')`, &cutShown)
	require.True(t, cutShown, "Resolved says it shows only the newest")
	var reads int
	b.eval(`performance.getEntriesByType('resource').filter((e) => e.name.includes('/v1/mandate-approvals?') && e.name.includes('status=denied')).length`, &reads)
	require.Equal(t, 20, reads, "the denied list is read newest first, 20 pages of 500, not to its end")

	var lookups int
	b.eval(`(() => {
		let n = 0;
		const d = Document.prototype.querySelector, e = Element.prototype.querySelector;
		Document.prototype.querySelector = function (...a) { n++; return d.apply(this, a); };
		Element.prototype.querySelector = function (...a) { n++; return e.apply(this, a); };
		try {
			const f = document.getElementById('filter-kind');
			f.value = 'mandate_overrun';
			f.dispatchEvent(new Event('change'));
		} finally {
			Document.prototype.querySelector = d;
			Element.prototype.querySelector = e;
		}
		return n;
	})()`, &lookups)
	require.Less(t, lookups, 100, "a redraw of 10,000 items looked each one up")
	b.noExceptions()
}

// An answer whose response is lost on the way back (the connection reset
// after the server recorded it) is not said to be unrecorded: the page
// asks what became of the request, and finds the answer its own.
func TestInboxDoesNotSayAnAnswerWhoseResponseWasLostWentUnrecorded(t *testing.T) {
	s := newStack(t)
	id := s.toolCall(token(t, org, "agent"), "s1", map[string]any{"agent_id": agent, "tool_name": "shell"})
	b := newBrowser(t)
	b.openInbox(s.http.URL, signedToken(t, "alice", "approver"))
	b.waitFor("the pending call", itemJS(id, "true"))
	var noCut bool
	b.eval(`document.getElementById('cut').hidden`, &noCut)
	require.True(t, noCut, "a short list says nothing of a cut")
	var lost atomic.Int32
	b.loseResponses("*/tool-approvals", func(ev *fetch.EventRequestPaused) bool {
		if ev.Request.Method != http.MethodPost {
			return false
		}
		lost.Add(1)
		return true
	})
	b.run(chromedp.Click(chromedp.CSS(itemSel(id) + ` [data-role="approve"]`)))
	require.Eventually(t, func() bool { return lost.Load() == 1 }, time.Minute, 5*time.Millisecond, "the answer's response was lost")
	// (the live event may show the answer before the page has dealt with
	// the lost response: the page's word on its own answer comes after)
	b.waitFor("the page's word on its answer", `(() => { const t = document.getElementById('announce').textContent; return t.startsWith('Approved: ') || t.startsWith('Not recorded'); })()`)
	var said string
	b.eval(`document.getElementById('announce').textContent`, &said)
	require.True(t, strings.HasPrefix(said, "Approved: "), "the page said: %q", said)
	r := s.call(http.MethodGet, "/v1/tool-approvals/"+id, signedToken(t, "alice", "approver"), nil)
	require.Equal(t, "approved", r.body["status"], "the server recorded alice's answer")
	b.waitStatus(id, "Approved")
	var errText string
	b.eval(`(document.querySelector(`+js(itemSel(id))+` + ' [data-role="error"]') || {}).textContent || ''`, &errText)
	require.Empty(t, errText, "the card says the answer was not recorded")
	b.noExceptions()
}

// Resolved that failed to load (a 503 while a replica restarts) says so in
// the banner; opened again, it loads, and the banner no longer says it
// could not be loaded above the list it shows.
func TestInboxClearsTheResolvedTabsErrorOnceItLoads(t *testing.T) {
	s := newStack(t)
	id := s.toolCall(token(t, org, "agent"), "s1", map[string]any{"agent_id": agent, "tool_name": "shell"})
	r := s.call(http.MethodPost, "/v1/sessions/s1/tool-approvals", signedToken(t, "bob", "approver"),
		map[string]any{"approval_id": id, "decision": "denied"})
	require.Equal(t, http.StatusOK, r.status, string(r.raw))
	b := newBrowser(t)
	b.openInbox(s.http.URL, signedToken(t, "alice", "approver"))
	var failed atomic.Bool
	b.intercept("*/v1/tool-approvals?*status=resolved*", func(*fetch.EventRequestPaused) *fetch.FulfillRequestParams {
		if !failed.CompareAndSwap(false, true) {
			return nil
		}
		return &fetch.FulfillRequestParams{ResponseCode: http.StatusServiceUnavailable,
			ResponseHeaders: []*fetch.HeaderEntry{{Name: "Content-Type", Value: "application/problem+json"}},
			Body:            []byte(`{"type":"about:blank","title":"Service Unavailable","status":503,"detail":"server stopping"}`)}
	})
	b.run(chromedp.Click(chromedp.CSS(`#tab-resolved`)))
	b.waitFor("the failure's banner", `!document.getElementById('banner').hidden`)
	b.run(chromedp.Click(chromedp.CSS(`#tab-pending`)), chromedp.Click(chromedp.CSS(`#tab-resolved`)))
	b.waitFor("the denied call in Resolved", itemJS(id, "true")+` && document.getElementById('loading').hidden`)
	var banner string
	b.eval(`document.getElementById('banner').hidden ? '' : document.getElementById('banner').textContent`, &banner)
	require.Empty(t, banner, "Resolved loaded: no banner says it could not be")
	b.noExceptions()
}
