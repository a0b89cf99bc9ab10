package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// The stream suite: a command's stdout followed live, through the execOutput subscription
// (GraphQL over a WebSocket) and through REST Server-Sent Events, next to a bare
// `runsc exec` whose stdout is a pipe the benchmark reads.

// gqlExecStartMutation starts a command without waiting for it (wait: false).
const gqlExecStartMutation = `mutation($id: ID!, $cmd: [String!]!) {
  exec(sandboxId: $id, input: {command: $cmd, timeoutSec: 600}, wait: false) { exec { execId } }
}`

// gqlExecOutputSubscription follows a command's output from its start to its EXIT event.
const gqlExecOutputSubscription = `subscription($id: ID!) {
  execOutput(execId: $id) { kind stream dataBase64 result { exitCode signal timedOut error outputBytes } }
}`

// streamHead is how much of each output stream a run keeps, to check a small output and to
// show in errors.
const streamHead = 4 << 10

// streamRun is what one followed command delivered.
type streamRun struct {
	// first is the time from the request to the first stdout bytes; total to the exit.
	first, total time.Duration
	// stdoutBytes counts stdout; stdout and stderr keep their first streamHead bytes.
	stdoutBytes    int64
	stdout, stderr []byte
	exit           execResult
	exited         bool
	// outputBytes is what the exit says the command wrote (stdout and stderr), -1 unknown.
	outputBytes int64
	// data is the buffer a REST chunk's data_base64 is decoded into, reused (output keeps a
	// copy of the head only).
	data []byte
}

// output records one piece of output of stream ("stdout" or "stderr") received at elapsed.
func (r *streamRun) output(stream string, data []byte, elapsed time.Duration) error {
	switch stream {
	case "stdout", "STDOUT":
		if len(data) > 0 && r.stdoutBytes == 0 {
			r.first = elapsed
		}
		r.stdoutBytes += int64(len(data))
		r.stdout = appendHead(r.stdout, data)
	case "stderr", "STDERR":
		r.stderr = appendHead(r.stderr, data)
	default:
		return fmt.Errorf("output of unknown stream %q", stream)
	}
	return nil
}

func appendHead(head, data []byte) []byte {
	return append(head, data[:min(len(data), streamHead-len(head))]...)
}

// check fails unless the command exited 0 having written exactly wantBytes to stdout (and,
// when wantStdout is not "", exactly that).
func (r *streamRun) check(wantBytes int64, wantStdout string) error {
	if !r.exited {
		return errors.New("the stream ended without the exit")
	}
	if err := r.exit.check(""); err != nil {
		return fmt.Errorf("%w (stderr %q)", err, r.stderr)
	}
	if r.stdoutBytes != wantBytes {
		return fmt.Errorf("got %d bytes of stdout, want %d; the exit reports %d bytes of output (-1: unknown), stderr %q",
			r.stdoutBytes, wantBytes, r.outputBytes, r.stderr)
	}
	if wantStdout != "" && string(r.stdout) != wantStdout {
		return fmt.Errorf("got stdout %q, want %q", r.stdout, wantStdout)
	}
	return nil
}

// ---- GraphQL over the WebSocket ----

type gqlExecOutputEvent struct {
	Kind   string  `json:"kind"`
	Stream *string `json:"stream"`
	// DataBase64 is decoded by execOutputEvent (splitDataBase64), else by encoding/json
	// ([]byte is base64 in JSON).
	DataBase64 []byte `json:"dataBase64"`
	Result     *struct {
		ExitCode    *int    `json:"exitCode"`
		Signal      *string `json:"signal"`
		TimedOut    bool    `json:"timedOut"`
		Error       *string `json:"error"`
		OutputBytes *int64  `json:"outputBytes"`
	} `json:"result"`
}

// execStream sends the exec mutation with wait: false on w, subscribes to the command's
// execOutput and follows it to the EXIT event, timed from sending the mutation. The
// subscription's complete is awaited after the timing.
func (w *wsConn) execStream(ctx context.Context, sandboxID string, argv []string) (*streamRun, error) {
	mutation, _ := json.Marshal(map[string]any{"query": gqlExecStartMutation, "variables": map[string]any{"id": sandboxID, "cmd": argv}})
	r := &streamRun{outputBytes: -1}
	t0 := time.Now()
	op, err := w.subscribe(ctx, mutation)
	if err != nil {
		return r, err
	}
	payload, err := w.answer(ctx, op)
	if err != nil {
		return r, err
	}
	var started struct {
		Payload *struct {
			Exec struct {
				ExecID string `json:"execId"`
			} `json:"exec"`
		} `json:"exec"`
	}
	if err := gqlData(payload, &started); err != nil {
		return r, err
	}
	if started.Payload == nil || started.Payload.Exec.ExecID == "" {
		return r, fmt.Errorf("exec(wait: false) answered %s: no execId", payload)
	}
	sub, _ := json.Marshal(map[string]any{"query": gqlExecOutputSubscription, "variables": map[string]any{"id": started.Payload.Exec.ExecID}})
	if op, err = w.subscribe(ctx, sub); err != nil {
		return r, err
	}
	for !r.exited {
		ev, err := w.execOutputEvent(ctx, op)
		if err != nil {
			return r, fmt.Errorf("execOutput of %s: %w", started.Payload.Exec.ExecID, err)
		}
		elapsed := time.Since(t0)
		switch ev.Kind {
		case "CHUNK":
			if ev.Stream == nil {
				return r, errors.New("CHUNK without stream")
			}
			if err := r.output(*ev.Stream, ev.DataBase64, elapsed); err != nil {
				return r, err
			}
		case "TRUNCATED":
			return r, fmt.Errorf("execOutput of %s: TRUNCATED after %d bytes of stdout", started.Payload.Exec.ExecID, r.stdoutBytes)
		case "EXIT":
			r.total, r.exited = elapsed, true
			if res := ev.Result; res != nil {
				if res.ExitCode != nil {
					r.exit.ExitCode = *res.ExitCode
				}
				r.exit.Signal, r.exit.Error, r.exit.TimedOut = deref(res.Signal), deref(res.Error), res.TimedOut
				if res.OutputBytes != nil {
					r.outputBytes = *res.OutputBytes
				}
			} else {
				r.exit.Error = "EXIT event without result"
			}
		default:
			return r, fmt.Errorf("execOutput: unknown event kind %q", ev.Kind)
		}
	}
	return r, w.complete(ctx, op)
}

// execOutputEvent reads the next event of subscription op; pings are answered and the
// messages of other operations skipped. The benchmark's CPU is the server's CPU on a small
// machine, so a chunk's data is taken out of the message (splitDataBase64) and base64-decoded
// straight into a reused buffer, and encoding/json decodes the rest of the message, which is
// small: the whole message is still checked, the data by the base64 decoder.
func (w *wsConn) execOutputEvent(ctx context.Context, op string) (*gqlExecOutputEvent, error) {
	for {
		_, b, err := w.c.Read(ctx)
		if err != nil {
			return nil, fmt.Errorf("websocket read: %w", err)
		}
		b, data64 := splitBase64(b, gqlDataKey)
		var m struct {
			ID      string `json:"id"`
			Type    string `json:"type"`
			Payload struct {
				Data *struct {
					ExecOutput *gqlExecOutputEvent `json:"execOutput"`
				} `json:"data"`
				Errors []struct {
					Message string `json:"message"`
				} `json:"errors"`
			} `json:"payload"`
		}
		if err := json.Unmarshal(b, &m); err != nil {
			// An error message's payload is a list of errors.
			var raw wsMsg
			if json.Unmarshal(b, &raw) == nil && raw.ID == op && raw.Type == "error" {
				return nil, fmt.Errorf("websocket operation %s: error %s", op, raw.Payload)
			}
			if raw.ID != op && raw.ID != "" {
				continue
			}
			return nil, fmt.Errorf("websocket: decoding %.300q: %w", b, err)
		}
		switch {
		case m.Type == "ping":
			if err := w.write(ctx, wsMsg{Type: "pong"}); err != nil {
				return nil, err
			}
		case m.ID != op:
		case m.Type == "complete":
			return nil, errors.New("complete before the EXIT event")
		case m.Type != "next":
			return nil, fmt.Errorf("unexpected message %.300q", b)
		case len(m.Payload.Errors) > 0:
			return nil, fmt.Errorf("GraphQL error: %s", m.Payload.Errors[0].Message)
		case m.Payload.Data == nil || m.Payload.Data.ExecOutput == nil:
			return nil, fmt.Errorf("next without execOutput: %.300q", b)
		default:
			ev := m.Payload.Data.ExecOutput
			if data64 != nil {
				if w.data, err = base64.StdEncoding.AppendDecode(w.data[:0], data64); err != nil {
					return nil, fmt.Errorf("execOutput dataBase64: %w", err)
				}
				ev.DataBase64 = w.data
			}
			return ev, nil
		}
	}
}

// The keys that start a chunk's base64 data: in an execOutput message, in a REST chunk event.
var (
	gqlDataKey  = []byte(`"dataBase64":"`)
	restDataKey = []byte(`"data_base64":"`)
)

// splitBase64 returns msg with the string that key starts emptied, and that string's content
// (nil when msg has none). Base64 needs no JSON escape, so the string ends at the next quote.
func splitBase64(msg, key []byte) (rest, data []byte) {
	i := bytes.Index(msg, key)
	if i < 0 {
		return msg, nil
	}
	start := i + len(key)
	end := bytes.IndexByte(msg[start:], '"')
	if end < 0 {
		return msg, nil
	}
	// A new slice for the rest: data still points into msg.
	return append(msg[:start:start], msg[start+end:]...), msg[start : start+end]
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// gqlData decodes a GraphQL answer's data into out; an error in the answer fails.
func gqlData(payload []byte, out any) error {
	var a gqlAnswer
	if err := json.Unmarshal(payload, &a); err != nil {
		return fmt.Errorf("decoding GraphQL answer %q: %w", payload, err)
	}
	if len(a.Errors) > 0 {
		return fmt.Errorf("GraphQL error: %s", a.Errors[0].Message)
	}
	if err := json.Unmarshal(a.Data, out); err != nil {
		return fmt.Errorf("decoding GraphQL data %q: %w", a.Data, err)
	}
	return nil
}

// ---- REST Server-Sent Events ----

// sseExec posts an exec with Accept: text/event-stream and reads its events (started, chunk…,
// exit) to the end of the response, timed from sending the request to the exit event.
func (c *client) sseExec(ctx context.Context, id string, body []byte) (*streamRun, error) {
	path := restPrefix + "/" + url.PathEscape(id) + "/exec"
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.base+path, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("X-Api-Key", c.key)
	req.Header.Set("Accept", "text/event-stream")
	req.Header.Set("Content-Type", "application/json")
	r := &streamRun{outputBytes: -1}
	t0 := time.Now()
	resp, err := c.http.Do(req)
	if err != nil {
		return r, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		data, _ := io.ReadAll(resp.Body)
		return r, fmt.Errorf("POST %s (Accept: text/event-stream): %s: %w", path, resp.Header.Get("Content-Type"),
			&apiError{Status: resp.StatusCode, Body: string(data)})
	}
	err = readSSE(bufio.NewReaderSize(resp.Body, 256<<10), func(event string, data []byte) error {
		return r.sseEvent(event, data, time.Since(t0))
	})
	if err != nil {
		return r, fmt.Errorf("POST %s (Accept: text/event-stream): %w", path, err)
	}
	return r, nil
}

// sseEvent records one event of a REST exec's event stream received at elapsed.
func (r *streamRun) sseEvent(event string, data []byte, elapsed time.Duration) error {
	switch event {
	case "started":
	case "chunk":
		// The base64 data is cut out and decoded straight into a reused buffer; encoding/json
		// decodes the rest (execOutputEvent does the same).
		rest, data64 := splitBase64(data, restDataKey)
		var ch struct {
			Stream     string  `json:"stream"`
			Data       *string `json:"data"`
			DataBase64 *string `json:"data_base64"`
		}
		if err := json.Unmarshal(rest, &ch); err != nil {
			return fmt.Errorf("chunk %.200q: %w", rest, err)
		}
		var out []byte
		var err error
		switch {
		case ch.Data != nil && ch.DataBase64 == nil:
			out = []byte(*ch.Data)
		case ch.DataBase64 != nil && ch.Data == nil:
			if data64 == nil {
				data64 = []byte(*ch.DataBase64)
			}
			if r.data, err = base64.StdEncoding.AppendDecode(r.data[:0], data64); err != nil {
				return fmt.Errorf("chunk data_base64: %w", err)
			}
			out = r.data
		default:
			return fmt.Errorf("chunk with neither or both of data and data_base64: %.200q", data)
		}
		return r.output(ch.Stream, out, elapsed)
	case "exit":
		if r.exited {
			return errors.New("a second exit event")
		}
		r.total, r.exited = elapsed, true
		var exit struct {
			execResult
			OutputBytes *int64 `json:"output_bytes"`
		}
		if err := json.Unmarshal(data, &exit); err != nil {
			return fmt.Errorf("exit %q: %w", data, err)
		}
		r.exit = exit.execResult
		if exit.OutputBytes != nil {
			r.outputBytes = *exit.OutputBytes
		}
	case "truncated":
		return fmt.Errorf("truncated event after %d bytes of stdout: %s", r.stdoutBytes, data)
	case "error":
		return fmt.Errorf("error event: %s", data)
	default:
		return fmt.Errorf("unknown event %q: %.200q", event, data)
	}
	return nil
}

// curlExec runs `curl -sS -N` posting an exec with Accept: text/event-stream, its output into
// a file, timed from starting curl to its exit (after the server ended the stream with the
// exit event). The file is then read untimed, every event checked as sseExec checks them.
func (c *client) curlExec(ctx context.Context, curl, dir, id string, body []byte) (*streamRun, error) {
	out := filepath.Join(dir, "curl-stream.out")
	defer os.Remove(out)
	u := c.base + restPrefix + "/" + url.PathEscape(id) + "/exec"
	cmd := exec.CommandContext(ctx, curl, "-sS", "-N", "-o", out, "-w", "%{http_code} %{content_type}",
		"-H", "X-Api-Key: "+c.key, "-H", "Accept: text/event-stream", "-H", "Content-Type: application/json",
		"--data-binary", string(body), u)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	r := &streamRun{outputBytes: -1}
	t0 := time.Now()
	err := cmd.Run()
	total := time.Since(t0)
	if err != nil {
		return r, fmt.Errorf("curl -N %s: %w (stderr %q)", u, err, stderr.Bytes())
	}
	if status := stdout.String(); !strings.HasPrefix(status, "200 text/event-stream") {
		data, _ := os.ReadFile(out)
		return r, fmt.Errorf("curl -N %s: answered %s: %.300q", u, status, data)
	}
	f, err := os.Open(out)
	if err != nil {
		return r, err
	}
	defer f.Close()
	if err := readSSE(bufio.NewReaderSize(f, 256<<10), func(event string, data []byte) error {
		return r.sseEvent(event, data, total)
	}); err != nil {
		return r, fmt.Errorf("curl -N %s: %w", u, err)
	}
	r.total = total
	return r, nil
}

// readSSE calls on for each event of an event stream until its end; comments are skipped.
func readSSE(rd *bufio.Reader, on func(event string, data []byte) error) error {
	var (
		event   string
		data    []byte
		hasData bool
		long    []byte
	)
	for {
		line, err := rd.ReadSlice('\n')
		if errors.Is(err, bufio.ErrBufferFull) {
			long = append(long[:0], line...)
			for errors.Is(err, bufio.ErrBufferFull) {
				line, err = rd.ReadSlice('\n')
				long = append(long, line...)
			}
			line = long
		}
		if err == io.EOF && len(line) == 0 {
			return nil
		}
		if err != nil && err != io.EOF {
			return err
		}
		line = bytes.TrimSuffix(bytes.TrimSuffix(line, []byte("\n")), []byte("\r"))
		switch {
		case len(line) == 0:
			if hasData {
				if event == "" {
					event = "message"
				}
				if err := on(event, data); err != nil {
					return err
				}
			}
			event, data, hasData = "", data[:0], false
		case line[0] == ':':
		default:
			field, value, _ := bytes.Cut(line, []byte(":"))
			value = bytes.TrimPrefix(value, []byte(" "))
			switch string(field) {
			case "event":
				event = string(value)
			case "data":
				if hasData {
					data = append(data, '\n')
				}
				data, hasData = append(data, value...), true
			}
		}
		if err == io.EOF {
			return nil
		}
	}
}

// ---- bare ----

// bareStream runs `runsc <flags> exec <id> <argv…>` with stdout on a pipe that it reads to
// the end, timed from starting runsc to its exit.
func (b *bench) bareStream(ctx context.Context, flags []string, id string, argv []string) (*streamRun, error) {
	args := append(append(append([]string{}, flags...), "exec", id), argv...)
	cmd := exec.CommandContext(ctx, b.runsc, args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	r := &streamRun{outputBytes: -1}
	buf := make([]byte, 64<<10)
	t0 := time.Now()
	if err := cmd.Start(); err != nil {
		return r, err
	}
	for {
		n, err := out.Read(buf)
		if n > 0 {
			_ = r.output("stdout", buf[:n], time.Since(t0))
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
			return r, fmt.Errorf("reading runsc exec's stdout: %w", err)
		}
	}
	err = cmd.Wait()
	r.total, r.exited = time.Since(t0), true
	r.stderr = appendHead(r.stderr, stderr.Bytes())
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		r.exit.ExitCode = ee.ExitCode()
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			r.exit.Signal = ws.Signal().String()
		}
	case err != nil:
		return r, fmt.Errorf("runsc exec %s %v: %w", id, argv, err)
	}
	return r, nil
}

// isRedisServer reports whether a process's first argument is redis-server's (which retitles
// itself "/usr/bin/redis-server unixsocket:…").
func isRedisServer(arg0 string) bool {
	prog, _, _ := strings.Cut(arg0, " ")
	return filepath.Base(prog) == "redis-server"
}

// cpuMeter sums the CPU used around each run of a path.
type cpuMeter struct {
	runs  int
	total cpuSnap
}

func (m *cpuMeter) add(before, after cpuSnap) {
	m.runs++
	m.total.sandboxd += after.sandboxd - before.sandboxd
	m.total.redis += after.redis - before.redis
	m.total.box += after.box - before.box
	m.total.self += after.self - before.self
}

func (m *cpuMeter) String() string {
	if m.runs == 0 {
		return "no runs"
	}
	n := time.Duration(m.runs)
	return fmt.Sprintf("sandboxd %s, its embedded redis-server %s, sandbox processes %s, benchmark %s", fmtDuration(m.total.sandboxd/n),
		fmtDuration(m.total.redis/n), fmtDuration(m.total.box/n), fmtDuration(m.total.self/n))
}

// ---- the suite ----

// streamPath is one way of following a command's output.
type streamPath struct {
	res *Result
	run func(ctx context.Context, argv []string) (*streamRun, error)
	cpu cpuMeter
}

// benchStream: a command's stdout followed live through the execOutput subscription (GraphQL
// over a WebSocket) and through REST Server-Sent Events, next to a bare runsc exec whose stdout
// is a pipe the benchmark reads: the throughput of a large output and the first byte of a
// small one.
func benchStream(ctx context.Context, b *bench) (groups []*Group, err error) {
	mb := max(b.opts.streamMB, 1)
	curlBin, _ := exec.LookPath("curl")
	n := int64(mb) << 20
	tp := &Group{Name: fmt.Sprintf("stdout throughput, %d MiB (`head -c %d /dev/zero`)", mb, n)}
	fb := &Group{Name: "first byte of stdout (`echo x`)"}
	groups = []*Group{tp, fb}

	id, _, err := b.createSandbox(ctx)
	defer b.finishSandbox(id, &err)
	if err != nil {
		return groups, fmt.Errorf("creating the sandbox: %w", err)
	}
	skip := b.bareSkipReason()
	var flags []string
	if skip == "" {
		if flags, err = b.containerFlags(id); err != nil {
			return groups, err
		}
	}
	ws, err := b.api.dialWS(ctx)
	if err != nil {
		return groups, err
	}
	defer ws.close()

	paths := func(g *Group, gqlLabel, restLabel, bareLabel string) []*streamPath {
		ps := []*streamPath{
			{res: g.result(gqlLabel, false),
				run: func(ctx context.Context, argv []string) (*streamRun, error) { return ws.execStream(ctx, id, argv) }},
			{res: g.result(restLabel, false),
				run: func(ctx context.Context, argv []string) (*streamRun, error) {
					return b.api.sseExec(ctx, id, execBody(argv, ""))
				}},
		}
		bare := &streamPath{res: g.result(bareLabel, true),
			run: func(ctx context.Context, argv []string) (*streamRun, error) {
				return b.bareStream(ctx, flags, id, argv)
			}}
		if skip != "" {
			bare.res.Skipped = skip
		} else {
			ps = append(ps, bare)
		}
		return ps
	}
	steps := func(ps []*streamPath, argv []string, wantBytes int64, wantStdout string, sample func(*streamRun) time.Duration) []step {
		var out []step
		for _, p := range ps {
			out = append(out, step{p.res, func(ctx context.Context) (time.Duration, error) {
				before := b.cpuSnapshot(id)
				r, err := p.run(ctx, argv)
				p.cpu.add(before, b.cpuSnapshot(id))
				if err == nil {
					err = r.check(wantBytes, wantStdout)
				}
				if err != nil {
					return 0, err
				}
				return sample(r), nil
			}})
		}
		return out
	}
	cpuNote := func(ps []*streamPath) string {
		var parts []string
		for _, p := range ps {
			parts = append(parts, fmt.Sprintf("%s: %s", p.res.Label, p.cpu.String()))
		}
		return strings.Join(parts, "; ")
	}

	// Throughput: to the exit, every byte counted.
	tpPaths := paths(tp, "GraphQL WebSocket: exec(wait: false) + execOutput → EXIT",
		"REST POST …/exec, Accept: text/event-stream → exit event", "bare runsc exec, stdout on a pipe → exit")
	argv := []string{"head", "-c", strconv.FormatInt(n, 10), "/dev/zero"}
	// curl -N on the same REST stream, the way a person at a terminal follows it.
	curlPath := &streamPath{res: tp.result("curl -N, REST POST …/exec, Accept: text/event-stream → curl's exit", false),
		run: func(ctx context.Context, argv []string) (*streamRun, error) {
			return b.api.curlExec(ctx, curlBin, b.tmp, id, execBody(argv, ""))
		}}
	// Its row goes before the bare one, beside the REST row.
	rs := tp.Results
	copy(rs[3:], rs[2:len(rs)-1])
	rs[2] = curlPath.res
	if curlBin == "" {
		curlPath.res.Skipped = "curl is not on PATH"
	} else {
		tpPaths = append(tpPaths[:2], append([]*streamPath{curlPath}, tpPaths[2:]...)...)
	}
	err = interleave(ctx, tp.Name, min(b.opts.warmup, 1), b.opts.streamN, steps(tpPaths, argv, n, "", func(r *streamRun) time.Duration { return r.total }))
	for _, p := range tpPaths {
		if s := summarize(p.res.Samples); s.N > 0 {
			p.res.Rate, p.res.RateUnit = float64(n)/mib/s.Median.Seconds(), "MiB/s"
		}
	}
	tp.Note = fmt.Sprintf("one sandbox of the default profile; each run is timed from sending the request (the exec mutation, "+
		"the POST, starting runsc) to the exit (the EXIT event, the exit event, runsc's exit after the pipe's EOF), and every run "+
		"must deliver exactly %d bytes of stdout (a TRUNCATED event fails the run; the size stays below 64 MiB, the guest "+
		"init's cap on one exec's output log, 5-byte record headers included, past which output is dropped). The ours/bare column is the ratio of the "+
		"times; the throughput column is %d MiB over the median time, with its ratio ours/bare in parentheses (below 1: slower). "+
		"GraphQL: one graphql-transport-ws connection kept open, `exec(…, wait: false) { execId }` then "+
		"`execOutput(execId) { kind stream dataBase64 result {…} }`, the chunks base64-decoded by the benchmark; REST: the "+
		"chunk events' `data` (JSON text; NUL bytes travel as `\\u0000`, six bytes each) or `data_base64`, over a keep-alive "+
		"connection; curl: `curl -sS -N` with the same POST, its output into a file in the run's folder, timed to curl's exit, "+
		"the file's events checked afterwards, untimed, as the REST path checks them; bare: `runsc <the driver's global flags> exec <sandbox id> head -c …` on the same sandbox, stdout an os "+
		"pipe read 64 KiB at a time. CPU per run, including the warm-up: %s.", n, mb, cpuNote(tpPaths))
	if err != nil {
		return groups, err
	}

	// First byte: to the first stdout chunk; the rest of the stream is read untimed.
	fbPaths := paths(fb, "GraphQL WebSocket: exec(wait: false) + execOutput → first CHUNK",
		"REST POST …/exec, Accept: text/event-stream → first chunk event", "bare runsc exec → first byte of the pipe")
	// Its floor: echo x spawned inside the sandbox, to the first byte of its pipe (echo's own
	// start, its locale among it, is in every row alike; /bin/true's floor has none of it).
	fbFloor := fb.reference("floor: posix_spawn of /bin/echo x inside the sandbox, to the first byte of its stdout pipe")
	perRound := floorPerRound(b.opts.firstByteN)
	fbSteps := append(steps(fbPaths, []string{"echo", "x"}, 2, "x\n", func(r *streamRun) time.Duration { return r.first }),
		b.floorStep(id, floorFirst, fbFloor, b.opts.warmup, perRound))
	err = interleave(ctx, fb.Name, b.opts.warmup, b.opts.firstByteN, fbSteps)
	fb.Note = "the same sandbox and connections; GraphQL: from sending `exec(…, wait: false)` to the first CHUNK event of " +
		"`execOutput` subscribed right after its answer on the same WebSocket; REST: from sending the POST (Accept: " +
		"text/event-stream) to the end of the first chunk event; bare: from starting `runsc exec <sandbox id> echo x` to " +
		"the first byte read from its stdout pipe. Each stream is then read to its exit, untimed, and checked (`x\\n`, exit 0). " +
		"CPU per run (the whole command), including the warm-up: " + cpuNote(fbPaths) + "."
	if err == nil {
		fb.Note += " " + floorNote(fb, fbFloor, perRound, "`os.posix_spawn(\"/bin/echo\", [\"echo\", \"x\"])` with stdout on an "+
			"`os.pipe()`, timed to the first byte `os.read` returns (then read to its end and waited for, untimed),")
	}
	return groups, err
}
