package store

import (
	"slices"
	"strconv"
	"strings"
	"sync"
)

// Bounds of a Store's page memo: how many pages it remembers, and how many ids in all.
const (
	pageMemoKeys = 1024
	pageMemoIDs  = 64 << 10
)

// pageMemo remembers, per list page (project, cursor, size), the ids its latest read found,
// so that the next read of the page can read their entries in the same round trip as the
// index (Store.list). It holds ids only, never what they say, and a guess that is wrong costs
// a round trip, never a wrong answer. It is bounded in pages and in ids: a full memo forgets
// pages at random (a client walking many cursors only costs the others' guesses).
type pageMemo struct {
	mu      sync.Mutex
	maxKeys int
	maxIDs  int
	ids     int
	pages   map[string][]string
}

func newPageMemo(maxKeys, maxIDs int) *pageMemo {
	return &pageMemo{maxKeys: maxKeys, maxIDs: maxIDs, pages: map[string][]string{}}
}

// pageKey names a list page: the project's index, where the page starts and its size.
func pageKey(tenant, project, after string, limit int) string {
	var b strings.Builder
	b.Grow(len(tenant) + len(project) + len(after) + 8)
	b.WriteString(tenant)
	b.WriteByte(0)
	b.WriteString(project)
	b.WriteByte(0)
	b.WriteString(after)
	b.WriteByte(0)
	b.WriteString(strconv.Itoa(limit))
	return b.String()
}

// get returns the ids the page's latest read found (nil if none is remembered). The slice is
// the memo's own: read it, never write it.
func (m *pageMemo) get(key string) []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.pages[key]
}

// put remembers ids as the page's, in place of what it held; an empty page is forgotten.
func (m *pageMemo) put(key string, ids []string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if old, ok := m.pages[key]; ok {
		if slices.Equal(old, ids) {
			return
		}
		m.ids -= len(old)
		delete(m.pages, key)
	}
	if len(ids) == 0 || len(ids) > m.maxIDs {
		return
	}
	for len(m.pages) >= m.maxKeys || m.ids+len(ids) > m.maxIDs {
		for k, v := range m.pages { // a random page: Go's map iteration starts anywhere
			m.ids -= len(v)
			delete(m.pages, k)
			break
		}
	}
	m.pages[key] = append([]string(nil), ids...)
	m.ids += len(ids)
}
