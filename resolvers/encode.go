package resolvers

import (
	"context"
	"encoding/base64"
	"unicode/utf8"

	"github.com/99designs/gqlgen/graphql"

	"sandboxd/internal/gqlbytes"
)

// Bytes reach clients in two encodings, text (when valid UTF-8) and base64, in sibling fields
// (content/contentBase64, stdout/stdoutBase64, data/dataBase64). Each is a copy as large as the
// bytes (base64 a third more), so an answer builds only the encodings its selection asks for.

// fieldSet is the set of fields selected on the object a resolver returns; nil means every
// field (a caller without a selection to look at).
type fieldSet map[string]bool

func (s fieldSet) has(name string) bool { return s == nil || s[name] }

// selectedFields is the selection of the field being resolved, whose type is typeName: fields
// selected directly or through fragments, @skip and @include honoured.
func selectedFields(ctx context.Context, typeName string) fieldSet {
	if graphql.GetFieldContext(ctx) == nil {
		return nil
	}
	s := fieldSet{}
	for _, f := range graphql.CollectFieldsCtx(ctx, []string{typeName}) {
		s[f.Name] = true
	}
	return s
}

// selectedFieldsOf is the selection of one field of the payload being resolved: the fields
// selected on field (of type typeName) of the payload type payloadName, through every alias of
// field, fragments, @skip and @include honoured. No alias of field selected: an empty set.
func selectedFieldsOf(ctx context.Context, payloadName, field, typeName string) fieldSet {
	if graphql.GetFieldContext(ctx) == nil {
		return nil
	}
	oc := graphql.GetOperationContext(ctx)
	s := fieldSet{}
	for _, pf := range graphql.CollectFieldsCtx(ctx, []string{payloadName}) {
		if pf.Name != field {
			continue
		}
		for _, f := range graphql.CollectFields(oc, pf.Selections, []string{typeName}) {
			s[f.Name] = true
		}
	}
	return s
}

// textOf is b as text when the text field is selected and b is valid UTF-8, else nil.
func textOf(b []byte, sel fieldSet, field string) *string {
	if !sel.has(field) || !utf8.Valid(b) {
		return nil
	}
	s := string(b)
	return &s
}

// base64Of is b in base64 when the field is selected, else "".
func base64Of(b []byte, sel fieldSet, field string) string {
	if !sel.has(field) {
		return ""
	}
	return base64.StdEncoding.EncodeToString(b)
}

// optBase64 is b as base64 (encoded when the response is written) when the field is
// selected, else nil.
func optBase64(b []byte, sel fieldSet, field string) *gqlbytes.Base64 {
	if !sel.has(field) {
		return nil
	}
	v := gqlbytes.Base64(b) // encoded when the response is written (output bytes never change)
	return &v
}
