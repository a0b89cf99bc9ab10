package execstream

import (
	"context"
	"crypto/rand"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/oklog/ulid/v2"
	"github.com/redis/go-redis/v9"

	"sandboxd/internal/redistest"
)

// execID is an exec id whose ULID was made at t.
func execID(t time.Time) string {
	return "exec_" + ulid.MustNew(ulid.Timestamp(t), rand.Reader).String()
}

// createIn registers exec id of sandbox sbx, started at c's time, with the terminal fields
// of m.
func createIn(t *testing.T, s *Store, c *clock, sbx, id string, m Meta) {
	t.Helper()
	m.ID, m.Tenant, m.Project, m.Sandbox, m.Argv = id, "t", "p", sbx, "true"
	if err := s.Create(context.Background(), m, "A", c.Now(), lease); err != nil {
		t.Fatal(err)
	}
}

func ids(ms []Meta) []string {
	out := make([]string, len(ms))
	for i, m := range ms {
		out[i] = m.ID
	}
	return out
}

// TestListPagesNewestFirst: a sandbox's execs come newest first, filtered by state, in pages
// whose cursor is the last id, and never another sandbox's.
func TestListPagesNewestFirst(t *testing.T) {
	redistest.Both(t, func(t *testing.T, srv *redistest.Server) {
		s, c := newStore(srv, Options{})
		ctx := context.Background()
		var all []string
		for range 7 {
			c.Add(time.Millisecond)
			id := execID(c.Now())
			createIn(t, s, c, "sbx_a", id, Meta{})
			all = append(all, id)
		}
		createIn(t, s, c, "sbx_b", execID(c.Now()), Meta{})
		// Three of sbx_a's end.
		for _, id := range []string{all[1], all[4], all[6]} {
			mustAppend(t, s, id, "A", nil, &Exit{ExitCode: 0})
		}
		newest := slices.Clone(all)
		slices.Reverse(newest)

		var got []string
		after := ""
		for pages := 0; ; pages++ {
			ms, next, err := s.List(ctx, "sbx_a", "", after, 3)
			if err != nil {
				t.Fatal(err)
			}
			got = append(got, ids(ms)...)
			if next == "" {
				if pages != 2 || len(ms) != 1 {
					t.Fatalf("got %d pages before the last, whose size is %d; want 2 and 1", pages, len(ms))
				}
				break
			}
			if next != ms[len(ms)-1].ID {
				t.Fatalf("next cursor %s, want the page's last id %s", next, ms[len(ms)-1].ID)
			}
			after = next
		}
		if !slices.Equal(got, newest) {
			t.Fatalf("got %v, want %v", got, newest)
		}

		running, next, err := s.List(ctx, "sbx_a", Running, "", 10)
		if err != nil {
			t.Fatal(err)
		}
		if want := []string{all[5], all[3], all[2], all[0]}; !slices.Equal(ids(running), want) || next != "" {
			t.Fatalf("running: got %v (next %q), want %v", ids(running), next, want)
		}
		ended, next, err := s.List(ctx, "sbx_a", Ended, "", 2)
		if err != nil {
			t.Fatal(err)
		}
		if want := []string{all[6], all[4]}; !slices.Equal(ids(ended), want) || next != all[4] {
			t.Fatalf("ended page: got %v (next %q), want %v and next %s", ids(ended), next, want, all[4])
		}
		ended, next, err = s.List(ctx, "sbx_a", Ended, next, 2)
		if err != nil || !slices.Equal(ids(ended), []string{all[1]}) || next != "" {
			t.Fatalf("ended second page: got %v (next %q, %v), want [%s]", ids(ended), next, err, all[1])
		}
		for _, m := range running {
			if m.Sandbox != "sbx_a" || m.State != Running {
				t.Fatalf("got %+v in sbx_a's running list", m)
			}
		}
		// Junk never reaches Redis; an unknown sandbox has no execs.
		for _, sbx := range []string{"", "sbx_{x}", "sbx_none"} {
			if ms, next, err := s.List(ctx, sbx, "", "", 10); err != nil || len(ms) != 0 || next != "" {
				t.Fatalf("List(%q): got %v %q %v, want nothing", sbx, ms, next, err)
			}
		}
	})
}

// TestListRepairsTheIndex: a member whose meta hash is gone is dropped once it is older than
// the create grace (a Create in progress keeps its member); a swept exec leaves its index; the
// index keeps the newest MaxPerSandbox members.
func TestListRepairsTheIndex(t *testing.T) {
	redistest.Both(t, func(t *testing.T, srv *redistest.Server) {
		s, c := newStore(srv, Options{MaxPerSandbox: 4, Retention: time.Minute})
		ctx := context.Background()
		key := sandboxKey("sbx_a")
		old, fresh := execID(c.Now().Add(-2*createGrace)), execID(c.Now())
		if err := srv.Client.ZAdd(ctx, key, lexMember(old), lexMember(fresh)).Err(); err != nil {
			t.Fatal(err)
		}
		if ms, _, err := s.List(ctx, "sbx_a", "", "", 10); err != nil || len(ms) != 0 {
			t.Fatalf("got %v %v, want no execs", ms, err)
		}
		members, _ := srv.Client.ZRange(ctx, key, 0, -1).Result()
		if !slices.Equal(members, []string{fresh}) {
			t.Fatalf("index: got %v, want only the fresh member %s", members, fresh)
		}

		var all []string
		for range 5 {
			c.Add(time.Millisecond)
			id := execID(c.Now())
			createIn(t, s, c, "sbx_a", id, Meta{})
			all = append(all, id)
		}
		members, _ = srv.Client.ZRange(ctx, key, 0, -1).Result()
		if !slices.Equal(members, all[1:]) {
			t.Fatalf("index after 5 creates with a bound of 4: got %v, want %v", members, all[1:])
		}
		mustAppend(t, s, all[4], "A", nil, &Exit{})
		c.Add(2 * time.Minute)
		if n, err := s.Sweep(ctx, c.Now()); err != nil || n != 1 {
			t.Fatalf("sweep: got %d, %v, want 1", n, err)
		}
		members, _ = srv.Client.ZRange(ctx, key, 0, -1).Result()
		if !slices.Equal(members, all[1:4]) {
			t.Fatalf("index after the sweep: got %v, want %v", members, all[1:4])
		}
		for _, id := range all[1:4] {
			if _, ok, err := s.TryFollow(ctx, id, "A", c.Now(), lease); !ok || err != nil {
				t.Fatalf("follow %s again: %v %v", id, ok, err)
			}
			mustAppend(t, s, id, "A", nil, &Exit{})
		}
		c.Add(2 * time.Minute)
		if _, err := s.Sweep(ctx, c.Now()); err != nil {
			t.Fatal(err)
		}
		if n, _ := srv.Client.Exists(ctx, key).Result(); n != 0 {
			t.Fatalf("the index of a sandbox whose execs are all swept still exists")
		}
	})
}

// TestTerminalFields: stdin and the terminal size are kept with the exec; closing stdin and
// resizing change a running exec only.
func TestTerminalFields(t *testing.T) {
	redistest.Both(t, func(t *testing.T, srv *redistest.Server) {
		s, c := newStore(srv, Options{})
		ctx := context.Background()
		tty, plain := execID(c.Now()), execID(c.Now())
		createIn(t, s, c, "sbx_a", tty, Meta{StdinOpen: true, TtyRows: 24, TtyCols: 80})
		createIn(t, s, c, "sbx_a", plain, Meta{})
		m, err := s.Get(ctx, tty)
		if err != nil || !m.StdinOpen || m.TtyRows != 24 || m.TtyCols != 80 {
			t.Fatalf("tty exec: got %+v %v, want stdin open and 24x80", m, err)
		}
		if m, _ := s.Get(ctx, plain); m.StdinOpen || m.TtyRows != 0 || m.TtyCols != 0 {
			t.Fatalf("plain exec: got %+v, want no stdin and no terminal", m)
		}
		if err := s.SetTty(ctx, tty, 50, 132); err != nil {
			t.Fatal(err)
		}
		if err := s.CloseStdin(ctx, tty); err != nil {
			t.Fatal(err)
		}
		if m, _ := s.Get(ctx, tty); m.StdinOpen || m.TtyRows != 50 || m.TtyCols != 132 {
			t.Fatalf("after resize and close: got %+v, want stdin closed and 50x132", m)
		}
		mustAppend(t, s, tty, "A", nil, &Exit{})
		if err := s.SetTty(ctx, tty, 10, 10); err != nil {
			t.Fatal(err) // an ended exec is left as it is, without an error
		}
		if m, _ := s.Get(ctx, tty); m.TtyRows != 50 {
			t.Fatalf("resize after the end changed the exec: %+v", m)
		}
		if err := s.CloseStdin(ctx, execID(c.Now())); !errors.Is(err, ErrNotFound) {
			t.Fatalf("close stdin of an unknown exec: got %v, want ErrNotFound", err)
		}
		for _, v := range []string{"", "x", "0x5", "5x", "ax3", "24x80x1"} {
			if r, c := parseTty(v); r != 0 || c != 0 {
				t.Fatalf("parseTty(%q) = %d, %d, want 0, 0", v, r, c)
			}
		}
	})
}

func lexMember(member string) redis.Z { return redis.Z{Score: 0, Member: member} }

// TestListScanBudget: a filter that matches little reads at most listScanBudget members in one
// call: the page ends early, empty here, with a cursor, and the next call goes on from it and
// finds the match.
func TestListScanBudget(t *testing.T) {
	redistest.Both(t, func(t *testing.T, srv *redistest.Server) {
		s, c := newStore(srv, Options{})
		ctx := context.Background()
		c.Add(time.Millisecond)
		old := execID(c.Now())
		createIn(t, s, c, "sbx_a", old, Meta{})
		mustAppend(t, s, old, "A", nil, &Exit{ExitCode: 0})
		n := listScanBudget(1) + 100
		for range n {
			c.Add(time.Millisecond)
			createIn(t, s, c, "sbx_a", execID(c.Now()), Meta{})
		}
		ms, next, err := s.List(ctx, "sbx_a", Ended, "", 1)
		if err != nil {
			t.Fatal(err)
		}
		if len(ms) != 0 || next == "" {
			t.Fatalf("first page over %d running execs: got %v and next %q, want an empty page with a cursor", n, ids(ms), next)
		}
		ms, next, err = s.List(ctx, "sbx_a", Ended, next, 1)
		if err != nil || !slices.Equal(ids(ms), []string{old}) || next != "" {
			t.Fatalf("second page: got %v (next %q, %v), want [%s] and the end", ids(ms), next, err, old)
		}
	})
}
