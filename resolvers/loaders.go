package resolvers

import (
	"context"
	"strings"
	"sync"
	"time"

	"github.com/99designs/gqlgen/graphql"
	"github.com/vektah/gqlparser/v2/ast"
	"github.com/vektah/gqlparser/v2/gqlerror"
	"github.com/vikstrous/dataloadgen"

	"sandboxd/graph/model"
	"sandboxd/internal/api"
	"sandboxd/internal/apierror"
	"sandboxd/internal/auth"
	"sandboxd/internal/sandbox"
)

// Object references (Sandbox.latestSnapshot, Snapshot.sandbox, AgentRun.exec) are resolved
// through dataloaders (vikstrous/dataloadgen) made afresh for each response: one page of 500
// snapshots of 3 sandboxes reads 3 sandboxes, each once, the reads of one batch running side
// by side (at most loadParallel at a time). A subscription gets new loaders for each event, so
// nothing read for one event is served stale to the next. A reference that is gone (a
// destroyed sandbox, a trimmed snapshot, an exec whose output expired) is null without an
// error: the id field beside it still says what it was.
//
// Global ids (node, nodes): the ids the service hands out already carry their type as a prefix
// (sbx_, snap_, exec_, run_) before a ULID, are unique across types and are what the REST
// paths take, so they are the global ids as they are, with no second encoding to learn.

const (
	// loadWait is how long a loader gathers keys before it reads them: the sibling fields of
	// one list resolve within it.
	loadWait = 5 * time.Millisecond
	// loadBatch bounds the keys of one batch.
	loadBatch = 100
	// loadParallel bounds the reads of one batch that run at once.
	loadParallel = 8
	// MaxNodes bounds the ids of one nodes(ids:) field.
	MaxNodes = 100
)

// loaders are one response's dataloaders.
type loaders struct {
	sandboxes *dataloadgen.Loader[string, *sandbox.Sandbox]
	snapshots *dataloadgen.Loader[string, *sandbox.SnapshotInfo]
	execs     *dataloadgen.Loader[string, *sandbox.ExecResult]
}

type loadersKey struct{}

func newLoaders(svc api.Service) *loaders {
	opts := []dataloadgen.Option{dataloadgen.WithWait(loadWait), dataloadgen.WithBatchCapacity(loadBatch)}
	return &loaders{
		sandboxes: dataloadgen.NewLoader(fetchEach(func(ctx context.Context, p auth.Principal, id string) (sandbox.Sandbox, error) {
			return svc.Get(ctx, p, id)
		}), opts...),
		snapshots: dataloadgen.NewLoader(fetchEach(func(ctx context.Context, p auth.Principal, id string) (sandbox.SnapshotInfo, error) {
			return svc.GetSnapshot(ctx, p, id)
		}), opts...),
		execs: dataloadgen.NewLoader(fetchEach(func(ctx context.Context, p auth.Principal, id string) (sandbox.ExecResult, error) {
			return svc.GetExec(ctx, p, "", id, false)
		}), opts...),
	}
}

// withLoaders is response middleware: each response (each event of a subscription) resolves
// its references through loaders of its own.
func withLoaders(svc api.Service) graphql.ResponseMiddleware {
	return func(ctx context.Context, next graphql.ResponseHandler) *graphql.Response {
		return next(context.WithValue(ctx, loadersKey{}, newLoaders(svc)))
	}
}

// loadersOf is the response's loaders; a caller outside a response (a unit test calling a
// resolver) gets loaders of its own.
func (r *Resolver) loadersOf(ctx context.Context) *loaders {
	if l, ok := ctx.Value(loadersKey{}).(*loaders); ok {
		return l
	}
	return newLoaders(r.svc)
}

// fetchEach makes a batch function of a one-key read: the keys are read side by side, as the
// caller's principal; NOT_FOUND is a nil value, any other error that key's error.
func fetchEach[V any](get func(context.Context, auth.Principal, string) (V, error)) func(context.Context, []string) ([]*V, []error) {
	return func(ctx context.Context, keys []string) ([]*V, []error) {
		vals, errs := make([]*V, len(keys)), make([]error, len(keys))
		p, err := auth.Require(ctx)
		if err != nil {
			for i := range errs {
				errs[i] = err
			}
			return vals, errs
		}
		errs = sideBySide(ctx, len(keys), func(i int) error {
			v, err := get(ctx, p, keys[i])
			switch {
			case apierror.Is(err, apierror.NotFound):
				return nil
			case err != nil:
				return err
			}
			vals[i] = &v
			return nil
		})
		return vals, errs
	}
}

// sideBySide runs fn for each index below n, loadParallel at a time, and returns each one's
// error by index; a panic is logged with its stack and becomes an internal error on its index.
func sideBySide(ctx context.Context, n int, fn func(i int) error) []error {
	errs := make([]error, n)
	sem := make(chan struct{}, loadParallel)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			defer func() {
				if v := recover(); v != nil {
					errs[i] = &apierror.Error{Code: apierror.Internal, Message: "internal error"}
					graphql.Recover(ctx, v) // logs it with its stack
				}
			}()
			errs[i] = fn(i)
		}()
	}
	wg.Wait()
	return errs
}

// ---- references ----

func (r *Resolver) sandboxRef(ctx context.Context, id string) (*model.Sandbox, error) {
	return ref(ctx, r.loadersOf(ctx).sandboxes, id, toSandbox)
}

func (r *Resolver) snapshotRef(ctx context.Context, id string) (*model.Snapshot, error) {
	return ref(ctx, r.loadersOf(ctx).snapshots, id, toSnapshot)
}

func (r *Resolver) execRef(ctx context.Context, id string) (*model.ExecResult, error) {
	return ref(ctx, r.loadersOf(ctx).execs, id, func(e sandbox.ExecResult) *model.ExecResult {
		return toExecResult(e, nil) // references carry no output
	})
}

// ref loads the object id refers to through l and converts it: nil for no id, or for an
// object that is gone.
func ref[V, M any](ctx context.Context, l *dataloadgen.Loader[string, *V], id string, conv func(V) *M) (*M, error) {
	if id == "" {
		return nil, nil
	}
	v, err := l.Load(ctx, id)
	if err != nil || v == nil {
		return nil, err
	}
	return conv(*v), nil
}

// profileRef is the configured profile of this name; null when the configuration no longer
// has it. Profiles are configuration in memory: there is nothing to batch.
func (r *Resolver) profileRef(name string) *model.Profile {
	for _, p := range r.svc.Profiles() {
		if p.Name == name {
			return toProfiles([]sandbox.Profile{p})[0]
		}
	}
	return nil
}

// ---- node, nodes ----

// node resolves one global id by its type's prefix. A missing or another tenant's object, or
// an id of no known type, is NOT_FOUND.
func (r *Resolver) node(ctx context.Context, p auth.Principal, id string) (model.Node, error) {
	switch {
	case strings.HasPrefix(id, "sbx_"):
		sb, err := r.svc.Get(ctx, p, id)
		if err != nil {
			return nil, err
		}
		return toSandbox(sb), nil
	case strings.HasPrefix(id, "snap_"):
		s, err := r.svc.GetSnapshot(ctx, p, id)
		if err != nil {
			return nil, err
		}
		return toSnapshot(s), nil
	case strings.HasPrefix(id, "exec_"):
		sel := fieldSet{}
		output := false
		for _, f := range graphql.CollectFieldsCtx(ctx, []string{"ExecResult", "Node"}) {
			sel[f.Name] = true
			output = output || outputFields[f.Name]
		}
		res, err := r.svc.GetExec(ctx, p, "", id, output)
		if err != nil {
			return nil, err
		}
		return toExecResult(res, sel), nil
	case strings.HasPrefix(id, "run_"):
		run, err := r.svc.GetAgentRun(ctx, p, id)
		if err != nil {
			return nil, err
		}
		return toAgentRun(run), nil
	}
	return nil, apierror.New(apierror.NotFound, "node %s not found", apierror.Truncate(id, 64))
}

// nodes resolves up to MaxNodes ids side by side; each failure is an error on its own index
// and null in its place.
func (r *Resolver) nodes(ctx context.Context, p auth.Principal, ids []string) ([]model.Node, error) {
	if len(ids) > MaxNodes {
		return nil, invalidArg("ids", "ids holds %d ids; at most %d are allowed", len(ids), MaxNodes)
	}
	out := make([]model.Node, len(ids))
	errs := sideBySide(ctx, len(ids), func(i int) (err error) {
		out[i], err = r.node(ctx, p, ids[i])
		return err
	})
	path := graphql.GetPath(ctx)
	for i, err := range errs {
		if err == nil {
			continue
		}
		if _, ok := err.(*apierror.Error); !ok {
			err = apierror.From(err)
		}
		out[i] = nil
		graphql.AddError(ctx, &gqlerror.Error{Err: err, Message: err.Error(), Path: append(append(ast.Path{}, path...), ast.PathIndex(i))})
	}
	return out, nil
}
