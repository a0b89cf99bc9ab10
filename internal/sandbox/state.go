package sandbox

import (
	"fmt"
	"time"

	"sandboxd/internal/apierror"
)

// State is a sandbox's lifecycle state.
type State string

// The states, as DESIGN.md names them.
const (
	Creating   State = "CREATING"
	Running    State = "RUNNING"
	Stopping   State = "STOPPING"
	Stopped    State = "STOPPED"
	Starting   State = "STARTING"
	Destroying State = "DESTROYING"
	Destroyed  State = "DESTROYED"
	Failed     State = "FAILED"
	Expired    State = "EXPIRED"
	// Pausing, Paused and Resuming: a pause keeps the sandbox's memory and processes (a runsc
	// checkpoint image) and its workspace, and holds neither compute nor a concurrency slot
	// while PAUSED; a resume brings the processes back (pause.go).
	Pausing  State = "PAUSING"
	Paused   State = "PAUSED"
	Resuming State = "RESUMING"
)

// States lists every state.
var States = []State{Creating, Running, Stopping, Stopped, Starting, Destroying, Destroyed, Failed, Expired, Pausing, Paused, Resuming}

// ParseState returns the state named s (case-sensitive, as the API spells it).
func ParseState(s string) (State, error) {
	for _, st := range States {
		if string(st) == s {
			return st, nil
		}
	}
	return "", apierror.New(apierror.InvalidArgument, "unknown state %q: one of %v", s, States)
}

// Verb is something a caller asks of an existing sandbox.
type Verb string

// The verbs.
const (
	VerbGet     Verb = "get"
	VerbExec    Verb = "exec"
	VerbFiles   Verb = "files"
	VerbStop    Verb = "stop"
	VerbStart   Verb = "start"
	VerbDestroy Verb = "destroy"
	// VerbSnapshot checkpoints a running sandbox's workspace without stopping it.
	VerbSnapshot Verb = "snapshot"
	// VerbUpdate changes a sandbox's labels, autostop_sec or ttl_sec; it keeps the state and
	// holds the sandbox's operation lock while it writes the record.
	VerbUpdate Verb = "update"
	// VerbPause saves a running sandbox's memory and workspace and releases its compute and
	// slot; VerbResume brings a paused one back with its processes.
	VerbPause  Verb = "pause"
	VerbResume Verb = "resume"
)

// Verbs lists every verb.
var Verbs = []Verb{VerbGet, VerbExec, VerbFiles, VerbStop, VerbStart, VerbDestroy, VerbSnapshot, VerbUpdate, VerbPause, VerbResume}

// rule is what one verb does in one state.
type rule int

const (
	// reject: the verb does not fit the state (409 INVALID_STATE).
	reject rule = iota
	// allow: the verb runs; stateful verbs move through their transient state.
	allow
	// busy: another transition is in flight (409 INVALID_STATE with Retry-After).
	busy
	// gone: the sandbox no longer exists for callers (404).
	gone
)

// transitions is the one table of what each verb may do in each state. Stateful verbs move
// through a transient state to their target: stop RUNNING|FAILED|PAUSED → STOPPING → STOPPED,
// start STOPPED|FAILED → STARTING → RUNNING, destroy → DESTROYING → DESTROYED, pause RUNNING →
// PAUSING → PAUSED, resume PAUSED → RESUMING → RUNNING. Snapshot keeps the state (RUNNING) and
// holds the sandbox's operation lock while it checkpoints; so does update, in any state that
// is not in flight or final (EXPIRED is only destroyed).
var transitions = map[State]map[Verb]rule{
	Creating:   {VerbGet: allow, VerbExec: busy, VerbFiles: busy, VerbStop: busy, VerbStart: busy, VerbDestroy: busy, VerbSnapshot: busy, VerbUpdate: busy, VerbPause: busy, VerbResume: busy},
	Running:    {VerbGet: allow, VerbExec: allow, VerbFiles: allow, VerbStop: allow, VerbStart: reject, VerbDestroy: allow, VerbSnapshot: allow, VerbUpdate: allow, VerbPause: allow, VerbResume: reject},
	Stopping:   {VerbGet: allow, VerbExec: busy, VerbFiles: busy, VerbStop: busy, VerbStart: busy, VerbDestroy: busy, VerbSnapshot: busy, VerbUpdate: busy, VerbPause: busy, VerbResume: busy},
	Stopped:    {VerbGet: allow, VerbExec: reject, VerbFiles: reject, VerbStop: reject, VerbStart: allow, VerbDestroy: allow, VerbSnapshot: reject, VerbUpdate: allow, VerbPause: reject, VerbResume: reject},
	Starting:   {VerbGet: allow, VerbExec: busy, VerbFiles: busy, VerbStop: busy, VerbStart: busy, VerbDestroy: busy, VerbSnapshot: busy, VerbUpdate: busy, VerbPause: busy, VerbResume: busy},
	Destroying: {VerbGet: allow, VerbExec: busy, VerbFiles: busy, VerbStop: busy, VerbStart: busy, VerbDestroy: busy, VerbSnapshot: busy, VerbUpdate: busy, VerbPause: busy, VerbResume: busy},
	Destroyed:  {VerbGet: gone, VerbExec: gone, VerbFiles: gone, VerbStop: gone, VerbStart: gone, VerbDestroy: gone, VerbSnapshot: gone, VerbUpdate: gone, VerbPause: gone, VerbResume: gone},
	Failed:     {VerbGet: allow, VerbExec: reject, VerbFiles: reject, VerbStop: allow, VerbStart: allow, VerbDestroy: allow, VerbSnapshot: reject, VerbUpdate: allow, VerbPause: reject, VerbResume: reject},
	Expired:    {VerbGet: allow, VerbExec: reject, VerbFiles: reject, VerbStop: reject, VerbStart: reject, VerbDestroy: allow, VerbSnapshot: reject, VerbUpdate: reject, VerbPause: reject, VerbResume: reject},
	Pausing:    {VerbGet: allow, VerbExec: busy, VerbFiles: busy, VerbStop: busy, VerbStart: busy, VerbDestroy: busy, VerbSnapshot: busy, VerbUpdate: busy, VerbPause: busy, VerbResume: busy},
	Paused:     {VerbGet: allow, VerbExec: reject, VerbFiles: reject, VerbStop: allow, VerbStart: reject, VerbDestroy: allow, VerbSnapshot: reject, VerbUpdate: allow, VerbPause: reject, VerbResume: allow},
	Resuming:   {VerbGet: allow, VerbExec: busy, VerbFiles: busy, VerbStop: busy, VerbStart: busy, VerbDestroy: busy, VerbSnapshot: busy, VerbUpdate: busy, VerbPause: busy, VerbResume: busy},
}

// busyRetryAfter is the Retry-After of a verb refused because a transition is in flight.
const busyRetryAfter = 2 * time.Second

// Transient is the state a stateful verb moves through, and Target where it ends.
func (v Verb) transient() (transient, target State, ok bool) {
	switch v {
	case VerbStop:
		return Stopping, Stopped, true
	case VerbStart:
		return Starting, Running, true
	case VerbDestroy:
		return Destroying, Destroyed, true
	case VerbPause:
		return Pausing, Paused, true
	case VerbResume:
		return Resuming, Running, true
	}
	return "", "", false
}

// Check returns nil when verb fits state, else the coded error a client sees.
func Check(state State, verb Verb, id string) error {
	switch transitions[state][verb] {
	case allow:
		return nil
	case busy:
		return apierror.New(apierror.InvalidState, "sandbox %s is %s: another operation is in flight, retry shortly", id, state).
			WithRetryAfter(busyRetryAfter).WithDetail("state", string(state))
	case gone:
		return apierror.New(apierror.NotFound, "sandbox %s not found", id)
	default:
		return apierror.New(apierror.InvalidState, "cannot %s sandbox %s: it is %s%s", verb, id, state, hint(state, verb)).
			WithDetail("state", string(state))
	}
}

func hint(state State, verb Verb) string {
	switch {
	case state == Stopped && (verb == VerbExec || verb == VerbFiles):
		return " (start it first)"
	case state == Running && verb == VerbStart:
		return " already"
	case state == Failed && (verb == VerbExec || verb == VerbFiles || verb == VerbSnapshot):
		return " (start it again, or destroy it)"
	case state == Stopped && verb == VerbSnapshot:
		return " (its latest snapshot already holds the workspace)"
	case state == Expired && verb == VerbUpdate:
		return " (its TTL ended: it can only be destroyed)"
	case state == Paused && (verb == VerbExec || verb == VerbFiles):
		return " (resume it first, or create it with auto_resume: true to resume it on such calls)"
	case state == Paused && verb == VerbStart:
		return " (resume it: its processes were kept)"
	case state == Paused && verb == VerbSnapshot:
		return " (its pause took a snapshot of the workspace: latest_snapshot_id)"
	case (state == Paused && verb == VerbPause) || (state == Running && verb == VerbResume):
		return " already"
	case verb == VerbPause:
		return " (only a RUNNING sandbox can be paused)"
	case verb == VerbResume:
		return " (only a PAUSED sandbox can be resumed)"
	}
	return ""
}

// String implements fmt.Stringer.
func (s State) String() string { return string(s) }

var _ fmt.Stringer = State("")
