package store_test

import (
	"context"
	"testing"

	"github.com/flowfabric/ffreconcile/internal/fftest"
	"github.com/flowfabric/ffreconcile/internal/testdb"
	"github.com/flowfabric/ffreconcile/store"
)

// TestDeleteExpiredBudgetDedupKeys: expired keys are deleted, one at
// exactly now and one renewed are kept, a second run changes nothing, and
// a batch answers in input order. A regression shows as a live key
// deleted (a retried report_usage then counts twice).
func TestDeleteExpiredBudgetDedupKeys(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.New(t).Pool
	const now, p = int64(4_000_000), int16(8)
	fftest.InsertBudgetDedup(t, pool, p, "k-old", now-10)
	fftest.InsertBudgetDedup(t, pool, p, "k-now", now)
	fftest.InsertBudgetDedup(t, pool, p, "k-live", now+10)
	fftest.InsertBudgetDedup(t, pool, p, "k-old2", now-1)
	keys := []string{"k-old", "k-now", "k-live", "k-missing", "k-old2", "k-old"}
	res, err := store.DeleteExpiredBudgetDedupKeys(ctx, pool, p, keys, now)
	if err != nil {
		t.Fatal(err)
	}
	want := []store.BudgetDedupExpiryResult{{true, now - 10}, {}, {}, {}, {true, now - 1}, {}}
	for i := range want {
		if res[i] != want[i] {
			t.Errorf("result %d (%s) = %+v; want %+v", i, keys[i], res[i], want[i])
		}
	}
	if n := fftest.Count(t, pool, `SELECT count(*) FROM ff_budget_usage_dedup WHERE partition_key = $1`, p); n != 2 {
		t.Fatalf("%d keys left; want 2", n)
	}
}
