package e2e

import (
	"context"
	"errors"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/fetch"
	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/chromedp"
	"github.com/chromedp/chromedp/kb"
	"github.com/stretchr/testify/require"

	"github.com/reveille/reveille/api"
)

// The inbox page in headless Chromium, against the engine and a real
// Temporal server: approvals are made over REST as agents make them, and
// answered in the page as a person does.

const inboxTokenKey = "reveille.inbox.token" // the page's sessionStorage key

// signedToken signs a token for org with sub and roles.
func signedToken(t *testing.T, sub string, roles ...string) string {
	t.Helper()
	tok, err := api.SignToken(secret, api.TokenSpec{OrgID: org, Sub: sub, Roles: roles, TTL: time.Hour})
	require.NoError(t, err)
	return tok
}

// openInbox opens the page with tok in the fragment and waits for the
// pending list to load.
func (b *browser) openInbox(base, tok string) {
	b.t.Helper()
	b.run(chromedp.Navigate(base + "/inbox#token=" + tok))
	b.waitFor("the signed-in inbox", `!document.getElementById('inbox-view').hidden && document.getElementById('loading').hidden`)
}

func itemSel(id string) string { return `li.item[data-id="` + id + `"]` }

// itemJS is a JavaScript expression on the item's element (null-safe).
func itemJS(id, expr string) string {
	return `(() => { const el = document.querySelector(` + js(itemSel(id)) + `); return !!el && (` + expr + `); })()`
}

func (b *browser) itemText(id string) string {
	b.t.Helper()
	var text string
	b.eval(`(document.querySelector(`+js(itemSel(id))+`) || {}).textContent || ''`, &text)
	return text
}

func (b *browser) waitStatus(id, status string) {
	b.t.Helper()
	b.waitFor("item "+id+" to show "+status, itemJS(id, `el.querySelector('.status').textContent === `+js(status)))
}

// overrun posts a wake-up that the mandate refuses and returns its
// approval request's id.
func (s *stack) overrun(tok string, body map[string]any) string {
	s.t.Helper()
	r := s.call(http.MethodPost, "/v1/wakeups", tok, body)
	require.Equal(s.t, http.StatusPaymentRequired, r.status, string(r.raw))
	return r.body["approval_id"].(string)
}

// toolCall posts a tool call with tok and returns its pending approval id.
func (s *stack) toolCall(tok, session string, body map[string]any) string {
	s.t.Helper()
	r := s.call(http.MethodPost, "/v1/sessions/"+url.PathEscape(session)+"/tool-calls", tok, body)
	require.Equal(s.t, http.StatusOK, r.status, string(r.raw))
	require.Equal(s.t, "pending", r.body["decision"], string(r.raw))
	return r.body["approval_id"].(string)
}

func TestInboxInABrowserAnswersWhatAgentsWaitFor(t *testing.T) {
	s := newStack(t)
	s.fund(2)
	approver := token(t, org, "approver") // sub user-approver
	agentTok := token(t, org, "agent")
	b := newBrowser(t)

	// Made before the page opens: a tool call the approver made itself (as
	// an agent), another tool call, and a spend over the mandate, parked on.
	ownID := s.toolCall(signedToken(t, "user-approver", "agent"), "s2", map[string]any{"agent_id": agent, "tool_name": "deploy"})
	toolID := s.toolCall(agentTok, "s1", map[string]any{"agent_id": agent, "tool_name": "shell",
		"input": map[string]any{"cmd": "ls -la", "cwd": "/srv/app", "env": map[string]any{"DRY_RUN": true}}})
	wf := s.workflowID()
	body := wakeupBody(wf, "echo", map[string]any{"x": 1})
	body["cost"], body["reason"] = 5, "summarise the incident report with the large model"
	overrunID := s.overrun(agentTok, body)
	run := s.park(wf, "wake", 1, 0)

	t.Run("signs in with a fragment token and removes it from the address bar", func(t *testing.T) {
		b.openInbox(s.http.URL, approver)
		var href, stored, cookie string
		var localItems int
		b.eval(`location.href`, &href)
		b.eval(`sessionStorage.getItem(`+js(inboxTokenKey)+`)`, &stored)
		b.eval(`document.cookie`, &cookie)
		b.eval(`localStorage.length`, &localItems)
		require.Equal(t, s.http.URL+"/inbox", href)
		require.Equal(t, approver, stored)
		require.Empty(t, cookie)
		require.Zero(t, localItems)
		var who string
		b.eval(`document.getElementById('who').textContent`, &who)
		require.Equal(t, "user-approver · "+org, who)
	})

	t.Run("a pending tool call and a pending overrun made over REST appear, newest first", func(t *testing.T) {
		b.waitFor("both items", itemJS(toolID, "true")+" && "+itemJS(overrunID, "true"))
		b.screenshot("docs/img/inbox-desktop.png", 1280, 800)
		b.screenshot("docs/img/inbox-360.png", 360, 740)
		tool := b.itemText(toolID)
		for _, want := range []string{"shell", agent, "s1", "user-agent", `"cmd": "ls -la"`, `"DRY_RUN": true`, "Pending"} {
			require.Contains(t, tool, want)
		}
		over := b.itemText(overrunID)
		for _, want := range []string{"Spending overrun", scope, agent, "user-agent", "summarise the incident report with the large model",
			"Cost 5", "budget of 2", "of which 0 is spent", "3 over"} {
			require.Contains(t, over, want)
		}
		var first string
		b.eval(`document.querySelector('#list > li').dataset.id`, &first)
		require.Equal(t, overrunID, first, "the newest request leads")
	})

	t.Run("a focused request is a list item named for a screen reader, in the tab's panel", func(t *testing.T) {
		b.run(chromedp.Focus(chromedp.CSS(itemSel(toolID))))
		item, list := b.accessible(`document.activeElement`)
		require.Equal(t, axNode{Role: "listitem", Name: "Tool call shell from " + agent + ", pending"}, item)
		require.Equal(t, "list", list.Role)
		_, panel := b.accessible(`document.getElementById('list')`)
		require.Equal(t, "tabpanel", panel.Role)
		require.Equal(t, "Pending 3", panel.Name, "the panel is named by its tab")
		b.run(chromedp.Focus(chromedp.CSS(itemSel(overrunID))))
		item, _ = b.accessible(`document.activeElement`)
		require.Equal(t, "Spending overrun "+scope+" from "+agent+", pending", item.Name)
	})

	t.Run("the focus ring has 3:1 contrast on the card and the page, light and dark", func(t *testing.T) {
		// WCAG 1.4.11: a focus indicator needs 3:1 against what is next to
		// it — the card inside a focused request, the page outside it.
		type ring struct {
			Visible     bool
			Style       string
			Card, Page  float64
			Color, Back string
		}
		const contrast = `(() => {
			const rgb = (c) => c.match(/[\d.]+/g).slice(0, 3).map(Number);
			const lum = (c) => {
				const [r, g, b] = rgb(c).map((v) => { v /= 255; return v <= 0.04045 ? v / 12.92 : ((v + 0.055) / 1.055) ** 2.4; });
				return 0.2126 * r + 0.7152 * g + 0.0722 * b;
			};
			const ratio = (a, b) => { const [x, y] = [lum(a), lum(b)].sort((p, q) => q - p); return (x + 0.05) / (y + 0.05); };
			const el = document.activeElement;
			const s = getComputedStyle(el);
			const page = getComputedStyle(document.body).backgroundColor;
			return { visible: el.matches(':focus-visible'), style: s.outlineStyle, color: s.outlineColor, back: page,
				card: ratio(s.outlineColor, s.backgroundColor), page: ratio(s.outlineColor, page) };
		})()`
		// By keyboard, as :focus-visible wants: Tab from the last filter
		// reaches the first request.
		b.run(chromedp.Focus(chromedp.CSS(`#filter-kind`)), chromedp.KeyEvent(kb.Tab))
		var focused string
		b.eval(`document.activeElement.dataset.id || ''`, &focused)
		require.Equal(t, overrunID, focused)
		for _, scheme := range []string{"light", "dark"} {
			b.colorScheme(scheme)
			var r ring
			b.eval(contrast, &r)
			require.True(t, r.Visible, "the focused request shows no focus ring")
			require.Equal(t, "solid", r.Style)
			require.GreaterOrEqual(t, r.Card, 3.0, "%s: ring %s on the card", scheme, r.Color)
			require.GreaterOrEqual(t, r.Page, 3.0, "%s: ring %s on the page %s", scheme, r.Color, r.Back)
		}
		b.colorScheme("light")
	})

	t.Run("answering one's own request is refused in words and the item stays", func(t *testing.T) {
		b.run(chromedp.Click(chromedp.CSS(itemSel(ownID) + ` [data-role="approve"]`)))
		b.waitFor("the 403 in words", itemJS(ownID, `el.querySelector('[data-role="error"]').textContent.includes('You cannot approve or deny your own request')`))
		require.Contains(t, b.itemText(ownID), "Pending")
		require.Equal(t, "pending", s.toolApproval(ownID)["status"])
	})

	t.Run("a note over the server's 1000 bytes is refused in the page, before sending", func(t *testing.T) {
		note := itemSel(toolID) + ` [data-role="note"]`
		var maxLength int
		b.eval(`document.querySelector(`+js(note)+`).maxLength`, &maxLength)
		require.Equal(t, 1000, maxLength)
		// 334 characters, within maxlength, are 1002 bytes in UTF-8.
		long := strings.Repeat("€", 334)
		var typed bool
		b.eval(`(() => { const n = document.querySelector(`+js(note)+`); n.value = `+js(long)+`; n.dispatchEvent(new Event('input')); return true; })()`, &typed)
		b.run(chromedp.Click(chromedp.CSS(itemSel(toolID) + ` [data-role="approve"]`)))
		b.waitFor("the refusal in words", itemJS(toolID, `el.querySelector('[data-role="error"]').textContent.startsWith('The note is 1002 bytes long in UTF-8, and the server takes at most 1000')`))
		var focused string
		b.eval(`document.activeElement.dataset.role || ''`, &focused)
		require.Equal(t, "note", focused, "the note is focused to be shortened")
		require.Equal(t, "pending", s.toolApproval(toolID)["status"])
		for _, r := range b.sent() {
			require.False(t, strings.HasSuffix(r.URL, "/v1/sessions/s1/tool-approvals"), "an answer was sent")
		}
		b.eval(`(() => { const n = document.querySelector(`+js(note)+`); n.value = ''; n.dispatchEvent(new Event('input')); return true; })()`, &typed)
	})

	t.Run("approving a tool call with always resolves it, and the agent's next call is approved by policy", func(t *testing.T) {
		b.run(
			chromedp.SendKeys(chromedp.CSS(itemSel(toolID)+` [data-role="note"]`), "fine for the staging box"),
			chromedp.Click(chromedp.CSS(itemSel(toolID)+` [data-role="policy-always"]`)),
			chromedp.Click(chromedp.CSS(itemSel(toolID)+` [data-role="approve"]`)),
		)
		b.waitStatus(toolID, "Approved")
		b.waitFor("who approved", itemJS(toolID, `el.querySelector('[data-role="outcome"]').textContent.includes('by user-approver (you)')`))
		a := s.toolApproval(toolID)
		require.Equal(t, "approved", a["status"])
		require.Equal(t, "fine for the staging box", a["note"])
		next := s.askTool("s1", "shell", "", map[string]any{"input": map[string]any{"cmd": "pwd"}})
		require.Equal(t, "approved", next["decision"])
		require.Equal(t, "policy", next["source"])
	})

	t.Run("denying an overrun asks for confirmation, and the parked workflow wakes denied", func(t *testing.T) {
		// By keyboard: focus the item, press d.
		b.run(chromedp.Focus(chromedp.CSS(itemSel(overrunID))), chromedp.KeyEvent("d"))
		b.waitFor("the confirmation", `document.getElementById('confirm').open`)
		b.run(chromedp.KeyEvent(kb.Escape)) // changing one's mind keeps it pending
		b.waitFor("the dialog to close", `!document.getElementById('confirm').open`)
		require.Contains(t, b.itemText(overrunID), "Pending")
		r := s.call(http.MethodGet, "/v1/mandate-approvals/"+overrunID, approver, nil)
		require.Equal(t, "pending", r.body["state"])

		b.run(chromedp.Click(chromedp.CSS(itemSel(overrunID) + ` [data-role="deny"]`)))
		b.waitFor("the confirmation", `document.getElementById('confirm').open`)
		var question string
		b.eval(`document.getElementById('confirm-title').textContent`, &question)
		require.Equal(t, "Deny this spending overrun?", question)
		var text string
		b.eval(`document.getElementById('confirm-text').textContent`, &text)
		require.Equal(t, "The spend on "+scope+" by "+agent+" will not happen (if a wake-up asked for it, its workflow wakes with the outcome denied).", text,
			"true of a plain spend too, which no workflow waits for")
		b.run(chromedp.Click(chromedp.CSS(`#confirm-deny`)))
		b.waitStatus(overrunID, "Denied")
		wakes := s.wakesOf(run)
		require.Equal(t, "denied", wakes[0].Outcome)
	})

	t.Run("a request made while the page is open appears without a reload", func(t *testing.T) {
		b.waitFor("the live indicator", `document.getElementById('conn').dataset.state === 'live'`)
		id := s.toolCall(agentTok, "s3", map[string]any{"agent_id": agent, "tool_name": "send_email", "input": map[string]any{"to": "cfo@example.com"}})
		b.waitFor("the new item", itemJS(id, "true"))
		require.Contains(t, b.itemText(id), "cfo@example.com")

		t.Run("and another approver's answer shows it resolved", func(t *testing.T) {
			r := s.call(http.MethodPost, "/v1/sessions/s3/tool-approvals", signedToken(t, "bob", "approver"),
				map[string]any{"approval_id": id, "decision": "denied", "note": "not to the CFO"})
			require.Equal(t, http.StatusOK, r.status, string(r.raw))
			b.waitStatus(id, "Denied")
			out := b.itemText(id)
			require.Contains(t, out, "Denied by bob")
			require.Contains(t, out, "not to the CFO")
		})
	})

	t.Run("the deny dialog closes when another approver answers first, and focus stays on the item", func(t *testing.T) {
		id := s.toolCall(agentTok, "s5", map[string]any{"agent_id": agent, "tool_name": "drop_table"})
		b.waitFor("the new item", itemJS(id, "true"))
		b.run(chromedp.Click(chromedp.CSS(itemSel(id) + ` [data-role="deny"]`)))
		b.waitFor("the confirmation", `document.getElementById('confirm').open`)
		r := s.call(http.MethodPost, "/v1/sessions/s5/tool-approvals", signedToken(t, "bob", "approver"),
			map[string]any{"approval_id": id, "decision": "approved"})
		require.Equal(t, http.StatusOK, r.status, string(r.raw))
		b.waitStatus(id, "Approved")
		b.waitFor("the stale dialog to close", `!document.getElementById('confirm').open`)
		b.waitFor("why nothing was sent", itemJS(id, `el.querySelector('[data-role="error"]').textContent === 'Your denial was not sent: bob approved it first.'`))
		var focused string
		b.eval(`document.activeElement.dataset.id || document.activeElement.tagName`, &focused)
		require.Equal(t, id, focused, "focus left the item")
		require.Contains(t, b.itemText(id), "Approved by bob")
		a := s.toolApproval(id)
		require.Equal(t, "approved", a["status"])
		require.Equal(t, "bob", a["resolved_by"])
	})

	t.Run("a dropped stream reconnects by itself and misses nothing", func(t *testing.T) {
		s.http.CloseClientConnections()           // the server side of the event stream goes away
		http.DefaultClient.CloseIdleConnections() // and the test's own, which it would reuse
		id := s.toolCall(agentTok, "s4", map[string]any{"agent_id": agent, "tool_name": "fetch_url"})
		b.waitFor("the item made while the stream was down", itemJS(id, "true"))
		b.waitFor("the live indicator", `document.getElementById('conn').dataset.state === 'live'`)
	})

	t.Run("the token travels only in the Authorization header", func(t *testing.T) {
		sent := b.sent()
		require.NotEmpty(t, sent)
		escaped := url.QueryEscape(approver)
		var api, events int
		for _, r := range sent {
			require.NotContains(t, r.URL, approver, "a URL carries the token")
			require.NotContains(t, r.URL, escaped, "a URL carries the token")
			for name, value := range r.Headers {
				if name != "authorization" {
					require.NotContains(t, value, approver, "header %s of %s carries the token", name, r.URL)
				}
			}
			require.Empty(t, r.Headers["cookie"], r.URL)
			u, err := url.Parse(r.URL)
			require.NoError(t, err)
			if strings.HasPrefix(u.Path, "/v1/") {
				api++
				require.Equal(t, "Bearer "+approver, r.Headers["authorization"], r.URL)
				if u.Path == "/v1/approvals/events" {
					events++
				}
			} else {
				require.Empty(t, r.Headers["authorization"], "the page's own files need no token: %s", r.URL)
			}
		}
		require.Positive(t, api)
		require.Positive(t, events, "the page follows the events stream")
	})
	b.noExceptions()
}

// dismissAnsweredJS is the Pending tab's "Dismiss answered (N)" button.
const dismissAnsweredJS = `document.getElementById('dismiss-answered')`

// listedIDs are the ids of the requests the list shows, in its order.
func (b *browser) listedIDs() []string {
	b.t.Helper()
	var ids []string
	b.eval(`Array.from(document.querySelectorAll('#list > li.item')).map((li) => li.dataset.id)`, &ids)
	return ids
}

func TestInboxDismissesEveryAnsweredRequestAtOnce(t *testing.T) {
	s := newStack(t)
	s.fund(2)
	agentTok := token(t, org, "agent")
	bob := signedToken(t, "bob", "approver")
	b := newBrowser(t)

	call := func(session, tool string, extra map[string]any) string {
		body := map[string]any{"agent_id": agent, "tool_name": tool}
		for k, v := range extra {
			body[k] = v
		}
		return s.toolCall(agentTok, session, body)
	}
	first, second := call("s1", "read_file", nil), call("s2", "deploy", nil)
	approvedByBob, deniedByBob := call("s3", "shell", nil), call("s4", "send_email", nil)
	body := wakeupBody(s.workflowID(), "echo", map[string]any{"x": 1})
	body["cost"], body["reason"] = 5, "a larger model for the quarterly report"
	overrun := s.overrun(agentTok, body)
	mine := call("s5", "restart_service", nil)
	b.openInbox(s.http.URL, signedToken(t, "alice", "approver"))
	for _, id := range []string{first, second, approvedByBob, deniedByBob, overrun, mine} {
		b.waitFor("item "+id, itemJS(id, "true"))
	}
	hidden := func() bool {
		var h bool
		b.eval(`(() => { const b = `+dismissAnsweredJS+`; return b.hidden && b.getClientRects().length === 0; })()`, &h)
		return h
	}

	t.Run("there is no such button while nothing shown is answered, and one's own answer counts", func(t *testing.T) {
		require.True(t, hidden(), "shown with every request pending")
		// One's own answer stays in Pending too, until dismissed: an
		// approver who answers twenty has twenty to clear.
		b.run(chromedp.Click(chromedp.CSS(itemSel(mine) + ` [data-role="approve"]`)))
		b.waitStatus(mine, "Approved")
		b.waitFor("who approved", itemJS(mine, `el.querySelector('[data-role="outcome"]').textContent.includes('by alice (you)')`))
		b.waitFor("one's own answer counted", dismissAnsweredJS+`.textContent === 'Dismiss answered (1)'`)
		require.False(t, hidden())
	})

	// Made now, so that it expires (10 s) after the check above.
	expiring := call("s6", "rotate_keys", map[string]any{"expires_in_s": 10})
	b.waitFor("the expiring item", itemJS(expiring, "true"))

	t.Run("requests another approver answered, or that expired, are counted in the button's name too", func(t *testing.T) {
		r := s.call(http.MethodPost, "/v1/sessions/s3/tool-approvals", bob, map[string]any{"approval_id": approvedByBob, "decision": "approved"})
		require.Equal(t, http.StatusOK, r.status, string(r.raw))
		r = s.call(http.MethodPost, "/v1/sessions/s4/tool-approvals", bob, map[string]any{"approval_id": deniedByBob, "decision": "denied"})
		require.Equal(t, http.StatusOK, r.status, string(r.raw))
		r = s.call(http.MethodPost, "/v1/mandate-approvals/"+overrun+"/deny", bob, map[string]any{"note": "over budget"})
		require.Equal(t, http.StatusOK, r.status, string(r.raw))
		b.waitStatus(approvedByBob, "Approved")
		b.waitStatus(deniedByBob, "Denied")
		b.waitStatus(overrun, "Denied")
		b.waitStatus(expiring, "Expired")
		b.waitFor("five answered", dismissAnsweredJS+`.textContent === 'Dismiss answered (5)'`)
		require.False(t, hidden())
		node, _ := b.accessible(dismissAnsweredJS)
		require.Equal(t, axNode{Role: "button", Name: "Dismiss answered (5)"}, node)
		require.ElementsMatch(t, []string{expiring, mine, overrun, deniedByBob, approvedByBob, second, first}, b.listedIDs())
	})

	t.Run("pressing it removes those five only, and focus moves to the first request left", func(t *testing.T) {
		b.run(chromedp.Focus(chromedp.CSS(`#dismiss-answered`)), chromedp.KeyEvent(kb.Enter))
		gone := make([]string, 0, 5)
		for _, id := range []string{expiring, mine, overrun, deniedByBob, approvedByBob} {
			gone = append(gone, `!document.querySelector(`+js(itemSel(id))+`)`)
		}
		b.waitFor("the answered ones to go", strings.Join(gone, " && "))
		require.Equal(t, []string{second, first}, b.listedIDs(), "pending requests stay, newest first")
		require.Contains(t, b.itemText(first), "Pending")
		require.Contains(t, b.itemText(second), "Pending")
		var focused string
		b.eval(`document.activeElement.dataset.id || document.activeElement.tagName`, &focused)
		require.Equal(t, second, focused, "focus left the list")
		require.True(t, hidden(), "the button stays with nothing to dismiss")
		b.waitFor("the count announced", `document.getElementById('announce').textContent === 'Dismissed 5 answered requests'`)
		var count string
		b.eval(`document.getElementById('count-pending').textContent`, &count)
		require.Equal(t, "2", count)
	})

	t.Run("the dismissed requests are still in Resolved", func(t *testing.T) {
		b.run(chromedp.Click(chromedp.CSS(`#tab-resolved`)))
		for _, id := range []string{expiring, mine, overrun, deniedByBob, approvedByBob} {
			b.waitFor("item "+id, itemJS(id, "true"))
		}
		require.True(t, hidden(), "shown in the Resolved tab")
	})
	b.noExceptions()
}

// hostile is an attack in every field an agent or a token controls: if
// any of it became HTML, the browser would load /pwned-… (img-src allows
// the page's own origin) or set window.__pwned.
const hostile = `<img src=/pwned-img onerror="window.__pwned='img';fetch('/pwned-fetch')"></script>` +
	`<script>window.__pwned='script'</script><a href="javascript:window.__pwned='link'">click me</a>`

// shortHostile fits a tool name (128 bytes).
const shortHostile = `<img src=/pwned-tool onerror="window.__pwned='tool'">`

func TestInboxShowsHostileDataAsTextAndRunsNothing(t *testing.T) {
	s := newStack(t)
	hostileAgent := "agent " + hostile
	agentTok := signedToken(t, "sub "+hostile, "agent")
	approverTok := signedToken(t, "approver "+hostile, "approver")
	b := newBrowser(t)

	session := "session " + hostile
	call := func(tool string) string {
		return s.toolCall(agentTok, session, map[string]any{"agent_id": hostileAgent, "tool_name": tool, "input": map[string]any{
			"payload": hostile, hostile: []any{hostile, "javascript:window.__pwned='input'"}, "link": "javascript:alert(1)"}})
	}
	spend := func(reason string) string {
		body := wakeupBody(s.workflowID(), "echo", map[string]any{"x": hostile})
		body["agent_id"], body["scope"], body["reason"] = hostileAgent, "scope "+hostile, reason
		return s.overrun(agentTok, body)
	}
	pendingTool, resolvedTool := call(shortHostile), call("second "+shortHostile)
	pendingSpend, resolvedSpend := spend(hostile), spend("second "+hostile)
	// Answered by an approver whose sub and note are hostile too.
	r := s.call(http.MethodPost, "/v1/sessions/"+url.PathEscape(session)+"/tool-approvals", approverTok,
		map[string]any{"approval_id": resolvedTool, "decision": "approved", "note": "note " + hostile})
	require.Equal(t, http.StatusOK, r.status, string(r.raw))
	r = s.call(http.MethodPost, "/v1/mandate-approvals/"+resolvedSpend+"/deny", approverTok, map[string]any{"note": "note " + hostile})
	require.Equal(t, http.StatusOK, r.status, string(r.raw))

	nothingRan := func(t *testing.T, ids ...string) {
		t.Helper()
		for _, id := range ids {
			b.waitFor("item "+id, itemJS(id, "true"))
		}
		var pwned any
		var elements int
		var text string
		b.eval(`window.__pwned`, &pwned)
		b.eval(`document.querySelectorAll('img, script:not([src]), iframe, #list a, a[href^="javascript"]').length`, &elements)
		b.eval(`document.getElementById('list').innerText`, &text)
		require.Nil(t, pwned, "a payload ran")
		require.Zero(t, elements, "data became elements")
		require.Contains(t, text, hostile, "the payload shows as text")
		require.Contains(t, text, shortHostile)
		for _, req := range b.sent() {
			require.NotContains(t, req.URL, "pwned", "a payload made the browser fetch")
		}
	}

	t.Run("pending", func(t *testing.T) {
		b.openInbox(s.http.URL, approverTok)
		nothingRan(t, pendingTool, pendingSpend)
		tool, spend := b.itemText(pendingTool), b.itemText(pendingSpend)
		for _, want := range []string{"agent " + hostile, "session " + hostile, "sub " + hostile, shortHostile, `"payload": ` + js(hostile)} {
			require.Contains(t, tool, want)
		}
		for _, want := range []string{"agent " + hostile, "sub " + hostile, "scope " + hostile, hostile} {
			require.Contains(t, spend, want)
		}
		var option string
		b.eval(`Array.from(document.querySelectorAll('#filter-agent option')).map(o => o.textContent).join('\n')`, &option)
		require.Contains(t, option, hostileAgent)
	})
	t.Run("resolved", func(t *testing.T) {
		b.run(chromedp.Click(chromedp.CSS(`#tab-resolved`)))
		nothingRan(t, resolvedTool, resolvedSpend)
		for _, id := range []string{resolvedTool, resolvedSpend} {
			out := b.itemText(id)
			require.Contains(t, out, "by approver "+hostile)
			require.Contains(t, out, "Note: note "+hostile)
		}
	})
	t.Run("in the deny confirmation", func(t *testing.T) {
		b.run(chromedp.Click(chromedp.CSS(`#tab-pending`)),
			chromedp.SendKeys(chromedp.CSS(itemSel(pendingSpend)+` [data-role="note"]`), hostile),
			chromedp.Click(chromedp.CSS(itemSel(pendingSpend)+` [data-role="deny"]`)))
		b.waitFor("the confirmation", `document.getElementById('confirm').open`)
		var note string
		b.eval(`document.getElementById('confirm').innerText`, &note)
		require.Contains(t, note, hostile)
		nothingRan(t)
		b.run(chromedp.Click(chromedp.CSS(`#confirm-cancel`)))
	})
	b.noExceptions()
}

// navigateInPage opens url in the tab without waiting for a load: a URL
// that differs from the page's only in its fragment is a same-document
// navigation, which fires hashchange and loads nothing.
func (b *browser) navigateInPage(url string) {
	b.t.Helper()
	b.run(chromedp.Func(func(ctx context.Context, tgt *chromedp.Target) error {
		res, err := cdp.Call(ctx, tgt, page.Navigate, page.NavigateParams{URL: url})
		if err == nil && res.ErrorText != "" {
			err = errors.New(res.ErrorText)
		}
		return err
	}))
}

// historyURLs are the URLs of the tab's history entries.
func (b *browser) historyURLs() []string {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, wait)
	defer cancel()
	h, err := chromedp.Run(ctx, chromedp.NavigationEntries())
	require.NoError(b.t, err)
	var urls []string
	for _, e := range h.Entries {
		urls = append(urls, e.URL)
	}
	return urls
}

func TestInboxTakesATokenLinkOpenedInATabAlreadyOnIt(t *testing.T) {
	s := newStack(t)
	alice, bob := signedToken(t, "alice", "approver"), signedToken(t, "bob", "approver")
	id := s.toolCall(token(t, org, "agent"), "s1", map[string]any{"agent_id": agent, "tool_name": "shell"})
	b := newBrowser(t)
	b.openInbox(s.http.URL, alice)
	b.waitFor("alice's live inbox", `document.getElementById('who').textContent === 'alice · `+org+`' && document.getElementById('conn').dataset.state === 'live'`)

	// The link for bob, opened where the page already is: only the
	// fragment changes, so the page does not reload.
	b.navigateInPage(s.http.URL + "/inbox#token=" + bob)
	b.waitFor("bob signed in", `document.getElementById('who').textContent === 'bob · `+org+`'`)
	b.waitFor("bob's list, live", itemJS(id, "true")+` && document.getElementById('conn').dataset.state === 'live'`)
	var href, stored string
	b.eval(`location.href`, &href)
	b.eval(`sessionStorage.getItem(`+js(inboxTokenKey)+`)`, &stored)
	require.Equal(t, s.http.URL+"/inbox", href, "the token stays in the address bar")
	require.Equal(t, bob, stored)
	for _, u := range b.historyURLs() {
		require.NotContains(t, u, "token=", "a history entry keeps a token")
	}

	// A fragment without a token (the skip link's) changes nothing.
	// The test's listener runs after the page's, which was added first.
	var clicked bool
	b.eval(`(() => { window.__hashed = false; addEventListener('hashchange', () => { window.__hashed = true; }, { once: true });
		document.querySelector('.skip').click(); return true; })()`, &clicked)
	b.waitFor("the skip link's fragment", `window.__hashed && location.hash === '#main'`)
	var who string
	b.eval(`document.getElementById('who').textContent`, &who)
	require.Equal(t, "bob · "+org, who)
	b.noExceptions()
}

func TestInboxRefusesATokenThatCannotAnswer(t *testing.T) {
	s := newStack(t)
	s.toolCall(token(t, org, "agent"), "s1", map[string]any{"agent_id": agent, "tool_name": "shell"})
	bound, err := api.SignToken(secret, api.TokenSpec{OrgID: org, Sub: "carol", AgentID: agent, Roles: []string{"approver", "agent"}, TTL: time.Hour})
	require.NoError(t, err)
	noSub := signedToken(t, "", "approver")
	b := newBrowser(t)

	refused := func(t *testing.T, tok, why string) {
		t.Helper()
		b.run(chromedp.Navigate("about:blank"), chromedp.Navigate(s.http.URL+"/inbox#token="+tok))
		b.waitFor("the refusal", `document.getElementById('signin-error').textContent !== ''`)
		var text string
		var inboxHidden bool
		var stored any
		b.eval(`document.getElementById('signin-error').textContent`, &text)
		b.eval(`document.getElementById('inbox-view').hidden`, &inboxHidden)
		b.eval(`sessionStorage.getItem(`+js(inboxTokenKey)+`)`, &stored)
		require.Contains(t, text, why)
		require.Contains(t, text, "The inbox needs an approver token with a sub that is not bound to an agent.")
		require.True(t, inboxHidden, "the inbox is shown, with buttons that cannot work")
		require.Nil(t, stored, "the refused token is kept")
		for _, r := range b.sent() {
			require.NotContains(t, r.URL, "/v1/tool-approvals", "the page went on with a token it cannot use")
			require.NotContains(t, r.URL, "/v1/approvals/events", "the page went on with a token it cannot use")
		}
	}
	t.Run("an approver token bound to an agent", func(t *testing.T) {
		refused(t, bound, "This token is bound to agent "+agent+" (its agent_id claim), and a token bound to an agent never answers approvals")
	})
	t.Run("an approver token without sub", func(t *testing.T) {
		refused(t, noSub, "This token has no sub claim, and a token without sub never answers approvals")
	})

	t.Run("the event stream's 403 is shown with the server's reason", func(t *testing.T) {
		// The server's own refusal of the stream, answered to a token the
		// page accepts (as a proxy or a newer server might refuse it).
		r := s.call(http.MethodGet, "/v1/approvals/events", bound, nil)
		require.Equal(t, http.StatusForbidden, r.status, string(r.raw))
		detail, _ := r.body["detail"].(string)
		require.NotEmpty(t, detail)
		b.intercept("*/v1/approvals/events*", func(*fetch.EventRequestPaused) *fetch.FulfillRequestParams {
			return &fetch.FulfillRequestParams{ResponseCode: http.StatusForbidden, Body: r.raw,
				ResponseHeaders: []*fetch.HeaderEntry{{Name: "Content-Type", Value: "application/problem+json"}}}
		})
		b.run(chromedp.Navigate("about:blank"))
		b.openInbox(s.http.URL, signedToken(t, "dave", "approver"))
		b.waitFor("the stream refused", `document.getElementById('conn').dataset.state === 'failed'`)
		var text string
		b.eval(`document.getElementById('conn-text').textContent`, &text)
		require.Equal(t, "Live updates refused: "+detail, text)
	})
	b.noExceptions()
}

// A request whose names are as long as the server takes (a 230-character
// agent id, a 128-character tool name, a long session and input) stays in
// its card: the page is never wider than the window, on a desktop or a
// phone. The policy legend ("And from now on, for <tool> by <agent>") did
// not wrap, and the page was 1936 px wide in a 1280 px window, the Agent
// filter stretched by the agent's name.
func TestInboxKeepsLongNamesInTheirCards(t *testing.T) {
	s := newStack(t)
	agentTok := signedToken(t, "runtime", "agent")
	approverTok := signedToken(t, "approver", "approver")
	longAgent := "longagent" + strings.Repeat("a", 221)
	longTool := strings.Repeat("t", 128)
	id := s.toolCall(agentTok, "session-"+strings.Repeat("s", 200), map[string]any{"agent_id": longAgent, "tool_name": longTool,
		"input": map[string]any{strings.Repeat("k", 120): strings.Repeat("v", 400)}})
	b := newBrowser(t)
	b.openInbox(s.http.URL, approverTok)
	b.waitFor("the long item", itemJS(id, "true"))
	require.Contains(t, b.itemText(id), "And from now on, for "+longTool+" by "+longAgent)

	// (the elements past the window's right edge, or their card's, named)
	const overflowing = `(() => {
		const out = [];
		const w = window.innerWidth;
		for (const e of document.querySelectorAll('body *')) {
			const r = e.getBoundingClientRect();
			if (r.width === 0 || e.closest('.sr-only')) continue;
			const card = e.closest('li.item');
			const edge = card && card !== e ? card.getBoundingClientRect().right : w;
			if (r.right > edge + 0.5) out.push(e.tagName.toLowerCase() + (e.className ? '.' + e.className : '') + ' ' + Math.round(r.right) + ' > ' + Math.round(edge));
		}
		return out.slice(0, 12);
	})()`
	for _, vp := range []struct {
		name          string
		width, height int64
	}{{"desktop", 1280, 800}, {"phone", 390, 844}} {
		t.Run(vp.name, func(t *testing.T) {
			b.run(chromedp.EmulateViewport(vp.width, vp.height))
			defer b.run(chromedp.EmulateViewport(1280, 800))
			var sizes struct{ Scroll, Inner, Select, Filters float64 }
			b.eval(`({scroll: document.documentElement.scrollWidth, inner: window.innerWidth,
				select: document.getElementById('filter-agent').getBoundingClientRect().width,
				filters: document.querySelector('.bar').getBoundingClientRect().width})`, &sizes)
			var wide []string
			b.eval(overflowing, &wide)
			// REVEILLE_LAYOUT_SHOTS=<dir> keeps a look at the card's top and its answer form.
			if dir := os.Getenv("REVEILLE_LAYOUT_SHOTS"); dir != "" {
				for _, shot := range []struct{ name, scroll string }{{"top", `window.scrollTo(0, 0)`}, {"form", `document.querySelector('fieldset.policy').scrollIntoView()`}} {
					var ignored any
					b.eval(shot.scroll, &ignored)
					ctx, cancel := context.WithTimeout(b.ctx, wait)
					png, err := chromedp.Run(ctx, chromedp.CaptureScreenshot())
					cancel()
					require.NoError(t, err)
					require.NoError(t, os.WriteFile(filepath.Join(dir, "inbox-long-"+vp.name+"-"+shot.name+".png"), png, 0o644))
				}
			}
			require.Empty(t, wide, "elements past their card or the window")
			require.LessOrEqual(t, sizes.Scroll, sizes.Inner, "the page is no wider than the window")
			require.LessOrEqual(t, sizes.Select, sizes.Filters, "the Agent filter fits its bar")
		})
	}
	b.noExceptions()
}

// On a focused request a approves and d denies, with the note and policy
// choice as they stand; from the request's own controls (a policy radio,
// the note, the Approve and Deny… buttons) the keys do nothing. A focused
// "Always allow" radio is not a selected one: a pressed there approved at
// once as "this call only", and the approver could not tell.
func TestInboxShortcutsComeFromTheRequestNotItsControls(t *testing.T) {
	s := newStack(t)
	agentTok := signedToken(t, "runtime", "agent")
	approverTok := signedToken(t, "approver", "approver")
	id := s.toolCall(agentTok, "s-keys", map[string]any{"agent_id": agent, "tool_name": "deploy"})
	b := newBrowser(t)
	b.openInbox(s.http.URL, approverTok)
	b.waitFor("the item", itemJS(id, "true"))

	answered := func() bool {
		for _, r := range b.sent() {
			if strings.Contains(r.URL, "/tool-approvals") && !strings.Contains(r.URL, "/v1/tool-approvals") {
				return true
			}
		}
		return false
	}
	for _, control := range []string{`[data-role="policy-always"]`, `[data-role="policy-never"]`, `[data-role="approve"]`, `[data-role="deny"]`, `[data-role="note"]`} {
		t.Run("not from "+control, func(t *testing.T) {
			b.run(chromedp.Focus(chromedp.CSS(itemSel(id)+" "+control)), chromedp.KeyEvent("a"))
			if control != `[data-role="note"]` {
				b.run(chromedp.KeyEvent("d"))
			}
			time.Sleep(300 * time.Millisecond) // (an answer would have been sent by now)
			var dialogOpen bool
			b.eval(`document.getElementById('confirm').open`, &dialogOpen)
			require.False(t, dialogOpen, "d opened the deny confirmation")
			require.False(t, answered(), "a key on a control answered")
			require.Contains(t, b.itemText(id), "Pending")
			var policy string
			b.eval(`document.querySelector(`+js(itemSel(id)+` input[type="radio"]:checked`)+`).value`, &policy)
			require.Empty(t, policy, "focus alone selects no policy")
		})
	}

	t.Run("from the request, with the policy selected", func(t *testing.T) {
		b.run(chromedp.Click(chromedp.CSS(itemSel(id)+` [data-role="policy-always"]`)),
			chromedp.Focus(chromedp.CSS(itemSel(id))), chromedp.KeyEvent("a"))
		b.waitStatus(id, "Approved")
		r := s.call(http.MethodGet, "/v1/agents/"+agent+"/tool-policies", token(t, org, "admin"), nil)
		require.Equal(t, http.StatusOK, r.status, string(r.raw))
		require.Contains(t, string(r.raw), `"approval":"always"`, "the selected policy was sent")
		require.Contains(t, string(r.raw), `"tool_name":"deploy"`)
	})
	b.noExceptions()
}

// A list that fails to load at sign-in (a replica restarting, a proxy's
// 502) loads again before the page follows live, as its banner says: the
// stream alone starts at the log's end (the page has no seq to resume
// from), and what was pending before the page opened never showed.
func TestInboxLoadsTheListAgainWhenItFailedAtSignIn(t *testing.T) {
	s := newStack(t)
	id := s.toolCall(token(t, org, "agent"), "s1", map[string]any{"agent_id": agent, "tool_name": "shell"})
	b := newBrowser(t)
	var failed atomic.Bool
	b.intercept("*/v1/tool-approvals?*", func(ev *fetch.EventRequestPaused) *fetch.FulfillRequestParams {
		if ev.Request.Method != http.MethodGet || !failed.CompareAndSwap(false, true) {
			return nil
		}
		return &fetch.FulfillRequestParams{ResponseCode: http.StatusServiceUnavailable,
			Body:            []byte(`{"type":"about:blank","title":"Service Unavailable","status":503,"detail":"restarting"}`),
			ResponseHeaders: []*fetch.HeaderEntry{{Name: "Content-Type", Value: "application/problem+json"}}}
	})
	b.run(chromedp.Navigate(s.http.URL + "/inbox#token=" + signedToken(t, "alice", "approver")))
	b.waitFor("the request pending since before the page opened", itemJS(id, "true"))
	b.waitFor("the live indicator", `document.getElementById('conn').dataset.state === 'live'`)
	require.True(t, failed.Load(), "the first list read failed")
	var banner string
	b.eval(`document.getElementById('banner').textContent`, &banner)
	require.NotContains(t, banner, "could not be loaded", "the list loaded, and the banner still says it did not")
	b.noExceptions()
}

// After a reset (retention purged events the page had not seen), what was
// answered meanwhile leaves Pending and shows in Resolved, which the page
// had loaded before: it reloaded Pending only, and the request was in
// neither tab.
func TestInboxShowsInResolvedWhatWasAnsweredAcrossAReset(t *testing.T) {
	s := newStack(t)
	id := s.toolCall(token(t, org, "agent"), "s1", map[string]any{"agent_id": agent, "tool_name": "shell"})
	b := newBrowser(t)
	var down atomic.Bool
	b.intercept("*/v1/approvals/events*", func(*fetch.EventRequestPaused) *fetch.FulfillRequestParams {
		if !down.Load() {
			return nil
		}
		return &fetch.FulfillRequestParams{ResponseCode: http.StatusServiceUnavailable}
	})
	b.openInbox(s.http.URL, signedToken(t, "alice", "approver"))
	b.waitFor("the pending request", itemJS(id, "true"))
	b.waitFor("the live indicator", `document.getElementById('conn').dataset.state === 'live'`)
	// The approver looks at Resolved once (nothing there yet), then back.
	b.run(chromedp.Click(chromedp.CSS(`#tab-resolved`)))
	b.waitFor("the resolved list", `document.getElementById('loading').hidden && !`+itemJS(id, "true"))
	b.run(chromedp.Click(chromedp.CSS(`#tab-pending`)))
	b.waitFor("the pending request again", itemJS(id, "true"))

	// The stream drops and stays down; meanwhile bob answers, and
	// retention purges the org's events.
	down.Store(true)
	s.http.CloseClientConnections()
	b.waitFor("the page to notice", `document.getElementById('conn').dataset.state !== 'live'`)
	r := s.call(http.MethodPost, "/v1/sessions/s1/tool-approvals", signedToken(t, "bob", "approver"),
		map[string]any{"approval_id": id, "decision": "approved"})
	require.Equal(t, http.StatusOK, r.status, string(r.raw))
	_, err := s.db.Exec(context.Background(), `DELETE FROM approval_events WHERE org_id = $1`, org)
	require.NoError(t, err)
	down.Store(false)
	b.waitFor("the request to leave Pending after the reset", `!`+itemJS(id, "true"))
	b.waitFor("the live indicator", `document.getElementById('conn').dataset.state === 'live'`)

	b.run(chromedp.Click(chromedp.CSS(`#tab-resolved`)))
	b.waitFor("the request bob answered, in Resolved", itemJS(id, `el.textContent.includes('Approved by bob')`))
	b.noExceptions()
}

// A sign-in that fails for want of the server (a replica restarting, a
// proxy's 502) is not the token's fault: the page keeps the token, even
// across a reload, and signs in by itself once the server answers. It used
// to drop the token on any failure, so a reload during a restart signed
// the approver out.
func TestInboxKeepsItsTokenThroughASignInTheServerCouldNotAnswer(t *testing.T) {
	s := newStack(t)
	id := s.toolCall(token(t, org, "agent"), "s1", map[string]any{"agent_id": agent, "tool_name": "shell"})
	b := newBrowser(t)
	var whoamis atomic.Int64
	b.intercept("*/v1/whoami*", func(*fetch.EventRequestPaused) *fetch.FulfillRequestParams {
		if whoamis.Add(1) > 2 {
			return nil
		}
		return &fetch.FulfillRequestParams{ResponseCode: http.StatusBadGateway,
			Body:            []byte(`{"type":"about:blank","title":"Bad Gateway","status":502,"detail":"upstream restarting"}`),
			ResponseHeaders: []*fetch.HeaderEntry{{Name: "Content-Type", Value: "application/problem+json"}}}
	})
	tok := signedToken(t, "alice", "approver")
	b.run(chromedp.Navigate(s.http.URL + "/inbox#token=" + tok))
	b.waitFor("the failed sign-in", `document.getElementById('signin-error').textContent.includes('Trying again')`)
	var stored string
	b.eval(`sessionStorage.getItem(`+js(inboxTokenKey)+`) || ''`, &stored)
	require.Equal(t, tok, stored, "the token is kept")

	b.run(chromedp.Reload()) // the approver reloads while the server is still down
	b.waitFor("the signed-in inbox", `!document.getElementById('inbox-view').hidden`)
	b.waitFor("the pending request", itemJS(id, "true"))
	require.EqualValues(t, 3, whoamis.Load(), "two refusals, then the sign-in that worked")
	b.noExceptions()
}
