package resolvers

import (
	"context"
	"encoding/base64"
	"os"
	"strings"
	"time"
	"unicode/utf8"

	"sandboxd/graph/model"
	"sandboxd/internal/api"
	"sandboxd/internal/apierror"
	"sandboxd/internal/auth"
	"sandboxd/internal/sandbox"
)

// This file converts GraphQL arguments to service requests (rejecting what the schema cannot
// express with INVALID_ARGUMENT) and service results to GraphQL models. Range checks of
// values (page sizes, timeouts, env sizes, mode bits) are the service's.

// maxReadFileBytes bounds readFile: larger files are PAYLOAD_TOO_LARGE (the REST download
// streams them).
const maxReadFileBytes = 10 << 20

// readLimit is readFile's maxBytes: 1 to maxReadFileBytes, the cap when null.
func readLimit(maxBytes *int64) (int64, error) {
	if maxBytes == nil {
		return maxReadFileBytes, nil
	}
	if *maxBytes < 1 || *maxBytes > maxReadFileBytes {
		return 0, apierror.New(apierror.InvalidArgument, "maxBytes must be between 1 and %d, got %d", maxReadFileBytes, *maxBytes)
	}
	return *maxBytes, nil
}

// Defaults of nullable arguments that were sent as an explicit null.
const (
	defaultPageSize    = 50
	defaultListEntries = 1000
)

func invalidArg(field, format string, args ...any) error {
	return apierror.New(apierror.InvalidArgument, format, args...).WithDetail("field", field)
}

// ---- arguments ----

func listOptions(first *int, after *string, state *model.SandboxState) (sandbox.ListOptions, error) {
	limit, err := pageSize(first)
	if err != nil {
		return sandbox.ListOptions{}, err
	}
	opts := sandbox.ListOptions{Limit: limit, After: deref(after)}
	if state != nil {
		opts.State = sandbox.State(*state)
	}
	return opts, nil
}

// pageSize is a page's size from first (null: the default); the service bounds it above.
func pageSize(first *int) (int, error) {
	if first == nil {
		return defaultPageSize, nil
	}
	if *first < 1 {
		return 0, invalidArg("first", "first must be at least 1, got %d", *first)
	}
	return *first, nil
}

func listDirArgs(path *string, first *int) (string, int, error) {
	p, limit := ".", defaultListEntries
	if path != nil && *path != "" {
		p = *path
	}
	if first != nil {
		if *first < 1 {
			return "", 0, invalidArg("first", "first must be at least 1, got %d", *first)
		}
		limit = *first
	}
	return p, limit, nil
}

func createRequest(in model.CreateSandboxInput) (sandbox.CreateRequest, error) {
	env, err := envMap("input.env", in.Env)
	if err != nil {
		return sandbox.CreateRequest{}, err
	}
	labels, err := labelMap("input.labels", in.Labels)
	if err != nil {
		return sandbox.CreateRequest{}, err
	}
	req := sandbox.CreateRequest{Profile: deref(in.Profile), AutostopSec: int64Ptr(in.AutostopSec),
		TTLSec: int64Ptr(in.TTLSec), Env: env, Labels: labels}
	if src := in.Source; src != nil {
		req.Source = &sandbox.Source{SnapshotID: deref(src.SnapshotID), ArchiveURL: deref(src.ArchiveURL), GCSPrefix: deref(src.GcsPrefix)}
	}
	if n := in.Network; n != nil {
		req.Network = &sandbox.NetworkRequest{Mode: strings.ToLower(string(n.Mode)), EgressAllow: n.EgressAllow, EgressDeny: n.EgressDeny}
	}
	if a := in.AutostopAction; a != nil {
		req.AutostopAction = strings.ToLower(string(*a))
	}
	req.AutoResume = in.AutoResume != nil && *in.AutoResume
	return req, nil
}

// toNetworkPolicy converts a sandbox's or a profile's network policy; lists are never null.
func toNetworkPolicy(p sandbox.NetworkPolicy) *model.NetworkPolicy {
	out := &model.NetworkPolicy{Mode: model.NetworkMode(strings.ToUpper(p.Mode)), EgressAllow: nonNilStrings(p.EgressAllow),
		EgressDeny: nonNilStrings(p.EgressDeny), AlwaysDeny: nonNilStrings(p.AlwaysDeny), DNSServers: nonNilStrings(p.DNSServers),
		Pinned: []*model.PinnedHost{}}
	if !out.Mode.IsValid() {
		out.Mode = model.NetworkModeNone
	}
	for _, h := range p.Pinned {
		out.Pinned = append(out.Pinned, &model.PinnedHost{Host: h.Host, Addresses: nonNilStrings(h.Addresses)})
	}
	return out
}

func nonNilStrings(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

// execRequest converts exec's arguments; wait false (not null) detaches.
func execRequest(in model.ExecInput, wait *bool) (sandbox.ExecRequest, error) {
	env, err := envMap("input.env", in.Env)
	if err != nil {
		return sandbox.ExecRequest{}, err
	}
	stdin, err := oneOf("input.stdin", in.Stdin, "input.stdinBase64", in.StdinBase64, false)
	if err != nil {
		return sandbox.ExecRequest{}, err
	}
	req := sandbox.ExecRequest{Command: in.Command, TimeoutSec: int64Ptr(in.TimeoutSec), Env: env,
		Cwd: deref(in.Cwd), Stdin: stdin, Detach: wait != nil && !*wait, StdinOpen: in.StdinOpen != nil && *in.StdinOpen}
	if in.Tty != nil {
		req.Tty = &sandbox.TtySize{Rows: in.Tty.Rows, Cols: in.Tty.Cols}
	}
	return req, nil
}

// execListOptions converts execs' arguments.
func execListOptions(state *model.ExecState, first *int, after *string) (sandbox.ExecListOptions, error) {
	limit, err := pageSize(first)
	if err != nil {
		return sandbox.ExecListOptions{}, err
	}
	opts := sandbox.ExecListOptions{Limit: limit, After: deref(after)}
	if state != nil {
		opts.State = sandbox.ExecState(*state)
	}
	return opts, nil
}

// oneOf returns the bytes of a text argument or of its base64 twin. Both set is
// INVALID_ARGUMENT; neither is too when required.
func oneOf(textName string, text *string, b64Name string, b64 *string, required bool) ([]byte, error) {
	switch {
	case text != nil && b64 != nil:
		return nil, invalidArg(b64Name, "send %s or %s, not both", textName, b64Name)
	case text != nil:
		return []byte(*text), nil
	case b64 != nil:
		data, err := base64.StdEncoding.DecodeString(*b64)
		if err != nil {
			return nil, invalidArg(b64Name, "%s is not valid base64 (standard alphabet, padded)", b64Name)
		}
		return data, nil
	case required:
		return nil, invalidArg(textName, "send exactly one of %s and %s", textName, b64Name)
	}
	return nil, nil
}

func fileMode(mode *int) (os.FileMode, error) {
	if mode == nil {
		return 0, nil
	}
	if *mode < 0 || *mode > 0o777 {
		return 0, invalidArg("mode", "mode must be permission bits between 0 and 511 (0777), got %d", *mode)
	}
	return os.FileMode(*mode), nil
}

// envMap turns a list of variables into the service's map; a name given twice is an error
// rather than a silent overwrite.
func envMap(field string, vars []*model.EnvVarInput) (map[string]string, error) {
	if vars == nil {
		return nil, nil
	}
	env := make(map[string]string, len(vars))
	for _, v := range vars {
		if _, dup := env[v.Name]; dup {
			return nil, invalidArg(field, "environment variable %q is given twice", v.Name)
		}
		env[v.Name] = v.Value
	}
	return env, nil
}

// ---- results ----

func toSandbox(s sandbox.Sandbox) *model.Sandbox {
	return &model.Sandbox{
		ID:             s.ID,
		TenantID:       s.Tenant,
		ProjectID:      s.Project,
		ProfileName:    s.Profile,
		State:          model.SandboxState(s.State),
		StateReason:    optString(s.StateReason),
		CreatedAt:      s.CreatedAt,
		StateChangedAt: s.StateChangedAt,
		AutostopSec:    int(s.AutostopSec),
		TTLSec:         int(s.TTLSec),
		ExpiresAt:      optTime(s.ExpiresAt()),
		AutostopAt:     optTime(s.AutostopAt),

		LatestSnapshotID: optString(s.LatestSnapshotID),
		Resources:        &model.Resources{MilliCPU: int(s.MilliCPU), MemoryBytes: s.MemoryBytes, DiskBytes: s.DiskBytes},
		Network:          s.Network,
		NetworkPolicy:    toNetworkPolicy(s.NetworkPolicy),
		Labels:           toLabels(s.Labels),
		AutostopAction:   autostopAction(s.AutostopAction),
		AutoResume:       s.AutoResume,
	}
}

// autostopAction is a sandbox's auto-stop action: PAUSE, or STOP for anything else.
func autostopAction(a string) model.AutostopAction {
	if a == sandbox.AutostopPause {
		return model.AutostopActionPause
	}
	return model.AutostopActionStop
}

// sandboxCursor is the list cursor of a sandbox: the service pages by sandbox id
// (ListOptions.After is the id of the last sandbox of the previous page).
func sandboxCursor(s sandbox.Sandbox) string { return s.ID }

func toConnection(page sandbox.Page) *model.SandboxConnection {
	c := &model.SandboxConnection{
		Edges:    make([]*model.SandboxEdge, len(page.Sandboxes)),
		Nodes:    make([]*model.Sandbox, len(page.Sandboxes)),
		PageInfo: &model.PageInfo{HasNextPage: page.NextCursor != ""},
	}
	for i, s := range page.Sandboxes {
		n := toSandbox(s)
		c.Nodes[i] = n
		c.Edges[i] = &model.SandboxEdge{Cursor: sandboxCursor(s), Node: n}
	}
	if len(c.Edges) > 0 {
		c.PageInfo.StartCursor = &c.Edges[0].Cursor
		end := c.Edges[len(c.Edges)-1].Cursor
		if page.NextCursor != "" {
			end = page.NextCursor
		}
		c.PageInfo.EndCursor = &end
	} else if page.NextCursor != "" {
		// A filtered page that found nothing before the scan's bound: go on after it.
		end := page.NextCursor
		c.PageInfo.EndCursor = &end
	}
	return c
}

// toExecConnection converts a page of execs; the cursor of an exec is its id.
func toExecConnection(page sandbox.ExecPage) *model.ExecConnection {
	c := &model.ExecConnection{
		Edges:    make([]*model.ExecEdge, len(page.Execs)),
		Nodes:    make([]*model.ExecResult, len(page.Execs)),
		PageInfo: &model.PageInfo{HasNextPage: page.NextCursor != ""},
	}
	for i, e := range page.Execs {
		n := toExecResult(e, nil)
		c.Nodes[i] = n
		c.Edges[i] = &model.ExecEdge{Cursor: e.ExecID, Node: n}
	}
	if len(c.Edges) > 0 {
		c.PageInfo.StartCursor = &c.Edges[0].Cursor
		end := c.Edges[len(c.Edges)-1].Cursor
		if page.NextCursor != "" {
			end = page.NextCursor
		}
		c.PageInfo.EndCursor = &end
	} else if page.NextCursor != "" {
		// A page a filter left empty (the scan's budget ran out first) still goes on.
		c.PageInfo.EndCursor = &page.NextCursor
	}
	return c
}

func toDestroyPayload(r sandbox.DestroyResult) *model.DestroySandboxPayload {
	return &model.DestroySandboxPayload{Sandbox: toSandbox(r.Sandbox), SnapshotID: optString(r.SnapshotID)}
}

func toSnapshot(s sandbox.SnapshotInfo) *model.Snapshot {
	return &model.Snapshot{ID: s.ID, SandboxID: s.SandboxID, CreatedAt: s.CreatedAt, SizeBytes: s.SizeBytes,
		RawSizeBytes: s.RawSizeBytes, Sha256: s.SHA256, ParentSnapshotID: optString(s.Parent)}
}

func toProfiles(ps []sandbox.Profile) []*model.Profile {
	out := make([]*model.Profile, len(ps))
	for i, p := range ps {
		out[i] = &model.Profile{Name: p.Name, Description: p.Description, MilliCPU: int(p.MilliCPU),
			MemoryBytes: p.MemoryBytes, DiskBytes: p.DiskBytes, Network: p.Network,
			NetworkPolicy: toNetworkPolicy(p.NetworkPolicy), Default: p.Default}
	}
	return out
}

// toExecResult converts an exec's status or result. The exit fields are null (timedOut false)
// while it runs. A result without a state is a finished one (what Exec answered before execs
// had states).
// toExecResult converts an exec's result; only the output encodings in sel are built.
func toExecResult(r sandbox.ExecResult, sel fieldSet) *model.ExecResult {
	res := &model.ExecResult{
		ID:              r.ExecID,
		ExecID:          r.ExecID,
		SandboxID:       r.SandboxID,
		Command:         r.Command,
		State:           model.ExecStateEnded,
		StartedAt:       optTime(r.StartedAt),
		OutputBytes:     r.OutputBytes,
		StdoutBase64:    base64Of(r.Stdout, sel, "stdoutBase64"),
		StderrBase64:    base64Of(r.Stderr, sel, "stderrBase64"),
		StdoutTruncated: r.StdoutTruncated,
		StderrTruncated: r.StderrTruncated,
	}
	if sel.has("stdout") {
		res.Stdout = validUTF8(r.Stdout)
	}
	if sel.has("stderr") {
		res.Stderr = validUTF8(r.Stderr)
	}
	if r.Tty != nil {
		res.Tty = &model.TtySize{Rows: r.Tty.Rows, Cols: r.Tty.Cols}
	}
	if r.State == sandbox.ExecRunning {
		res.State = model.ExecStateRunning
		res.StdinOpen = r.StdinOpen
		return res
	}
	exitCode, durationMs := r.ExitCode, r.Duration.Milliseconds()
	res.ExitCode, res.DurationMs = &exitCode, &durationMs
	res.Signal, res.TimedOut, res.EndedAt, res.Error = optString(r.Signal), r.TimedOut, optTime(r.EndedAt), optString(r.Error)
	return res
}

func toFileInfo(f sandbox.FileInfo) *model.FileInfo {
	return &model.FileInfo{Name: f.Name, Path: f.Path, Size: f.Size, Mode: int(f.Mode), IsDir: f.IsDir,
		Symlink: optString(f.Symlink), ModTime: optTime(f.ModTime), Type: fileType(f.Type)}
}

// toFileContent converts a file read; only the encodings in sel are built.
func toFileContent(path string, data []byte, info sandbox.FileInfo, sel fieldSet) *model.FileContent {
	fc := &model.FileContent{Path: path, Content: textOf(data, sel, "content"),
		ContentBase64: base64Of(data, sel, "contentBase64"), Size: int64(len(data)), File: toFileInfo(info)}
	if info.Path != "" {
		fc.Path = info.Path
	}
	return fc
}

func toEvent(e sandbox.Event) *model.SandboxEvent {
	ev := &model.SandboxEvent{Cursor: e.Cursor, Type: model.SandboxEventType(e.Type), SandboxID: e.SandboxID,
		State: model.SandboxState(e.State), Reason: optString(e.Reason), At: e.At}
	if e.PreviousState != "" {
		prev := model.SandboxState(e.PreviousState)
		ev.PreviousState = &prev
	}
	if e.Exec != nil {
		ev.Exec = toExecResult(*e.Exec, nil) // carries no output
	}
	if e.Type == sandbox.EventBootstrapProgress {
		n := e.BytesRead
		ev.BytesRead = &n
	}
	return ev
}

// subscribeEvents is the sandboxEvents subscription's channel, fed by the service's follower
// itself: each event converted and sent on its goroutine, no goroutine of ours between (one
// fewer per subscription: 10,000 idle subscriptions are 10,000 of them). Events of a kind this
// server does not know are left out; a sandbox's own stream ends after its DESTROYED event;
// a stream that ends otherwise while ctx lives broke off (an UNAVAILABLE error, streamend.go).
func subscribeEvents(ctx context.Context, svc api.Service, p auth.Principal, sandboxID, after string) (<-chan *model.SandboxEvent, error) {
	out := make(chan *model.SandboxEvent)
	sawLast := false // the follower's goroutine only
	deliver := func(e sandbox.Event) bool {
		// An event of a type this schema does not know (a newer replica's) is skipped.
		if !model.SandboxEventType(e.Type).IsValid() {
			return true
		}
		select {
		case out <- toEvent(e):
		case <-ctx.Done():
			return false
		}
		sawLast = sandboxID != "" && e.State == sandbox.Destroyed
		return !sawLast
	}
	ended := func() {
		if !sawLast && ctx.Err() == nil {
			streamBroke(ctx)
		}
		close(out)
	}
	if err := svc.EventsFunc(ctx, p, sandboxID, after, deliver, ended); err != nil {
		return nil, err
	}
	return out, nil
}

// forward converts a service stream into a subscription's channel. It owns and closes out; it
// ends when in closes, when ctx ends, or after sending an event for which last is true (last
// nil: never), and never blocks past ctx. When a stream with a last event closes before it
// while ctx lives, the service's stream broke off: the subscription ends with an UNAVAILABLE error
// (streamend.go), never a bare complete.
func forward[In, Out any](ctx context.Context, in <-chan In, convert func(In) Out, last func(In) bool) <-chan Out {
	out := make(chan Out)
	go func() {
		defer close(out)
		for {
			select {
			case <-ctx.Done():
				return
			case e, ok := <-in:
				if !ok {
					if last != nil && ctx.Err() == nil {
						streamBroke(ctx)
					}
					return
				}
				select {
				case out <- convert(e):
				case <-ctx.Done():
					return
				}
				if last != nil && last(e) {
					return
				}
			}
		}
	}()
	return out
}

// ---- small helpers ----

// validUTF8 returns b as text with each invalid byte replaced by U+FFFD.
func validUTF8(b []byte) string {
	if utf8.Valid(b) {
		return string(b)
	}
	var sb strings.Builder
	sb.Grow(len(b) + 16)
	for len(b) > 0 {
		r, n := utf8.DecodeRune(b)
		sb.WriteRune(r) // utf8.RuneError for an invalid byte (n == 1)
		b = b[n:]
	}
	return sb.String()
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

func optString(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

func optTime(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}

func int64Ptr(i *int) *int64 {
	if i == nil {
		return nil
	}
	v := int64(*i)
	return &v
}
