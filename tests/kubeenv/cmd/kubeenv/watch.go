package main

import (
	"context"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"
)

// getWatcher is the part of a typed client (Nodes(), ServiceAccounts(ns), …) watchFor uses.
type getWatcher[T any] interface {
	Get(ctx context.Context, name string, opts metav1.GetOptions) (T, error)
	Watch(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error)
}

// watchFor gets the named object and watches it until cond holds. It returns false (and
// the error, if any) when the watch ends first; the caller starts over.
func watchFor[T any](ctx context.Context, c getWatcher[T], name string, cond func(T) bool) (bool, error) {
	rv := ""
	obj, err := c.Get(ctx, name, metav1.GetOptions{})
	switch {
	case err == nil:
		if cond(obj) {
			return true, nil
		}
		if m, err := meta.Accessor(obj); err == nil {
			rv = m.GetResourceVersion()
		}
	case !apierrors.IsNotFound(err):
		return false, err
	}
	w, err := c.Watch(ctx, metav1.ListOptions{
		FieldSelector:   fields.OneTermEqualSelector("metadata.name", name).String(),
		ResourceVersion: rv,
	})
	if err != nil {
		return false, err
	}
	defer w.Stop()
	for ev := range w.ResultChan() {
		if o, ok := ev.Object.(T); ok && ev.Type != watch.Deleted && cond(o) {
			return true, nil
		}
	}
	return false, nil
}
