package tests

import (
	"encoding/base64"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"

	"sandboxd/tests/e2e"
)

const gqlFilePage = `query($id: ID!, $path: String, $first: Int, $after: String) {
	listFiles(sandboxId: $id, path: $path, first: $first, after: $after) {
		path edges { cursor node { name type } } pageInfo { hasNextPage endCursor } } }`

type gqlFileConn struct {
	Path  string `json:"path"`
	Edges []struct {
		Cursor string `json:"cursor"`
		Node   struct {
			Name string `json:"name"`
			Type string `json:"type"`
		} `json:"node"`
	} `json:"edges"`
	PageInfo struct {
		HasNextPage bool    `json:"hasNextPage"`
		EndCursor   *string `json:"endCursor"`
	} `json:"pageInfo"`
}

// TestListFilesPages: listFiles is a Relay connection over a folder in name order. A folder of
// 2,500 files (made in an order unlike the names') and a link out of the workspace comes in 3
// pages of first: 1000 with nothing lost or repeated; REST's listing is as before; a hostile
// cursor is INVALID_ARGUMENT and never a path; another tenant finds no sandbox.
func TestListFilesPages(t *testing.T) {
	s := e2e.StartServer(t, e2e.ServerOptions{})
	h := e2e.HdrTenant1
	id := s.Create(t, e2e.CreateBody, h).SandboxID
	sh(t, s, id, `mkdir -p /workspace/big && cd /workspace/big &&
python3 -c "[open('f%05d' % ((i * 7919) % 2500), 'w').close() for i in range(2500)]" &&
ln -s /etc zz-etc && ls | wc -l`, h)
	want := make([]string, 0, 2501)
	for i := range 2500 {
		want = append(want, fmt.Sprintf("f%05d", i))
	}
	want = append(want, "zz-etc")

	e2e.Step(t, "three-pages", func(t *testing.T) {
		var got []string
		var after any
		pages := 0
		for {
			var c gqlFileConn
			s.GQL(t, gqlFilePage, map[string]any{"id": id, "path": "big", "first": 1000, "after": after}, h).OK(t, "listFiles", &c)
			pages++
			if len(c.Edges) > 1000 || c.Path != "big" {
				t.Fatalf("page %d: got %d edges, path %q, want at most 1000 and path big", pages, len(c.Edges), c.Path)
			}
			for i, e := range c.Edges {
				got = append(got, e.Node.Name)
				if e.Cursor == "" || strings.Contains(e.Cursor, e.Node.Name) {
					t.Errorf("page %d edge %d: got %+v, want an opaque cursor", pages, i, e)
				}
			}
			if n := len(c.Edges); n > 0 && (c.PageInfo.EndCursor == nil || *c.PageInfo.EndCursor != c.Edges[n-1].Cursor) {
				t.Errorf("page %d: endCursor %v, want the last edge's cursor", pages, c.PageInfo.EndCursor)
			}
			if !c.PageInfo.HasNextPage || pages > 5 {
				break
			}
			after = *c.PageInfo.EndCursor
		}
		if pages != 3 || !slices.Equal(got, want) {
			t.Errorf("got %d pages of %d names, want 3 pages of the %d names in order", pages, len(got), len(want))
		}
	})

	e2e.Step(t, "link-is-an-entry", func(t *testing.T) {
		// The last name is the link: listed as a link, never followed out of the workspace.
		var c gqlFileConn
		s.GQL(t, gqlFilePage, map[string]any{"id": id, "path": "big", "first": 1, "after": fileCursorOf("f02499")}, h).OK(t, "listFiles", &c)
		if len(c.Edges) != 1 || c.Edges[0].Node.Name != "zz-etc" || c.Edges[0].Node.Type != "SYMLINK" || c.PageInfo.HasNextPage {
			t.Errorf("after f02499: got %+v, want only the link zz-etc and no next page", c)
		}
		s.GQL(t, gqlFilePage, map[string]any{"id": id, "path": "big/zz-etc"}, h).WantCode(t, 0, "INVALID_ARGUMENT")
	})

	e2e.Step(t, "rest-unchanged", func(t *testing.T) {
		// curl "$URL/sandbox/sandboxes/v1/$ID/files/list?path=big&limit=1000"
		r := s.Curl(t, http.MethodGet, fileURL(id, "list", "big", "limit", "1000"), nil, h)
		r.Want(t, http.StatusOK)
		var l struct {
			Path      string         `json:"path"`
			Entries   []fileInfoJSON `json:"entries"`
			Truncated bool           `json:"truncated"`
		}
		r.Decode(t, &l)
		if len(l.Entries) != 1000 || !l.Truncated {
			t.Errorf("%s: got %d entries, truncated %v, want 1000 and truncated", r, len(l.Entries), l.Truncated)
		}
	})

	e2e.Step(t, "hostile-cursors", func(t *testing.T) {
		for _, bad := range []string{
			"../../etc", "/etc/passwd", "f1.", fileCursorOf(".."), fileCursorOf("../etc"), fileCursorOf("a/b"),
			fileCursorOf("a\x00b"), fileCursorOf(strings.Repeat("n", 256)), "f1." + strings.Repeat("A", 5000),
			"1700000000000000000.snap_01M8TM4CT8DKBQ061KTJ7ETKK3_0000000001",
		} {
			g := s.GQL(t, gqlFilePage, map[string]any{"id": id, "path": "big", "first": 10, "after": bad}, h)
			g.WantCode(t, 0, "INVALID_ARGUMENT", "cursor")
			if raw, _ := g.Dig("listFiles"); string(raw) != "null" {
				t.Errorf("after %q: got data %s, want null", bad, raw)
			}
		}
		// A first over the bound is refused before anything runs (its price alone is over the
		// default budget; a larger budget meets the service's bound, INVALID_ARGUMENT).
		g := s.GQL(t, gqlFilePage, map[string]any{"id": id, "path": "big", "first": 1_000_000}, h)
		if len(g.Errors) == 0 || (g.Errors[0].Code() != "COST_EXCEEDED" && g.Errors[0].Code() != "INVALID_ARGUMENT") {
			t.Errorf("first 1000000: got %s, want COST_EXCEEDED or INVALID_ARGUMENT", g)
		}
	})

	e2e.Step(t, "another-tenant", func(t *testing.T) {
		g := s.GQL(t, gqlFilePage, map[string]any{"id": id, "path": "big", "first": 10, "after": fileCursorOf("f00001")}, e2e.HdrTenant2)
		g.WantCode(t, 0, "NOT_FOUND")
		if raw, _ := g.Dig("listFiles"); string(raw) != "null" {
			t.Errorf("another tenant: got data %s, want null", raw)
		}
	})
}

// fileCursorOf is the cursor the server hands out for a name (its form is the server's; the
// test makes one to aim hostile ones at the parser).
func fileCursorOf(name string) string {
	return "f1." + base64.RawURLEncoding.EncodeToString([]byte(name))
}
