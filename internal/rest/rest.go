// Package rest serves the documented REST paths (/sandbox/sandboxes/v1…, and agent runs at
// /sandbox/agent/v1/runs) over the domain service. Handlers are thin: authenticate, decode and
// bound the request, call internal/sandbox, encode the answer. Errors are {"error":{"code","message",…}} with the status of their code.
// An exec's output also streams as Server-Sent Events (exec.go, sse.go).
package rest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"

	"sandboxd/internal/api"
	"sandboxd/internal/apierror"
	"sandboxd/internal/auth"
	"sandboxd/internal/sandbox"
	"sandboxd/internal/tracing"
)

// Handler serves the REST API.
type Handler struct {
	svc  api.Service
	auth *auth.Authenticator
	log  *slog.Logger
	mux  *http.ServeMux
	// routes are the patterns of mux that are routes (not the catch-alls that answer NOT_FOUND).
	routes map[string]bool
	// shutdown, when closed, ends the open exec output streams (clients reattach elsewhere).
	shutdown <-chan struct{}
	// writeTimeout bounds each write of a stream; keepAlive is the idle time before a comment.
	writeTimeout, keepAlive time.Duration
	// limit charges one request to its principal's rate limit; nil means none.
	limit func(context.Context, auth.Principal) error
	// wsOrigins are the Origin patterns the terminal WebSocket accepts besides its own host;
	// ttyInitTimeout bounds its wait for a first (authentication) message (tty.go).
	wsOrigins      []string
	ttyInitTimeout time.Duration
}

// Prefix is the root of the sandbox REST paths.
const Prefix = "/sandbox/sandboxes/v1"

// The route DELETE …/{id}/files, and the wider pattern ServeMux serves it under (see New).
const (
	deleteFileRoute   = "DELETE " + Prefix + "/{id}/files"
	deleteFilePattern = "DELETE " + Prefix + "/{id}/{name}"
)

// maxJSONBody bounds JSON request bodies (an exec's stdin travels inside, base64-encoded).
const maxJSONBody = 8 << 20

// New returns the REST handler. Mount it at "/". Closing shutdown ends the open exec output
// streams, which http.Server.Shutdown would otherwise wait for.
func New(svc api.Service, authn *auth.Authenticator, log *slog.Logger, shutdown <-chan struct{}) *Handler {
	h := &Handler{svc: svc, auth: authn, log: log, mux: http.NewServeMux(), routes: map[string]bool{}, shutdown: shutdown,
		writeTimeout: sseWriteTimeout, keepAlive: sseKeepAlive}
	route := func(pattern string, fn http.HandlerFunc) {
		h.mux.HandleFunc(pattern, fn)
		h.routes[pattern] = true
	}
	route("POST "+Prefix, h.create)
	route("GET "+Prefix, h.list)
	route("GET "+Prefix+"/quota", h.quota)
	// More specific than GET …/{id}, so ServeMux routes it here.
	route("GET "+Prefix+"/snapshots", h.listSnapshots)
	route("DELETE "+Prefix+"/snapshots/{snapshot_id}", h.deleteSnapshot)
	route("GET "+Prefix+"/{id}", h.get)
	route("DELETE "+Prefix+"/{id}", h.destroy)
	route("PATCH "+Prefix+"/{id}", h.update)
	route("POST "+Prefix+"/{id}/exec", h.exec)
	route("GET "+Prefix+"/{id}/execs/{exec_id}", h.execStatus)
	route("GET "+Prefix+"/{id}/execs/{exec_id}/output", h.execOutput)
	route("GET "+Prefix+"/{id}/execs", h.listExecs)
	route("POST "+Prefix+"/{id}/execs/{exec_id}/signal", h.signalExec)
	route("POST "+Prefix+"/{id}/execs/{exec_id}/stdin", h.writeStdin)
	route("POST "+Prefix+"/{id}/execs/{exec_id}/resize", h.resizeTty)
	route(ttyRoute, h.tty)
	route("POST "+Prefix+"/{id}/stop", h.stop)
	route("POST "+Prefix+"/{id}/start", h.start)
	route("POST "+Prefix+"/{id}/pause", h.pause)
	route("POST "+Prefix+"/{id}/resume", h.resume)
	route("GET "+Prefix+"/{id}/files", h.download)
	route("PUT "+Prefix+"/{id}/files", h.upload)
	route("POST "+Prefix+"/{id}/files", h.upload)
	route("GET "+Prefix+"/{id}/files/list", h.listFiles)
	// DELETE …/{id}/files: ServeMux refuses that pattern beside DELETE …/snapshots/{snapshot_id}
	// (both would match …/snapshots/files), so the mux's pattern takes any name, deleteFile
	// answers NOT_FOUND for every name but "files", and the route is labelled by its real path.
	h.mux.HandleFunc(deleteFilePattern, h.deleteFile)
	h.routes[deleteFileRoute] = true
	route("POST "+Prefix+"/{id}/files/move", h.moveFile)
	route("POST "+Prefix+"/{id}/files/mkdir", h.makeDir)
	route("GET "+Prefix+"/{id}/files/stat", h.statFile)
	route("GET "+Prefix+"/{id}/files/watch", h.watchFiles)
	route("POST "+Prefix+"/{id}/snapshots", h.snapshot)
	route("GET "+Prefix+"/{id}/snapshots", h.listSnapshots)
	route("POST "+AgentPrefix+"/runs", h.startAgentRun)
	route("GET "+AgentPrefix+"/runs", h.listAgentRuns)
	route("GET "+AgentPrefix+"/runs/{run_id}", h.getAgentRun)
	route("POST "+AgentPrefix+"/runs/{run_id}/cancel", h.cancelAgentRun)
	route("GET "+AgentPrefix+"/runs/{run_id}/events", h.agentRunEvents)
	// Anything else under the prefixes is NOT_FOUND in the REST error body. These catch-alls
	// are no routes: RecordRoute notes nothing for them.
	h.mux.HandleFunc(Prefix+"/", h.notFound)
	h.mux.HandleFunc(AgentPrefix+"/", h.notFound)
	return h
}

// WithRateLimit makes every authenticated request (a stream when it is opened) spend one
// request of its principal's rate limit: limit answers nil, or the RATE_LIMITED error the
// request is refused with (429 with Retry-After).
func (h *Handler) WithRateLimit(limit func(context.Context, auth.Principal) error) *Handler {
	h.limit = limit
	return h
}

// ServeHTTP authenticates the caller, charges its rate limit and routes the request.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if slot, ok := r.Context().Value(routeKey{}).(*string); ok {
		// Before authentication: a refused request is labelled by its route too.
		_, pattern := h.mux.Handler(r)
		if pattern == deleteFilePattern && strings.HasSuffix(r.URL.Path, "/files") {
			pattern = deleteFileRoute
		}
		if h.routes[pattern] {
			*slot = pattern
		}
	}
	if h.keylessTty(r) {
		h.mux.ServeHTTP(w, r) // the terminal's WebSocket authenticates in its first message
		return
	}
	p, err := h.auth.Authenticate(r.Header.Get(auth.HeaderAPIKey), r.Header.Get(auth.HeaderTenant), r.Header.Get(auth.HeaderProject))
	if err != nil {
		h.fail(w, r, err)
		return
	}
	if h.limit != nil {
		if err := h.limit(r.Context(), p); err != nil {
			h.fail(w, r, err)
			return
		}
	}
	h.mux.ServeHTTP(w, r.WithContext(auth.WithPrincipal(r.Context(), p)))
}

// routeKey is the context key of the slot RecordRoute makes.
type routeKey struct{}

// RecordRoute returns a context in which ServeHTTP notes the pattern of the route that serves
// a request ("GET /sandbox/sandboxes/v1/{id}"; nothing for a request no route takes), and a
// function that tells it once ServeHTTP returned. The handler is mounted behind the server's
// mux at "/", whose http.Request.Pattern is "/" for every REST request: this is how the
// request metrics around that mux learn the inner route. The pattern is noted before the
// caller is authenticated, so that refused requests are labelled by their route as well.
func RecordRoute(ctx context.Context) (context.Context, func() string) {
	slot := new(string)
	return context.WithValue(ctx, routeKey{}, slot), func() string { return *slot }
}

func (h *Handler) notFound(w http.ResponseWriter, r *http.Request) {
	h.fail(w, r, apierror.New(apierror.NotFound, "no such path: %s %s", r.Method, r.URL.Path))
}

// ---- sandboxes ----

type createBody struct {
	Profile     string            `json:"profile"`
	AutostopSec *int64            `json:"autostop_sec"`
	TTLSec      *int64            `json:"ttl_sec"`
	Env         map[string]string `json:"env"`
	Source      *sourceBody       `json:"source"`
	Labels      map[string]string `json:"labels"`
	// Network narrows the profile's network policy: "none", or an object.
	Network *networkBody `json:"network"`
	// AutostopAction is "stop" (default) or "pause"; AutoResume resumes a PAUSED sandbox on
	// exec and file calls.
	AutostopAction string `json:"autostop_action"`
	AutoResume     bool   `json:"auto_resume"`
}

// networkBody is a create's network: the string "none" (no network), or
// {"mode": "none"|"egress", "egress_allow": [...], "egress_deny": [...]}.
type networkBody struct {
	Mode        string   `json:"mode"`
	EgressAllow []string `json:"egress_allow"`
	EgressDeny  []string `json:"egress_deny"`
}

func (n *networkBody) UnmarshalJSON(b []byte) error {
	var mode string
	if err := json.Unmarshal(b, &mode); err == nil {
		*n = networkBody{Mode: mode}
		return nil
	}
	type plain networkBody
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	var p plain
	if err := dec.Decode(&p); err != nil {
		return fmt.Errorf("network must be \"none\" or an object of mode, egress_allow and egress_deny: %w", err)
	}
	*n = networkBody(p)
	return nil
}

// networkPolicyOut is a sandbox's effective network policy.
type networkPolicyOut struct {
	Mode        string              `json:"mode"`
	EgressAllow []string            `json:"egress_allow"`
	EgressDeny  []string            `json:"egress_deny"`
	AlwaysDeny  []string            `json:"always_deny"`
	DNSServers  []string            `json:"dns_servers"`
	Pinned      map[string][]string `json:"pinned"`
}

func networkPolicyJSON(p sandbox.NetworkPolicy) networkPolicyOut {
	out := networkPolicyOut{Mode: p.Mode, EgressAllow: nonNil(p.EgressAllow), EgressDeny: nonNil(p.EgressDeny),
		AlwaysDeny: nonNil(p.AlwaysDeny), DNSServers: nonNil(p.DNSServers), Pinned: map[string][]string{}}
	for _, h := range p.Pinned {
		out.Pinned[h.Host] = nonNil(h.Addresses)
	}
	return out
}

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

// sourceBody is where a new sandbox's workspace comes from: exactly one field.
type sourceBody struct {
	SnapshotID string `json:"snapshot_id"`
	ArchiveURL string `json:"archive_url"`
	GCSPrefix  string `json:"gcs_prefix"`
}

func (b createBody) request() sandbox.CreateRequest {
	req := sandbox.CreateRequest{Profile: b.Profile, AutostopSec: b.AutostopSec, TTLSec: b.TTLSec, Env: b.Env, Labels: b.Labels,
		AutostopAction: b.AutostopAction, AutoResume: b.AutoResume}
	if b.Source != nil {
		req.Source = &sandbox.Source{SnapshotID: b.Source.SnapshotID, ArchiveURL: b.Source.ArchiveURL, GCSPrefix: b.Source.GCSPrefix}
	}
	if b.Network != nil {
		req.Network = &sandbox.NetworkRequest{Mode: b.Network.Mode, EgressAllow: b.Network.EgressAllow, EgressDeny: b.Network.EgressDeny}
	}
	return req
}

func (h *Handler) create(w http.ResponseWriter, r *http.Request) {
	var b createBody
	if !h.decode(w, r, &b) {
		return
	}
	sb, err := h.svc.Create(r.Context(), principal(r), b.request())
	if err != nil {
		h.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, sandboxJSON(sb))
}

func (h *Handler) list(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	opts := sandbox.ListOptions{After: q.Get("cursor"), State: sandbox.State(strings.ToUpper(q.Get("state")))}
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n <= 0 {
			h.fail(w, r, apierror.New(apierror.InvalidArgument, "limit must be a positive integer, got %q", v))
			return
		}
		opts.Limit = n
	}
	if terms := q["label"]; len(terms) > 0 {
		sel, err := labelSelector(h.svc.Limits(), terms)
		if err != nil {
			h.fail(w, r, err)
			return
		}
		opts.Labels = sel
	}
	page, err := h.svc.List(r.Context(), principal(r), opts)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	out := struct {
		Sandboxes  []sandboxOut `json:"sandboxes"`
		NextCursor string       `json:"next_cursor,omitempty"`
	}{Sandboxes: make([]sandboxOut, 0, len(page.Sandboxes)), NextCursor: page.NextCursor}
	for _, sb := range page.Sandboxes {
		out.Sandboxes = append(out.Sandboxes, sandboxJSON(sb))
	}
	writeJSON(w, http.StatusOK, out)
}

func (h *Handler) get(w http.ResponseWriter, r *http.Request) {
	sb, err := h.svc.Get(r.Context(), principal(r), r.PathValue("id"))
	h.answerSandbox(w, r, sb, err)
}

func (h *Handler) quota(w http.ResponseWriter, r *http.Request) {
	u, err := h.svc.Quota(r.Context(), principal(r))
	if err != nil {
		h.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]int{"limit": u.Limit, "in_use": u.InUse})
}

func (h *Handler) stop(w http.ResponseWriter, r *http.Request) {
	if !h.emptyBody(w, r) {
		return
	}
	sb, err := h.svc.Stop(r.Context(), principal(r), r.PathValue("id"))
	h.answerSandbox(w, r, sb, err)
}

func (h *Handler) start(w http.ResponseWriter, r *http.Request) {
	if !h.emptyBody(w, r) {
		return
	}
	sb, err := h.svc.Start(r.Context(), principal(r), r.PathValue("id"))
	h.answerSandbox(w, r, sb, err)
}

func (h *Handler) destroy(w http.ResponseWriter, r *http.Request) {
	res, err := h.svc.Destroy(r.Context(), principal(r), r.PathValue("id"))
	if err != nil {
		h.fail(w, r, err)
		return
	}
	out := sandboxJSON(res.Sandbox)
	writeJSON(w, http.StatusOK, struct {
		sandboxOut
		SnapshotID string `json:"snapshot_id"`
	}{out, res.SnapshotID})
}

func (h *Handler) answerSandbox(w http.ResponseWriter, r *http.Request, sb sandbox.Sandbox, err error) {
	if err != nil {
		h.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, sandboxJSON(sb))
}

// ---- files ----

func (h *Handler) download(w http.ResponseWriter, r *http.Request) {
	path := r.URL.Query().Get("path")
	rc, info, err := h.svc.OpenFile(r.Context(), principal(r), r.PathValue("id"), path)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	defer rc.Close()
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Length", strconv.FormatInt(info.Size, 10))
	w.Header().Set("X-File-Mode", fmt.Sprintf("%04o", info.Mode&0o7777))
	w.Header().Set("Last-Modified", info.ModTime.UTC().Format(http.TimeFormat))
	if _, err := io.Copy(w, rc); err != nil {
		h.log.Warn("file download cut short", "sandbox", r.PathValue("id"), "err", err)
	}
}

func (h *Handler) upload(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	var mode uint64
	if v := q.Get("mode"); v != "" {
		m, err := strconv.ParseUint(v, 8, 32)
		if err != nil {
			h.fail(w, r, apierror.New(apierror.InvalidArgument, "mode must be octal permission bits like 0644, got %q", v))
			return
		}
		mode = m
	}
	limit := h.svc.Limits().MaxFileBytes
	if r.ContentLength > limit {
		h.fail(w, r, apierror.New(apierror.PayloadTooLarge, "the file is %d bytes, at most %d", r.ContentLength, limit))
		return
	}
	fi, err := h.svc.WriteFile(r.Context(), principal(r), r.PathValue("id"), q.Get("path"), os.FileMode(mode), r.Body)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, fileJSON(fi))
}

func (h *Handler) listFiles(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	limit := 0
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n <= 0 {
			h.fail(w, r, apierror.New(apierror.InvalidArgument, "limit must be a positive integer, got %q", v))
			return
		}
		limit = n
	}
	path := q.Get("path")
	if path == "" {
		path = "."
	}
	entries, truncated, err := h.svc.ListDir(r.Context(), principal(r), r.PathValue("id"), path, limit)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	out := struct {
		Path      string    `json:"path"`
		Entries   []fileOut `json:"entries"`
		Truncated bool      `json:"truncated"`
	}{Path: path, Entries: make([]fileOut, 0, len(entries)), Truncated: truncated}
	for _, e := range entries {
		out.Entries = append(out.Entries, fileJSON(e))
	}
	writeJSON(w, http.StatusOK, out)
}

// ---- encoding ----

type resourcesOut struct {
	MilliCPU    int64 `json:"milli_cpu"`
	MemoryBytes int64 `json:"memory_bytes"`
	DiskBytes   int64 `json:"disk_bytes"`
}

type sandboxOut struct {
	SandboxID        string       `json:"sandbox_id"`
	TenantID         string       `json:"tenant_id"`
	ProjectID        string       `json:"project_id"`
	Profile          string       `json:"profile"`
	State            string       `json:"state"`
	StateReason      string       `json:"state_reason,omitempty"`
	CreatedAt        time.Time    `json:"created_at"`
	StateChangedAt   time.Time    `json:"state_changed_at"`
	AutostopSec      int64        `json:"autostop_sec"`
	TTLSec           int64        `json:"ttl_sec"`
	ExpiresAt        *time.Time   `json:"expires_at,omitempty"`
	AutostopAt       *time.Time   `json:"autostop_at,omitempty"`
	LatestSnapshotID string       `json:"latest_snapshot_id,omitempty"`
	Resources        resourcesOut `json:"resources"`
	Network          string       `json:"network"`
	// NetworkPolicy is the effective policy Network names.
	NetworkPolicy networkPolicyOut `json:"network_policy"`
	// Labels is always an object ({} for none).
	Labels map[string]string `json:"labels"`
	// AutostopAction is what idle auto-stop does ("stop" or "pause"); AutoResume whether exec
	// and file calls resume a PAUSED sandbox.
	AutostopAction string `json:"autostop_action"`
	AutoResume     bool   `json:"auto_resume"`
}

func sandboxJSON(sb sandbox.Sandbox) sandboxOut {
	out := sandboxOut{SandboxID: sb.ID, TenantID: sb.Tenant, ProjectID: sb.Project, Profile: sb.Profile,
		State: string(sb.State), StateReason: sb.StateReason, CreatedAt: sb.CreatedAt, StateChangedAt: sb.StateChangedAt,
		AutostopSec: sb.AutostopSec, TTLSec: sb.TTLSec, LatestSnapshotID: sb.LatestSnapshotID,
		Resources: resourcesOut{MilliCPU: sb.MilliCPU, MemoryBytes: sb.MemoryBytes, DiskBytes: sb.DiskBytes}, Network: sb.Network,
		NetworkPolicy: networkPolicyJSON(sb.NetworkPolicy), Labels: sb.Labels,
		AutostopAction: sb.AutostopAction, AutoResume: sb.AutoResume}
	if out.Labels == nil {
		out.Labels = map[string]string{}
	}
	if t := sb.ExpiresAt(); !t.IsZero() {
		out.ExpiresAt = &t
	}
	if t := sb.AutostopAt; !t.IsZero() {
		out.AutostopAt = &t
	}
	return out
}

type fileOut struct {
	Name    string    `json:"name"`
	Path    string    `json:"path"`
	Size    int64     `json:"size"`
	Mode    string    `json:"mode"`
	IsDir   bool      `json:"is_dir"`
	Symlink string    `json:"symlink,omitempty"`
	ModTime time.Time `json:"mod_time"`
	Type    string    `json:"type,omitempty"`
}

func fileJSON(f sandbox.FileInfo) fileOut {
	return fileOut{Name: f.Name, Path: f.Path, Size: f.Size, Mode: fmt.Sprintf("%04o", f.Mode&0o7777), IsDir: f.IsDir,
		Symlink: f.Symlink, ModTime: f.ModTime, Type: string(f.Type)}
}

func principal(r *http.Request) auth.Principal {
	p, _ := auth.FromContext(r.Context())
	return p
}

// decode reads a bounded JSON body into v, refusing unknown fields and trailing data. It
// answers the client itself and returns false when the body is bad.
func (h *Handler) decode(w http.ResponseWriter, r *http.Request, v any) bool {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxJSONBody))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			h.fail(w, r, apierror.New(apierror.PayloadTooLarge, "the request body is larger than %d bytes", maxJSONBody))
		} else {
			h.fail(w, r, apierror.New(apierror.InvalidArgument, "could not read the request body"))
		}
		return false
	}
	trimmed := bytes.TrimSpace(body)
	if len(trimmed) == 0 {
		h.fail(w, r, apierror.New(apierror.InvalidArgument, "the request body must be a JSON object"))
		return false
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		h.fail(w, r, apierror.New(apierror.InvalidArgument, "invalid JSON body: %s", jsonProblem(err)))
		return false
	}
	// Decode takes null for an empty object; only an object is one.
	if trimmed[0] != '{' {
		h.fail(w, r, apierror.New(apierror.InvalidArgument, "the request body must be a JSON object"))
		return false
	}
	// Not dec.More: it reports false before a stray '}' or ']', so "{}}" would pass.
	if _, err := dec.Token(); err != io.EOF {
		h.fail(w, r, apierror.New(apierror.InvalidArgument, "invalid JSON body: unexpected data after the object"))
		return false
	}
	return true
}

// emptyBody accepts a verb with no body, or an empty JSON object.
func (h *Handler) emptyBody(w http.ResponseWriter, r *http.Request) bool {
	// One byte past the bound: a body that only starts with 4096 spaces is no empty body.
	body, err := io.ReadAll(io.LimitReader(r.Body, 4097))
	if err != nil {
		h.fail(w, r, apierror.New(apierror.InvalidArgument, "could not read the request body"))
		return false
	}
	if t := bytes.TrimSpace(body); len(body) > 4096 || (len(t) != 0 && !bytes.Equal(t, []byte("{}"))) {
		h.fail(w, r, apierror.New(apierror.InvalidArgument, "this call takes no body"))
		return false
	}
	return true
}

func jsonProblem(err error) string {
	var se *json.SyntaxError
	var te *json.UnmarshalTypeError
	switch {
	case errors.As(err, &se):
		return fmt.Sprintf("syntax error at byte %d: %v", se.Offset, se)
	case errors.As(err, &te):
		if te.Field != "" {
			return fmt.Sprintf("field %q must be %s, not a JSON %s", te.Field, te.Type.String(), te.Value)
		}
		return fmt.Sprintf("expected %s, got a JSON %s", te.Type.String(), te.Value)
	case errors.Is(err, io.ErrUnexpectedEOF):
		return "the JSON ends early"
	case strings.HasPrefix(err.Error(), "json: unknown field"):
		return strings.TrimPrefix(err.Error(), "json: ")
	}
	return err.Error()
}

// WriteError answers err as {"error":{"code","message",…}} with its code's status.
func WriteError(w http.ResponseWriter, log *slog.Logger, r *http.Request, err error) {
	e := apierror.From(err)
	if e.Code == apierror.Internal || e.Code == apierror.Unavailable {
		log.Error("request failed", "method", r.Method, "path", r.URL.Path, "code", e.Code, "err", err)
	}
	tracing.SetErrorCode(r.Context(), string(e.Code))
	body := map[string]any{"code": string(e.Code), "message": e.Message}
	for k, v := range e.Details {
		if k != "code" && k != "message" {
			body[k] = v
		}
	}
	if e.RetryAfter > 0 {
		secs := int((e.RetryAfter + time.Second - 1) / time.Second)
		w.Header().Set("Retry-After", strconv.Itoa(secs))
		body["retry_after_sec"] = secs
	}
	writeJSON(w, e.Code.HTTPStatus(), map[string]any{"error": body})
}

func (h *Handler) fail(w http.ResponseWriter, r *http.Request, err error) {
	WriteError(w, h.log, r, err)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(v)
}
