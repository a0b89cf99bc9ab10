package main

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"
)

// parseClients parses a comma-separated list of positive client counts ("1,8,32").
func parseClients(s string) ([]int, error) {
	var out []int
	for f := range strings.SplitSeq(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		n, err := strconv.Atoi(f)
		if err != nil || n <= 0 {
			return nil, fmt.Errorf("client count %q: want a positive integer", f)
		}
		if !slices.Contains(out, n) {
			out = append(out, n)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no client counts in %q", s)
	}
	return out, nil
}

// benchReads: REST GET …/{id} and the REST list with N concurrent clients each in a closed
// loop, next to GET /healthz of the same server at the same N (the HTTP floor: no key check,
// no Redis), alternating slice by slice.
func benchReads(ctx context.Context, b *bench) (groups []*Group, err error) {
	counts, err := parseClients(b.opts.readsClients)
	if err != nil {
		return nil, err
	}
	id, _, err := b.createSandbox(ctx)
	defer b.finishSandbox(id, &err)
	if err != nil {
		return nil, fmt.Errorf("creating the sandbox: %w", err)
	}
	// One keep-alive connection per client.
	api := b.api.withConns(slices.Max(counts) + 4)
	defer api.http.CloseIdleConnections()
	var page struct {
		Sandboxes []sandboxJSON `json:"sandboxes"`
	}
	if err := api.do(ctx, http.MethodGet, restPrefix, nil, &page); err != nil {
		return nil, err
	}
	getPath := restPrefix + "/" + url.PathEscape(id)
	// The big list (bench_list.go): its own sandboxd over listN stopped sandboxes.
	var bigList func() func(ctx context.Context) error
	if b.server != nil {
		ls, lapi, cursors, err := startListServer(ctx, b, id, slices.Max(counts)+4)
		if err != nil {
			return nil, fmt.Errorf("the big list's server: %w", err)
		}
		defer func() {
			if serr := ls.stop(); serr != nil && err == nil {
				progress("the big list's sandboxd: %v", serr)
			}
		}()
		defer lapi.http.CloseIdleConnections()
		bigList = func() func(ctx context.Context) error { return pager(lapi, cursors) }
	}
	rounds := max(b.opts.readsRounds, 1)
	slice := b.opts.readsDuration / time.Duration(rounds)
	for _, n := range counts {
		g := &Group{Name: fmt.Sprintf("reads, %d client%s", n, plural(n))}
		groups = append(groups, g)
		get := &rateStep{res: g.result("REST GET …/{id}", false), op: func(ctx context.Context) error {
			return api.do(ctx, http.MethodGet, getPath, nil, nil)
		}}
		list := &rateStep{res: g.result("REST GET list", false), op: func(ctx context.Context) error {
			return api.do(ctx, http.MethodGet, restPrefix, nil, nil)
		}}
		health := &rateStep{res: g.result("GET /healthz", true), op: func(ctx context.Context) error {
			return api.do(ctx, http.MethodGet, "/healthz", nil, nil)
		}}
		steps := []*rateStep{get, list, health}
		if bigList != nil {
			steps = append(steps, &rateStep{res: g.result(fmt.Sprintf("REST GET list, %d sandboxes, pages of %d", listN, listPage), false),
				op: bigList()})
		}
		for _, s := range steps {
			s.res.RateUnit = "req/s"
		}
		if err := interleaveLoad(ctx, g.Name, n, rounds, slice, 300*time.Millisecond, steps); err != nil {
			return groups, err
		}
	}
	groups[0].Note = fmt.Sprintf("N clients in a closed loop (each waits for its answer), one keep-alive connection each, "+
		"%v per path and N in %d slices alternating the paths (after a 0.3 s warm-up of each); throughput is answers per second "+
		"over those slices, latency each request's round trip; the ratios are ours/healthz: of the latency medians in the last "+
		"column, of the throughputs in parentheses. GET …/{id} of one RUNNING sandbox; the list answers the project's "+
		"%d sandbox%s (default page); the big list is a second sandboxd of the same build over %d STOPPED sandboxes of the project "+
		"(records written into its state folder before it started, as a restart finds them), each request the page after the "+
		"previous request's, first to last in turn, %d per page by cursor. /healthz is the first server's mux without key check or Redis: its HTTP floor. "+
		"The benchmark's clients run on the same cores as sandboxd.", b.opts.readsDuration, rounds, len(page.Sandboxes), pluralES(len(page.Sandboxes)), listN, listPage)
	return groups, nil
}

func plural(n int) string {
	if n == 1 {
		return ""
	}
	return "s"
}

func pluralES(n int) string {
	if n == 1 {
		return ""
	}
	return "es"
}
