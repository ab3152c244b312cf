package api

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"
)

// pageBrowser is a headless Chromium tab for the inbox page's tests here.
type pageBrowser struct {
	t   *testing.T
	ctx context.Context
}

func newPageBrowser(t *testing.T) *pageBrowser {
	t.Helper()
	path, err := exec.LookPath("chromium")
	require.NoError(t, err, "chromium on PATH")
	tmp, err := os.MkdirTemp("", "api-chromium-")
	require.NoError(t, err)
	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(path), chromedp.NoSandbox,
		chromedp.WindowSize(1280, 800), chromedp.Env("TMPDIR="+tmp))
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(allocCtx)
	require.NoError(t, chromedp.Do(ctx, chromedp.EmulateViewport(1280, 800)))
	t.Cleanup(func() {
		cancel()
		cancelAlloc()
		_ = os.RemoveAll(tmp)
	})
	return &pageBrowser{t: t, ctx: ctx}
}

func (b *pageBrowser) run(actions ...chromedp.Action[chromedp.Void]) {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 60*time.Second)
	defer cancel()
	require.NoError(b.t, chromedp.Do(ctx, actions...))
}

func (b *pageBrowser) eval(js string, out any) {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 60*time.Second)
	defer cancel()
	raw, err := chromedp.Run(ctx, chromedp.Evaluate[string](`JSON.stringify((() => (`+js+`))()) ?? 'null'`))
	require.NoError(b.t, err)
	require.NoError(b.t, json.Unmarshal([]byte(raw), out), raw)
}

func (b *pageBrowser) waitFor(what, js string) {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 60*time.Second)
	defer cancel()
	_, err := chromedp.Run(ctx, chromedp.Poll[chromedp.Void](js, chromedp.WithPollingTimeout(60*time.Second)))
	require.NoError(b.t, err, "waiting for %s", what)
}

// A burst of live events (a reconnect's catch-up, a fleet of agents) is
// redrawn once per read of the stream, not once per event: a redraw sorts
// and walks every item, and with the page's 10,000 items a burst of 300
// events froze it for half a minute. Counted here by the redraws of the
// pending count, which every redraw writes.
func TestInboxPageRedrawsABurstOfEventsOncePerRead(t *testing.T) {
	f := newInboxFixture(t, time.Second)
	ctx := context.Background()
	db := f.s.svc.DB
	f.pendingToolCall(t, f.agent, "s1")
	b := newPageBrowser(t)
	b.run(chromedp.Navigate(f.srv.URL + "/inbox#token=" + f.alice))
	b.waitFor("the list", `document.querySelectorAll('#list > li').length === 1`)
	b.waitFor("live", `document.getElementById('conn').dataset.state === 'live'`)
	var started bool
	b.eval(`(window.__redraws = 0, new MutationObserver((records) => { window.__redraws += records.length }).observe(
		document.getElementById('count-pending'), {childList: true, characterData: true, subtree: true}), true)`, &started)
	// 300 requests committed at once, with their events.
	_, err := db.Exec(ctx, `
WITH ids AS (SELECT gen_random_uuid() AS id, g FROM generate_series(1, 300) g),
     ins AS (INSERT INTO tool_approvals (id, org_id, session_id, agent_id, tool_name, input, status, requested_by, expires_at)
             SELECT id, 'org-a', 's1', 'agent-1', 'burst-' || g, '{}', 'pending', 'runtime', now() + interval '1 hour' FROM ids RETURNING id),
     c AS (INSERT INTO approval_event_counters (org_id, seq) VALUES ('org-a', 300)
           ON CONFLICT (org_id) DO UPDATE SET seq = approval_event_counters.seq + 300 RETURNING seq)
INSERT INTO approval_events (org_id, seq, type, kind, approval_id, payload)
SELECT 'org-a', c.seq - 300 + ids.g, 'requested', 'tool_call', ids.id,
       jsonb_build_object('id', ids.id, 'session_id', 's1', 'agent_id', 'agent-1', 'tool_name', 'burst-' || ids.g, 'input', '{}'::jsonb,
         'status', 'pending', 'requested_by', 'runtime', 'created_at', now(), 'expires_at', now() + interval '1 hour')
FROM ids, c`)
	require.NoError(t, err)
	_, err = db.Exec(ctx, `SELECT pg_notify('reveille_approval_events', '1/org-a')`)
	require.NoError(t, err)
	b.waitFor("the burst", `document.querySelectorAll('#list > li').length === 301`)
	var redraws int
	b.eval(`window.__redraws`, &redraws)
	// (the server sends the burst in pages of 100 events; the browser reads
	// them in a few chunks each)
	require.Less(t, redraws, 60, "300 events were redrawn %d times", redraws)
}

// A request arriving while the approver types a note into another
// request's card must leave that card alone: the note field they type in
// stays the same element, with the caret where they put it.
func TestInboxPageLeavesTheCardBeingAnsweredAloneWhenAnotherRequestArrives(t *testing.T) {
	f := newInboxFixture(t, time.Second)
	first := f.pendingToolCall(t, f.agent, "s1")
	b := newPageBrowser(t)
	b.run(chromedp.Navigate(f.srv.URL + "/inbox#token=" + f.alice))
	note := `document.querySelector('li.item[data-id="` + first + `"] [data-role="note"]')`
	b.waitFor("the first request", note)
	b.waitFor("live", `document.getElementById('conn').dataset.state === 'live'`)
	b.run(chromedp.Click(chromedp.CSS(`li.item[data-id="`+first+`"] [data-role="note"]`)),
		chromedp.SendKeys(chromedp.CSS(`li.item[data-id="`+first+`"] [data-role="note"]`), "looks fine to me"))
	var ok bool
	// The approver puts the caret after "looks" to add a word there.
	b.eval(`(window.__note = `+note+`, window.__note.setSelectionRange(5, 5), document.activeElement === window.__note)`, &ok)
	require.True(t, ok)

	second := f.pendingToolCall(t, f.agent, "s2")
	b.waitFor("the second request", `document.querySelector('li.item[data-id="`+second+`"]')`)
	var got struct {
		Same, Focused bool
		Value         string
		Caret         int
	}
	b.eval(`({same: `+note+` === window.__note, focused: document.activeElement === window.__note,
		value: document.activeElement.value, caret: document.activeElement.selectionStart})`, &got)
	require.Equal(t, "looks fine to me", got.Value)
	require.True(t, got.Same, "the note field being typed in was replaced by a new one")
	require.True(t, got.Focused)
	require.Equal(t, 5, got.Caret, "the caret moved from where the approver put it")
}
