package client

import (
	"context"
	"encoding/json"
	"errors"
	"maps"
	"net/http"
	"net/url"
	"slices"
)

// UpdateRequest changes a sandbox (Update). Zero fields change nothing; set at least one.
// The labels are a merge patch: SetLabels sets (or changes) labels, RemoveLabels removes
// labels, ClearLabels removes every label first; the labels named in none stay.
type UpdateRequest struct {
	SetLabels    map[string]string
	RemoveLabels []string
	ClearLabels  bool
	// AutostopSec and TTLSec replace the sandbox's, within the server's bounds; TTLSec still
	// counts from the sandbox's creation and may not end its life before now.
	AutostopSec *int64
	TTLSec      *int64
}

// MarshalJSON is the request as the REST API's JSON merge patch: {"labels": {"k": "v",
// "removed": null} | null, "autostop_sec": N, "ttl_sec": N}. A merge patch cannot clear the
// labels and set or remove some in one request: ClearLabels with SetLabels or RemoveLabels is
// an error (clear first, then set, in two updates).
func (r UpdateRequest) MarshalJSON() ([]byte, error) {
	body := map[string]any{}
	switch {
	case r.ClearLabels && (len(r.SetLabels) > 0 || len(r.RemoveLabels) > 0):
		return nil, errors.New("client: ClearLabels with SetLabels or RemoveLabels: clear first, then set, in two updates")
	case r.ClearLabels:
		body["labels"] = nil
	case len(r.SetLabels) > 0 || len(r.RemoveLabels) > 0:
		patch := map[string]any{}
		for _, k := range r.RemoveLabels {
			patch[k] = nil
		}
		for k, v := range r.SetLabels {
			patch[k] = v
		}
		body["labels"] = patch
	}
	if r.AutostopSec != nil {
		body["autostop_sec"] = *r.AutostopSec
	}
	if r.TTLSec != nil {
		body["ttl_sec"] = *r.TTLSec
	}
	return json.Marshal(body)
}

// Update changes a sandbox's labels, auto-stop and TTL (PATCH /sandbox/sandboxes/v1/{id})
// and answers the sandbox as updated, with its new deadlines (ExpiresAt, and AutostopAt
// counted from this call).
func (c *Client) Update(ctx context.Context, id string, req UpdateRequest) (Sandbox, error) {
	var sb Sandbox
	err := c.call(ctx, http.MethodPatch, sandboxPath(id), req, &sb)
	return sb, err
}

// addLabelFilter adds the list filter label=key=value for every label, in key order.
func addLabelFilter(q url.Values, labels map[string]string) {
	for _, k := range slices.Sorted(maps.Keys(labels)) {
		q.Add("label", k+"="+labels[k])
	}
}
