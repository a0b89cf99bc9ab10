package client

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"time"
)

// Sandbox states.
const (
	StateCreating   = "CREATING"
	StateRunning    = "RUNNING"
	StateStopping   = "STOPPING"
	StateStopped    = "STOPPED"
	StateStarting   = "STARTING"
	StateDestroying = "DESTROYING"
	StateDestroyed  = "DESTROYED"
	StateFailed     = "FAILED"
	StateExpired    = "EXPIRED"
	StatePausing    = "PAUSING"
	StatePaused     = "PAUSED"
	StateResuming   = "RESUMING"
)

// Sandbox is a sandbox as the REST API answers it.
type Sandbox struct {
	ID               string     `json:"sandbox_id"`
	TenantID         string     `json:"tenant_id"`
	ProjectID        string     `json:"project_id"`
	Profile          string     `json:"profile"`
	State            string     `json:"state"`
	StateReason      string     `json:"state_reason,omitempty"`
	CreatedAt        time.Time  `json:"created_at"`
	StateChangedAt   time.Time  `json:"state_changed_at"`
	AutostopSec      int64      `json:"autostop_sec"`
	TTLSec           int64      `json:"ttl_sec"`
	ExpiresAt        *time.Time `json:"expires_at,omitempty"`
	AutostopAt       *time.Time `json:"autostop_at,omitempty"`
	LatestSnapshotID string     `json:"latest_snapshot_id,omitempty"`
	Resources        Resources  `json:"resources"`
	Network          string     `json:"network"`
	// NetworkPolicy is the effective network policy Network names.
	NetworkPolicy NetworkPolicy `json:"network_policy"`
	// SnapshotID is the final checkpoint Destroy took; empty elsewhere.
	SnapshotID string `json:"snapshot_id,omitempty"`
	// Labels are the sandbox's labels (see Update).
	Labels map[string]string `json:"labels,omitempty"`
	// AutostopAction is what idle auto-stop does: "stop" or "pause"; AutoResume whether exec
	// and file calls resume the sandbox when it is PAUSED.
	AutostopAction string `json:"autostop_action,omitempty"`
	AutoResume     bool   `json:"auto_resume,omitempty"`
}

// Resources are a sandbox's limits.
type Resources struct {
	MilliCPU    int64 `json:"milli_cpu"`
	MemoryBytes int64 `json:"memory_bytes"`
	DiskBytes   int64 `json:"disk_bytes"`
}

// CreateRequest is the body of Create. Nil and zero fields take the server's defaults.
type CreateRequest struct {
	Profile     string            `json:"profile,omitempty"`
	AutostopSec *int64            `json:"autostop_sec,omitempty"`
	TTLSec      *int64            `json:"ttl_sec,omitempty"`
	Env         map[string]string `json:"env,omitempty"`
	Source      *Source           `json:"source,omitempty"`
	// Labels tag the sandbox: Kubernetes' label syntax, at most the server's limit (32),
	// none under sandboxd.io/, kubernetes.io/ or k8s.io/.
	Labels map[string]string `json:"labels,omitempty"`
	// Network narrows the profile's network policy (nil keeps it); widening it is refused
	// with PERMISSION_DENIED.
	Network *NetworkRequest `json:"network,omitempty"`
	// AutostopAction is what idle auto-stop does: "stop" (the default) or "pause" (keep the
	// processes: Pause).
	AutostopAction string `json:"autostop_action,omitempty"`
	// AutoResume makes exec and file calls on the sandbox, PAUSED, resume it first.
	AutoResume bool `json:"auto_resume,omitempty"`
}

// NetworkRequest narrows a profile's network policy at create: mode "none" always; "egress"
// on an egress profile, with allow entries (IPv4 CIDRs, host names) the profile allows whole
// (none: the profile's) and deny entries added to the profile's.
type NetworkRequest struct {
	Mode        string   `json:"mode"`
	EgressAllow []string `json:"egress_allow,omitempty"`
	EgressDeny  []string `json:"egress_deny,omitempty"`
}

// NetworkPolicy is a sandbox's effective network policy: the most specific entry of
// EgressAllow, EgressDeny and AlwaysDeny holding a destination decides (at one prefix EgressDeny
// beats EgressAllow, which beats AlwaysDeny), none
// holding it denies; DNS only to DNSServers; host names allow the addresses in Pinned.
type NetworkPolicy struct {
	Mode        string              `json:"mode"`
	EgressAllow []string            `json:"egress_allow"`
	EgressDeny  []string            `json:"egress_deny"`
	AlwaysDeny  []string            `json:"always_deny"`
	DNSServers  []string            `json:"dns_servers"`
	Pinned      map[string][]string `json:"pinned"`
}

// Source fills a new sandbox's workspace: set exactly one field.
type Source struct {
	SnapshotID string `json:"snapshot_id,omitempty"`
	ArchiveURL string `json:"archive_url,omitempty"`
	GCSPrefix  string `json:"gcs_prefix,omitempty"`
}

// Create creates a sandbox (POST /sandbox/sandboxes/v1) and answers it once created.
func (c *Client) Create(ctx context.Context, req CreateRequest) (Sandbox, error) {
	var sb Sandbox
	err := c.call(ctx, http.MethodPost, SandboxesPath, req, &sb)
	return sb, err
}

// Get answers one sandbox.
func (c *Client) Get(ctx context.Context, id string) (Sandbox, error) {
	var sb Sandbox
	err := c.call(ctx, http.MethodGet, sandboxPath(id), nil, &sb)
	return sb, err
}

// ListOptions select a page of List. Zero values take the server's defaults.
type ListOptions struct {
	State  string // only sandboxes in this state
	Limit  int    // at most this many (the server's bound is 500, its default 50)
	Cursor string // the NextCursor of the previous page
	// Labels keeps only sandboxes that have every one of these labels with its value.
	Labels map[string]string
}

// Page is a page of sandboxes, newest first.
type Page struct {
	Sandboxes  []Sandbox `json:"sandboxes"`
	NextCursor string    `json:"next_cursor,omitempty"`
}

// List answers a page of the caller's sandboxes; pass NextCursor as Cursor for the next one
// (an empty NextCursor is the last page).
func (c *Client) List(ctx context.Context, opts ListOptions) (Page, error) {
	q := url.Values{}
	if opts.State != "" {
		q.Set("state", opts.State)
	}
	if opts.Limit > 0 {
		q.Set("limit", strconv.Itoa(opts.Limit))
	}
	if opts.Cursor != "" {
		q.Set("cursor", opts.Cursor)
	}
	addLabelFilter(q, opts.Labels)
	var p Page
	err := c.call(ctx, http.MethodGet, withQuery(SandboxesPath, q), nil, &p)
	return p, err
}

// Quota is a tenant:project's concurrency slots (Limit 0 = unlimited).
type Quota struct {
	Limit int `json:"limit"`
	InUse int `json:"in_use"`
}

// Quota answers the caller's concurrency slots.
func (c *Client) Quota(ctx context.Context) (Quota, error) {
	var q Quota
	err := c.call(ctx, http.MethodGet, SandboxesPath+"/quota", nil, &q)
	return q, err
}

// Stop checkpoints a running sandbox's workspace and releases its compute (STOPPED).
func (c *Client) Stop(ctx context.Context, id string) (Sandbox, error) {
	var sb Sandbox
	err := c.call(ctx, http.MethodPost, sandboxPath(id, "stop"), nil, &sb)
	return sb, err
}

// Start restores a stopped sandbox's workspace (RUNNING).
func (c *Client) Start(ctx context.Context, id string) (Sandbox, error) {
	var sb Sandbox
	err := c.call(ctx, http.MethodPost, sandboxPath(id, "start"), nil, &sb)
	return sb, err
}

// Pause keeps a running sandbox's memory, processes and workspace and releases its compute
// and concurrency slot (PAUSED).
func (c *Client) Pause(ctx context.Context, id string) (Sandbox, error) {
	var sb Sandbox
	err := c.call(ctx, http.MethodPost, sandboxPath(id, "pause"), nil, &sb)
	return sb, err
}

// Resume brings a paused sandbox back with its processes (RUNNING); when they cannot come
// back, it starts it on its workspace and StateReason says "memory not restored: …". It takes
// a concurrency slot (a *Error with code QUOTA_EXCEEDED and RetryAfter when none is free).
func (c *Client) Resume(ctx context.Context, id string) (Sandbox, error) {
	var sb Sandbox
	err := c.call(ctx, http.MethodPost, sandboxPath(id, "resume"), nil, &sb)
	return sb, err
}

// Destroy removes a sandbox's runtime after a final checkpoint (Sandbox.SnapshotID).
func (c *Client) Destroy(ctx context.Context, id string) (Sandbox, error) {
	var sb Sandbox
	err := c.call(ctx, http.MethodDelete, sandboxPath(id), nil, &sb)
	return sb, err
}

// ---- files ----

// FileInfo describes a file of a workspace.
type FileInfo struct {
	Name    string    `json:"name"`
	Path    string    `json:"path"`
	Size    int64     `json:"size"`
	Mode    string    `json:"mode"` // octal permission bits, "0644"
	IsDir   bool      `json:"is_dir"`
	Symlink string    `json:"symlink,omitempty"`
	ModTime time.Time `json:"mod_time"`
	// Type is FILE, DIRECTORY, SYMLINK, SOCKET, FIFO, CHAR_DEVICE, BLOCK_DEVICE or OTHER
	// ("" from a server that does not say).
	Type string `json:"type,omitempty"`
}

// FileList is a folder's listing.
type FileList struct {
	Path      string     `json:"path"`
	Entries   []FileInfo `json:"entries"`
	Truncated bool       `json:"truncated"`
}

// WriteFile writes r's bytes to path (relative to /workspace) atomically, creating parents;
// mode 0 leaves the server's default.
func (c *Client) WriteFile(ctx context.Context, id, path string, r io.Reader, mode os.FileMode) (FileInfo, error) {
	q := url.Values{"path": {path}}
	if mode != 0 {
		q.Set("mode", fmt.Sprintf("%04o", mode.Perm()))
	}
	req, err := c.request(ctx, http.MethodPut, withQuery(sandboxPath(id, "files"), q), r)
	if err != nil {
		return FileInfo{}, err
	}
	req.Header.Set("Content-Type", "application/octet-stream")
	resp, err := c.send(req)
	if err != nil {
		return FileInfo{}, err
	}
	defer resp.Body.Close()
	var fi FileInfo
	return fi, decodeBody(resp, &fi)
}

// OpenFile streams a file of the workspace; the caller closes it.
func (c *Client) OpenFile(ctx context.Context, id, path string) (io.ReadCloser, error) {
	req, err := c.request(ctx, http.MethodGet, withQuery(sandboxPath(id, "files"), url.Values{"path": {path}}), nil)
	if err != nil {
		return nil, err
	}
	resp, err := c.send(req)
	if err != nil {
		return nil, err
	}
	return resp.Body, nil
}

// ReadFile answers a file of the workspace.
func (c *Client) ReadFile(ctx context.Context, id, path string) ([]byte, error) {
	rc, err := c.OpenFile(ctx, id, path)
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	return io.ReadAll(rc)
}

// ListFiles lists a folder of the workspace ("" is /workspace); limit 0 takes the server's.
func (c *Client) ListFiles(ctx context.Context, id, path string, limit int) (FileList, error) {
	q := url.Values{}
	if path != "" {
		q.Set("path", path)
	}
	if limit > 0 {
		q.Set("limit", strconv.Itoa(limit))
	}
	var l FileList
	err := c.call(ctx, http.MethodGet, withQuery(sandboxPath(id, "files", "list"), q), nil, &l)
	return l, err
}

// ---- snapshots ----

// Snapshot is a workspace checkpoint.
type Snapshot struct {
	ID               string    `json:"snapshot_id"`
	SandboxID        string    `json:"sandbox_id"`
	CreatedAt        time.Time `json:"created_at"`
	SizeBytes        int64     `json:"size_bytes"`
	RawSizeBytes     int64     `json:"raw_size_bytes"`
	SHA256           string    `json:"sha256"`
	ParentSnapshotID string    `json:"parent_snapshot_id,omitempty"`
}

// Snapshot checkpoints a running sandbox's workspace; the sandbox keeps running.
func (c *Client) Snapshot(ctx context.Context, id string) (Snapshot, error) {
	var s Snapshot
	err := c.call(ctx, http.MethodPost, sandboxPath(id, "snapshots"), nil, &s)
	return s, err
}

// Snapshots lists one sandbox's snapshots, or with sandboxID "" the whole project's, newest
// first; limit 0 takes the server's default.
func (c *Client) Snapshots(ctx context.Context, sandboxID string, limit int) ([]Snapshot, error) {
	path := SandboxesPath + "/snapshots"
	if sandboxID != "" {
		path = sandboxPath(sandboxID, "snapshots")
	}
	q := url.Values{}
	if limit > 0 {
		q.Set("limit", strconv.Itoa(limit))
	}
	var out struct {
		Snapshots []Snapshot `json:"snapshots"`
	}
	err := c.call(ctx, http.MethodGet, withQuery(path, q), nil, &out)
	return out.Snapshots, err
}

// DeleteSnapshot deletes a snapshot.
func (c *Client) DeleteSnapshot(ctx context.Context, snapshotID string) error {
	return c.call(ctx, http.MethodDelete, SandboxesPath+"/snapshots/"+url.PathEscape(snapshotID), nil, nil)
}

func withQuery(path string, q url.Values) string {
	if len(q) == 0 {
		return path
	}
	return path + "?" + q.Encode()
}
