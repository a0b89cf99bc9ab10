package apitest

import (
	"bytes"
	"context"
	"io"
	"os"
	"time"

	"sandboxd/internal/apierror"
	"sandboxd/internal/auth"
	"sandboxd/internal/quota"
	"sandboxd/internal/sandbox"
)

// Create answers SandboxRunning, with the requested profile when there is one.
func (f *Fake) Create(_ context.Context, p auth.Principal, req sandbox.CreateRequest) (sandbox.Sandbox, error) {
	f.record(Call{Method: "Create", Principal: p, Create: req})
	s := runningSandbox(p)
	if req.Profile != "" {
		s.Profile = req.Profile
	}
	s.Labels = req.Labels
	return s, nil
}

// Update answers the sandbox with the request applied: its labels patched (a key with nil
// removed), autostop_sec and ttl_sec replaced. It checks nothing else (the domain does).
func (f *Fake) Update(_ context.Context, p auth.Principal, id string, req sandbox.UpdateRequest) (sandbox.Sandbox, error) {
	f.record(Call{Method: "Update", Principal: p, SandboxID: id, Update: req})
	s, err := lookup(p, id)
	if err != nil {
		return s, err
	}
	for k, v := range req.Labels {
		if s.Labels == nil {
			s.Labels = map[string]string{}
		}
		if v == nil {
			delete(s.Labels, k)
		} else {
			s.Labels[k] = *v
		}
	}
	if req.AutostopSec != nil {
		s.AutostopSec = *req.AutostopSec
	}
	if req.TTLSec != nil {
		s.TTLSec = *req.TTLSec
	}
	return s, nil
}

func (f *Fake) Get(_ context.Context, p auth.Principal, id string) (sandbox.Sandbox, error) {
	f.record(Call{Method: "Get", Principal: p, SandboxID: id})
	s, err := lookup(p, id)
	f.mu.Lock()
	if err == nil && f.LatestSnapshot != "" {
		s.LatestSnapshotID = f.LatestSnapshot
	}
	f.mu.Unlock()
	return s, err
}

// List answers one page of two sandboxes, whose next cursor is the second.
func (f *Fake) List(_ context.Context, p auth.Principal, opts sandbox.ListOptions) (sandbox.Page, error) {
	f.record(Call{Method: "List", Principal: p, List: opts})
	a, b := runningSandbox(p), runningSandbox(p)
	b.ID = sandboxListed
	return sandbox.Page{Sandboxes: []sandbox.Sandbox{a, b}, NextCursor: b.ID}, nil
}

func (f *Fake) Stop(_ context.Context, p auth.Principal, id string) (sandbox.Sandbox, error) {
	f.record(Call{Method: "Stop", Principal: p, SandboxID: id})
	s, err := lookup(p, id)
	s.State = sandbox.Stopped
	return s, err
}

func (f *Fake) Start(_ context.Context, p auth.Principal, id string) (sandbox.Sandbox, error) {
	f.record(Call{Method: "Start", Principal: p, SandboxID: id})
	return lookup(p, id)
}

// Pause answers the sandbox PAUSED.
func (f *Fake) Pause(_ context.Context, p auth.Principal, id string) (sandbox.Sandbox, error) {
	f.record(Call{Method: "Pause", Principal: p, SandboxID: id})
	s, err := lookup(p, id)
	s.State = sandbox.Paused
	return s, err
}

// Resume answers the sandbox RUNNING.
func (f *Fake) Resume(_ context.Context, p auth.Principal, id string) (sandbox.Sandbox, error) {
	f.record(Call{Method: "Resume", Principal: p, SandboxID: id})
	return lookup(p, id)
}

// Destroy answers the sandbox DESTROYED, with SnapDestroyed as its last checkpoint.
func (f *Fake) Destroy(_ context.Context, p auth.Principal, id string) (sandbox.DestroyResult, error) {
	f.record(Call{Method: "Destroy", Principal: p, SandboxID: id})
	s, err := lookup(p, id)
	s.State = sandbox.Destroyed
	return sandbox.DestroyResult{Sandbox: s, SnapshotID: SnapDestroyed}, err
}

// EventsFunc delivers SandboxEvents (see Fake), then ends (SandboxEventsEnd) or waits for ctx.
func (f *Fake) EventsFunc(ctx context.Context, p auth.Principal, sandboxID, after string, deliver func(sandbox.Event) bool, ended func()) error {
	f.record(Call{Method: "Events", Principal: p, SandboxID: sandboxID, After: after})
	if sandboxID != "" {
		if _, err := lookup(p, sandboxID); err != nil {
			return err
		}
	}
	f.mu.Lock()
	evs, end, delay := append([]sandbox.Event(nil), f.SandboxEvents...), f.SandboxEventsEnd, f.SandboxEventsDelay
	f.mu.Unlock()
	f.streams.Add(1)
	go func() {
		defer f.streams.Done()
		defer signal(f.eventsDone, struct{}{})
		defer ended()
		select {
		case <-time.After(delay):
		case <-ctx.Done():
			return
		}
		for _, e := range evs {
			if ctx.Err() != nil || !deliver(e) {
				return
			}
		}
		if !end {
			<-ctx.Done()
		}
	}()
	return nil
}

// EventsCursor answers EventsCursorNow, and records the call.
func (f *Fake) EventsCursor(_ context.Context, p auth.Principal) (string, error) {
	f.record(Call{Method: "EventsCursor", Principal: p})
	return EventsCursorNow, nil
}

// Quota answers 3 of 10 slots in use.
func (f *Fake) Quota(_ context.Context, p auth.Principal) (quota.Usage, error) {
	f.record(Call{Method: "Quota", Principal: p})
	return quota.Usage{Limit: 10, InUse: 3}, nil
}

// Profiles answers the one default profile.
func (f *Fake) Profiles() []sandbox.Profile {
	f.record(Call{Method: "Profiles"})
	return []sandbox.Profile{{Name: "sandboxes-default", Description: "Debian with Python", MilliCPU: 2000,
		MemoryBytes: 4 << 30, DiskBytes: 10 << 30, Network: "none", Default: true}}
}

// Limits answers the defaults.
func (f *Fake) Limits() sandbox.Limits {
	f.record(Call{Method: "Limits"})
	return sandbox.DefaultLimits()
}

// ---- files ----

// ReadFile answers File as a.txt, or PAYLOAD_TOO_LARGE when it is larger than maxBytes.
func (f *Fake) ReadFile(_ context.Context, p auth.Principal, id, path string, maxBytes int64) ([]byte, sandbox.FileInfo, error) {
	f.record(Call{Method: "ReadFile", Principal: p, SandboxID: id, Path: path, MaxBytes: maxBytes})
	if _, err := lookup(p, id); err != nil {
		return nil, sandbox.FileInfo{}, err
	}
	f.mu.Lock()
	data := f.File
	f.mu.Unlock()
	if int64(len(data)) > maxBytes {
		return nil, sandbox.FileInfo{}, apierror.New(apierror.PayloadTooLarge, "%s is too large", path)
	}
	return data, fileInfo(path, data), nil
}

// OpenFile answers File as a.txt.
func (f *Fake) OpenFile(_ context.Context, p auth.Principal, id, path string) (io.ReadCloser, sandbox.FileInfo, error) {
	f.record(Call{Method: "OpenFile", Principal: p, SandboxID: id, Path: path})
	if _, err := lookup(p, id); err != nil {
		return nil, sandbox.FileInfo{}, err
	}
	f.mu.Lock()
	data := f.File
	f.mu.Unlock()
	return io.NopCloser(bytes.NewReader(data)), fileInfo(path, data), nil
}

func fileInfo(path string, data []byte) sandbox.FileInfo {
	return sandbox.FileInfo{Name: "a.txt", Path: "/workspace/" + path, Size: int64(len(data)), Mode: 0o644, ModTime: T0}
}

// WriteFile reads r whole (Call.Data) and answers b.bin with its size and mode.
func (f *Fake) WriteFile(_ context.Context, p auth.Principal, id, path string, mode os.FileMode, r io.Reader) (sandbox.FileInfo, error) {
	data, readErr := io.ReadAll(r)
	f.record(Call{Method: "WriteFile", Principal: p, SandboxID: id, Path: path, Mode: mode, Data: data})
	if _, err := lookup(p, id); err != nil {
		return sandbox.FileInfo{}, err
	}
	if readErr != nil {
		return sandbox.FileInfo{}, readErr
	}
	return sandbox.FileInfo{Name: "b.bin", Path: "/workspace/" + path, Size: int64(len(data)), Mode: uint32(mode)}, nil
}

// FilePage answers ListDir's two entries as a page with a next cursor.
func (f *Fake) FilePage(_ context.Context, p auth.Principal, id, path string, opts sandbox.FileListOptions) (sandbox.FilePage, error) {
	f.record(Call{Method: "FilePage", Principal: p, SandboxID: id, Path: path, Limit: opts.Limit, After: opts.After})
	if _, err := lookup(p, id); err != nil {
		return sandbox.FilePage{}, err
	}
	return sandbox.FilePage{Entries: []sandbox.FileInfo{
		{Name: "link", Path: "/workspace/link", Symlink: "src", Mode: 0o777},
		{Name: "src", Path: "/workspace/src", IsDir: true, Mode: 0o755, ModTime: T0},
	}, NextCursor: sandbox.FileCursor("src")}, nil
}

// ListDir answers a folder and a link to it, and that there were more entries.
func (f *Fake) ListDir(_ context.Context, p auth.Principal, id, path string, limit int) ([]sandbox.FileInfo, bool, error) {
	f.record(Call{Method: "ListDir", Principal: p, SandboxID: id, Path: path, Limit: limit})
	if _, err := lookup(p, id); err != nil {
		return nil, false, err
	}
	return []sandbox.FileInfo{
		{Name: "src", Path: "/workspace/src", IsDir: true, Mode: 0o755, ModTime: T0},
		{Name: "link", Path: "/workspace/link", Symlink: "src", Mode: 0o777},
	}, true, nil
}
