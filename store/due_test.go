package store_test

import (
	"context"
	"maps"
	"slices"
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

// TestDuePartitionsHorizon checks the horizon ticks pass (now plus the
// lookahead): a partition whose earliest row falls due before it is found,
// one whose rows all fall due after it is not, and partitions come out in
// partition order, the order their scans are enqueued in. A lower bound (the
// tick's probe for rows not yet due) leaves out partitions holding only
// older rows.
func TestDuePartitionsHorizon(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testdb.New(t)
	const now = int64(7_000_000)
	// Partitions 40, 7 (two rows), 3 and 12 hold rows already due; 20 only
	// a row due at now+200 (inside a 500 ms lookahead); 30 only one due at
	// now+900 (outside it).
	rows := []struct {
		p  int16
		at int64
	}{{7, now - 50}, {12, now - 100}, {3, now - 100}, {7, now - 200}, {40, now - 300}, {20, now + 200}, {30, now + 900}}
	for _, r := range rows {
		e := fftest.Delayed(r.p, r.at)
		e.Namespace = "a"
		id := fftest.InsertExec(t, db.Pool, e)
		fftest.InsertAttempt(t, db.Pool, r.p, id, 0, fftest.Ms(r.at))
		fftest.InsertSuspension(t, db.Pool, fftest.Suspension{Partition: r.p, ExecutionID: id, TimeoutAtMs: fftest.Ms(r.at)})
	}
	due := map[string]func(context.Context, store.DB, int64, int64, int, store.Filter) ([]int16, error){
		"lease":      store.DueLeasePartitions,
		"suspension": store.DueSuspensionPartitions,
		"promotion":  store.DuePromotionPartitions,
	}
	tests := []struct {
		name          string
		from, horizon int64
		filter        store.Filter
		want          []int16
	}{
		{"Now", store.NoLowerBound, now, store.Filter{}, []int16{3, 7, 12, 40}},
		{"Lookahead", store.NoLowerBound, now + 500, store.Filter{}, []int16{3, 7, 12, 20, 40}},
		// From is inclusive: 7's row at now-50 is in; 3, 12 and 40 hold
		// only rows older than from.
		{"From", now - 50, now + 500, store.Filter{}, []int16{7, 20}},
		{"NotYetDue", now, now + 1000, store.Filter{}, []int16{20, 30}},
		{"Filtered", store.NoLowerBound, now + 500, store.Filter{Namespace: "a"}, []int16{3, 7, 12, 20, 40}},
		{"NothingOutsideFilter", store.NoLowerBound, now + 500, store.Filter{Namespace: "other"}, []int16{}},
	}
	for name, fn := range due {
		for _, tt := range tests {
			t.Run(name+"/"+tt.name, func(t *testing.T) {
				got, err := fn(ctx, db.Pool, tt.from, tt.horizon, 256, tt.filter)
				if err != nil {
					t.Fatal(err)
				}
				if len(got) != len(tt.want) || (len(got) > 0 && !slices.Equal(got, tt.want)) {
					t.Fatalf("due partitions = %v; want %v", got, tt.want)
				}
			})
		}
	}
	// The counts a tick takes of its busy partitions: rows due at now, per
	// partition asked for (0 for none), with the filter applied.
	counts := map[string]store.DueCountsQuery{
		"lease":      store.CountDueLeases,
		"suspension": store.CountDueSuspensions,
		"promotion":  store.CountDuePromotions,
	}
	parts := []int16{3, 7, 12, 20, 40, 99}
	for name, fn := range counts {
		for _, tt := range []struct {
			name   string
			filter store.Filter
			want   map[int16]int
		}{
			{"All", store.Filter{}, map[int16]int{3: 1, 7: 2, 12: 1, 20: 0, 40: 1, 99: 0}},
			{"NothingOutsideFilter", store.Filter{Namespace: "other"}, map[int16]int{3: 0, 7: 0, 12: 0, 20: 0, 40: 0, 99: 0}},
		} {
			t.Run(name+"/Count"+tt.name, func(t *testing.T) {
				got, err := fn(ctx, db.Pool, now, parts, tt.filter)
				if err != nil {
					t.Fatal(err)
				}
				if !maps.Equal(got, tt.want) {
					t.Fatalf("due counts = %v; want %v", got, tt.want)
				}
			})
		}
	}
}
