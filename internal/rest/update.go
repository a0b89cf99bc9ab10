package rest

import (
	"encoding/json"
	"net/http"

	"sandboxd/internal/sandbox"
)

// PATCH /sandbox/sandboxes/v1/{id}: a JSON merge patch (RFC 7396) of the sandbox's labels,
// autostop_sec and ttl_sec. "labels": {"k": "v"} sets k, {"k": null} removes it, labels not
// named are kept, and "labels": null removes them all; a field left out (or null, for
// autostop_sec and ttl_sec) is left as it is. Unknown fields are refused, as everywhere.

type updateBody struct {
	Labels      labelPatch `json:"labels"`
	AutostopSec *int64     `json:"autostop_sec"`
	TTLSec      *int64     `json:"ttl_sec"`
}

// labelPatch is the "labels" member of a PATCH body: absent, null (remove every label) or an
// object whose null values remove their label.
type labelPatch struct {
	present, null bool
	set           map[string]*string
}

// UnmarshalJSON implements json.Unmarshaler; the decoder calls it for null too, and once per
// member named labels (in any case): the last one counts, as for every other field.
func (p *labelPatch) UnmarshalJSON(b []byte) error {
	*p = labelPatch{present: true}
	if string(b) == "null" {
		p.null = true
		return nil
	}
	return json.Unmarshal(b, &p.set)
}

func (b updateBody) request() sandbox.UpdateRequest {
	req := sandbox.UpdateRequest{AutostopSec: b.AutostopSec, TTLSec: b.TTLSec, Labels: b.Labels.set}
	if b.Labels.present && req.Labels == nil {
		req.Labels = map[string]*string{}
	}
	req.ClearLabels = b.Labels.null
	return req
}

func (h *Handler) update(w http.ResponseWriter, r *http.Request) {
	var b updateBody
	if !h.decode(w, r, &b) {
		return
	}
	sb, err := h.svc.Update(r.Context(), principal(r), r.PathValue("id"), b.request())
	h.answerSandbox(w, r, sb, err)
}

// labelSelector is the list filter of the repeated query parameter label=key=value.
func labelSelector(l sandbox.Limits, terms []string) (map[string]string, error) {
	if len(terms) > l.MaxLabels {
		// Bounded before the terms are parsed.
		return l.Selector(make([]sandbox.Label, len(terms)))
	}
	labels := make([]sandbox.Label, 0, len(terms))
	for _, t := range terms {
		lb, err := sandbox.ParseLabelTerm(t)
		if err != nil {
			return nil, err
		}
		labels = append(labels, lb)
	}
	return l.Selector(labels)
}
