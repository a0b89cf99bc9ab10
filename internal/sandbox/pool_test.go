package sandbox_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"sandboxd/internal/apierror"
	"sandboxd/internal/auth"
	"sandboxd/internal/domain"
	"sandboxd/internal/domain/domaintest"
	. "sandboxd/internal/sandbox"
	"sandboxd/runtime"
	"sandboxd/runtime/runtimetest"
)

// pooled is a domain whose profile "p" keeps a warm pool of n boxes per replica (e.Svc is
// the first replica).
func pooled(t *testing.T, n, limit int) *domaintest.Env {
	t.Helper()
	return domaintest.New(t, domaintest.Options{Limit: limit,
		Config: func(c *Config) { c.Profiles[0].WarmPool = n; c.Profiles[0].Env = map[string]string{"PROFILE_VAR": "p"} },
		Deps:   func(d *domain.Deps) { d.Pooler = d.Driver.(runtime.Pooler) }})
}

// readyPool waits until the fake holds want ready boxes of the pool and returns their ids.
func readyPool(t *testing.T, e *domaintest.Env, want int) []string {
	t.Helper()
	var ids []string
	deadline := time.Now().Add(20 * time.Second)
	for {
		boxes, err := e.Fake.ListPool(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		ids = ids[:0]
		for _, b := range boxes {
			if b.Record.Annotations["pool_state"] == "ready" {
				ids = append(ids, b.Record.ID)
			}
		}
		if len(ids) == want {
			return slices.Clone(ids)
		}
		if time.Now().After(deadline) {
			t.Fatalf("ready pool boxes: got %d (%v), want %d", len(ids), ids, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func run(t *testing.T, svc *domain.Service, id, script string) string {
	t.Helper()
	res, err := svc.Exec(context.Background(), alice, id, ExecRequest{Command: []string{"sh", "-c", script}})
	if err != nil {
		t.Fatalf("exec in %s: %v", id, err)
	}
	return strings.TrimSpace(string(res.Stdout))
}

func TestWarmPoolClaimIsFreshAndCarriesTheCallersEnv(t *testing.T) {
	e := pooled(t, 2, 0)
	svc := e.Svc
	pool := readyPool(t, e, 2)
	ctx := context.Background()
	sb, err := svc.Create(ctx, alice, CreateRequest{Env: map[string]string{"CALLER": "alice", "PROFILE_VAR": "over"},
		Labels: map[string]string{"team": "a"}})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(pool, sb.ID) {
		t.Fatalf("create: got sandbox %s, want one of the pool's boxes %v", sb.ID, pool)
	}
	if sb.State != Running || sb.Tenant != alice.Tenant || sb.Labels["team"] != "a" {
		t.Fatalf("claimed sandbox: got %+v", sb)
	}
	if got := run(t, svc, sb.ID, `echo "$CALLER|$PROFILE_VAR"; ls -A | wc -l`); got != "alice|over\n0" {
		t.Fatalf("env and workspace of the claimed sandbox: got %q, want %q", got, "alice|over\n0")
	}
	// It is a sandbox now, and no longer in the pool: the pool refills to 2 others.
	if _, err := svc.Get(ctx, alice, sb.ID); err != nil {
		t.Fatalf("Get: %v", err)
	}
	if _, err := svc.Get(ctx, bob, sb.ID); apierror.CodeOf(err) != apierror.NotFound {
		t.Fatalf("Get by another tenant: got %v, want NOT_FOUND", err)
	}
	refilled := readyPool(t, e, 2)
	if slices.Contains(refilled, sb.ID) {
		t.Fatalf("the claimed box %s is still in the pool %v", sb.ID, refilled)
	}
	// A second create takes another box, with its own env only.
	sb2, err := svc.Create(ctx, alice, CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(refilled, sb2.ID) {
		t.Fatalf("second create: got %s, want one of %v", sb2.ID, refilled)
	}
	if got := run(t, svc, sb2.ID, `echo "[$CALLER]$PROFILE_VAR"`); got != "[]p" {
		t.Fatalf("env of the second sandbox: got %q, want %q", got, "[]p")
	}
	// Pool boxes are no sandboxes: the lookup and the runtime's list hold the two sandboxes only.
	page, err := svc.List(ctx, alice, ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(page.Sandboxes) != 2 {
		t.Fatalf("list: got %d sandboxes, want 2", len(page.Sandboxes))
	}
	boxes, _ := e.Fake.List(ctx)
	if len(boxes) != 2 {
		t.Fatalf("runtime list: got %d boxes, want 2 (the pool's are left out)", len(boxes))
	}
}

func TestWarmPoolConcurrentClaimsNeverShareABox(t *testing.T) {
	e := pooled(t, 3, 0)
	a, b := e.Svc, e.Replica(t)
	readyPool(t, e, 6) // 3 per replica
	const n = 10
	var wg sync.WaitGroup
	ids := make([]string, n)
	errs := make([]error, n)
	for i := range n {
		svc := a
		if i%2 == 1 {
			svc = b
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			sb, err := svc.Create(context.Background(), alice, CreateRequest{Env: map[string]string{"WHO": fmt.Sprint(i)}})
			ids[i], errs[i] = sb.ID, err
		}()
	}
	wg.Wait()
	seen := map[string]int{}
	for i := range n {
		if errs[i] != nil {
			t.Fatalf("create %d: %v", i, errs[i])
		}
		if j, dup := seen[ids[i]]; dup {
			t.Fatalf("creates %d and %d got the same sandbox %s", j, i, ids[i])
		}
		seen[ids[i]] = i
		if got := run(t, a, ids[i], `echo "$WHO"; ls -A | wc -l`); got != fmt.Sprintf("%d\n0", i) {
			t.Fatalf("sandbox of create %d: got %q", i, got)
		}
	}
	// Every sandbox is in the runtime's list once, none is still a pool box.
	boxes, _ := e.Fake.List(context.Background())
	if len(boxes) != n {
		t.Fatalf("runtime list: got %d sandboxes, want %d", len(boxes), n)
	}
	pool, _ := e.Fake.ListPool(context.Background())
	for _, p := range pool {
		if _, ok := seen[p.Record.ID]; ok {
			t.Fatalf("sandbox %s is still a pool box", p.Record.ID)
		}
	}
}

func TestWarmPoolHoldsNoSlot(t *testing.T) {
	e := pooled(t, 3, 1)
	svc := e.Svc
	readyPool(t, e, 3)
	ctx := context.Background()
	if u, err := svc.Quota(ctx, alice); err != nil || u.InUse != 0 {
		t.Fatalf("quota with a full pool: got %+v, %v, want 0 in use", u, err)
	}
	if _, err := svc.Create(ctx, alice, CreateRequest{}); err != nil {
		t.Fatal(err)
	}
	before, _ := e.Fake.ListPool(ctx)
	if _, err := svc.Create(ctx, alice, CreateRequest{}); apierror.CodeOf(err) != apierror.QuotaExceeded {
		t.Fatalf("create in a full project: got %v, want QUOTA_EXCEEDED", err)
	}
	// The refused create took no box, and left no slot, lookup entry or record behind.
	after, _ := e.Fake.ListPool(ctx)
	ready := func(bs []runtime.Box) int {
		n := 0
		for _, b := range bs {
			if b.Record.Annotations["pool_state"] == "ready" {
				n++
			}
		}
		return n
	}
	if ready(after) < ready(before) {
		t.Fatalf("a refused create took a pool box: ready %d before, %d after", ready(before), ready(after))
	}
	if u, _ := svc.Quota(ctx, alice); u.InUse != 1 {
		t.Fatalf("quota: got %d in use, want 1", u.InUse)
	}
	// Another project is not affected by the pool.
	if _, err := svc.Create(ctx, bob, CreateRequest{}); err != nil {
		t.Fatalf("create of another project: %v", err)
	}
}

func TestWarmPoolColdWhenTheCreateAsksForMore(t *testing.T) {
	e := pooled(t, 2, 0)
	svc := e.Svc
	pool := readyPool(t, e, 2)
	ctx := context.Background()
	sb, err := svc.Create(ctx, alice, CreateRequest{Network: &NetworkRequest{Mode: "none"}})
	if err != nil {
		t.Fatal(err)
	}
	if slices.Contains(pool, sb.ID) {
		t.Fatalf("a create with a network policy took pool box %s; want a cold create", sb.ID)
	}
	if got := readyPool(t, e, 2); !slices.Equal(got, pool) {
		t.Fatalf("pool after a cold create: got %v, want %v untouched", got, pool)
	}
}

func TestWarmPoolOrphansAreAdoptedOrRetired(t *testing.T) {
	e := domaintest.New(t, domaintest.Options{}) // its first replica keeps no pool
	ctx := context.Background()
	spec := runtime.BoxSpec{Profile: "p", MemoryBytes: 64 << 20, Network: "none", Env: map[string]string{"PROFILE_VAR": "p"}}
	mk := func(state string, sp runtime.BoxSpec) string {
		id := NewID("sbx_")
		rec := runtime.Record{ID: id, Spec: sp, Pool: "p", Annotations: map[string]string{"pool_owner": "pool_dead", "pool_state": state}}
		if err := e.Fake.Create(ctx, rec); err != nil {
			t.Fatal(err)
		}
		return id
	}
	stale := spec
	stale.MemoryBytes = 128 << 20
	ready := mk("ready", spec)     // adopted
	filling := mk("filling", spec) // interrupted while it booted: retired
	other := mk("ready", stale)    // made for another config of the profile: retired
	extra := mk("ready", spec)     // beyond the target once the first is adopted: retired
	dead := mk("ready", spec)      // its compute died: retired
	if err := e.Fake.Kill(dead, "crashed"); err != nil {
		t.Fatal(err)
	}
	cfg := e.Config
	cfg.Profiles = []ProfileConfig{{Name: "p", MemoryMB: 64, WarmPool: 1, Env: map[string]string{"PROFILE_VAR": "p"}}}
	start := func() *domain.Service {
		d := e.NewDeps()
		d.Pooler = e.Fake
		svc, err := domain.New(cfg, d)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(svc.Close)
		return svc
	}
	start()
	deadline := time.Now().Add(10 * time.Second)
	for {
		boxes, _ := e.Fake.ListPool(ctx)
		var left []string
		for _, b := range boxes {
			left = append(left, b.Record.ID)
		}
		if slices.Equal(left, []string{ready}) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("pool after the orphans' pass: got %v, want only the adopted %s (retired: %s %s %s %s)", left, ready, filling, other, extra, dead)
		}
		time.Sleep(20 * time.Millisecond)
	}
	// A second live replica leaves the first one's box alone and fills its own.
	start()
	if got := readyPool(t, e, 2); !slices.Contains(got, ready) {
		t.Fatalf("pool with two replicas: got %v, want the adopted %s kept", got, ready)
	}
}

func TestWarmPoolDrainsOnClose(t *testing.T) {
	e := pooled(t, 2, 0)
	readyPool(t, e, 2)
	e.Svc.Close()
	boxes, _ := e.Fake.ListPool(context.Background())
	if len(boxes) != 0 {
		t.Fatalf("pool boxes after Close: got %d, want 0", len(boxes))
	}
}

func TestWarmPoolConfig(t *testing.T) {
	e := domaintest.New(t, domaintest.Options{})
	for _, n := range []int{-1, MaxWarmPool + 1} {
		cfg := e.Config
		cfg.Profiles = []ProfileConfig{{Name: "p", WarmPool: n}}
		d := e.NewDeps()
		d.Pooler = e.Fake
		if svc, err := domain.New(cfg, d); err == nil {
			svc.Close()
			t.Fatalf("warm_pool %d: got no error", n)
		}
	}
	cfg := e.Config
	cfg.Profiles = []ProfileConfig{{Name: "p", WarmPool: 1}}
	if svc, err := domain.New(cfg, e.NewDeps()); err == nil || !strings.Contains(err.Error(), "keeps no warm boxes") {
		if svc != nil {
			svc.Close()
		}
		t.Fatalf("warm_pool on a runtime without pools: got %v, want an error", err)
	}
}

// TestWarmPoolClaimSeesNoWarmUp: every pool box runs a warm-up command before it is ready (one
// that writes output, fails and leaves a process behind here), and its claimer finds nothing of
// it: no exec listed by the service or by the guest init, no exec event, no leftover process,
// an empty workspace, and its first exec is the only one.
func TestWarmPoolClaimSeesNoWarmUp(t *testing.T) {
	marker := filepath.Join(t.TempDir(), "warmups")
	// The leftover's argument is this run's own (a run killed midway may leave its sleep).
	nap := fmt.Sprintf("4241.%06d", time.Now().UnixNano()%1e6)
	SetWarmUpArgv(t, []string{"sh", "-c", "echo ran >> " + marker + "; sleep " + nap + " & echo out; echo err >&2; exit 3"})
	e := pooled(t, 1, 0)
	svc := e.Svc
	readyPool(t, e, 1)
	if b, err := os.ReadFile(marker); err != nil || string(b) != "ran\n" {
		t.Fatalf("the warm-up's marker: got %q, %v; want one run", b, err)
	}
	ctx := context.Background()
	sb, err := svc.Create(ctx, alice, CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	page, err := svc.ListExecs(ctx, alice, sb.ID, ExecListOptions{})
	if err != nil || len(page.Execs) != 0 {
		t.Fatalf("execs of the claimed sandbox: got %+v, %v; want none", page.Execs, err)
	}
	g, err := svc.Guest(ctx, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	if infos, err := g.Execs(ctx); err != nil || len(infos) != 0 {
		t.Fatalf("execs the guest init knows: got %+v, %v; want none", infos, err)
	}
	// Killed by the forget before the box was ready; dying takes the kernel a moment.
	for deadline := time.Now().Add(2 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		pids := procsWith("sleep\x00" + nap)
		if len(pids) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the warm-up's background process outlived it: pids %v", pids)
		}
	}
	if got := run(t, svc, sb.ID, `ls -A | wc -l`); got != "0" {
		t.Fatalf("files in the claimed workspace: got %s, want 0", got)
	}
	page, err = svc.ListExecs(ctx, alice, sb.ID, ExecListOptions{})
	if err != nil || len(page.Execs) != 1 {
		t.Fatalf("execs after the claimer's first: got %d, %v; want 1", len(page.Execs), err)
	}
	// The project's events from the start: the claimed sandbox's create and its one exec.
	ectx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	evs, err := domaintest.Events(ectx, svc, alice, "", "0-0")
	if err != nil {
		t.Fatal(err)
	}
	execEvents := 0
	for ev := range evs {
		if ev.SandboxID != sb.ID {
			t.Errorf("an event of another box: %+v", ev)
		}
		if strings.HasPrefix(ev.Type, "EXEC_") {
			execEvents++
			if ev.Exec == nil || ev.Exec.ExecID != page.Execs[0].ExecID {
				t.Errorf("an exec event not of the claimer's exec: %+v", ev)
			}
		}
	}
	if execEvents == 0 {
		t.Error("no event of the claimer's exec (the check saw nothing)")
	}
}

// procsWith lists the pids whose command line contains s (NUL-separated arguments).
func procsWith(s string) []string {
	var pids []string
	dirs, _ := os.ReadDir("/proc")
	for _, d := range dirs {
		if b, err := os.ReadFile(filepath.Join("/proc", d.Name(), "cmdline")); err == nil && strings.Contains(string(b), s) {
			pids = append(pids, d.Name())
		}
	}
	return pids
}

// sharedFake is the Fake as a runtime whose pools every replica shares (a cluster's).
type sharedFake struct{ *runtimetest.Fake }

func (sharedFake) PoolsShared() {}

// TestWarmPoolSharedKeepsOnePool: on a runtime whose pools all replicas share, warm_pool is the
// cluster's number: two replicas keep 3 boxes in all, not 3 each, one of them filling; when it
// closes (retiring its boxes) the other takes over and fills the pool again, and a create on
// either replica claims from it.
func TestWarmPoolSharedKeepsOnePool(t *testing.T) {
	e := domaintest.New(t, domaintest.Options{}) // its first replica keeps no pool
	cfg := e.Config
	cfg.Profiles = []ProfileConfig{{Name: "p", MemoryMB: 64, WarmPool: 3}}
	start := func() *domain.Service {
		d := e.NewDeps()
		d.Pooler = sharedFake{e.Fake}
		svc, err := domain.New(cfg, d)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(svc.Close)
		return svc
	}
	a, b := start(), start()
	readyPool(t, e, 3)
	owners := func() map[string]int {
		boxes, err := e.Fake.ListPool(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		m := map[string]int{}
		for _, bx := range boxes {
			m[bx.Record.Annotations["pool_owner"]]++
		}
		return m
	}
	// Two more passes of each replica (every 2 s): still 3 boxes, all of one owner.
	for deadline := time.Now().Add(4500 * time.Millisecond); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if o := owners(); len(o) != 1 || o[firstKey(o)] > 3 {
			t.Fatalf("pool owners %v: want one replica keeping at most 3 boxes", o)
		}
	}
	sb, err := b.Create(context.Background(), alice, CreateRequest{Profile: "p"})
	if err != nil {
		t.Fatal(err)
	}
	if sb.State != Running {
		t.Fatalf("create: %+v", sb)
	}
	readyPool(t, e, 3)
	before := firstKey(owners())
	a.Close()
	b.Close()
	c := start()
	readyPool(t, e, 3)
	if o := owners(); len(o) != 1 || o[before] != 0 {
		t.Fatalf("after the replicas closed, pool owners %v: want only the new replica's", o)
	}
	if _, err := c.Create(context.Background(), alice, CreateRequest{Profile: "p"}); err != nil {
		t.Fatal(err)
	}
}

func firstKey(m map[string]int) string {
	for k := range m {
		return k
	}
	return ""
}

// staleList lists the pool as it was when stale was set: every create then tries boxes that
// earlier creates claimed, as a replica whose view trails another's would.
type staleList struct {
	runtime.Pooler
	mu    sync.Mutex
	stale bool
	boxes []runtime.Box
}

func (s *staleList) ListPool(ctx context.Context) ([]runtime.Box, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stale && s.boxes != nil {
		return slices.Clone(s.boxes), nil
	}
	boxes, err := s.Pooler.ListPool(ctx)
	if s.stale {
		s.boxes = boxes
	}
	return boxes, err
}

// TestWarmPoolClaimOfAClaimedBoxKeepsTheSlots: a claim of a box that another claim took (a
// stale candidate) gives back only a slot it took itself. In the winner's project the box's
// slot is the winner's: the loser must leave it held; in another project the loser's own
// fresh slot goes back.
func TestWarmPoolClaimOfAClaimedBoxKeepsTheSlots(t *testing.T) {
	list := &staleList{}
	e := domaintest.New(t, domaintest.Options{Limit: 3, RealRedis: true,
		Config: func(c *Config) { c.Profiles[0].WarmPool = 3 },
		Deps: func(d *domain.Deps) {
			list.Pooler = d.Driver.(runtime.Pooler)
			d.Pooler = list
		}})
	readyPool(t, e, 3)
	list.mu.Lock()
	list.stale = true
	list.mu.Unlock()
	ctx := context.Background()
	inUse := func(p auth.Principal) int {
		u, err := e.Svc.Quota(ctx, p)
		if err != nil {
			t.Fatal(err)
		}
		return u.InUse
	}
	var ids []string
	for i := range 3 {
		sb, err := e.Svc.Create(ctx, alice, CreateRequest{})
		if err != nil {
			t.Fatalf("create %d: %v", i, err)
		}
		ids = append(ids, sb.ID)
		if got := inUse(alice); got != i+1 {
			t.Fatalf("after create %d: %d slots in use, want %d (a losing claim gave back the winner's slot)", i, got, i+1)
		}
	}
	if _, err := e.Svc.Create(ctx, alice, CreateRequest{}); apierror.CodeOf(err) != apierror.QuotaExceeded {
		t.Fatalf("a fourth create in a project of 3: got %v, want QUOTA_EXCEEDED", err)
	}
	for _, id := range ids {
		if got := run(t, e.Svc, id, "echo ok"); got != "ok" {
			t.Fatalf("sandbox %s: got %q", id, got)
		}
	}
	// Another project's creates try the same claimed boxes first: their own slots only.
	if _, err := e.Svc.Create(ctx, bob, CreateRequest{}); err != nil {
		t.Fatal(err)
	}
	if got := inUse(bob); got != 1 {
		t.Fatalf("bob: %d slots in use, want 1", got)
	}
	if got := inUse(alice); got != 3 {
		t.Fatalf("alice after bob's create: %d slots in use, want 3", got)
	}
}
