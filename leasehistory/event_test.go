package leasehistory

import (
	"testing"

	"github.com/flowfabric/ffreconcile/store"
)

// TestEventExecutionIDForms: toEvent reads a stored execution id in every
// form FlowFabric's Uuid::parse_str takes and prints FlowFabric's
// {fp:N}:<uuid> with the lower-case hyphenated form; a row whose id is not a
// UUID is refused (the stream skips it with a warning).
func TestEventExecutionIDForms(t *testing.T) {
	t.Parallel()
	const want = "{fp:3}:0b8e5a8e-7c1d-4d2a-9a54-7d1c7e0e0001"
	tests := []struct {
		in string
		ok bool
	}{
		{"0b8e5a8e-7c1d-4d2a-9a54-7d1c7e0e0001", true},
		{"0B8E5A8E-7C1D-4D2A-9A54-7D1C7E0E0001", true},
		{"0b8e5a8e7c1d4d2a9a547d1c7e0e0001", true},
		{"{0b8e5a8e-7c1d-4d2a-9a54-7d1c7e0e0001}", true},
		{"urn:uuid:0b8e5a8e-7c1d-4d2a-9a54-7d1c7e0e0001", true},
		{"{fp:3}:0b8e5a8e-7c1d-4d2a-9a54-7d1c7e0e0001", false},
		{"0b8e5a8e-7c1d-4d2a-9a54-7d1c7e0e000g", false},
		{"0b8e5a8e+7c1d-4d2a-9a54-7d1c7e0e0001", false},
		{"", false},
	}
	for _, tt := range tests {
		ev, err := toEvent(&store.LeaseEvent{EventID: 1, ExecutionID: tt.in, EventType: "expired", PartitionKey: 3})
		if tt.ok && (err != nil || ev.ExecutionID != want) {
			t.Errorf("toEvent(%q) = %q, %v; want %q", tt.in, ev.ExecutionID, err, want)
		}
		if !tt.ok && err == nil {
			t.Errorf("toEvent(%q) = %q; want an error", tt.in, ev.ExecutionID)
		}
	}
}

func TestToEvent(t *testing.T) {
	t.Parallel()
	ns, tag, lease := "prod", "i-7", "l-1"
	ev, err := toEvent(&store.LeaseEvent{
		EventID: 9, ExecutionID: "0B8E5A8E-7C1D-4D2A-9A54-7D1C7E0E0001", EventType: "reclaimed",
		OccurredAtMs: 1_700_000_000_123, PartitionKey: 17, Namespace: &ns, InstanceTag: &tag, LeaseID: &lease,
	})
	if err != nil {
		t.Fatal(err)
	}
	if ev.Type != EventReclaimed || ev.ExecutionID != "{fp:17}:0b8e5a8e-7c1d-4d2a-9a54-7d1c7e0e0001" ||
		ev.Partition != 17 || ev.EventID != 9 || ev.OccurredAt.UnixMilli() != 1_700_000_000_123 ||
		ev.Namespace != ns || ev.InstanceTag != tag || ev.LeaseID != lease || ev.Cursor.String() != "020000000000000009" {
		t.Errorf("toEvent = %+v", ev)
	}
	if _, err := toEvent(&store.LeaseEvent{ExecutionID: "0b8e5a8e-7c1d-4d2a-9a54-7d1c7e0e0001", EventType: "stolen"}); err == nil {
		t.Error("unknown event type accepted")
	}
	if _, err := toEvent(&store.LeaseEvent{ExecutionID: "nope", EventType: "acquired"}); err == nil {
		t.Error("non-UUID execution id accepted")
	}
}

func TestFilterPasses(t *testing.T) {
	t.Parallel()
	s := func(v string) *string { return &v }
	tests := []struct {
		name   string
		opts   Options
		row    store.LeaseEvent
		passes bool
	}{
		{"no filter, NULL columns", Options{}, store.LeaseEvent{PartitionKey: 4}, true},
		{"namespace match", Options{Namespace: "a"}, store.LeaseEvent{Namespace: s("a")}, true},
		{"namespace mismatch", Options{Namespace: "a"}, store.LeaseEvent{Namespace: s("b")}, false},
		{"namespace NULL never matches", Options{Namespace: "a"}, store.LeaseEvent{}, false},
		{"tag value match", Options{InstanceTag: "i-1"}, store.LeaseEvent{InstanceTag: s("i-1")}, true},
		{"tag NULL never matches", Options{InstanceTag: "i-1"}, store.LeaseEvent{Namespace: s("i-1")}, false},
		{"both must match", Options{Namespace: "a", InstanceTag: "i-1"}, store.LeaseEvent{Namespace: s("a"), InstanceTag: s("i-2")}, false},
		{"partition listed", Options{Partitions: []int{1, 255}}, store.LeaseEvent{PartitionKey: 255}, true},
		{"partition not listed", Options{Partitions: []int{1, 255}}, store.LeaseEvent{PartitionKey: 2}, false},
		{"partition out of range in row", Options{Partitions: []int{1}}, store.LeaseEvent{PartitionKey: 300}, false},
	}
	for _, tt := range tests {
		f, err := newFilter(tt.opts)
		if err != nil {
			t.Fatal(err)
		}
		if got := f.passes(&tt.row); got != tt.passes {
			t.Errorf("%s: passes = %v; want %v", tt.name, got, tt.passes)
		}
	}
	for _, p := range []int{-1, 256} {
		if _, err := newFilter(Options{Partitions: []int{p}}); err == nil {
			t.Errorf("partition %d accepted", p)
		}
	}
}
