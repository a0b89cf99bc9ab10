package resolvers

import (
	"sandboxd/graph/model"
	"sandboxd/internal/sandbox"
)

// The connections of lists the service pages by a cursor of its own (snapshots, agent runs,
// a folder's entries):
// an edge's cursor is the service's cursor of its item, endCursor the last edge's, and
// hasNextPage whether the service found more after the page.

// pageInfo is the PageInfo of a page whose edges have these cursors; next is the service's
// cursor of the next page ("" on the last page).
func pageInfo(cursors []string, next string) *model.PageInfo {
	pi := &model.PageInfo{HasNextPage: next != ""}
	if len(cursors) > 0 {
		start, end := cursors[0], cursors[len(cursors)-1]
		pi.StartCursor, pi.EndCursor = &start, &end
	}
	return pi
}

func toSnapshotConnection(page sandbox.SnapshotPage) *model.SnapshotConnection {
	c := &model.SnapshotConnection{
		Edges: make([]*model.SnapshotEdge, len(page.Snapshots)),
		Nodes: make([]*model.Snapshot, len(page.Snapshots)),
	}
	cursors := make([]string, len(page.Snapshots))
	for i, s := range page.Snapshots {
		n := toSnapshot(s)
		cursors[i] = sandbox.SnapshotCursor(s)
		c.Nodes[i] = n
		c.Edges[i] = &model.SnapshotEdge{Cursor: cursors[i], Node: n}
	}
	c.PageInfo = pageInfo(cursors, page.NextCursor)
	return c
}

func toFileConnection(path string, page sandbox.FilePage) *model.FileConnection {
	c := &model.FileConnection{
		Path:  path,
		Edges: make([]*model.FileEdge, len(page.Entries)),
		Nodes: make([]*model.FileInfo, len(page.Entries)),
	}
	cursors := make([]string, len(page.Entries))
	for i, e := range page.Entries {
		n := toFileInfo(e)
		cursors[i] = sandbox.FileCursor(e.Name)
		c.Nodes[i] = n
		c.Edges[i] = &model.FileEdge{Cursor: cursors[i], Node: n}
	}
	c.PageInfo = pageInfo(cursors, page.NextCursor)
	return c
}

func toAgentRunConnection(page sandbox.AgentRunPage) *model.AgentRunConnection {
	c := &model.AgentRunConnection{
		Edges: make([]*model.AgentRunEdge, len(page.Runs)),
		Nodes: make([]*model.AgentRun, len(page.Runs)),
	}
	cursors := make([]string, len(page.Runs))
	for i, r := range page.Runs {
		n := toAgentRun(r)
		cursors[i] = r.ID
		c.Nodes[i] = n
		c.Edges[i] = &model.AgentRunEdge{Cursor: cursors[i], Node: n}
	}
	c.PageInfo = pageInfo(cursors, page.NextCursor)
	return c
}
