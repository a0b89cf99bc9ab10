package server

import (
	"bufio"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"

	"sandboxd/guest/proto"
)

// handleQuiesce serves POST /v1/quiesce (proto/pause.go): refused while a process holds a unix
// socket bound in the workspace, else Options.Quiesce closes the host socket, and the exec
// streams are closed.
func (s *Server) handleQuiesce(w http.ResponseWriter, r *http.Request) {
	if s.opts.Quiesce == nil {
		writeError(w, errorf(proto.ErrCodeInvalid, "this guest init has no host socket to close: it cannot be paused"))
		return
	}
	bound, err := boundUnder(procNetUnix, s.ws)
	if err != nil {
		writeError(w, errorf(proto.ErrCodeInternal, "reading the box's unix sockets: %v", err))
		return
	}
	if len(bound) > 0 {
		more := ""
		if len(bound) > 1 {
			more = fmt.Sprintf(" (and %d more)", len(bound)-1)
		}
		writeError(w, errorf(proto.ErrCodeState,
			"a process holds a unix socket bound in the workspace, at %s%s: the workspace is a host folder, and runsc cannot save a socket bound there; bind it under /tmp, or end that process, then pause again",
			strings.Replace(bound[0], s.ws, proto.Workspace, 1), more))
		return
	}
	closed, err := s.opts.Quiesce()
	s.closeStreams()
	if err != nil {
		writeError(w, errorf(proto.ErrCodeInternal, "closing the host socket: %v", err))
		return
	}
	writeJSON(w, http.StatusOK, proto.QuiesceResult{Closed: closed})
}

// procNetUnix lists the unix sockets of the box's network namespace (gVisor's, inside a box).
const procNetUnix = "/proc/net/unix"

// maxSocketLines bounds how much of procNetUnix is read: a box with more sockets than this is
// not checked past them (each line is about a hundred bytes).
const maxSocketLines = 1 << 16

// boundUnder returns the paths of the unix sockets listed in the file table (the format of
// /proc/net/unix: seven fields, then the path of a bound socket) that are bound at dir or
// below it. A socket whose file was deleted keeps its path there.
func boundUnder(table, dir string) ([]string, error) {
	f, err := os.Open(table)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return parseBound(f, filepath.Clean(dir))
}

func parseBound(r io.Reader, dir string) ([]string, error) {
	var out []string
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 4096), 16<<10)
	for n := 0; sc.Scan() && n < maxSocketLines; n++ {
		if n == 0 {
			continue // the header
		}
		line := sc.Text()
		rest := line
		for range 7 {
			rest = strings.TrimLeft(rest, " ")
			i := strings.IndexByte(rest, ' ')
			if i < 0 {
				rest = ""
				break
			}
			rest = rest[i:]
		}
		p := strings.TrimSpace(rest)
		if p == "" || p[0] == '@' {
			continue // unbound, or abstract: no file
		}
		if p == dir || strings.HasPrefix(p, dir+"/") {
			out = append(out, p)
		}
	}
	if err := sc.Err(); err != nil {
		return out, err
	}
	return out, nil
}
