package gvisor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"sync"
	"syscall"
	"time"

	"sandboxd/runtime"
)

// MaxIDLen bounds a box id. The project's ids are fixed-length (`sbx_` + a 26-character ULID),
// which also keeps runsc's prefix matching of container ids unambiguous.
const MaxIDLen = 64

var idPattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_-]*$`)

// ValidID reports whether id is usable as a box id: letters, digits, '_' and '-', starting
// with a letter or digit (so it can never be read as a flag), at most MaxIDLen bytes (so it
// is always one path element).
func ValidID(id string) bool {
	return len(id) <= MaxIDLen && idPattern.MatchString(id)
}

func checkID(id string) error {
	if !ValidID(id) {
		return fmt.Errorf("gvisor: invalid box id %q: %w", id, runtime.ErrNotFound)
	}
	return nil
}

// Files of a box under StateDir/boxes/<id>/.
const (
	recordFile  = "record.json"
	lockFile    = "record.lock"
	flagsFile   = "runsc-flags.json"
	logFile     = "runsc.log"
	workspaceDn = "workspace"
	bundleDn    = "bundle"
	// hostDn is mounted at /run/sbx/host: the guest init makes its host socket there.
	hostDn = "host"
	// tamperedFile says why the box's attach channel was found tampered with (its compute
	// was then ended): the box is PhaseFailed until it is started again.
	tamperedFile = "tampered"
	// connectProcessFile is the process spec of the `runsc exec --process` fallback attach.
	connectProcessFile = "connect-process.json"
)

// boxStore is the boxes' folders under StateDir/boxes and the record kept in each: where a
// box's files are, and its record.json read, written and updated (the box's fence with it)
// under a per-box mutex and a flock.
type boxStore struct {
	dir string // StateDir/boxes
	// recMu serializes record read-modify-writes within this process (a flock extends that
	// across processes).
	recMu keyedMutex
}

func (s *boxStore) boxDir(id string) string { return filepath.Join(s.dir, id) }
func (s *boxStore) boxPath(id, name string) string {
	return filepath.Join(s.dir, id, name)
}

// storedRecord is the content of record.json: the sandbox's record, and beside its fields the
// driver's own: the highest fence a write to the box has carried (runtime.WithFence).
type storedRecord struct {
	runtime.Record
	Fence uint64 `json:"fence,omitempty"`
}

// readRecord reads a box's record; ErrNotFound when the box (or its record) is missing.
func (s *boxStore) readRecord(id string) (runtime.Record, error) {
	st, err := s.readStored(id)
	return st.Record, err
}

// readStored reads a box's record.json; ErrNotFound when the box (or its record) is missing.
func (s *boxStore) readStored(id string) (storedRecord, error) {
	var st storedRecord
	b, err := os.ReadFile(s.boxPath(id, recordFile))
	if errors.Is(err, fs.ErrNotExist) {
		return st, fmt.Errorf("gvisor: box %s: %w", id, runtime.ErrNotFound)
	}
	if err != nil {
		return st, fmt.Errorf("gvisor: read record of %s: %w", id, err)
	}
	if err := json.Unmarshal(b, &st); err != nil {
		return st, fmt.Errorf("gvisor: decode record of %s: %w", id, err)
	}
	return st, nil
}

func (s *boxStore) writeStored(st storedRecord) error {
	b, err := json.MarshalIndent(st, "", "  ")
	if err != nil {
		return fmt.Errorf("gvisor: encode record of %s: %w", st.ID, err)
	}
	return writeFileAtomic(s.boxPath(st.ID, recordFile), append(b, '\n'), 0o600)
}

// writeStoredUnsynced is writeStored without the syncs: atomic for every reader, not durable
// across a host crash.
func (s *boxStore) writeStoredUnsynced(st storedRecord) error {
	b, err := json.MarshalIndent(st, "", "  ")
	if err != nil {
		return fmt.Errorf("gvisor: encode record of %s: %w", st.ID, err)
	}
	path := s.boxPath(st.ID, recordFile)
	f, err := os.CreateTemp(filepath.Dir(path), "."+recordFile+".tmp*")
	if err != nil {
		return err
	}
	_, err = f.Write(append(b, '\n'))
	if err == nil {
		err = f.Chmod(0o600)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(f.Name(), path)
	}
	if err != nil {
		os.Remove(f.Name())
	}
	return err
}

// updateStored is a read-modify-write of a box's record.json under the box's record mutex and
// the flock of its lock file (for other processes sharing StateDir). The write's fence (ctx)
// is admitted first: a lower one than the stored fence is ErrFenced and nothing is written; a
// higher one is stored with fn's change. fn may not change the id. With write false after fn
// (nothing to store) the file is rewritten only when the fence rose.
func (s *boxStore) updateStored(ctx context.Context, id string, fn func(*runtime.Record) (write bool, err error)) (runtime.Record, error) {
	return s.updateStoredSync(ctx, id, true, fn)
}

// updateStoredSync is updateStored; with sync false the write is atomic (temporary file and
// rename) but not synced: other processes see it at once, a host crash may lose it (the
// records of warm pool boxes, whose compute does not survive one either: pool.go).
func (s *boxStore) updateStoredSync(ctx context.Context, id string, sync bool, fn func(*runtime.Record) (write bool, err error)) (runtime.Record, error) {
	unlock := s.recMu.lock(id)
	defer unlock()
	funlock, err := s.lockRecordFile(ctx, id)
	if err != nil {
		return runtime.Record{}, err
	}
	defer funlock()
	st, err := s.readStored(id)
	if err != nil {
		return runtime.Record{}, err
	}
	fence, raised, err := runtime.AdmitFence(ctx, st.Fence)
	if err != nil {
		return runtime.Record{}, fmt.Errorf("gvisor: box %s: %w", id, err)
	}
	rec := st.Record
	write, err := fn(&rec)
	if err != nil {
		return runtime.Record{}, err
	}
	if rec.ID != id {
		return runtime.Record{}, fmt.Errorf("gvisor: UpdateRecord may not change the id (%s to %s)", id, rec.ID)
	}
	if write || raised {
		st := storedRecord{Record: rec, Fence: fence}
		write := s.writeStored
		if !sync {
			write = s.writeStoredUnsynced
		}
		if err := write(st); err != nil {
			return runtime.Record{}, err
		}
	}
	return rec, nil
}

// admitFence checks a lifecycle write (start, stop, delete) made with ctx against the box's
// stored fence before it changes anything, and stores a higher one. The caller holds the
// box's lifecycle mutex, so no other lifecycle write of this process interleaves between the
// check and the change it guards.
func (s *boxStore) admitFence(ctx context.Context, id string) error {
	if _, ok := runtime.FenceFrom(ctx); !ok {
		return nil
	}
	_, err := s.updateStored(ctx, id, func(*runtime.Record) (bool, error) { return false, nil })
	return err
}

// writeFileAtomic writes data to a temporary file beside path, syncs it, renames it over path
// and syncs the folder, so a reader sees the old or the new content, never a mix, even after a
// crash.
func writeFileAtomic(path string, data []byte, perm os.FileMode) error {
	dir := filepath.Dir(path)
	f, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	ok := false
	defer func() {
		if !ok {
			f.Close()
			os.Remove(tmp)
		}
	}()
	if _, err := f.Write(data); err != nil {
		return err
	}
	if err := f.Chmod(perm); err != nil {
		return err
	}
	if err := f.Sync(); err != nil {
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		return err
	}
	ok = true
	if df, err := os.Open(dir); err == nil {
		_ = df.Sync()
		df.Close()
	}
	return nil
}

// lockRecordFile takes an exclusive flock on the box's lock file, so that two processes
// sharing a StateDir do not interleave read-modify-writes of a record. The lock lives on a
// separate file because the record itself is replaced by rename on every write. It polls so
// that ctx bounds the wait.
func (s *boxStore) lockRecordFile(ctx context.Context, id string) (unlock func(), err error) {
	f, err := os.OpenFile(s.boxPath(id, lockFile), os.O_RDWR|os.O_CREATE, 0o600)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("gvisor: box %s: %w", id, runtime.ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("gvisor: open lock of %s: %w", id, err)
	}
	delay := time.Millisecond
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			return func() {
				_ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
				f.Close()
			}, nil
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) && !errors.Is(err, syscall.EINTR) {
			f.Close()
			return nil, fmt.Errorf("gvisor: lock record of %s: %w", id, err)
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, fmt.Errorf("gvisor: lock record of %s: %w", id, ctx.Err())
		case <-time.After(delay):
		}
		delay = min(delay*2, 20*time.Millisecond)
	}
}

// keyedMutex is a set of mutexes by key whose entries are dropped when nobody holds or waits
// for them, so it does not grow with every id ever seen.
type keyedMutex struct {
	mu sync.Mutex
	m  map[string]*keyedEntry
}

type keyedEntry struct {
	mu   sync.Mutex
	refs int
}

func (k *keyedMutex) lock(key string) (unlock func()) {
	k.mu.Lock()
	if k.m == nil {
		k.m = make(map[string]*keyedEntry)
	}
	e := k.m[key]
	if e == nil {
		e = &keyedEntry{}
		k.m[key] = e
	}
	e.refs++
	k.mu.Unlock()

	e.mu.Lock()
	return func() {
		e.mu.Unlock()
		k.mu.Lock()
		e.refs--
		if e.refs == 0 {
			delete(k.m, key)
		}
		k.mu.Unlock()
	}
}

func writeJSONAtomic(path string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	return writeFileAtomic(path, append(b, '\n'), 0o600)
}
