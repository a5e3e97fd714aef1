package bench

import (
	"context"
	"strings"
	"testing"

	"github.com/flowfabric/ffreconcile/internal/dbconn"
	"github.com/flowfabric/ffreconcile/internal/testdb"
	"github.com/flowfabric/ffreconcile/jobs"
	"github.com/flowfabric/ffreconcile/workers"
)

// TestWarm: warm leaves n distinct connections with the cache entry of every
// index of every partition of the reconciler's tables, which a fresh
// connection does not have; an unknown reconciler is an error naming it.
func TestWarm(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testdb.New(t)
	pool, err := dbconn.Open(ctx, db.URL, dbconn.Options{MaxConns: 4, AppName: "ffreconcile-bench-test"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)

	// Index cache entries ("index info" contexts, named for their index) a
	// connection holds for the partitions of ff_exec_core.
	const cachedIndexes = `
		SELECT count(*) FROM pg_backend_memory_contexts c
		  JOIN pg_class i ON i.relname = c.ident
		  JOIN pg_index x ON x.indexrelid = i.oid
		  JOIN pg_inherits h ON h.inhrelid = x.indrelid
		 WHERE c.name = 'index info' AND h.inhparent = 'ff_exec_core'::regclass`
	var want int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_index x JOIN pg_inherits h ON h.inhrelid = x.indrelid
		WHERE h.inhparent = 'ff_exec_core'::regclass`).Scan(&want); err != nil {
		t.Fatal(err)
	}
	if want < jobs.PartitionCount {
		t.Fatalf("ff_exec_core's partitions have %d indexes in all, want at least one each", want)
	}

	if err := warm(ctx, pool, 3, workers.DelayedPromotion.Name); err != nil {
		t.Fatalf("warm: %v", err)
	}
	// Held at once: four distinct connections, the three warmed first.
	pids := map[uint32]bool{}
	var got []int
	for range 4 {
		c, err := pool.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Release()
		pids[c.Conn().PgConn().PID()] = true
		var n int
		if err := c.QueryRow(ctx, cachedIndexes).Scan(&n); err != nil {
			t.Fatal(err)
		}
		got = append(got, n)
	}
	if len(pids) != 4 {
		t.Fatalf("%d distinct backends, want 4", len(pids))
	}
	warmed := 0
	for _, n := range got {
		switch n {
		case want:
			warmed++
		case 0:
		default:
			t.Errorf("a connection caches %d of the %d indexes", n, want)
		}
	}
	if warmed != 3 {
		t.Errorf("cached indexes per connection %v: want %d on exactly 3 connections, 0 on the fresh one", got, want)
	}

	err = warm(ctx, pool, 1, "no_such_reconciler")
	if err == nil || !strings.Contains(err.Error(), `"no_such_reconciler"`) {
		t.Errorf("warm with an unknown reconciler: %v, want an error naming it", err)
	}
}
