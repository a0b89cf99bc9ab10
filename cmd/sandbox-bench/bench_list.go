package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"sync/atomic"
	"time"

	"github.com/oklog/ulid/v2"
)

// The reads suite's big list: a second sandboxd over a state folder that holds listN STOPPED
// sandboxes of the bench's project, walked page by page with cursors by N clients, next to
// the same server's /healthz. A stopped sandbox is a record in the runtime's state folder and
// nothing else (no compute, no disk until it starts), so the bench writes the records before
// that server starts, as a restart would find them: the server rebuilds its Redis lookup from
// the runtime's list, and every request is then served as any other list.

// listN is how many sandboxes the big list holds; listPage its page size.
const (
	listN    = 1000
	listPage = 50
)

// seedStopped writes n STOPPED records modelled on template (a record.json of a sandbox the
// bench created) into stateDir's boxes folder: same owner and spec, new ids, no fence.
func seedStopped(stateDir string, template []byte, n int) error {
	var rec map[string]any
	if err := json.Unmarshal(template, &rec); err != nil {
		return fmt.Errorf("the template record: %w", err)
	}
	delete(rec, "fence")
	delete(rec, "annotations") // the running box's own (channel, network); a stopped one needs none
	now := time.Now().UTC()
	for i := range n {
		id := "sbx_" + ulid.Make().String()
		at := now.Add(time.Duration(i-n) * time.Millisecond)
		rec["id"], rec["state"], rec["desired_state"] = id, "STOPPED", "STOPPED"
		rec["created_at"], rec["state_changed_at"] = at, at
		rec["labels"] = map[string]string{"bench": "list", "n": fmt.Sprint(i % 10)}
		b, err := json.Marshal(rec)
		if err != nil {
			return err
		}
		dir := filepath.Join(stateDir, "boxes", id)
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(dir, "record.json"), b, 0o600); err != nil {
			return err
		}
	}
	return nil
}

// startListServer starts the big list's sandboxd with listN stopped sandboxes modelled on the
// bench's sandbox id, a client of it with conns keep-alive connections, and the cursor of each
// page ("" for the first).
func startListServer(ctx context.Context, b *bench, id string, conns int) (*server, *client, []string, error) {
	if b.server == nil || b.stateDir == "" {
		return nil, nil, nil, errors.New("the big list needs a sandboxd the benchmark starts")
	}
	template, err := os.ReadFile(filepath.Join(b.stateDir, "boxes", id, "record.json"))
	if err != nil {
		return nil, nil, nil, err
	}
	dir := filepath.Join(b.tmp, "list")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, nil, nil, err
	}
	if err := seedStopped(filepath.Join(dir, "state"), template, listN); err != nil {
		return nil, nil, nil, err
	}
	// The same options but for a warm pool: the big list's server boots none.
	o := *b.opts
	o.warmProfile = false
	s, err := startServer(ctx, &o, dir)
	if err != nil {
		if s != nil {
			_ = s.stop()
		}
		return nil, nil, nil, err
	}
	api := newClient(s.url, s.key).withConns(conns)
	// Every page once, so that the lookup is rebuilt and the count is what the row says.
	total, cursor, cursors := 0, "", []string{""}
	for {
		var page struct {
			Sandboxes  []sandboxJSON `json:"sandboxes"`
			NextCursor string        `json:"next_cursor"`
		}
		if err := api.do(ctx, http.MethodGet, listPath(cursor), nil, &page); err != nil {
			_ = s.stop()
			return nil, nil, nil, err
		}
		total += len(page.Sandboxes)
		if cursor = page.NextCursor; cursor == "" {
			break
		}
		cursors = append(cursors, cursor)
	}
	if total != listN {
		_ = s.stop()
		return nil, nil, nil, fmt.Errorf("the big list's server lists %d sandboxes, want %d", total, listN)
	}
	return s, api, cursors, nil
}

func listPath(cursor string) string {
	p := fmt.Sprintf("%s?limit=%d", restPrefix, listPage)
	if cursor != "" {
		p += "&cursor=" + url.QueryEscape(cursor)
	}
	return p
}

// pager walks the big list's pages in turn across all its callers: each call asks for the
// page after the one the previous call asked for (by the cursors the first walk collected), so
// every page, first to last, is asked for equally often.
func pager(api *client, cursors []string) func(ctx context.Context) error {
	var next atomic.Uint64
	return func(ctx context.Context) error {
		cursor := cursors[(next.Add(1)-1)%uint64(len(cursors))]
		var page struct {
			Sandboxes []sandboxJSON `json:"sandboxes"`
		}
		if err := api.do(ctx, http.MethodGet, listPath(cursor), nil, &page); err != nil {
			return err
		}
		if len(page.Sandboxes) != listPage {
			return fmt.Errorf("a page of %d sandboxes, want %d", len(page.Sandboxes), listPage)
		}
		return nil
	}
}
