package fleet

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/flowfabric/ffreconcile/store"
)

// TestShapeDiff: every setting that shapes a River schema's jobs tells two
// configurations apart, in words naming the setting and both values, and
// none of a process's own resources does. A regression lets two fleets
// that starve each other share a schema, or refuses a process that only
// sized its pools differently.
func TestShapeDiff(t *testing.T) {
	t.Parallel()
	base := Config{Reconcilers: map[string]time.Duration{"lease_expiry": time.Second, "delayed_promotion": time.Second}}
	tests := []struct {
		name   string
		change func(c *Config)
		want   string
	}{
		{name: "Same", change: func(*Config) {}, want: ""},
		{name: "OwnResources", change: func(c *Config) {
			c.RowWorkers, c.WorkConns, c.RowBatch, c.RowStatements = 7, 9, 3, 4
			c.SynchronousCommit, c.ClientID, c.DisableJobLogs = "off", "other", true
		}, want: ""},
		{name: "Reconcilers", change: func(c *Config) {
			c.Reconcilers = map[string]time.Duration{"lease_expiry": time.Second}
		}, want: "reconcilers delayed_promotion,lease_expiry here, lease_expiry there"},
		{name: "Interval", change: func(c *Config) {
			c.Reconcilers = map[string]time.Duration{"lease_expiry": 2 * time.Second, "delayed_promotion": time.Second}
		}, want: "lease_expiry interval 1s here, 2s there"},
		{name: "Namespace", change: func(c *Config) { c.Filter.Namespace = "acme" }, want: "namespace none here, acme there"},
		{name: "InstanceTag", change: func(c *Config) { c.Filter.TagKey, c.Filter.TagValue = "k", "v" },
			want: "instance tag none here, k=v there"},
		{name: "BatchSize", change: func(c *Config) { c.BatchSize = 10 }, want: "batch size 1000 here, 10 there"},
		{name: "PartitionCount", change: func(c *Config) { c.PartitionCount = 16 }, want: "partition count 256 here, 16 there"},
		{name: "BudgetPartitionCount", change: func(c *Config) { c.BudgetPartitionCount = 8 },
			want: "budget partition count 32 here, 8 there"},
		{name: "Lookahead", change: func(c *Config) { c.Lookahead = -1 }, want: "lookahead 500ms here, -1ns there"},
		{name: "Several", change: func(c *Config) { c.BatchSize, c.Filter.Namespace = 10, "acme" },
			want: "namespace none here, acme there; batch size 1000 here, 10 there"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			other := base
			tt.change(&other)
			// Through JSON, as the other process's row stores it.
			var theirs shape
			if err := json.Unmarshal(other.WithDefaults().shapeJSON(), &theirs); err != nil {
				t.Fatal(err)
			}
			if got := base.WithDefaults().shape().diff(theirs); got != tt.want {
				t.Errorf("diff = %q\nwant   %q", got, tt.want)
			}
		})
	}
}

// TestAcceptLive: a live process configured otherwise refuses the start
// with a ConfigMismatchError naming it; one that records no configuration
// (an earlier version, during a rolling upgrade) is accepted.
func TestAcceptLive(t *testing.T) {
	t.Parallel()
	cfg := Config{RiverSchema: "river"}.WithDefaults()
	other := cfg
	other.BatchSize = 10
	same := store.WorkerHeartbeat{ClientID: "same", Config: cfg.shapeJSON()}
	old := store.WorkerHeartbeat{ClientID: "old"}
	differs := store.WorkerHeartbeat{ClientID: "differs", Hostname: "h", PID: 7, Config: other.shapeJSON()}

	if err := cfg.acceptLive([]store.WorkerHeartbeat{same, old}); err != nil {
		t.Fatalf("same and unrecorded configurations: %v", err)
	}
	err := cfg.acceptLive([]store.WorkerHeartbeat{same, old, differs})
	mismatch, ok := err.(*ConfigMismatchError)
	if !ok || mismatch.Other.ClientID != "differs" || mismatch.Diff != "batch size 1000 here, 10 there" {
		t.Fatalf("err = %v; want a mismatch with process differs on batch size", err)
	}
	if err := cfg.acceptLive([]store.WorkerHeartbeat{{ClientID: "bad", Config: []byte(`"not an object"`)}}); err == nil {
		t.Fatal("an unreadable configuration was accepted")
	}
}
