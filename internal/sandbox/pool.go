package sandbox

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"reflect"
	"slices"
	"sync"
	"time"

	"sandboxd/guest/proto"
	"sandboxd/internal/apierror"
	"sandboxd/internal/auth"
	"sandboxd/internal/store"
	"sandboxd/runtime"
)

// Warm pools. A profile with warm_pool: N keeps N boxes booted ahead of any create, per replica
// (per state folder of the local runtime: every replica counts the boxes it owns). A create of
// that profile claims one instead of booting a box; the pool refills in the background.
//
// A box of a pool is an ordinary box of the driver whose record names the pool (Record.Pool),
// has no tenant and was never handed to anyone: drivers leave it out of Get and List, so
// nothing that works on sandboxes (the lookup and its rebuild, quotas, the reconciler, the
// state metrics) sees it, and it holds nobody's slot. Its id is minted as a sandbox id when the
// box is made, and becomes the sandbox's id at the claim (nothing is renamed: a runsc container,
// its folder, disk and network keep the id they were made with). Its record's annotations say
// which replica owns it (pool_owner) and where it is (pool_state: filling while it boots,
// ready once it answers, retiring on its way out).
//
// A claim (claimWarm) takes the sandbox's operation lock under the box's id, looks whether the
// box is still ready, takes the create's slot, then rewrites the record with
// runtime.Pooler.UpdatePool, which is atomic across every process sharing the runtime's state:
// of two claims of one box, one finds it ready and the other finds it gone and tries the next
// box (or creates cold); then it puts the lookup entry. The record
// the claim writes is the one a cold create would have written (CREATING, the caller's owner,
// labels, env, timers) with the annotation warm; the caller's environment goes to the guest
// init (PUT /v1/env) before the sandbox is RUNNING, and a reconciler that finishes an
// interrupted claim hands it again. The box's limits, disk and network are its profile's, as a
// cold create's would be: a box whose spec differs from what the create would build (the
// profile changed since it was made) is never claimed. A create that asks for more than the
// profile (a source to restore, a network policy narrower than the profile's) is created cold.
//
// The pools of a runtime whose boxes every replica sees (runtime.SharedPooler: a cluster's)
// are kept once for all of them: warm_pool is then the cluster's number, and only the replica
// holding the leader lock (pool-leader) fills, adopts and retires; the others claim only, and
// retire what they own from a time they led. A leader killed leaves orphans, which the next
// leader adopts.
//
// Every replica keeps a lock in Redis (pool-owner:<replica>) for its lifetime. A box whose
// owner's lock can be taken is an orphan (its replica died): a ready, running box of the right
// spec is adopted by the replica that finds it, while it has room; any other is retired
// (pool_state retiring, then deleted). A replica that shuts down retires its own boxes.

const (
	annPoolOwner = "pool_owner"
	annPoolState = "pool_state"
	// annWarm marks a sandbox claimed from a pool: its environment is handed to the guest init
	// at the claim (again by a reconciler finishing the create).
	annWarm = "warm"

	poolFilling  = "filling"
	poolReady    = "ready"
	poolRetiring = "retiring"

	// MaxWarmPool bounds a profile's warm_pool.
	MaxWarmPool = 32
	// poolEvery is how often a replica looks after its pools without a claim to wake it.
	poolEvery = 2 * time.Second
	// claimAttempts bounds the boxes one create tries before it creates cold.
	claimAttempts = 4
	// fillBackoffMax bounds the wait after failed fills of a profile.
	fillBackoffMax = time.Minute
)

// errPoolMoved: the box is no longer what the caller saw (claimed, retired, adopted).
var errPoolMoved = errors.New("the pool box changed hands")

// pool is this replica's side of the warm pools.
type pool struct {
	s      *Service
	pooler runtime.Pooler
	// owner names this replica as the owner of pool boxes.
	owner string
	kick  chan struct{}
	done  chan struct{}

	// profs are the profiles that keep a pool (copies: New's caller keeps the config).
	profs []ProfileConfig
	// shared: the pools are the runtime's, one for all replicas (runtime.SharedPooler).
	shared bool

	mu        sync.Mutex
	ownerLock *store.Lock
	// leaderLock is held while this replica keeps the shared pools.
	leaderLock *store.Lock
	// backoff is, per profile, when the next fill may start after failures, and how long the
	// last wait was.
	backoff map[string]fillBackoff
}

type fillBackoff struct {
	until time.Time
	wait  time.Duration
}

// newPool returns the replica's pools, or nil when no profile keeps one.
func newPool(s *Service, pooler runtime.Pooler, shared bool) (*pool, error) {
	var profs []ProfileConfig
	for _, p := range s.cfg.Profiles {
		if p.WarmPool > 0 {
			profs = append(profs, s.profiles[p.Name])
		}
	}
	if len(profs) == 0 {
		return nil, nil
	}
	if pooler == nil {
		return nil, fmt.Errorf("sandbox: profile %q has a warm_pool, and the %s runtime keeps no warm boxes", profs[0].Name, s.driver.Name())
	}
	return &pool{s: s, pooler: pooler, owner: NewID("pool_"), kick: make(chan struct{}, 1), done: make(chan struct{}),
		profs: profs, shared: shared, backoff: map[string]fillBackoff{}}, nil
}

// poolLeaderLockID names the lock of the replica that keeps shared pools.
const poolLeaderLockID = "pool-leader"

// lead reports whether this replica keeps the shared pools: it holds the leader lock (still,
// as Redis says), or takes it now.
func (p *pool) lead(ctx context.Context) bool {
	p.mu.Lock()
	l := p.leaderLock
	p.mu.Unlock()
	if l != nil {
		held, err := l.Renew(ctx)
		if err != nil {
			p.s.log.Warn("warm pool: cannot renew the leader lock; no fills in this pass", "err", err)
			return false
		}
		if held {
			return true
		}
		// Redis lost it or another replica took it after a lapse: take it again, if free.
		p.mu.Lock()
		p.leaderLock = nil
		p.mu.Unlock()
		l.Unlock(context.WithoutCancel(ctx))
	}
	nl, err := p.s.store.Lock(ctx, poolLeaderLockID, p.s.cfg.LockTTL)
	if err != nil {
		if !errors.Is(err, store.ErrLocked) {
			p.s.log.Warn("warm pool: cannot take the leader lock", "err", err)
		}
		return false
	}
	p.mu.Lock()
	p.leaderLock = nl
	p.mu.Unlock()
	p.s.log.Info("warm pool: this replica keeps the shared pools", "owner", p.owner)
	return true
}

// standDown is a pass of a replica that does not keep the shared pools: it retires what it
// owns (from a time it led).
func (p *pool) standDown(ctx context.Context) {
	if err := p.retireOwn(ctx); err != nil {
		p.s.log.Warn("warm pool: listing the pool failed", "err", err)
	}
	p.report(ctx)
}

// retireOwn retires (and removes) every box this replica owns.
func (p *pool) retireOwn(ctx context.Context) error {
	boxes, err := p.pooler.ListPool(ctx)
	if err != nil {
		return err
	}
	for _, b := range boxes {
		if b.Record.Annotations[annPoolOwner] != p.owner {
			continue
		}
		if b.Record.Annotations[annPoolState] == poolRetiring {
			p.remove(ctx, b.Record.ID)
		} else {
			p.retire(ctx, b.Record.ID, p.owner)
		}
	}
	return nil
}

// ownerLockID is the name of the lock a live replica holds as the owner of its pool boxes.
func ownerLockID(owner string) string { return "pool-owner:" + owner }

// wake asks the loop for a pass now (after a claim or a miss).
func (p *pool) wake() {
	select {
	case p.kick <- struct{}{}:
	default:
	}
}

// wakeAfterClaim asks for a pass refillDelay after a claim: the box just handed out gets its
// first commands without a new box's boot beside it on the same CPUs (a pass boots the
// refill at once), and a burst of claims is refilled in one pass. A miss wakes the loop at
// once (wake): the pool is empty then.
func (p *pool) wakeAfterClaim() { time.AfterFunc(refillDelay, p.wake) }

// refillDelay is how long a claim's refill waits (wakeAfterClaim). Measured on the kube
// runtime's test node (BENCHMARKS.md): the first exec in a claimed box took 46–70 ms with the
// refill's boot beside it, 25–30 ms without.
const refillDelay = 250 * time.Millisecond

// run looks after the pools until ctx ends, then retires this replica's boxes.
func (p *pool) run(ctx context.Context) {
	defer close(p.done)
	t := time.NewTicker(poolEvery)
	defer t.Stop()
	for {
		p.pass(ctx)
		select {
		case <-ctx.Done():
			p.drain()
			return
		case <-p.kick:
		case <-t.C:
		}
	}
}

// holdOwner makes sure this replica holds its owner lock (taking it again when Redis lost it).
func (p *pool) holdOwner(ctx context.Context) bool {
	l, err := p.s.store.Lock(ctx, ownerLockID(p.owner), p.s.cfg.LockTTL)
	if errors.Is(err, store.ErrLocked) {
		p.mu.Lock()
		held := p.ownerLock != nil
		p.mu.Unlock()
		return held // ours, still renewed (or an orphan probe of another replica, for a moment)
	}
	if err != nil {
		p.s.log.Warn("warm pool: cannot take the owner lock; no fills in this pass", "err", err)
		return false
	}
	p.mu.Lock()
	old := p.ownerLock
	p.ownerLock = l
	p.mu.Unlock()
	if old != nil {
		old.Unlock(context.WithoutCancel(ctx)) // it had vanished (Redis lost it); the new one is ours
	}
	return true
}

// ownerGone reports whether owner's lock can be taken: its replica is gone.
func (p *pool) ownerGone(ctx context.Context, owner string) bool {
	if owner == "" {
		return true
	}
	l, err := p.s.store.Lock(ctx, ownerLockID(owner), p.s.cfg.LockTTL)
	if err != nil {
		return false
	}
	l.Unlock(context.WithoutCancel(ctx))
	return true
}

// target is the number of boxes profile name keeps on this replica (on the leader, for shared
// pools: the cluster's).
func (p *pool) target(name string) int { return p.s.profiles[name].WarmPool }

// spec is the spec of a box of prof's pool: what a create of prof without options builds,
// with the profile's environment only.
func (p *pool) spec(ctx context.Context, prof ProfileConfig) (runtime.BoxSpec, error) {
	mode, policy, err := p.s.networkFor(ctx, prof, nil)
	if err != nil {
		return runtime.BoxSpec{}, err
	}
	return specOf(prof, mode, policy, maps.Clone(prof.Env)), nil
}

// specOf is the box spec of a create of prof.
func specOf(prof ProfileConfig, mode string, policy *runtime.NetworkPolicy, env map[string]string) runtime.BoxSpec {
	return runtime.BoxSpec{Profile: prof.Name, Rootfs: prof.Rootfs, Image: prof.Image, ImageHasInit: prof.ImageHasInit, MilliCPU: prof.MilliCPU,
		MemoryBytes: prof.MemoryMB << 20, DiskBytes: prof.DiskMB << 20, Network: mode, NetworkPolicy: policy, Env: env}
}

// sameSpec reports whether a box made with spec a can serve a create that builds b (b's
// environment aside, which the claim hands to the guest).
func sameSpec(a, b runtime.BoxSpec, profEnv map[string]string) bool {
	if len(a.Env) == 0 {
		a.Env = nil
	}
	b.Env = maps.Clone(profEnv)
	if len(b.Env) == 0 {
		b.Env = nil
	}
	return reflect.DeepEqual(a, b)
}

// pass is one look after the pools: orphans adopted or retired, dead and stale boxes retired,
// then fills up to each profile's target.
func (p *pool) pass(ctx context.Context) {
	s := p.s
	if !p.holdOwner(ctx) {
		return
	}
	if p.shared && !p.lead(ctx) {
		p.standDown(ctx)
		return
	}
	boxes, err := p.pooler.ListPool(ctx)
	if err != nil {
		s.log.Warn("warm pool: listing the pool failed", "err", err)
		return
	}
	specs := map[string]runtime.BoxSpec{}
	for _, prof := range p.profs {
		if sp, err := p.spec(ctx, prof); err == nil {
			specs[prof.Name] = sp
		} else {
			s.log.Warn("warm pool: the profile's spec cannot be built", "profile", prof.Name, "err", err)
		}
	}
	own := map[string][]string{}
	gone := map[string]bool{}
	for _, b := range boxes {
		if ctx.Err() != nil {
			return
		}
		rec := b.Record
		owner, state := rec.Annotations[annPoolOwner], rec.Annotations[annPoolState]
		want, pooled := specs[rec.Pool]
		fit := pooled && state == poolReady && b.Phase == runtime.PhaseRunning && sameSpec(rec.Spec, want, s.profiles[rec.Pool].Env)
		if owner != p.owner {
			dead, known := gone[owner]
			if !known {
				dead = p.ownerGone(ctx, owner)
				gone[owner] = dead
			}
			if !dead {
				continue
			}
			if state == poolRetiring {
				p.remove(ctx, rec.ID)
				continue
			}
			if fit && len(own[rec.Pool]) < p.target(rec.Pool) && p.adopt(ctx, rec.ID, owner) {
				own[rec.Pool] = append(own[rec.Pool], rec.ID)
				continue
			}
			p.retire(ctx, rec.ID, owner)
			continue
		}
		switch {
		case state == poolRetiring:
			p.remove(ctx, rec.ID)
		case !fit:
			// Dead, interrupted while it booted, or made for a profile that changed since.
			p.retire(ctx, rec.ID, p.owner)
		default:
			own[rec.Pool] = append(own[rec.Pool], rec.ID)
		}
	}
	for name, ids := range own {
		for _, id := range ids[min(len(ids), p.target(name)):] {
			p.retire(ctx, id, p.owner) // beyond the target (adopted, or the target shrank)
		}
	}
	p.report(ctx)
	for _, prof := range p.profs {
		sp, ok := specs[prof.Name]
		if !ok {
			continue
		}
		for n := len(own[prof.Name]); n < prof.WarmPool && ctx.Err() == nil; n++ {
			if !p.fill(ctx, prof, sp) {
				break
			}
		}
	}
	p.report(ctx)
}

// fill boots one box of prof's pool; false when it failed (the profile then backs off).
func (p *pool) fill(ctx context.Context, prof ProfileConfig, spec runtime.BoxSpec) bool {
	s := p.s
	p.mu.Lock()
	bo := p.backoff[prof.Name]
	p.mu.Unlock()
	if s.now().Before(bo.until) {
		return false
	}
	start := s.now()
	now := start.UTC()
	rec := runtime.Record{ID: NewID(idPrefix), Spec: spec, Pool: prof.Name, CreatedAt: now, StateChangedAt: now,
		Annotations: map[string]string{annPoolOwner: p.owner, annPoolState: poolFilling}}
	err := s.driver.Create(ctx, rec)
	if err == nil {
		// The warm-up also makes this replica's attach to the box, off the path of the
		// create that claims it (a claim elsewhere attaches there; remove drops it).
		if err = p.warmUp(ctx, rec.ID); err == nil {
			_, err = p.pooler.UpdatePool(ctx, rec.ID, func(r *runtime.Record) error {
				if r.Annotations[annPoolOwner] != p.owner || r.Annotations[annPoolState] != poolFilling {
					return errPoolMoved
				}
				r.Annotations[annPoolState] = poolReady
				return nil
			})
		}
		if err != nil && !errors.Is(err, errPoolMoved) {
			p.remove(context.WithoutCancel(ctx), rec.ID)
		}
	}
	if err != nil {
		s.metrics.poolFilled(prof.Name, "error", s.now().Sub(start))
		if ctx.Err() == nil {
			bo.wait = min(max(2*bo.wait, poolEvery), fillBackoffMax)
			bo.until = s.now().Add(bo.wait)
			p.mu.Lock()
			p.backoff[prof.Name] = bo
			p.mu.Unlock()
			s.log.Warn("warm pool: a fill failed", "profile", prof.Name, "retry_in", bo.wait, "err", err)
		}
		return false
	}
	p.mu.Lock()
	delete(p.backoff, prof.Name)
	p.mu.Unlock()
	s.metrics.poolFilled(prof.Name, "ok", s.now().Sub(start))
	s.log.Debug("warm pool: box ready", "profile", prof.Name, "box", rec.ID, "ms", s.now().Sub(start).Milliseconds())
	return true
}

// warmUpArgv is the command a box of a pool runs once before it is ready: a shell that
// starts and exits. Found through PATH like a claimer's command, it pays the first-time costs
// of a fresh gVisor sandbox (the guest init's exec path and log stream run for the first
// time, the first fork and execve, the dynamic loader and libc read through the gofer, PATH
// lookups) that would otherwise land on the first exec of whoever claims the box. Its exit
// code does not matter (an image without sh still warms all but the loader).
var warmUpArgv = []string{"sh", "-c", "true"}

const (
	// warmUpTimeout bounds the warm-up (the box is retired when it takes longer).
	warmUpTimeout = 20 * time.Second
	// warmUpLogBytes bounds the warm-up's log in the guest.
	warmUpLogBytes = 64 << 10
)

// warmUp runs warmUpArgv in box id while it is filling (no claim can take it), through the
// attach and the guest calls an exec uses, and then has the guest init forget it: no record,
// log, cgroup or leftover process of it stays in the box. Nothing of it reaches Redis either
// (no exec stream, exec index, event or activity: the box is no sandbox yet) and it counts
// against nobody (slots, MaxRunningExecs, quotas). An error leaves the box to be removed: a
// box whose warm-up the guest could not forget is never claimed.
func (p *pool) warmUp(ctx context.Context, id string) error {
	s := p.s
	ctx, cancel := context.WithTimeout(ctx, warmUpTimeout)
	defer cancel()
	g, err := s.Guest(ctx, id)
	if err != nil {
		return fmt.Errorf("warm pool: attaching to the box: %w", err)
	}
	wid := NewID("warmup_")
	res, err := g.Run(ctx, proto.ExecRequest{ID: wid, Argv: warmUpArgv, TimeoutMs: warmUpTimeout.Milliseconds(),
		MaxLogBytes: warmUpLogBytes}, 1<<10, 1<<10)
	if err != nil {
		return fmt.Errorf("warm pool: the warm-up command: %w", err)
	}
	if res.Exit.ExitCode != 0 || res.Exit.Signal != "" {
		s.log.Debug("warm pool: the warm-up command failed (the box is warm all the same)", "box", id,
			"exit", res.Exit.ExitCode, "signal", res.Exit.Signal, "stderr", string(res.Stderr))
	}
	if err := g.Forget(ctx, wid); err != nil {
		return fmt.Errorf("warm pool: forgetting the warm-up command: %w", err)
	}
	return nil
}

// adopt makes an orphan of owner this replica's.
func (p *pool) adopt(ctx context.Context, id, owner string) bool {
	_, err := p.pooler.UpdatePool(ctx, id, func(r *runtime.Record) error {
		if r.Annotations[annPoolOwner] != owner || r.Annotations[annPoolState] != poolReady {
			return errPoolMoved
		}
		r.Annotations[annPoolOwner] = p.owner
		return nil
	})
	if err == nil {
		p.s.log.Info("warm pool: adopted an orphaned box", "box", id, "previous_owner", owner)
	}
	return err == nil
}

// retire takes a box of owner out of the pool (no claim can take it from then on) and deletes
// it. Another replica that got there first (a claim, an adoption) keeps it.
func (p *pool) retire(ctx context.Context, id, owner string) {
	_, err := p.pooler.UpdatePool(ctx, id, func(r *runtime.Record) error {
		if r.Annotations[annPoolOwner] != owner || r.Annotations[annPoolState] == poolRetiring {
			return errPoolMoved
		}
		r.Annotations[annPoolState] = poolRetiring
		return nil
	})
	if err != nil {
		return
	}
	p.remove(ctx, id)
}

// remove deletes a retiring box (a failure is tried again by a later pass).
func (p *pool) remove(ctx context.Context, id string) {
	p.s.attachs.drop(id)
	if err := p.s.driver.Delete(context.WithoutCancel(ctx), id); err != nil {
		p.s.log.Warn("warm pool: deleting a box failed", "box", id, "err", err)
		return
	}
	p.s.log.Debug("warm pool: box removed", "box", id)
}

// drain retires this replica's boxes (it is shutting down) and gives up its owner lock.
func (p *pool) drain() {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := p.retireOwn(ctx); err != nil {
		p.s.log.Warn("warm pool: listing the pool at shutdown failed; the next replica takes its boxes", "err", err)
	}
	p.mu.Lock()
	l, ll := p.ownerLock, p.leaderLock
	p.ownerLock, p.leaderLock = nil, nil
	p.mu.Unlock()
	if l != nil {
		l.Unlock(ctx)
	}
	if ll != nil {
		ll.Unlock(ctx) // the next replica's pass takes the shared pools over and fills them
	}
	p.report(ctx)
}

// report sets the pool gauges: the ready boxes of each pooled profile this driver holds (of
// any replica), and this replica's target.
func (p *pool) report(ctx context.Context) {
	boxes, err := p.pooler.ListPool(ctx)
	if err != nil {
		return
	}
	ready, filling := map[string]int{}, map[string]int{}
	for _, b := range boxes {
		switch b.Record.Annotations[annPoolState] {
		case poolReady:
			if b.Phase == runtime.PhaseRunning {
				ready[b.Record.Pool]++
			}
		case poolFilling:
			filling[b.Record.Pool]++
		}
	}
	for _, prof := range p.profs {
		p.s.metrics.poolSize(prof.Name, prof.WarmPool, ready[prof.Name], filling[prof.Name])
	}
}

// PoolStatus is one profile's warm pool as this replica sees it.
type PoolStatus struct {
	Profile string
	// Target is this replica's warm_pool for the profile.
	Target int
	// Ready counts the boxes ready to be claimed (of every replica sharing the runtime's
	// state); Filling those booting.
	Ready, Filling int
}

// WarmPools reports the warm pools of the profiles that keep one (for operators: the same
// figures as the sandboxd_warm_pool_boxes gauge).
func (s *Service) WarmPools(ctx context.Context) ([]PoolStatus, error) {
	if s.pool == nil {
		return nil, nil
	}
	boxes, err := s.pool.pooler.ListPool(ctx)
	if err != nil {
		return nil, err
	}
	byName := map[string]*PoolStatus{}
	var out []PoolStatus
	for _, prof := range s.pool.profs {
		out = append(out, PoolStatus{Profile: prof.Name, Target: prof.WarmPool})
	}
	for i := range out {
		byName[out[i].Profile] = &out[i]
	}
	for _, b := range boxes {
		st := byName[b.Record.Pool]
		if st == nil {
			continue
		}
		switch b.Record.Annotations[annPoolState] {
		case poolReady:
			if b.Phase == runtime.PhaseRunning {
				st.Ready++
			}
		case poolFilling:
			st.Filling++
		}
	}
	return out, nil
}

// warmRefusal says why a create of a pooled profile cannot take a warm box ("" when it can).
func warmRefusal(req CreateRequest) string {
	switch {
	case req.Source != nil:
		return "source"
	case req.Network != nil:
		return "network"
	}
	return ""
}

// claimWarm creates the sandbox from a box of prof's pool. ok is false when it did not (no
// pool, a create the pool cannot serve, no ready box, every candidate taken by another
// claim): the caller creates cold. An error is the create's answer (a full project's 429).
func (s *Service) claimWarm(ctx context.Context, p auth.Principal, req CreateRequest, prof ProfileConfig, rec runtime.Record,
	start time.Time) (Sandbox, bool, error) {
	pl := s.pool
	if pl == nil || prof.WarmPool == 0 {
		return Sandbox{}, false, nil
	}
	if why := warmRefusal(req); why != "" {
		s.metrics.poolClaim(prof.Name, "cold_"+why)
		return Sandbox{}, false, nil
	}
	boxes, err := pl.pooler.ListPool(ctx)
	if err != nil {
		s.log.Warn("warm pool: listing the pool failed; creating cold", "err", err)
		s.metrics.poolClaim(prof.Name, "miss")
		return Sandbox{}, false, nil
	}
	var cands []string
	for _, b := range boxes {
		r := b.Record
		if r.Pool == prof.Name && r.Annotations[annPoolState] == poolReady && b.Phase == runtime.PhaseRunning &&
			sameSpec(r.Spec, rec.Spec, prof.Env) {
			cands = append(cands, r.ID)
		}
	}
	// Replicas claiming at once start from different boxes.
	rand.Shuffle(len(cands), func(i, j int) { cands[i], cands[j] = cands[j], cands[i] })
	rec.Annotations = withAnnotation(maps.Clone(rec.Annotations), annWarm, "true")
	for _, id := range cands[:min(len(cands), claimAttempts)] {
		rec.ID = id
		sb, ok, err := s.claimOne(ctx, prof, rec, start)
		if ok || err != nil {
			if err == nil {
				s.metrics.poolClaim(prof.Name, "hit")
				s.metrics.poolClaimed(prof.Name, s.now().Sub(start))
			}
			pl.wakeAfterClaim()
			return sb, ok, err
		}
	}
	s.metrics.poolClaim(prof.Name, "miss")
	pl.wake()
	return Sandbox{}, false, nil
}

// claimOne claims box rec.ID for the sandbox rec describes. ok false, err nil: the box went to
// another claim (or away). Every claimer of a box takes the box's operation lock first, then
// a slot, then claims with one write that the runtime makes atomic (UpdatePool): a claimer
// that lost touches neither the winner's slot nor its lookup entry. A slot it took itself is
// given back when its claim fails. A slot the box's id held already in the project is a
// claim of that project's that won before (a box's id holds no slot while in the pool): the
// box is read under the lock to tell that from a slot a claimer killed before its claim left
// behind, and only a box still ready is claimed.
func (s *Service) claimOne(ctx context.Context, prof ProfileConfig, rec runtime.Record, start time.Time) (Sandbox, bool, error) {
	id := rec.ID
	lock, err := s.store.Lock(ctx, id, s.cfg.LockTTL)
	if errors.Is(err, store.ErrLocked) {
		return Sandbox{}, false, nil
	}
	if err != nil {
		return Sandbox{}, false, apierror.Wrap(err, apierror.Unavailable, "the sandbox store is unavailable")
	}
	defer lock.Unlock(ctx)
	ready := func(r *runtime.Record) error {
		if r.Pool != prof.Name || r.Annotations[annPoolState] != poolReady || !sameSpec(r.Spec, rec.Spec, prof.Env) {
			return errPoolMoved
		}
		return nil
	}
	// A full project is answered now; the box stays in the pool.
	held, err := s.slots.take(ctx, rec.Tenant, rec.Project, id)
	if err != nil {
		return Sandbox{}, false, err
	}
	if held {
		// The look changes nothing and carries no fence, so the runtime writes nothing for
		// it; the claim's write below carries the lock's fence.
		if _, err := s.pool.pooler.UpdatePool(ctx, id, ready); err != nil {
			return Sandbox{}, false, nil // claimed (the slot is the winner's), retired or adopted
		}
	}
	ctx = runtime.WithFence(ctx, lock.Fence())
	claimed, err := s.pool.pooler.UpdatePool(ctx, id, func(r *runtime.Record) error {
		if err := ready(r); err != nil {
			return err
		}
		*r = rec
		return nil
	})
	if err != nil {
		s.slots.release(context.WithoutCancel(ctx), rec.Tenant, rec.Project, id)
		if !errors.Is(err, errPoolMoved) && !errors.Is(err, runtime.ErrNotFound) {
			s.log.Warn("warm pool: a claim failed", "box", id, "err", err)
		}
		return Sandbox{}, false, nil
	}
	// The lookup after the claim (a claimer that lost never writes it): a replica that dies
	// in between leaves a CREATING record that the reconciler's finish puts in the lookup.
	if err := s.store.Put(ctx, entryOf(claimed)); err != nil {
		s.abortCreate(ctx, claimed, start)
		return Sandbox{}, false, apierror.Wrap(err, apierror.Unavailable, "the sandbox store is unavailable")
	}
	s.Touch(ctx, id)
	s.publish(ctx, claimed, "")
	if err := s.handEnv(ctx, claimed); err != nil {
		s.abortCreate(ctx, claimed, start)
		return Sandbox{}, false, err
	}
	claimed, err = s.setState(ctx, id, Creating, Running, "")
	if err != nil {
		return Sandbox{}, false, err
	}
	d := s.now().Sub(start)
	s.metrics.lifecycle("create", "ok", d)
	s.log.Info("sandbox created", "sandbox", id, "tenant", rec.Tenant, "project", rec.Project, "profile", prof.Name,
		"warm", true, "ms", d.Milliseconds())
	return toSandbox(claimed), true, nil
}

// finishClaim does what an interrupted claim of a warm box may have left undone: the lookup
// entry and the environment (nothing for any other sandbox).
func (s *Service) finishClaim(ctx context.Context, rec runtime.Record) error {
	if rec.Annotations[annWarm] == "" {
		return nil
	}
	if err := s.store.Put(ctx, entryOf(rec)); err != nil {
		return apierror.Wrap(err, apierror.Unavailable, "the sandbox store is unavailable")
	}
	return s.handEnv(ctx, rec)
}

// handEnv hands a sandbox claimed from a pool its environment (the profile's with the
// create's over it) for every exec from now on; nothing for any other sandbox.
func (s *Service) handEnv(ctx context.Context, rec runtime.Record) error {
	if rec.Annotations[annWarm] == "" {
		return nil
	}
	if prof, ok := s.profiles[rec.Spec.Profile]; ok && maps.Equal(rec.Spec.Env, prof.Env) {
		// The box was made with this environment (a claim never takes a box made with
		// another, sameSpec), and no environment is ever handed to a box before its claim:
		// nothing to hand.
		return nil
	}
	keys := slices.Sorted(maps.Keys(rec.Spec.Env))
	env := make([]string, 0, len(keys))
	for _, k := range keys {
		env = append(env, k+"="+rec.Spec.Env[k])
	}
	g, err := s.Guest(ctx, rec.ID)
	if err == nil {
		_, err = g.SetEnv(ctx, env)
	}
	if err != nil {
		return s.GuestError(ctx, rec.ID, err)
	}
	return nil
}
