package server

import (
	"net/http"

	"sandboxd/guest/proto"
)

// handleRelease forgets the ended execs of a ReleaseRequest that left nothing running
// (proto/release.go).
func (s *Server) handleRelease(w http.ResponseWriter, r *http.Request) {
	var req proto.ReleaseRequest
	if perr := readJSON(r, &req, proto.MaxReleaseBytes); perr != nil {
		writeError(w, perr)
		return
	}
	if len(req.IDs) > proto.MaxReleaseIDs {
		writeError(w, errorf(proto.ErrCodeInvalid, "at most %d ids per release, got %d", proto.MaxReleaseIDs, len(req.IDs)))
		return
	}
	writeJSON(w, http.StatusOK, proto.ReleaseResult{Released: s.releaseEnded(req.IDs)})
}

// releaseEnded forgets each exec of ids that ended and left nothing running (releasable),
// and returns how many it forgot. Nothing of such an exec can run or be signalled any more:
// forgetting it drops its log's files and its record, and nothing else.
func (s *Server) releaseEnded(ids []string) int {
	n := 0
	for _, id := range ids {
		e := s.lookup(id)
		if e == nil || !e.releasable() {
			continue
		}
		s.mu.Lock()
		if s.execs[id] != e {
			s.mu.Unlock()
			continue // forgotten meanwhile
		}
		s.unlistLocked(id)
		s.mu.Unlock()
		e.discard()
		n++
	}
	return n
}

// releasable reports whether the exec ended (its exit record is written and the server is
// done with it) and left nothing running: its command never started, or its cgroup was given
// back at its end, or is empty now and given back here (what the command left in the
// background ended since). A started exec that the init tracks without cgroups is never
// releasable: nothing here tells that its processes are all gone.
func (e *execState) releasable() bool {
	select {
	case <-e.done:
	default:
		return false
	}
	e.dropEmptyCgroup()
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.pid == 0 || e.cg != nil && e.cgroupGone
}
