package workers

import "testing"

func TestQueuedAheadForgetsStartedJobs(t *testing.T) {
	t.Parallel()
	var q queuedAhead
	q.add("lease_expiry", 3, "a/0", 1_000)
	q.add("lease_expiry", 3, "b/0", 2_000)
	q.add("lease_expiry", 4, "c/0", 2_000)
	q.add("suspension_timeout", 3, "a", 2_000)
	tests := []struct {
		name       string
		reconciler string
		partition  int16
		nowMs      int64
		want       []string
	}{
		{"BothPending", "lease_expiry", 3, 999, []string{"a/0", "b/0"}},
		{"StartedForgotten", "lease_expiry", 3, 1_000, []string{"b/0"}},
		{"StaysForgotten", "lease_expiry", 3, 999, []string{"b/0"}},
		{"OtherPartition", "lease_expiry", 4, 1_500, []string{"c/0"}},
		{"OtherReconciler", "suspension_timeout", 3, 1_500, []string{"a"}},
		{"Unknown", "delayed_promotion", 3, 0, nil},
		{"AllStarted", "lease_expiry", 3, 2_000, nil},
	}
	for _, tt := range tests { // in order: pending forgets
		got := q.pending(tt.reconciler, tt.partition, tt.nowMs)
		if len(got) != len(tt.want) {
			t.Fatalf("%s: pending = %v; want %v", tt.name, got, tt.want)
		}
		for _, k := range tt.want {
			if _, ok := got[k]; !ok {
				t.Fatalf("%s: pending = %v; want %v", tt.name, got, tt.want)
			}
		}
	}
}
