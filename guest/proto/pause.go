package proto

// Pause. A runtime that keeps a box's memory across a stop (the local one: runsc checkpoint,
// then runsc restore) and the guest init agree on the following, because runsc cannot save a
// unix socket bound on a host folder: the init's host socket (HostSocketEnv) must be closed
// before the checkpoint and opened again after the restore. The connections already accepted
// on it need nothing: runsc closes their host ends when it saves the box, and the restored init
// sees them end.
//
//	POST /v1/quiesce   → QuiesceResult
//
// The init closes its host socket's listener and removes the socket's file; the connection that
// asked (and every other open one) stays usable until the box is saved. It refuses
// (ErrCodeState, nothing closed) while a process of the box holds a unix socket bound in the
// workspace: that is a host folder too, runsc cannot save such a socket, and a failed
// checkpoint ends the box. The message names the socket. Quiescing a quiesced init is no error.
//
// To open it again, the runtime writes the file ReopenMarker into the host socket's folder (on
// the host: the box cannot reach that folder), before `runsc restore` or into a box that runs
// quiesced: a quiesced init looks for the marker every few milliseconds, and on ReopenSignal
// to PID 1 (for a runtime that cannot wait), listens on its host socket again and deletes the
// marker. Without the marker the signal changes nothing, so a process of the box that sends it
// (it can: PID 1 handles it) cannot undo a quiesce before the checkpoint. Reopening an open
// socket is no error either. The marker must not be written before the checkpoint is done.
const (
	// QuiescePath is the endpoint of a quiesce.
	QuiescePath = "/v1/quiesce"
	// ReopenMarker is the file the runtime puts into the host socket's folder to ask for the
	// socket again.
	ReopenMarker = "reopen"
	// ReopenSignal is the signal (as `runsc kill` names it) that makes PID 1 look for the
	// marker: SIGUSR2.
	ReopenSignal = "USR2"
)

// QuiesceResult is the answer of POST /v1/quiesce.
type QuiesceResult struct {
	// Closed is true when this call closed the host socket; false when it was not open (already
	// quiesced, or the init has none).
	Closed bool `json:"closed"`
}
