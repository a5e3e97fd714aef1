package workers_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/flowfabric/ffreconcile/internal/testdb"
	"github.com/flowfabric/ffreconcile/store"
	"github.com/flowfabric/ffreconcile/workers"
)

// TestPlanTicksCachesEveryTickStatement: on a connection with the tick pool's
// force_generic_plan, PlanTicks leaves one prepared statement per distinct
// tick query (each reconciler's probe and, unless its rows are due as soon
// as they exist, its count of busy partitions' due rows), each with its
// generic plan built; the ticks' own calls, with real windows, then run
// those same statements and prepare nothing new. A tick whose SQL text
// depended on its window would prepare, and plan, a statement per tick.
func TestPlanTicksCachesEveryTickStatement(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	all := workers.Running{}
	for _, r := range workers.All() {
		all[r.Name] = true
	}
	// Without a running set every reconciler takes all its rows; with every
	// reconciler running, lease expiry and attempt timeout take their
	// shares, whose statements the ticks then run.
	for _, running := range []workers.Running{nil, all} {
		t.Run(fmt.Sprintf("Running%d", len(running)), func(t *testing.T) {
			ctx := context.Background()
			set, err := workers.New(workers.Config{Pool: db.Pool, PartitionCount: 256, Running: running})
			if err != nil {
				t.Fatal(err)
			}
			conn, err := db.Pool.Acquire(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Release()
			// The same connection may serve both cases: start from none.
			if err := conn.Conn().DeallocateAll(ctx); err != nil {
				t.Fatal(err)
			}
			if _, err := conn.Exec(ctx, `SET plan_cache_mode = force_generic_plan`); err != nil {
				t.Fatal(err)
			}
			prepared := func() (n, generic int) {
				t.Helper()
				if err := conn.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE generic_plans > 0)
					FROM pg_prepared_statements WHERE statement LIKE 'SELECT s.p%'`).Scan(&n, &generic); err != nil {
					t.Fatal(err)
				}
				return n, generic
			}
			if err := set.PlanTicks(ctx, conn); err != nil {
				t.Fatal(err)
			}
			dues := map[*store.Due]bool{}
			want := 0
			for _, r := range workers.All() {
				if !r.HasDue() {
					continue
				}
				due := r.DueIn(running)
				if !dues[due] {
					dues[due] = true
					want += 2
					if due.Always {
						want--
					}
				}
			}
			if n, generic := prepared(); n != want || generic != want {
				t.Fatalf("after PlanTicks: %d tick statements prepared, %d with a generic plan; want %d and %d", n, generic, want, want)
			}

			now := store.NowMs()
			for due := range dues {
				if _, err := due.Partitions(ctx, conn, now-1000, now+500, 256, store.Filter{}); err != nil {
					t.Fatal(err)
				}
				if _, err := due.Partitions(ctx, conn, store.NoLowerBound, now, 256, store.Filter{}); err != nil {
					t.Fatal(err)
				}
				if !due.Always {
					if _, err := due.Counts(ctx, conn, now, []int16{1, 2, 3}, store.Filter{}); err != nil {
						t.Fatal(err)
					}
				}
			}
			if n, _ := prepared(); n != want {
				t.Fatalf("the ticks' own queries prepared %d more statements", n-want)
			}
		})
	}
}
