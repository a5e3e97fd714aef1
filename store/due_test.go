package store_test

import (
	"context"
	"testing"

	"github.com/flowfabric/ffreconcile/internal/fftest"
	"github.com/flowfabric/ffreconcile/internal/testdb"
	"github.com/flowfabric/ffreconcile/store"
)

func TestCountDueAndTopPartitions(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testdb.New(t)
	const now = int64(5_000_000)
	// Partition 3: three due (two of tenant a); partition 8: one due of
	// tenant a; one not due; one orphan attempt (no execution row).
	for i, ns := range []string{"a", "a", "b"} {
		id := fftest.InsertExec(t, db.Pool, fftest.Exec{Partition: 3, Namespace: ns})
		fftest.InsertAttempt(t, db.Pool, 3, id, 0, fftest.Ms(now-int64(10+i)))
	}
	id := fftest.InsertExec(t, db.Pool, fftest.Exec{Partition: 8, Namespace: "a"})
	fftest.InsertAttempt(t, db.Pool, 8, id, 0, fftest.Ms(now-1))
	id = fftest.InsertExec(t, db.Pool, fftest.Exec{Partition: 8, Namespace: "a"})
	fftest.InsertAttempt(t, db.Pool, 8, id, 0, fftest.Ms(now+1))
	fftest.InsertAttempt(t, db.Pool, 9, fftest.NewUUID(), 0, fftest.Ms(now-1))

	tests := []struct {
		name    string
		filter  store.Filter
		cap     int
		want    store.DueCount
		wantTop []store.PartitionDue
	}{
		{"All", store.Filter{}, 100, store.DueCount{Due: 5}, []store.PartitionDue{{3, 3}, {8, 1}}},
		{"Capped", store.Filter{}, 2, store.DueCount{Due: 2, Capped: true}, nil},
		{"Tenant", store.Filter{Namespace: "a"}, 100, store.DueCount{Due: 3, OutsideFilter: 2}, []store.PartitionDue{{3, 2}, {8, 1}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := store.CountDue(ctx, db.Pool, "lease_expiry", now, tt.filter, tt.cap)
			if err != nil || got != tt.want {
				t.Fatalf("CountDue = %+v, %v; want %+v", got, err, tt.want)
			}
			if tt.wantTop == nil {
				return
			}
			top, err := store.TopDuePartitions(ctx, db.Pool, "lease_expiry", now, tt.filter, 2, 1000)
			if err != nil {
				t.Fatal(err)
			}
			if len(top) != len(tt.wantTop) || (len(top) > 0 && top[0] != tt.wantTop[0]) {
				t.Fatalf("TopDuePartitions = %+v; want %+v", top, tt.wantTop)
			}
		})
	}
	for _, r := range []string{"suspension_timeout", "delayed_promotion", "cancel_dispatch", "cancel_reconcile"} {
		if _, err := store.CountDue(ctx, db.Pool, r, now, store.Filter{Namespace: "a"}, 10); err != nil {
			t.Errorf("CountDue(%s): %v", r, err)
		}
	}
	if _, err := store.CountDue(ctx, db.Pool, "nope", now, store.Filter{}, 10); err == nil {
		t.Error("CountDue of an unknown reconciler: want error")
	}
}
