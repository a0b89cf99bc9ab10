package client_test

import (
	"errors"
	"fmt"
	"io"
	"reflect"
	"strings"
	"testing"

	"sandboxd/client"
	"sandboxd/internal/api/apitest"
	"sandboxd/internal/sandbox"
)

func TestDo(t *testing.T) {
	e := newEnv(t)
	c := e.client(t)
	ctx := ctxT(t)
	var out struct {
		Sandbox struct {
			ID    string `json:"id"`
			State string `json:"state"`
		} `json:"sandbox"`
	}
	resp, err := c.Do(ctx, `query($id: ID!) { sandbox(id: $id) { id state } }`, map[string]any{"id": apitest.SandboxRunning}, &out)
	if err != nil {
		t.Fatal(err)
	}
	if out.Sandbox.ID != apitest.SandboxRunning || out.Sandbox.State != "RUNNING" {
		t.Errorf("got %+v, want %s RUNNING", out, apitest.SandboxRunning)
	}
	if resp.Cost == nil || resp.Cost.Points == 0 || resp.Cost.PointsLimit == 0 {
		t.Errorf("got cost %+v, want points and a limit", resp.Cost)
	}

	_, err = c.Do(ctx, `mutation($id: ID!) { stopSandbox(id: $id) { sandbox { id } } }`, map[string]any{"id": apitest.SandboxBusy}, nil)
	var ae *client.Error
	if !errors.As(err, &ae) || ae.Code != client.CodeInvalidState || ae.RetryAfter == 0 || len(ae.Path) == 0 {
		t.Errorf("got %v (%+v), want INVALID_STATE with retryAfter and a path", err, ae)
	}
	_, err = c.Do(ctx, `query { nope }`, nil, nil)
	if !errors.As(err, &ae) || ae.Status/100 != 4 {
		t.Errorf("got %v, want a 4xx *Error for a query that does not validate", err)
	}
}

func TestSubscribeExecOutputResumesAfterCut(t *testing.T) {
	for _, cut := range []int{0, 2, 5} {
		t.Run(fmt.Sprintf("cut-after-%d", cut), func(t *testing.T) {
			e := newEnv(t)
			c := e.client(t)
			evs := outputEvents(6)
			e.fake.ExecEvents[apitest.ExecEnded] = evs
			e.cut.Arm(cut)
			sub, err := c.SubscribeExecOutput(ctxT(t), apitest.ExecEnded, "")
			if err != nil {
				t.Fatal(err)
			}
			defer sub.Close()
			var got []string
			for {
				ev, err := sub.Next()
				if err == io.EOF {
					break
				}
				if err != nil {
					t.Fatalf("after %v: %v", got, err)
				}
				got = append(got, fmt.Sprintf("%s %s %q %d", ev.Cursor, strings.ToLower(ev.Kind), ev.Data, ev.MissedBytes))
				if ev.Kind == "EXIT" && (ev.Result == nil || *ev.Result.ExitCode != 3) {
					t.Errorf("got exit %+v, want exit code 3", ev.Result)
				}
			}
			if w := want(evs); !reflect.DeepEqual(got, w) {
				t.Errorf("got events\n%v\nwant\n%v", got, w)
			}
			wantCuts := 0
			if cut > 0 {
				wantCuts = 1
			}
			if e.cut.Count() != wantCuts || sub.Reconnects != wantCuts {
				t.Errorf("got %d cuts and %d reconnects, want %d", e.cut.Count(), sub.Reconnects, wantCuts)
			}
			if cut > 0 {
				calls := e.fake.CallsTo("ExecOutput")
				if len(calls) != 2 || calls[1].After != evs[cut-1].Cursor {
					t.Errorf("got output subscriptions %+v, want a second after %s", calls, evs[cut-1].Cursor)
				}
			}
		})
	}
}

func TestSubscribeSandboxEvents(t *testing.T) {
	e := newEnv(t)
	e.fake.SandboxEvents = []sandbox.Event{
		{Cursor: "1-0", Type: "STATE_CHANGED", SandboxID: apitest.SandboxRunning, State: sandbox.Stopping, PreviousState: sandbox.Running, Reason: "requested", At: apitest.T0},
		{Cursor: "2-0", Type: "STATE_CHANGED", SandboxID: apitest.SandboxRunning, State: sandbox.Stopped, PreviousState: sandbox.Stopping, At: apitest.T0},
	}
	sub, err := e.client(t).SubscribeSandboxEvents(ctxT(t), apitest.SandboxRunning, "0-1")
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	for _, w := range e.fake.SandboxEvents {
		ev, err := sub.Next()
		if err != nil {
			t.Fatal(err)
		}
		if ev.Cursor != w.Cursor || ev.State != string(w.State) || ev.PreviousState == nil || *ev.PreviousState != string(w.PreviousState) {
			t.Errorf("got %+v, want cursor %s state %s", ev, w.Cursor, w.State)
		}
	}
	if sub.Cursor() != "2-0" {
		t.Errorf("got cursor %q, want 2-0", sub.Cursor())
	}
	if c := e.fake.Last("Events"); c.After != "0-1" || c.SandboxID != apitest.SandboxRunning {
		t.Errorf("the server got %+v, want after 0-1 for %s", c, apitest.SandboxRunning)
	}
}

func TestSubscribeRefusedKey(t *testing.T) {
	e := newEnv(t)
	sub, err := e.client(t, client.WithAPIKey("wrong")).SubscribeSandboxEvents(ctxT(t), "", "")
	if err == nil {
		_, err = sub.Next()
		sub.Close()
	}
	if !client.IsCode(err, client.CodeUnauthenticated) {
		t.Errorf("got %v, want UNAUTHENTICATED", err)
	}
}
