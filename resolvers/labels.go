package resolvers

import (
	"sandboxd/graph/model"
	"sandboxd/internal/apierror"
	"sandboxd/internal/sandbox"
)

// Labels: the conversions of createSandbox's and updateSandbox's labels, sandboxes' label
// filter and Sandbox.labels. Their syntax and bounds are the service's (internal/sandbox).

// labelMap turns a list of labels into the service's map; a key given twice is an error
// rather than a silent overwrite.
func labelMap(field string, in []*model.LabelInput) (map[string]string, error) {
	if in == nil {
		return nil, nil
	}
	out := make(map[string]string, len(in))
	for _, l := range in {
		if _, dup := out[l.Key]; dup {
			return nil, invalidArg(field, "label %q is given twice", apierror.Truncate(l.Key, 64))
		}
		out[l.Key] = l.Value
	}
	return out, nil
}

// labelSelector is sandboxes' label filter (nil for none), checked by the service's rules.
func labelSelector(l sandbox.Limits, in []*model.LabelInput) (map[string]string, error) {
	if len(in) == 0 {
		return nil, nil
	}
	terms := make([]sandbox.Label, 0, len(in))
	for _, t := range in {
		terms = append(terms, sandbox.Label{Key: t.Key, Value: t.Value})
	}
	return l.Selector(terms)
}

// updateRequest converts updateSandbox's input: labels as a merge patch (a null value removes
// the label), each key at most once.
func updateRequest(in model.UpdateSandboxInput) (sandbox.UpdateRequest, error) {
	req := sandbox.UpdateRequest{AutostopSec: int64Ptr(in.AutostopSec), TTLSec: int64Ptr(in.TTLSec),
		ClearLabels: in.ClearLabels != nil && *in.ClearLabels}
	if in.Labels != nil {
		req.Labels = make(map[string]*string, len(in.Labels))
		for _, l := range in.Labels {
			if _, dup := req.Labels[l.Key]; dup {
				return sandbox.UpdateRequest{}, invalidArg("input.labels", "label %q is given twice", apierror.Truncate(l.Key, 64))
			}
			req.Labels[l.Key] = l.Value
		}
	}
	return req, nil
}

// toLabels is Sandbox.labels: sorted by key, never null.
func toLabels(labels map[string]string) []*model.Label {
	out := make([]*model.Label, 0, len(labels))
	for _, l := range sandbox.SortedLabels(labels) {
		out = append(out, &model.Label{Key: l.Key, Value: l.Value})
	}
	return out
}
