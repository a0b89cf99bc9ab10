package sandbox

import (
	"strings"
	"testing"

	"sandboxd/internal/apierror"
)

// TestCheckEveryStateAndVerb pins the whole state table: every state × verb pair.
func TestCheckEveryStateAndVerb(t *testing.T) {
	const (
		ok    = ""
		state = apierror.InvalidState
		nf    = apierror.NotFound
	)
	type want struct {
		code  apierror.Code
		retry bool
	}
	busy := want{state, true}
	no := want{state, false}
	yes := want{ok, false}
	gone := want{nf, false}
	table := map[State]map[Verb]want{
		Creating:   {VerbGet: yes, VerbExec: busy, VerbFiles: busy, VerbStop: busy, VerbStart: busy, VerbDestroy: busy, VerbSnapshot: busy, VerbUpdate: busy, VerbPause: busy, VerbResume: busy},
		Running:    {VerbGet: yes, VerbExec: yes, VerbFiles: yes, VerbStop: yes, VerbStart: no, VerbDestroy: yes, VerbSnapshot: yes, VerbUpdate: yes, VerbPause: yes, VerbResume: no},
		Stopping:   {VerbGet: yes, VerbExec: busy, VerbFiles: busy, VerbStop: busy, VerbStart: busy, VerbDestroy: busy, VerbSnapshot: busy, VerbUpdate: busy, VerbPause: busy, VerbResume: busy},
		Stopped:    {VerbGet: yes, VerbExec: no, VerbFiles: no, VerbStop: no, VerbStart: yes, VerbDestroy: yes, VerbSnapshot: no, VerbUpdate: yes, VerbPause: no, VerbResume: no},
		Starting:   {VerbGet: yes, VerbExec: busy, VerbFiles: busy, VerbStop: busy, VerbStart: busy, VerbDestroy: busy, VerbSnapshot: busy, VerbUpdate: busy, VerbPause: busy, VerbResume: busy},
		Destroying: {VerbGet: yes, VerbExec: busy, VerbFiles: busy, VerbStop: busy, VerbStart: busy, VerbDestroy: busy, VerbSnapshot: busy, VerbUpdate: busy, VerbPause: busy, VerbResume: busy},
		Destroyed:  {VerbGet: gone, VerbExec: gone, VerbFiles: gone, VerbStop: gone, VerbStart: gone, VerbDestroy: gone, VerbSnapshot: gone, VerbUpdate: gone, VerbPause: gone, VerbResume: gone},
		Failed:     {VerbGet: yes, VerbExec: no, VerbFiles: no, VerbStop: yes, VerbStart: yes, VerbDestroy: yes, VerbSnapshot: no, VerbUpdate: yes, VerbPause: no, VerbResume: no},
		Expired:    {VerbGet: yes, VerbExec: no, VerbFiles: no, VerbStop: no, VerbStart: no, VerbDestroy: yes, VerbSnapshot: no, VerbUpdate: no, VerbPause: no, VerbResume: no},
		Pausing:    {VerbGet: yes, VerbExec: busy, VerbFiles: busy, VerbStop: busy, VerbStart: busy, VerbDestroy: busy, VerbSnapshot: busy, VerbUpdate: busy, VerbPause: busy, VerbResume: busy},
		Paused:     {VerbGet: yes, VerbExec: no, VerbFiles: no, VerbStop: yes, VerbStart: no, VerbDestroy: yes, VerbSnapshot: no, VerbUpdate: yes, VerbPause: no, VerbResume: yes},
		Resuming:   {VerbGet: yes, VerbExec: busy, VerbFiles: busy, VerbStop: busy, VerbStart: busy, VerbDestroy: busy, VerbSnapshot: busy, VerbUpdate: busy, VerbPause: busy, VerbResume: busy},
	}
	if len(table) != len(States) {
		t.Fatalf("the test covers %d states, the service has %d", len(table), len(States))
	}
	for _, st := range States {
		for _, v := range Verbs {
			w, ok := table[st][v]
			if !ok {
				t.Fatalf("no expectation for %s × %s", st, v)
			}
			t.Run(string(st)+"/"+string(v), func(t *testing.T) {
				err := Check(st, v, "sbx_x")
				if w.code == "" {
					if err != nil {
						t.Fatalf("got %v, want allowed", err)
					}
					return
				}
				e := apierror.From(err)
				if e.Code != w.code {
					t.Fatalf("got code %s, want %s (%v)", e.Code, w.code, err)
				}
				if got := e.RetryAfter > 0; got != w.retry {
					t.Fatalf("got retry-after %v, want retry %v", e.RetryAfter, w.retry)
				}
				if w.code == apierror.InvalidState && e.Details["state"] != string(st) {
					t.Fatalf("got state detail %v, want %s", e.Details["state"], st)
				}
			})
		}
	}
}

func TestTransientStates(t *testing.T) {
	tests := []struct {
		verb              Verb
		transient, target State
		ok                bool
	}{
		{VerbStop, Stopping, Stopped, true},
		{VerbStart, Starting, Running, true},
		{VerbDestroy, Destroying, Destroyed, true},
		{VerbPause, Pausing, Paused, true},
		{VerbResume, Resuming, Running, true},
		{VerbExec, "", "", false},
		{VerbFiles, "", "", false},
		{VerbGet, "", "", false},
		{VerbSnapshot, "", "", false},
		{VerbUpdate, "", "", false},
	}
	for _, tt := range tests {
		tr, tg, ok := tt.verb.transient()
		if tr != tt.transient || tg != tt.target || ok != tt.ok {
			t.Errorf("%s: got (%s, %s, %v), want (%s, %s, %v)", tt.verb, tr, tg, ok, tt.transient, tt.target, tt.ok)
		}
	}
}

func TestParseState(t *testing.T) {
	for _, st := range States {
		got, err := ParseState(string(st))
		if err != nil || got != st {
			t.Errorf("ParseState(%s) = %s, %v", st, got, err)
		}
	}
	if _, err := ParseState("running"); apierror.CodeOf(err) != apierror.InvalidArgument {
		t.Errorf("lower case: got %v, want INVALID_ARGUMENT", err)
	}
}

func TestPauseHints(t *testing.T) {
	for _, tc := range []struct {
		state State
		verb  Verb
		want  string
	}{
		{Paused, VerbPause, "already"},
		{Running, VerbResume, "already"},
		{Paused, VerbExec, "resume it first"},
		{Paused, VerbFiles, "auto_resume"},
		{Paused, VerbStart, "resume it"},
		{Stopped, VerbPause, "only a RUNNING sandbox"},
		{Stopped, VerbResume, "only a PAUSED sandbox"},
	} {
		err := Check(tc.state, tc.verb, "sbx_x")
		if e := apierror.From(err); e.Code != apierror.InvalidState || !strings.Contains(e.Message, tc.want) {
			t.Errorf("%s on %s: got %v, want INVALID_STATE saying %q", tc.verb, tc.state, err, tc.want)
		}
	}
}
