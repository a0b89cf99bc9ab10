package tests

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/input"
	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/chromedp"
	"github.com/chromedp/chromedp/kb"

	"sandboxd/tests/e2e"
)

// hostileName is a file name and a line of output that a page which put workload text into
// innerHTML would run as a script.
const hostileName = `<img src=x onerror="window.__pwned=1">`

// TestDashboard drives the built-in dashboard at / in a real headless Chromium against the built
// sandboxd on runsc: the key comes in the URL fragment and never reaches a URL the browser
// requests; the page lists a sandbox the test created, shows its state change live when the
// test stops it through REST (no reload), runs a command and shows its output, opens a shell
// in xterm.js over the terminal WebSocket, and shows hostile file names and output as text
// (no element made of them, no script run). The pages break no rule of their Content Security
// Policy, load nothing from another origin, and another tenant's key lists nothing of this
// tenant. GraphiQL at /graphiql loads from the server alone and introspects /graphql.
// SANDBOXD_DASHBOARD_SCREENSHOT names a PNG to write the dashboard's screenshot to (README's
// docs/dashboard.png).
func TestDashboard(t *testing.T) {
	browser := chromiumPath(t)
	s := e2e.StartServer(t, e2e.ServerOptions{})
	sb := s.Create(t, `{"labels":{"suite":"dashboard"}}`, e2e.HdrDev)
	id := sb.SandboxID
	s.Upload(t, id, url.QueryEscape(hostileName), []byte("hostile\n"), e2e.HdrDev)

	// The browser reaches the server through a TCP proxy the test can cut, as a network would.
	px := newCutProxy(t, s.Addr)
	base := "http://" + px.addr
	rec := &browserRecord{base: base}
	ctx := newBrowser(t, browser, rec)

	e2e.Step(t, "key_from_fragment", func(t *testing.T) {
		do(t, ctx, chromedp.Navigate(base+"/#key="+url.QueryEscape(e2e.KeyDev)),
			chromedp.WaitVisible(chromedp.CSS(`#sandboxes[data-loaded="true"]`)))
		href := eval[string](t, ctx, `location.href`)
		stored := eval[string](t, ctx, `sessionStorage.getItem('sandboxd.apiKey')`)
		if strings.Contains(href, e2e.KeyDev) || href != base+"/" {
			t.Errorf("got location %q, want %s/ without the key", href, base)
		}
		if stored != e2e.KeyDev {
			t.Errorf("got the stored key %q, want the fragment's", stored)
		}
	})

	row := fmt.Sprintf(`tr[data-sandbox-id=%q]`, id)
	e2e.Step(t, "lists_the_sandbox", func(t *testing.T) {
		do(t, ctx, chromedp.WaitVisible(chromedp.CSS(row+` [data-state="RUNNING"]`)))
		labels := text(t, ctx, row+` .labels`)
		if !strings.Contains(labels, "suite=dashboard") {
			t.Errorf("got labels %q, want suite=dashboard", labels)
		}
		waitText(t, ctx, `#quota-text`, "1 in use")
	})

	var created string // the sandbox the page creates
	e2e.Step(t, "creates_from_the_page", func(t *testing.T) {
		do(t, ctx,
			chromedp.SendKeys(chromedp.CSS(`#create-labels`), "team=web, tier=dev"),
			chromedp.Click(chromedp.CSS(`#create-form button[type="submit"]`)),
			chromedp.WaitVisible(chromedp.CSS(`#sandboxes tbody tr:nth-child(2)`)),
		)
		created = eval[string](t, ctx, `document.querySelector('#sandboxes tbody tr:first-child').dataset.sandboxId`)
		if created == id || !e2e.SandboxIDPattern.MatchString(created) {
			t.Fatalf("got the newest row %q, want the new sandbox above %s", created, id)
		}
		s.Track(created, e2e.HdrDev)
		do(t, ctx, chromedp.WaitVisible(chromedp.CSS(fmt.Sprintf(`tr[data-sandbox-id=%q] [data-state="RUNNING"]`, created))))
		var got struct {
			State  string            `json:"state"`
			Labels map[string]string `json:"labels"`
		}
		s.Curl(t, http.MethodGet, e2e.Prefix+"/"+created, nil, e2e.HdrDev).Decode(t, &got)
		if got.State != "RUNNING" || got.Labels["team"] != "web" || got.Labels["tier"] != "dev" {
			t.Errorf("got %s %v through REST, want RUNNING with the page's labels", got.State, got.Labels)
		}
		waitText(t, ctx, `#quota-text`, "2 in use")
	})

	e2e.Step(t, "runs_a_command", func(t *testing.T) {
		do(t, ctx,
			chromedp.Click(chromedp.CSS(row)),
			chromedp.Click(chromedp.CSS(`button[data-tab="Run"]`)),
			chromedp.WaitEnabled(chromedp.CSS(`#run-command`)),
			chromedp.SendKeys(chromedp.CSS(`#run-command`), `printf 'hello from %s\n' dashboard; echo "$0" >&2; cat /workspace/*onerror*; echo '`+hostileName+`'`),
			chromedp.Click(chromedp.CSS(`#run-button`)),
		)
		out := waitText(t, ctx, `#run-output`, "exit 0")
		for _, want := range []string{"hello from dashboard", "sh\n", "hostile\n", hostileName + "\n"} {
			if !strings.Contains(out, want) {
				t.Errorf("got output %q, want it to hold %q", out, want)
			}
		}
		if s := waitText(t, ctx, `#run-status`, "exit 0"); !strings.Contains(s, "exec_") {
			t.Errorf("got status %q, want the exec id and its exit", s)
		}
		if rec.screenshotPath != "" {
			png, err := chromedp.Run(ctx, chromedp.CaptureScreenshot())
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(rec.screenshotPath, png, 0o644); err != nil {
				t.Fatal(err)
			}
		}
	})

	// A command that floods its output: the page keeps the newest 512 Ki characters of it.
	e2e.Step(t, "output_flood_is_bounded", func(t *testing.T) {
		before := text(t, ctx, `#run-status`)
		eval[bool](t, ctx, `(() => { const i = document.querySelector('#run-command'); i.value = '';
			i.dispatchEvent(new Event('input', { bubbles: true })); return true })()`)
		do(t, ctx,
			chromedp.SendKeys(chromedp.CSS(`#run-command`), `yes 0123456789abcdef | head -c 2000000; echo; echo flood-end`),
			chromedp.Click(chromedp.CSS(`#run-button`)),
		)
		e2e.Eventually(t, 30*time.Second, "the flood's exit", func() (bool, string) {
			st := text(t, ctx, `#run-status`)
			return st != before && strings.Contains(st, "exit 0"), st
		})
		out := waitText(t, ctx, `#run-output`, "exit 0")
		if !strings.Contains(out, "flood-end") || len(out) > 512<<10+256 {
			t.Errorf("got %d characters ending %q, want at most 512 KiB and the newest output", len(out), out[max(0, len(out)-40):])
		}
		if eval[string](t, ctx, `document.querySelector('#run-output').dataset.dropped ?? ''`) != "true" {
			t.Error("the output view did not mark that it dropped older output")
		}
	})

	e2e.Step(t, "terminal", func(t *testing.T) {
		do(t, ctx,
			chromedp.Click(chromedp.CSS(`button[data-tab="Terminal"]`)),
			chromedp.Click(chromedp.CSS(`#terminal-open`)),
			chromedp.WaitVisible(chromedp.CSS(`.xterm-helper-textarea`)),
		)
		waitText(t, ctx, `#terminal-status`, "attached")
		// Typed as an input method would (Input.insertText: xterm.js takes it once), then Enter.
		do(t, ctx, chromedp.Focus(chromedp.CSS(`.xterm-helper-textarea`)))
		if _, err := chromedp.Call(ctx, input.InsertText, input.InsertTextParams{Text: "echo term-$((6*7))"}); err != nil {
			t.Fatal(err)
		}
		do(t, ctx, chromedp.KeyEvent(kb.Enter))
		waitText(t, ctx, `.xterm-rows`, "term-42")
	})

	e2e.Step(t, "hostile_file_name_is_text", func(t *testing.T) {
		do(t, ctx, chromedp.Click(chromedp.CSS(`button[data-tab="Files"]`)))
		waitText(t, ctx, `#files`, hostileName)
		do(t, ctx, chromedp.Click(chromedp.CSS(`#files tr[data-path*="onerror"] button.link`)))
		if got := waitText(t, ctx, `#file-content`, "hostile"); got != "hostile\n" {
			t.Errorf("got the file's content %q, want %q", got, "hostile\n")
		}
		if got := text(t, ctx, `#file-content`); got != "hostile\n" {
			t.Errorf("got %q", got)
		}
	})

	e2e.Step(t, "state_change_live", func(t *testing.T) {
		eval[bool](t, ctx, `window.__noReload = true`)
		s.Curl(t, http.MethodPost, e2e.Prefix+"/"+id+"/stop", nil, e2e.HdrDev).Want(t, http.StatusOK)
		start := time.Now()
		do(t, ctx, chromedp.WaitVisible(chromedp.CSS(row+` [data-state="STOPPED"]`)))
		t.Logf("STOPPED shown %s after the stop answered", time.Since(start).Round(time.Millisecond))
		if !eval[bool](t, ctx, `window.__noReload === true`) {
			t.Error("the page was reloaded, want the state shown live")
		}
		waitText(t, ctx, `#quota-text`, "1 in use") // the page's sandbox still runs
	})

	// The page's connection drops, and the sandbox starts again meanwhile: graphql-ws redials,
	// subscribes again after the last cursor it saw (not from "now"), and the page shows the
	// events it missed.
	e2e.Step(t, "resumes_after_a_drop", func(t *testing.T) {
		rec.mu.Lock()
		sentBefore := len(rec.sent)
		rec.mu.Unlock()
		px.cut(true)
		waitText(t, ctx, `#connection`, "connecting")
		s.Curl(t, http.MethodPost, e2e.Prefix+"/"+id+"/start", nil, e2e.HdrDev).Want(t, http.StatusOK)
		px.cut(false)
		do(t, ctx, chromedp.WaitVisible(chromedp.CSS(row+` [data-state="RUNNING"]`)))
		waitText(t, ctx, `#connection`, "live")
		rec.mu.Lock()
		defer rec.mu.Unlock()
		resumed := false
		for _, f := range rec.sent[sentBefore:] {
			if strings.Contains(f, `"type":"subscribe"`) && strings.Contains(f, "sandboxEvents") && strings.Contains(f, `"after":"`) {
				resumed = true
			}
		}
		if !resumed {
			t.Errorf("the page did not subscribe to sandboxEvents again after a cursor; it sent %q", rec.sent[sentBefore:])
		}
	})

	e2e.Step(t, "snapshots", func(t *testing.T) {
		do(t, ctx, chromedp.Click(chromedp.CSS(row)), chromedp.Click(chromedp.CSS(`button[data-tab="Snapshots"]`)))
		waitText(t, ctx, `#snapshots`, "snap_") // the stop's
		before := eval[int](t, ctx, `document.querySelectorAll('#snapshots tbody tr').length`)
		do(t, ctx, chromedp.Click(chromedp.CSS(`#snapshot-take`)))
		e2e.Eventually(t, 30*time.Second, "the new snapshot in the list", func() (bool, string) {
			n := eval[int](t, ctx, `document.querySelectorAll('#snapshots tbody tr').length`)
			return n == before+1 && strings.Contains(text(t, ctx, `#snapshots tbody tr:first-child`), "latest"), fmt.Sprint(n, " rows")
		})
	})

	// The test image has no agent binary: the run the page starts is FAILED at once, and says why.
	e2e.Step(t, "agent_run", func(t *testing.T) {
		do(t, ctx,
			chromedp.Click(chromedp.CSS(`button[data-tab="Agents"]`)),
			chromedp.SendKeys(chromedp.CSS(`.agent-form input.grow`), "test/model"),
			chromedp.SendKeys(chromedp.CSS(`.agent-form textarea`), "say hello"),
			chromedp.Click(chromedp.CSS(`.agent-form button[type="submit"]`)),
		)
		e2e.Eventually(t, 30*time.Second, "the run's status", func() (bool, string) {
			return strings.Contains(text(t, ctx, `#agent-status`), "FAILED"), text(t, ctx, `#agent-status`) + " " + text(t, ctx, `#errors`)
		})
		st := text(t, ctx, `#agent-status`)
		if !strings.Contains(st, "run_") || !strings.Contains(st, "opencode") {
			t.Errorf("got %q, want the run, its agent and why it failed", st)
		}
		waitText(t, ctx, `.runs`, "run_")
	})

	// Pause is offered on a RUNNING sandbox; a server without pauseSandbox answers
	// GRAPHQL_VALIDATION_FAILED, which the page shows; one with it pauses the sandbox.
	e2e.Step(t, "pause_or_the_servers_error", func(t *testing.T) {
		crow := fmt.Sprintf(`tr[data-sandbox-id=%q]`, created)
		do(t, ctx, chromedp.Click(chromedp.CSS(crow+` button[data-action="pauseSandbox"]`)))
		e2e.Eventually(t, 30*time.Second, "the pause's answer on the page", func() (bool, string) {
			errs := text(t, ctx, `#errors`)
			state := eval[string](t, ctx, fmt.Sprintf(`document.querySelector(%q)?.dataset.state ?? ''`, crow+` [data-state]`))
			return strings.Contains(errs, "pauseSandbox") || state == "PAUSED", fmt.Sprintf("errors %q, state %s", errs, state)
		})
	})

	e2e.Step(t, "no_script_ran_no_policy_broken", func(t *testing.T) {
		pwned := eval[bool](t, ctx, `window.__pwned !== undefined`)
		imgs := eval[int](t, ctx, `document.querySelectorAll('#app img').length`)
		if pwned || imgs != 0 {
			t.Errorf("got window.__pwned set %v and %d img elements, want hostile text shown as text", pwned, imgs)
		}
		rec.check(t, ctx)
	})

	e2e.Step(t, "another_tenant_sees_nothing", func(t *testing.T) {
		other := openTab(t, ctx, rec) // a new tab: its own session storage
		do(t, other, chromedp.Navigate(base+"/#key="+url.QueryEscape(e2e.KeyTenant2)),
			chromedp.WaitVisible(chromedp.CSS(`#sandboxes[data-loaded="true"]`)))
		hint := text(t, other, `.list .hint`)
		rows := eval[int](t, other, `document.querySelectorAll('#sandboxes tbody tr').length`)
		if rows != 0 || !strings.Contains(hint, "No sandboxes") {
			t.Errorf("tenant2 sees %d rows (%q), want none of dev's", rows, hint)
		}
	})

	e2e.Step(t, "bad_key_back_to_the_form", func(t *testing.T) {
		other := openTab(t, ctx, rec)
		do(t, other, chromedp.Navigate(base+"/#key=not-a-key"), chromedp.WaitVisible(chromedp.CSS(`#key-form`)))
		msg := waitText(t, other, `p.error`, "key")
		if !strings.Contains(msg, "refused the key") {
			t.Errorf("got %q, want the key form saying the server refused the key", msg)
		}
	})

	e2e.Step(t, "graphiql_embedded", func(t *testing.T) {
		gctx := openTab(t, ctx, rec)
		do(t, gctx,
			chromedp.Navigate(base+"/graphiql#key="+url.QueryEscape(e2e.KeyDev)),
			chromedp.WaitVisible(chromedp.CSS(`.graphiql-container`)),
		)
		// GraphiQL introspects the schema on load: the docs explorer then lists Query.
		do(t, gctx, chromedp.Click(chromedp.CSS(`button[aria-label="Show Documentation Explorer"]`)))
		waitText(t, gctx, `.graphiql-doc-explorer`, "Query")
		rec.check(t, gctx)
	})
}

// chromiumPath is SANDBOXD_CHROMIUM, else chromium on PATH (Debian's package; scripts/test.sh
// installs it). Without one the test skips, or fails under CI=true.
func chromiumPath(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("SANDBOXD_CHROMIUM"); p != "" {
		return p
	}
	if p, err := exec.LookPath("chromium"); err == nil {
		return p
	}
	const why = "no chromium: apt-get install chromium, or set SANDBOXD_CHROMIUM (scripts/test.sh installs it)"
	if e2e.InCI() {
		t.Fatalf("%s; CI=true makes this a failure", why)
	}
	t.Skip("skipping the dashboard's browser test: " + why)
	return ""
}

// browserRecord keeps what the browser did that the test checks at the end: every URL it
// requested or opened a WebSocket to, policy violations, script errors.
type browserRecord struct {
	base           string // the server's URL as the browser knows it
	mu             sync.Mutex
	urls           []string
	sent           []string // the text frames the pages sent on WebSockets
	screenshotPath string
}

func (r *browserRecord) add(list *[]string, s string) {
	r.mu.Lock()
	*list = append(*list, s)
	r.mu.Unlock()
}

// check fails t when the page of the tab broke its policy or threw, or the browser sent the
// key in a URL or reached anything but the server.
func (r *browserRecord) check(t *testing.T, tab context.Context) {
	t.Helper()
	problems := eval[[]string](t, tab, `window.__problems ?? ['the watch did not run']`)
	for _, p := range problems {
		t.Errorf("browser: %s", p)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, u := range r.urls {
		if strings.Contains(u, e2e.KeyDev) || strings.Contains(u, url.QueryEscape(e2e.KeyDev)) {
			t.Errorf("the key is in a URL the browser requested: %s", u)
		}
		if !strings.HasPrefix(u, r.base+"/") && !strings.HasPrefix(u, "ws"+strings.TrimPrefix(r.base, "http")+"/") && !strings.HasPrefix(u, "data:") && !strings.HasPrefix(u, "blob:") {
			t.Errorf("the browser reached beyond the server: %s", u)
		}
	}
	if len(r.urls) == 0 {
		t.Error("recorded no request of the browser")
	}
}

// newBrowser starts a headless Chromium (its own profile, ended with the test) and answers
// its first tab (see openTab).
func newBrowser(t *testing.T, path string, rec *browserRecord) context.Context {
	t.Helper()
	rec.screenshotPath = os.Getenv("SANDBOXD_DASHBOARD_SCREENSHOT")
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(path),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1440, 900),
		chromedp.NoSandbox, // the tests run as root
		chromedp.Flag("disable-gpu", true),
	)
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	tctx, cancelTimeout := context.WithTimeout(actx, 2*time.Minute)
	t.Cleanup(func() {
		cancelTimeout()
		cancelAlloc()
	})
	return openTab(t, tctx, rec)
}

// openTab opens a tab (with its own session storage) that records in rec every request and
// WebSocket, and in its page's window.__problems every Content Security Policy violation and
// uncaught script error.
func openTab(t *testing.T, parent context.Context, rec *browserRecord) context.Context {
	t.Helper()
	var opts []chromedp.ContextOption
	if chromedp.FromContext(parent) == nil { // the browser's first tab
		opts = append(opts, chromedp.WithErrorf(t.Logf))
	}
	ctx, cancel := chromedp.NewContext(parent, opts...)
	t.Cleanup(cancel)
	if err := chromedp.Listen(ctx, func(ev any) {
		switch e := ev.(type) {
		case *network.EventRequestWillBeSent:
			rec.add(&rec.urls, e.Request.URL)
		case *network.EventWebSocketCreated:
			rec.add(&rec.urls, e.URL)
		case *network.EventWebSocketFrameSent:
			if e.Response != nil && e.Response.Opcode == 1 {
				rec.add(&rec.sent, string(e.Response.PayloadData))
			}
		}
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := chromedp.Call(ctx, network.Enable, network.EnableParams{}); err != nil {
		t.Fatal(err)
	}
	if _, err := chromedp.Call(ctx, page.AddScriptToEvaluateOnNewDocument, page.AddScriptToEvaluateOnNewDocumentParams{Source: violationWatch}); err != nil {
		t.Fatal(err)
	}
	return ctx
}

// violationWatch runs in every page before its own scripts: it keeps what the page broke.
const violationWatch = `(() => {
  window.__problems = [];
  document.addEventListener('securitypolicyviolation', (e) =>
    window.__problems.push('CSP ' + e.violatedDirective + ' blocked ' + (e.blockedURI || 'inline') + ' at ' + e.sourceFile + ':' + e.lineNumber));
  window.addEventListener('error', (e) => window.__problems.push('error: ' + e.message));
  window.addEventListener('unhandledrejection', (e) => window.__problems.push('unhandled rejection: ' + String(e.reason)));
})();`

func do(t *testing.T, ctx context.Context, steps ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	if err := chromedp.Do(ctx, steps...); err != nil {
		t.Fatal(err)
	}
}

func eval[T any](t *testing.T, ctx context.Context, expr string) T {
	t.Helper()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[T](expr))
	if err != nil {
		t.Fatalf("%s: %v", expr, err)
	}
	return v
}

// text is the text content of the first element sel selects, "" when there is none.
func text(t *testing.T, ctx context.Context, sel string) string {
	t.Helper()
	return eval[string](t, ctx, fmt.Sprintf(`document.querySelector(%q)?.textContent ?? ''`, sel))
}

// waitText waits until the element's text holds want and answers it.
func waitText(t *testing.T, ctx context.Context, sel, want string) string {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		got := text(t, ctx, sel)
		if strings.Contains(got, want) {
			return got
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: got %q, want it to hold %q", sel, got, want)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// cutProxy forwards TCP connections to a server; cut(true) closes every open one and refuses
// new ones until cut(false), as a network that fails would.
type cutProxy struct {
	addr string
	mu   sync.Mutex
	down bool
	open map[net.Conn]bool
}

func newCutProxy(t *testing.T, backend string) *cutProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &cutProxy{addr: ln.Addr().String(), open: map[net.Conn]bool{}}
	var wg sync.WaitGroup
	t.Cleanup(func() {
		ln.Close()
		p.cut(true)
		wg.Wait()
	})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			b, err := net.Dial("tcp", backend)
			if err != nil || !p.track(c, b) {
				c.Close()
				if b != nil {
					b.Close()
				}
				continue
			}
			wg.Add(2)
			pipe := func(dst, src net.Conn) {
				defer wg.Done()
				_, _ = io.Copy(dst, src)
				dst.Close()
				src.Close()
				p.mu.Lock()
				delete(p.open, dst)
				delete(p.open, src)
				p.mu.Unlock()
			}
			go pipe(b, c)
			go pipe(c, b)
		}
	}()
	return p
}

// track records a proxied pair, unless the proxy is cut.
func (p *cutProxy) track(c, b net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.down {
		return false
	}
	p.open[c], p.open[b] = true, true
	return true
}

func (p *cutProxy) cut(down bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.down = down
	if down {
		for c := range p.open {
			c.Close()
		}
	}
}
