package auth

import (
	"testing"

	"sandboxd/internal/apierror"
)

func TestAuthenticate(t *testing.T) {
	a, err := New([]Key{
		{Name: "user", SHA256: HashKey("user-key-1"), Tenant: "t1", Project: "p1"},
		{Name: "platform", SHA256: HashKey("platform-key"), Tenant: "plat", Project: "ops", Platform: true},
	})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name, key, tenant, project string
		want                       Principal
		code                       apierror.Code
	}{
		{name: "missing-key", code: apierror.Unauthenticated},
		{name: "unknown-key", key: "nope", code: apierror.Unauthenticated},
		{name: "user", key: "user-key-1", want: Principal{Key: "user", Tenant: "t1", Project: "p1"}},
		{name: "user-with-scope-headers", key: "user-key-1", tenant: "t2", project: "p2", code: apierror.PermissionDenied},
		{name: "user-with-one-header", key: "user-key-1", tenant: "t1", code: apierror.PermissionDenied},
		{name: "platform-own", key: "platform-key", want: Principal{Key: "platform", Tenant: "plat", Project: "ops", Platform: true}},
		{name: "platform-acting", key: "platform-key", tenant: "t9", project: "p9", want: Principal{Key: "platform", Tenant: "t9", Project: "p9", Platform: true}},
		{name: "platform-one-header", key: "platform-key", project: "p9", code: apierror.InvalidArgument},
		{name: "platform-bad-id", key: "platform-key", tenant: "t/../x", project: "p", code: apierror.InvalidArgument},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := a.Authenticate(tt.key, tt.tenant, tt.project)
			if tt.code != "" {
				if apierror.CodeOf(err) != tt.code {
					t.Fatalf("got %v, want code %s", err, tt.code)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("got %+v, %v, want %+v", got, err, tt.want)
			}
		})
	}
}

func TestNewRejectsBadKeys(t *testing.T) {
	bad := [][]Key{
		{{Name: "short", SHA256: "abc", Tenant: "t", Project: "p"}},
		{{Name: "no-tenant", SHA256: HashKey("k"), Project: "p"}},
		{{Name: "a", SHA256: HashKey("k"), Tenant: "t", Project: "p"}, {Name: "b", SHA256: HashKey("k"), Tenant: "t", Project: "q"}},
	}
	for i, keys := range bad {
		if _, err := New(keys); err == nil {
			t.Errorf("case %d: got nil error, want a refusal", i)
		}
	}
}
