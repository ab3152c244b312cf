package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/chromedp/cdproto/accessibility"
	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/dom"
	"github.com/chromedp/cdproto/emulation"
	"github.com/chromedp/cdproto/fetch"
	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"
)

// chromiumNames are the executables a headless Chromium may be found as.
var chromiumNames = []string{"chromium", "chromium-browser", "google-chrome", "google-chrome-stable"}

// findChromium returns the browser's path, or fails the test: the browser
// tests are part of the suite and never skip (.ci/run installs Debian's
// chromium package when it is missing).
func findChromium(t *testing.T) string {
	t.Helper()
	for _, name := range chromiumNames {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	t.Fatalf("no Chromium on PATH (looked for %s): the inbox browser tests need one — apt-get install -y chromium", strings.Join(chromiumNames, ", "))
	return ""
}

// sentRequest is a request the page made, as the browser sent it.
type sentRequest struct {
	URL     string
	Headers map[string]string
}

// browser is one headless Chromium tab, shared by a test function's steps.
// It records every request the page makes and every uncaught exception.
type browser struct {
	t   *testing.T
	ctx context.Context
	tmp string    // the browser's TMPDIR, removed when the test ends
	cmd *exec.Cmd // the browser's process

	mu         sync.Mutex
	requests   map[network.RequestID]*sentRequest
	order      []network.RequestID
	exceptions []string
	fulfill    func(*fetch.EventRequestPaused) *fetch.FulfillRequestParams // see intercept
	lose       func(*fetch.EventRequestPaused) bool                        // see loseResponses
}

// browserStarts is how many times newBrowser starts Chromium when it
// crashes before it is up: Debian's Chromium (148) sometimes dies of a
// segmentation fault at start, roughly one start in fifty to two hundred
// on this machine (in two CI runs of the suite, and in a loop of starts
// outside the tests), before it opens DevTools. That is the browser's
// fault, not the page's: a start that crashed is made again, and said
// so; any other failure to start fails the test at once.
const browserStarts = 3

func newBrowser(t *testing.T) *browser {
	t.Helper()
	path := findChromium(t)
	b := &browser{t: t, requests: map[network.RequestID]*sentRequest{}}
	for attempt := 1; ; attempt++ {
		crashed, err := b.start(path)
		if err == nil {
			return b
		}
		if !crashed || attempt == browserStarts {
			require.NoError(t, err, "starting Chromium (start %d of at most %d)", attempt, browserStarts)
		}
		t.Logf("Chromium crashed as it started, starting it again: %v", err)
	}
}

// start starts a browser at path and opens its tab as b's; crashed says
// that the browser's process died of a signal before it was up.
func (b *browser) start(path string) (crashed bool, err error) {
	var cmd *exec.Cmd // the browser's process, to say how it ended if it does not start
	// Chromium leaves a directory of its own in $TMPDIR (its singleton
	// socket) when it is killed, as chromedp stops it: one in /tmp per
	// browser started, hundreds a day on a CI machine. Its own TMPDIR,
	// removed once the browser is reaped, keeps /tmp clean. (Not the
	// test's TempDir: under a long test name the socket's path passes the
	// 108 bytes a Unix socket may have, and Chromium stops on a CHECK.)
	tmp, err := os.MkdirTemp("", "e2e-chromium-")
	if err != nil {
		return false, err
	}
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(path),
		chromedp.NoSandbox, // CI runs as root, where Chromium's sandbox refuses to start
		chromedp.WindowSize(1280, 800),
		chromedp.Flag("lang", "en-US"),
		chromedp.Env("TMPDIR="+tmp),
		chromedp.ModifyCmdFunc(func(c *exec.Cmd) {
			cmd = c
			// What chromedp's own hook (which this one replaces) does: the
			// browser dies with the test binary (a -timeout panic, a kill),
			// rather than run on orphaned.
			c.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		}),
	)
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	// The listener is on before the tab's first command, so it sees every
	// request the page makes.
	ctx, cancel := chromedp.NewContext(allocCtx, chromedp.WithListener(b.observe))
	// The first Run starts the browser, which lives as long as its context:
	// no timeout on it.
	err = chromedp.Do(ctx, chromedp.Func(func(ctx context.Context, tgt *chromedp.Target) error {
		_, err := cdp.Call(ctx, tgt, network.Enable, network.EnableParams{})
		return err
	}), chromedp.EmulateViewport(1280, 800))
	// stop stops the browser, waits until it is reaped, then removes its
	// files; it returns how the browser ended (nil: it never ran)
	stop := func() *os.ProcessState {
		state := browserExit(allocCtx, cancelAlloc, cmd)
		_ = os.RemoveAll(tmp)
		return state
	}
	if err != nil {
		cancel()
		state := stop()
		if state == nil {
			return false, err
		}
		ws, _ := state.Sys().(syscall.WaitStatus)
		return ws.Signaled(), fmt.Errorf("%w (Chromium, process %d, ended: %s)", err, state.Pid(), state)
	}
	b.t.Cleanup(func() { stop() })
	b.t.Cleanup(cancel)
	b.ctx, b.tmp, b.cmd = ctx, tmp, cmd
	return false, nil
}

// browserExit stops the browser's allocator and waits for it, which reaps
// the process, and returns how the browser ended (its exit status or
// signal: for a browser that failed to start, chromedp reports only what
// it printed, which may be nothing), or nil if it never ran. Only after
// the wait is cmd's state safe to read.
func browserExit(allocCtx context.Context, cancelAlloc context.CancelFunc, cmd *exec.Cmd) *os.ProcessState {
	cancelAlloc()
	if c := chromedp.FromContext(allocCtx); c != nil && c.Allocator != nil {
		c.Allocator.Wait()
	}
	if cmd == nil {
		return nil
	}
	return cmd.ProcessState
}

func (b *browser) observe(ev any) {
	b.mu.Lock()
	defer b.mu.Unlock()
	switch ev := ev.(type) {
	case *network.EventRequestWillBeSent:
		r := b.request(ev.RequestID)
		r.URL = ev.Request.URL // without the fragment, as it goes on the wire
		for k, v := range ev.Request.Headers {
			r.Headers[strings.ToLower(k)] = fmt.Sprint(v)
		}
	case *network.EventRequestWillBeSentExtraInfo:
		// The headers as sent, cookies included.
		r := b.request(ev.RequestID)
		for k, v := range ev.Headers {
			r.Headers[strings.ToLower(k)] = fmt.Sprint(v)
		}
	case *fetch.EventRequestPaused:
		if b.lose != nil {
			// (paused at the response: the server has answered)
			lost := b.lose(ev)
			go func() {
				if lost {
					_, _ = chromedp.Call(b.ctx, fetch.FailRequest, fetch.FailRequestParams{RequestID: ev.RequestID, ErrorReason: network.ErrorReasonConnectionReset})
				} else {
					_, _ = chromedp.Call(b.ctx, fetch.ContinueRequest, fetch.ContinueRequestParams{RequestID: ev.RequestID})
				}
			}()
			break
		}
		if b.fulfill != nil {
			params := b.fulfill(ev)
			// Not on the listener's goroutine, which delivers the answer.
			if params == nil {
				go func() {
					_, _ = chromedp.Call(b.ctx, fetch.ContinueRequest, fetch.ContinueRequestParams{RequestID: ev.RequestID})
				}()
				break
			}
			params.RequestID = ev.RequestID
			go func() { _, _ = chromedp.Call(b.ctx, fetch.FulfillRequest, *params) }()
		}
	case *runtime.EventExceptionThrown:
		d := ev.ExceptionDetails
		text := d.Text
		if d.Exception != nil {
			text += " " + d.Exception.Description
		}
		b.exceptions = append(b.exceptions, text)
	}
}

func (b *browser) request(id network.RequestID) *sentRequest {
	r, ok := b.requests[id]
	if !ok {
		r = &sentRequest{Headers: map[string]string{}}
		b.requests[id] = r
		b.order = append(b.order, id)
	}
	return r
}

// sent returns the requests made so far, in order.
func (b *browser) sent() []sentRequest {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := make([]sentRequest, 0, len(b.order))
	for _, id := range b.order {
		r := b.requests[id]
		h := make(map[string]string, len(r.Headers))
		for k, v := range r.Headers {
			h[k] = v
		}
		out = append(out, sentRequest{URL: r.URL, Headers: h})
	}
	return out
}

// run runs actions in the tab, failing the test on error.
func (b *browser) run(actions ...chromedp.Action[chromedp.Void]) {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, wait)
	defer cancel()
	if err := chromedp.Do(ctx, actions...); err != nil {
		require.NoError(b.t, err, b.diagnose())
	}
}

// eval evaluates a JavaScript expression into out (a pointer), through
// JSON so that out may be any type.
func (b *browser) eval(js string, out any) {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, wait)
	defer cancel()
	raw, err := chromedp.Run(ctx, chromedp.Evaluate[string](`JSON.stringify((() => (`+js+`))()) ?? 'null'`))
	require.NoError(b.t, err, b.diagnose())
	require.NoError(b.t, json.Unmarshal([]byte(raw), out), raw)
}

// waitFor waits until the JavaScript expression is truthy in the page
// (polled on each animation frame); what names the condition on failure.
func (b *browser) waitFor(what, js string) {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, wait)
	defer cancel()
	for {
		_, err := chromedp.Run(ctx, chromedp.Poll[chromedp.Void](js, chromedp.WithPollingTimeout(wait)))
		if err == nil {
			return
		}
		if !contextGone(err) || ctx.Err() != nil {
			require.NoError(b.t, err, "waiting for %s\n%s", what, b.diagnose())
		}
		select {
		case <-ctx.Done():
		case <-time.After(pollEvery):
		}
	}
}

// contextGone says a poll went to the page's JavaScript context that a
// navigation replaced: chromedp learns of the new one from an event that,
// on a busy machine, comes after Navigate has returned, so the poll just
// after it fails ("Cannot find context with specified id"). Sent again, it
// reaches the new context.
func contextGone(err error) bool {
	msg := err.Error()
	return strings.Contains(msg, "Cannot find context with specified id") || strings.Contains(msg, "Execution context was destroyed")
}

// diagnose describes the page for a failure message.
func (b *browser) diagnose() string {
	ctx, cancel := context.WithTimeout(b.ctx, 5*time.Second)
	defer cancel()
	text, _ := chromedp.Run(ctx, chromedp.Evaluate[string](`(document.body ? document.body.innerText : '') + '\nURL: ' + location.href`))
	b.mu.Lock()
	defer b.mu.Unlock()
	return "page text:\n" + text + "\nexceptions: " + strings.Join(b.exceptions, "; ")
}

// intercept answers the page's requests whose URL matches pattern (* is
// any text) with what fulfill returns, instead of sending them; a request
// for which it returns nil goes to the server.
func (b *browser) intercept(pattern string, fulfill func(*fetch.EventRequestPaused) *fetch.FulfillRequestParams) {
	b.t.Helper()
	b.mu.Lock()
	b.fulfill = fulfill
	b.mu.Unlock()
	b.run(chromedp.Func(func(ctx context.Context, tgt *chromedp.Target) error {
		_, err := cdp.Call(ctx, tgt, fetch.Enable, fetch.EnableParams{Patterns: []*fetch.RequestPattern{{URLPattern: pattern}}})
		return err
	}))
}

// loseResponses lets the page's requests whose URL matches pattern reach
// the server, and loses the answers for which lose returns true: the
// connection is reset after the server answered, as when a network drops a
// response.
func (b *browser) loseResponses(pattern string, lose func(*fetch.EventRequestPaused) bool) {
	b.t.Helper()
	b.mu.Lock()
	b.lose = lose
	b.mu.Unlock()
	b.run(chromedp.Func(func(ctx context.Context, tgt *chromedp.Target) error {
		_, err := cdp.Call(ctx, tgt, fetch.Enable, fetch.EnableParams{Patterns: []*fetch.RequestPattern{{URLPattern: pattern, RequestStage: fetch.RequestStageResponse}}})
		return err
	}))
}

// noExceptions requires that the page threw nothing uncaught.
func (b *browser) noExceptions() {
	b.t.Helper()
	b.mu.Lock()
	defer b.mu.Unlock()
	require.Empty(b.t, b.exceptions, "uncaught exceptions in the page")
}

// screenshot saves the viewport at width×height as a PNG to path (relative
// to the repository root) when REVEILLE_SCREENSHOTS=1, so CI leaves the
// tree as it found it; it restores the desktop viewport afterwards.
func (b *browser) screenshot(path string, width, height int64) {
	b.t.Helper()
	if os.Getenv("REVEILLE_SCREENSHOTS") != "1" {
		return
	}
	b.run(chromedp.EmulateViewport(width, height))
	ctx, cancel := context.WithTimeout(b.ctx, wait)
	defer cancel()
	png, err := chromedp.Run(ctx, chromedp.CaptureScreenshot())
	require.NoError(b.t, err)
	b.run(chromedp.EmulateViewport(1280, 800))
	require.NoError(b.t, os.WriteFile("../../"+path, png, 0o644))
	b.t.Logf("wrote %s", path)
}

// axNode is an element as the accessibility tree shows it to a screen
// reader: its computed role and name.
type axNode struct {
	Role, Name string
	Ignored    bool
}

// accessible returns the accessibility node of the element the JavaScript
// expression yields, and that of its nearest ancestor the tree does not
// ignore (a zero axNode when there is none).
func (b *browser) accessible(expr string) (node, parent axNode) {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, wait)
	defer cancel()
	value := func(v *accessibility.Value) string {
		if v == nil || len(v.Value) == 0 {
			return ""
		}
		var s string
		_ = json.Unmarshal(v.Value, &s)
		return s
	}
	err := chromedp.Do(ctx, chromedp.Func(func(ctx context.Context, tgt *chromedp.Target) error {
		res, err := cdp.Call(ctx, tgt, runtime.Evaluate, runtime.EvaluateParams{Expression: expr})
		if err != nil {
			return err
		}
		if res.Result == nil || res.Result.ObjectID == "" {
			return fmt.Errorf("%s is not an element", expr)
		}
		obj := runtime.RemoteObjectID(res.Result.ObjectID)
		dn, err := cdp.Call(ctx, tgt, dom.DescribeNode, dom.DescribeNodeParams{ObjectID: obj})
		if err != nil {
			return err
		}
		tree, err := cdp.Call(ctx, tgt, accessibility.GetPartialAXTree, accessibility.GetPartialAXTreeParams{ObjectID: obj})
		if err != nil {
			return err
		}
		byID := map[accessibility.NodeID]*accessibility.Node{}
		var n *accessibility.Node
		for _, x := range tree.Nodes {
			byID[x.NodeID] = x
			if x.BackendDOMNodeID == dn.Node.BackendNodeID {
				n = x
			}
		}
		if n == nil {
			return fmt.Errorf("%s has no accessibility node", expr)
		}
		node = axNode{Role: value(n.Role), Name: value(n.Name), Ignored: n.Ignored}
		for p := byID[n.ParentID]; p != nil; p = byID[p.ParentID] {
			if !p.Ignored && value(p.Role) != "generic" && value(p.Role) != "none" {
				parent = axNode{Role: value(p.Role), Name: value(p.Name)}
				break
			}
		}
		return nil
	}))
	require.NoError(b.t, err, b.diagnose())
	return node, parent
}

// colorScheme emulates prefers-color-scheme (light or dark).
func (b *browser) colorScheme(scheme string) {
	b.t.Helper()
	b.run(chromedp.Func(func(ctx context.Context, tgt *chromedp.Target) error {
		_, err := cdp.Call(ctx, tgt, emulation.SetEmulatedMedia, emulation.SetEmulatedMediaParams{
			Features: []*emulation.MediaFeature{{Name: "prefers-color-scheme", Value: scheme}}})
		return err
	}))
}

// js quotes a Go string as a JavaScript string literal, as the page's
// JSON.stringify writes it (no HTML escapes).
func js(s string) string {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(s)
	return strings.TrimSuffix(buf.String(), "\n")
}

// TestABrowserThatCrashesAsItStartsIsToldFromOneThatFails: only a browser
// killed by a signal before it is up counts as crashed (and is started
// again); one that exits on its own is a failure to report, and both say
// how the process ended.
func TestABrowserThatCrashesAsItStartsIsToldFromOneThatFails(t *testing.T) {
	for _, tc := range []struct {
		name, script, ended string
		crashed             bool
	}{
		{"a segmentation fault is a crash", "kill -SEGV $$", "signal: segmentation fault", true},
		{"an exit status is a failure", "echo 'no display' >&2; exit 1", "exit status 1", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "browser")
			require.NoError(t, os.WriteFile(path, []byte("#!/bin/sh\n"+tc.script+"\n"), 0o755))
			b := &browser{t: t, requests: map[network.RequestID]*sentRequest{}}
			crashed, err := b.start(path)
			require.Error(t, err)
			require.Equal(t, tc.crashed, crashed)
			require.ErrorContains(t, err, "chrome failed to start")
			require.ErrorContains(t, err, "ended: "+tc.ended)
		})
	}
}

// TestABrowserLeavesNothingBehind: Chromium's own temporary files (which
// it leaves when it is killed, as chromedp stops it) go to a temporary
// directory of its own, and the browser is stopped and reaped, and that
// directory removed, when its test ends.
func TestABrowserLeavesNothingBehind(t *testing.T) {
	var b *browser
	if !t.Run("a browser", func(t *testing.T) {
		b = newBrowser(t)
		own, err := filepath.Glob(filepath.Join(b.tmp, "org.chromium.Chromium.*"))
		require.NoError(t, err)
		require.NotEmpty(t, own, "Chromium's temporary files are in the TMPDIR it was given")
	}) {
		return
	}
	require.NotNil(t, b.cmd.ProcessState, "the browser was reaped when its test ended")
	_, err := os.Stat(b.tmp)
	require.ErrorIs(t, err, fs.ErrNotExist, "the browser's TMPDIR is removed when its test ends")
}
