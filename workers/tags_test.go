package workers_test

import (
	"strings"
	"testing"

	"github.com/flowfabric/ffreconcile/store"
	"github.com/flowfabric/ffreconcile/workers"
)

// TestTenantTag: a filtered fleet's tag names its tenant with only the
// characters River accepts in a tag, at most 255 of them, ending in a
// word character; no filter, no tag. A regression writes a tag River's own
// clients would refuse, or none for a filtered fleet.
func TestTenantTag(t *testing.T) {
	tests := []struct {
		name string
		f    store.Filter
		want string
	}{
		{"None", store.Filter{}, ""},
		{"Namespace", store.Filter{Namespace: "acme"}, "tenant-acme"},
		{"NamespaceAndTag", store.Filter{Namespace: "acme", TagKey: "cairn.instance_id", TagValue: "i-7"}, "tenant-acme-i-7"},
		{"TagOnly", store.Filter{TagKey: "k", TagValue: "v"}, "tenant-v"},
		{"Unsafe", store.Filter{Namespace: "a.b/c d:e"}, "tenant-a_b_c_d_e"},
		{"TrailingDash", store.Filter{Namespace: "acme-"}, "tenant-acme_"},
		{"Long", store.Filter{Namespace: strings.Repeat("n", 400)}, "tenant-" + strings.Repeat("n", 248)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := workers.TenantTag(tt.f); got != tt.want {
				t.Errorf("TenantTag(%+v) = %q; want %q", tt.f, got, tt.want)
			}
		})
	}
}
