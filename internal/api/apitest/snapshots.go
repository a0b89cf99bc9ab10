package apitest

import (
	"context"
	"errors"
	"strings"
	"time"

	"sandboxd/internal/apierror"
	"sandboxd/internal/auth"
	"sandboxd/internal/sandbox"
)

// snapshots are SnapLatest (5 GiB, parent SnapOld) and SnapOld, newest first.
func snapshots() []sandbox.SnapshotInfo {
	return []sandbox.SnapshotInfo{
		{ID: SnapLatest, SandboxID: SandboxRunning, CreatedAt: T0.Add(time.Minute), SizeBytes: 5 << 30, RawSizeBytes: 6 << 30,
			SHA256: strings.Repeat("ab", 32), Parent: SnapOld},
		{ID: SnapOld, SandboxID: SandboxRunning, CreatedAt: T0, SizeBytes: 100, RawSizeBytes: 2048, SHA256: strings.Repeat("cd", 32)},
	}
}

// Snapshot answers SnapshotErr, or the first of Snapshots.
func (f *Fake) Snapshot(_ context.Context, p auth.Principal, id string) (sandbox.SnapshotInfo, error) {
	f.record(Call{Method: "Snapshot", Principal: p, SandboxID: id})
	f.mu.Lock()
	err, snaps := f.SnapshotErr, f.Snapshots
	f.mu.Unlock()
	if err != nil {
		return sandbox.SnapshotInfo{}, err
	}
	if _, err := lookup(p, id); err != nil {
		return sandbox.SnapshotInfo{}, err
	}
	if len(snaps) == 0 {
		return sandbox.SnapshotInfo{}, errors.New("apitest: Fake.Snapshots is empty")
	}
	return snaps[0], nil
}

// ListSnapshots answers SnapshotErr, or Snapshots (of the project, or of a known sandbox).
func (f *Fake) ListSnapshots(_ context.Context, p auth.Principal, sandboxID string, limit int) ([]sandbox.SnapshotInfo, error) {
	f.record(Call{Method: "ListSnapshots", Principal: p, SandboxID: sandboxID, Limit: limit})
	f.mu.Lock()
	err, snaps := f.SnapshotErr, append([]sandbox.SnapshotInfo(nil), f.Snapshots...)
	f.mu.Unlock()
	if err != nil {
		return nil, err
	}
	if sandboxID != "" {
		if _, err := lookup(p, sandboxID); err != nil {
			return nil, err
		}
	}
	return snaps, nil
}

// DeleteSnapshot answers SnapshotErr; SnapLatest is the only copy of a STOPPED sandbox's
// workspace (INVALID_STATE); another of Snapshots is deleted (it stays listed); anything
// else is NOT_FOUND.
func (f *Fake) DeleteSnapshot(_ context.Context, p auth.Principal, snapshotID string) error {
	f.record(Call{Method: "DeleteSnapshot", Principal: p, ID: snapshotID})
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.SnapshotErr != nil {
		return f.SnapshotErr
	}
	if snapshotID == SnapLatest {
		return apierror.New(apierror.InvalidState, "cannot delete snapshot %s: it is the only copy", snapshotID).WithDetail("state", "STOPPED")
	}
	for _, s := range f.Snapshots {
		if s.ID == snapshotID {
			return nil
		}
	}
	return apierror.New(apierror.NotFound, "snapshot %s not found", snapshotID)
}

// GetSnapshot answers SnapshotErr, or the one of Snapshots with this id when the caller is in
// the fixtures' tenant:project; anything else is NOT_FOUND.
func (f *Fake) GetSnapshot(_ context.Context, p auth.Principal, snapshotID string) (sandbox.SnapshotInfo, error) {
	f.record(Call{Method: "GetSnapshot", Principal: p, ID: snapshotID})
	f.mu.Lock()
	err, snaps := f.SnapshotErr, f.Snapshots
	f.mu.Unlock()
	if err != nil {
		return sandbox.SnapshotInfo{}, err
	}
	for _, s := range snaps {
		if s.ID != snapshotID {
			continue
		}
		if _, err := lookup(p, s.SandboxID); err != nil {
			break // another tenant's: as missing
		}
		return s, nil
	}
	return sandbox.SnapshotInfo{}, apierror.New(apierror.NotFound, "snapshot %s not found", snapshotID)
}
