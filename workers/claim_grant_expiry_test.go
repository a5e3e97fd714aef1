package workers_test

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivertest"

	"github.com/flowfabric/ffreconcile/internal/fftest"
	"github.com/flowfabric/ffreconcile/internal/testdb"
	"github.com/flowfabric/ffreconcile/internal/testlog"
	"github.com/flowfabric/ffreconcile/jobs"
	"github.com/flowfabric/ffreconcile/store"
	"github.com/flowfabric/ffreconcile/workers"
)

// TestClaimGrantExpireWorker works claim grant expiry's row job one at a
// time with rivertest (River's test worker: the job inserted and worked in
// a transaction, with River's completer, no fleet and no poll), each case
// on a database of its own built by setup, as River's own tests do. Every
// case works its job twice: the second finds nothing left to do and
// completes, changing nothing (the row action is safe to run twice). A
// regression shows as a grant left behind, a claimed execution reset, a
// job failing on a grant whose execution is missing (instead of the
// warning), or another tenant's grant deleted (instead of the job
// cancelled).
func TestClaimGrantExpireWorker(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	type testBundle struct {
		db     *testdb.DB
		logs   *testlog.Buffer
		worker *rivertest.Worker[jobs.ClaimGrantExpireArgs, pgx.Tx]
	}
	setup := func(t *testing.T, f store.Filter) *testBundle {
		t.Helper()
		b := &testBundle{db: testdb.New(t), logs: &testlog.Buffer{}}
		set, err := workers.New(workers.Config{Pool: b.db.Pool, Filter: f,
			Logger: slog.New(slog.NewTextHandler(b.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))})
		if err != nil {
			t.Fatal(err)
		}
		b.worker = rivertest.NewWorker(t, riverpgxv5.New(nil), &river.Config{Schema: testdb.RiverSchema},
			workers.RowWorker[jobs.ClaimGrantExpireArgs](set, workers.ClaimGrantExpiry))
		return b
	}
	// work works one job of args in a transaction of its own, rolled back
	// after (the action's own writes go through the worker's pool).
	work := func(t *testing.T, b *testBundle, args jobs.ClaimGrantExpireArgs) river.EventKind {
		t.Helper()
		tx, err := b.db.Pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx) //nolint:errcheck
		res, err := b.worker.Work(ctx, t, tx, args, nil)
		if err != nil {
			t.Fatalf("work %+v: %v", args, err)
		}
		return res.EventKind
	}
	expired := store.NowMs() - time.Second.Milliseconds()
	const p = 11

	t.Run("StrandedExecutionEligibleAgain", func(t *testing.T) {
		t.Parallel()
		b := setup(t, store.Filter{})
		exec := fftest.InsertExec(t, b.db.Pool, fftest.PendingClaim(p))
		grant := fftest.InsertGrant(t, b.db.Pool, fftest.Grant{Partition: p, ExecutionID: exec, ExpiresAtMs: expired})
		for range 2 {
			if kind := work(t, b, jobs.ClaimGrantExpireArgs{Partition: p, GrantID: grant}); kind != river.EventKindJobCompleted {
				t.Fatalf("job %s; want completed", kind)
			}
			ex := fftest.ReadExec(t, b.db.Pool, p, exec)
			if n := fftest.Grants(t, b.db.Pool, p, exec); n != 0 || ex.EligibilityState != "eligible_now" ||
				ex.PublicState != "waiting" || ex.BlockingReason == nil || *ex.BlockingReason != "waiting_for_worker" {
				t.Fatalf("%d grants left, execution %+v; want none, eligible_now, waiting for a worker", n, ex)
			}
		}
	})

	t.Run("ClaimedExecutionUntouched", func(t *testing.T) {
		t.Parallel()
		b := setup(t, store.Filter{})
		exec := fftest.InsertExec(t, b.db.Pool, fftest.Exec{Partition: p}) // active, leased: claimed
		grant := fftest.InsertGrant(t, b.db.Pool, fftest.Grant{Partition: p, ExecutionID: exec, ExpiresAtMs: expired})
		before := fftest.ReadExec(t, b.db.Pool, p, exec)
		for range 2 {
			if kind := work(t, b, jobs.ClaimGrantExpireArgs{Partition: p, GrantID: grant}); kind != river.EventKindJobCompleted {
				t.Fatalf("job %s; want completed", kind)
			}
		}
		if n, after := fftest.Grants(t, b.db.Pool, p, exec), fftest.ReadExec(t, b.db.Pool, p, exec); n != 0 ||
			after.EligibilityState != before.EligibilityState || after.PublicState != before.PublicState {
			t.Fatalf("%d grants left, execution %+v; want none, the execution as it was (%+v)", n, after, before)
		}
	})

	t.Run("MissingExecutionWarned", func(t *testing.T) {
		t.Parallel()
		b := setup(t, store.Filter{})
		exec := fftest.NewUUID()
		grant := fftest.InsertGrant(t, b.db.Pool, fftest.Grant{Partition: p, ExecutionID: exec, ExpiresAtMs: expired})
		if kind := work(t, b, jobs.ClaimGrantExpireArgs{Partition: p, GrantID: grant}); kind != river.EventKindJobCompleted {
			t.Fatalf("job %s; want completed", kind)
		}
		if n := fftest.Grants(t, b.db.Pool, p, exec); n != 0 {
			t.Fatalf("%d grants left; want the grant deleted", n)
		}
		if logs := b.logs.String(); !strings.Contains(logs, "level=WARN") || !strings.Contains(logs, exec) {
			t.Fatalf("logs name no missing execution %s:\n%s", exec, logs)
		}
	})

	t.Run("OtherTenantLeftAlone", func(t *testing.T) {
		t.Parallel()
		b := setup(t, store.Filter{Namespace: "acme"})
		e := fftest.PendingClaim(p)
		e.Namespace = "beta"
		exec := fftest.InsertExec(t, b.db.Pool, e)
		grant := fftest.InsertGrant(t, b.db.Pool, fftest.Grant{Partition: p, ExecutionID: exec, ExpiresAtMs: expired})
		if kind := work(t, b, jobs.ClaimGrantExpireArgs{Partition: p, GrantID: grant}); kind != river.EventKindJobCancelled {
			t.Fatalf("job %s; want cancelled for the tenant filter", kind)
		}
		if n, ex := fftest.Grants(t, b.db.Pool, p, exec), fftest.ReadExec(t, b.db.Pool, p, exec); n != 1 || ex.EligibilityState != "pending_claim" {
			t.Fatalf("%d grants, execution %+v; want the grant and the execution as they were", n, ex)
		}
	})
}
