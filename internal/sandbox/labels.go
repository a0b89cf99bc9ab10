package sandbox

import (
	"maps"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"

	"sandboxd/internal/apierror"
)

// Labels are a caller's key/value tags on a sandbox, set at create and changed by Update, and
// the filter of List. They follow Kubernetes' label syntax, since the Kubernetes runtime puts
// them on the sandbox's PVC and pod: a key is an optional DNS subdomain prefix (at most 253
// bytes) and "/", then a name of at most 63 bytes of [A-Za-z0-9._-] that starts and ends
// alphanumeric; a value is at most 63 such bytes, or empty. Keys whose prefix is one of
// reservedLabelDomains (or a subdomain of one) belong to the service and Kubernetes: a caller
// can neither set nor select them.

// reservedLabelDomains are the label key prefixes callers may not use: the service's own (the
// Kubernetes runtime's labels are sandboxd.io/*) and Kubernetes' (kubernetes.io, k8s.io, and
// their subdomains such as app.kubernetes.io, which the runtime's managed-by label uses).
var reservedLabelDomains = []string{"sandboxd.io", "kubernetes.io", "k8s.io"}

// maxLabelsCap bounds limits.max_labels: a label is at most 317 bytes of key and 63 of value,
// and on Kubernetes a sandbox's labels are kept twice in its PVC's metadata (as labels, and
// in the record's annotation), whose annotations may hold 256 KiB in all.
const maxLabelsCap = 256

// Label is one label of a sandbox.
type Label struct {
	Key   string
	Value string
}

// SortedLabels returns labels as a list sorted by key.
func SortedLabels(labels map[string]string) []Label {
	out := make([]Label, 0, len(labels))
	for _, k := range slices.Sorted(maps.Keys(labels)) {
		out = append(out, Label{Key: k, Value: labels[k]})
	}
	return out
}

// CheckLabelKey checks one label key: the syntax, and not under a reserved prefix.
func CheckLabelKey(key string) error {
	if errs := validation.IsQualifiedName(key); len(errs) > 0 {
		return apierror.New(apierror.InvalidArgument, "invalid label key %q: %s", apierror.Truncate(key, 64), errs[0]).
			WithDetail("field", "labels")
	}
	if prefix, _, ok := strings.Cut(key, "/"); ok {
		prefix = strings.ToLower(prefix)
		for _, d := range reservedLabelDomains {
			if prefix == d || strings.HasSuffix(prefix, "."+d) {
				return apierror.New(apierror.InvalidArgument, "label key %q is reserved: prefixes %s and their subdomains belong to the service",
					apierror.Truncate(key, 64), strings.Join(reservedLabelDomains, ", ")).WithDetail("field", "labels")
			}
		}
	}
	return nil
}

// checkLabel checks one label: its key (CheckLabelKey) and its value.
func checkLabel(key, value string) error {
	if err := CheckLabelKey(key); err != nil {
		return err
	}
	if errs := validation.IsValidLabelValue(value); len(errs) > 0 {
		return apierror.New(apierror.InvalidArgument, "invalid value of label %q: %s", apierror.Truncate(key, 64), errs[0]).
			WithDetail("field", "labels")
	}
	return nil
}

// CheckLabels checks a sandbox's whole label set: at most MaxLabels labels, each valid.
func (l Limits) CheckLabels(labels map[string]string) error {
	if len(labels) > l.MaxLabels {
		return apierror.New(apierror.InvalidArgument, "at most %d labels per sandbox, got %d", l.MaxLabels, len(labels)).
			WithDetail("field", "labels")
	}
	for _, k := range slices.Sorted(maps.Keys(labels)) {
		if err := checkLabel(k, labels[k]); err != nil {
			return err
		}
	}
	return nil
}

// ParseLabelTerm parses one term of a label filter, "key=value" (an empty value selects the
// label with the empty value).
func ParseLabelTerm(term string) (Label, error) {
	k, v, ok := strings.Cut(term, "=")
	if !ok {
		return Label{}, apierror.New(apierror.InvalidArgument, "malformed label filter %q: want key=value", apierror.Truncate(term, 64)).
			WithDetail("field", "label")
	}
	return Label{Key: k, Value: v}, nil
}

// Selector is a label filter: the labels a sandbox must all have, with these values. A key
// selected twice must have the same value both times (else nothing could match: refused). At
// most MaxLabels terms; each key and value is checked like a label's.
func (l Limits) Selector(terms []Label) (map[string]string, error) {
	if len(terms) == 0 {
		return nil, nil
	}
	if len(terms) > l.MaxLabels {
		return nil, apierror.New(apierror.InvalidArgument, "at most %d label filters, got %d", l.MaxLabels, len(terms)).
			WithDetail("field", "label")
	}
	sel := make(map[string]string, len(terms))
	for _, t := range terms {
		if err := checkLabel(t.Key, t.Value); err != nil {
			return nil, err
		}
		if v, dup := sel[t.Key]; dup && v != t.Value {
			return nil, apierror.New(apierror.InvalidArgument, "label %q is filtered on twice with different values", t.Key).
				WithDetail("field", "label")
		}
		sel[t.Key] = t.Value
	}
	return sel, nil
}

// matchLabels reports whether labels has every label of sel with its value.
func matchLabels(labels, sel map[string]string) bool {
	for k, v := range sel {
		if have, ok := labels[k]; !ok || have != v {
			return false
		}
	}
	return true
}

// applyLabelPatch returns labels with patch applied as a JSON merge patch: a key with a value
// sets it, a key with nil removes it, the others are kept. labels is not changed.
func applyLabelPatch(labels map[string]string, patch map[string]*string) map[string]string {
	out := maps.Clone(labels)
	if out == nil {
		out = map[string]string{}
	}
	for k, v := range patch {
		if v == nil {
			delete(out, k)
		} else {
			out[k] = *v
		}
	}
	if len(out) == 0 {
		return nil
	}
	return out
}

// checkLabelPatch checks an Update's label patch: at most twice MaxLabels entries (as many
// removals as sets), every key valid and not reserved, every value set valid.
func (l Limits) checkLabelPatch(patch map[string]*string) error {
	if len(patch) > 2*l.MaxLabels {
		return apierror.New(apierror.InvalidArgument, "at most %d labels in one update, got %d", 2*l.MaxLabels, len(patch)).
			WithDetail("field", "labels")
	}
	for _, k := range slices.Sorted(maps.Keys(patch)) {
		var err error
		if v := patch[k]; v == nil {
			err = CheckLabelKey(k)
		} else {
			err = checkLabel(k, *v)
		}
		if err != nil {
			return err
		}
	}
	return nil
}
