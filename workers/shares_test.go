package workers_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/flowfabric/ffreconcile/internal/fftest"
	"github.com/flowfabric/ffreconcile/internal/fleet"
	"github.com/flowfabric/ffreconcile/internal/fleettest"
	"github.com/flowfabric/ffreconcile/internal/testdb"
	"github.com/flowfabric/ffreconcile/jobs"
	"github.com/flowfabric/ffreconcile/store"
	"github.com/flowfabric/ffreconcile/workers"
)

// TestOneRowJobPerExpiredLease: a fleet running lease expiry and attempt
// timeout gives every expired lease exactly one row job, of the reconciler
// the execution's retry policy names (attempt timeout for an active
// execution declaring retries, spent or not; lease expiry for every other),
// with that reconciler's whole action, for leases already expired when it
// starts and leases it sees coming (enqueued ahead by both before). A fleet
// running only one of them behaves as it always did: it takes every row it
// is due for. Counted in river_job by kind and execution. A regression
// shows as a row with a job of each kind (two jobs, one a no-op), a row
// acted on by the other reconciler than the rule gives it, a no-op, or a
// lease left behind.
func TestOneRowJobPerExpiredLease(t *testing.T) {
	t.Parallel()
	const (
		lease   = "lease_expiry"
		timeout = "attempt_timeout"
		none    = ""
	)
	// The rows: active with retries left, active without a retry policy,
	// active with its retries spent (it declares them: attempt timeout's,
	// which ends it), and a lease left on a terminal execution.
	type rowKind struct {
		name string
		exec fftest.Exec
		// want is the reconciler acting on the row, by fleet.
		want map[string]string
	}
	retries := func(n int) any { return map[string]any{"retry_policy": map[string]any{"max_retries": n}} }
	kinds := []rowKind{
		{"Retries", fftest.Exec{Policy: retries(2)}, map[string]string{"Both": timeout, "LeaseExpiryOnly": lease, "AttemptTimeoutOnly": timeout}},
		{"NoRetries", fftest.Exec{}, map[string]string{"Both": lease, "LeaseExpiryOnly": lease, "AttemptTimeoutOnly": timeout}},
		{"RetriesSpent", fftest.Exec{Policy: retries(1), AttemptIndex: 1}, map[string]string{"Both": timeout, "LeaseExpiryOnly": lease, "AttemptTimeoutOnly": timeout}},
		{"Terminal", fftest.Exec{LifecyclePhase: "terminal", OwnershipState: "unowned", Policy: retries(2)}, map[string]string{"Both": lease, "LeaseExpiryOnly": lease, "AttemptTimeoutOnly": none}},
	}
	tests := []struct {
		name string
		run  []*workers.Reconciler
	}{
		{"Both", []*workers.Reconciler{workers.LeaseExpiry, workers.AttemptTimeout}},
		{"LeaseExpiryOnly", []*workers.Reconciler{workers.LeaseExpiry}},
		{"AttemptTimeoutOnly", []*workers.Reconciler{workers.AttemptTimeout}},
	}
	kindOf := map[string]string{lease: jobs.KindLeaseRelease, timeout: jobs.KindAttemptExpire}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			db := testdb.New(t)
			parts := somePartitions(8)
			type seeded struct {
				id, kind string
				p        int16
				attempt  int32
				want     string
			}
			var rows []seeded
			now := store.NowMs()
			// Each kind of row, expired already and expiring in 2.5 s
			// (found ahead by the ticks, as a lease lapsing in production
			// is), three of each, over the partitions.
			i := 0
			for _, k := range kinds {
				for _, expires := range []int64{now - 1000, now + 2500} {
					for range 3 {
						p := parts[i%len(parts)]
						i++
						e := k.exec
						e.Partition = p
						id := fftest.InsertExec(t, db.Pool, e)
						fftest.InsertAttempt(t, db.Pool, p, id, e.AttemptIndex, fftest.Ms(expires))
						rows = append(rows, seeded{id: id, kind: k.name, p: p, attempt: e.AttemptIndex, want: k.want[tt.name]})
					}
				}
			}
			f := fleettest.Start(t, db, fleet.Config{Reconcilers: fleettest.Fast(tt.run...)})

			acted := 0
			for _, r := range rows {
				if r.want != none {
					acted++
				}
			}
			fleettest.WaitFor(t, 3*time.Minute, "every lease its reconciler's to release released, and its job completed", func() (bool, string) {
				released := fftest.Count(t, db.Pool, `SELECT count(*) FROM ff_attempt
					WHERE partition_key = ANY($1) AND lease_expires_at_ms IS NULL`, parts)
				unfinished := fftest.Count(t, db.Pool, `SELECT count(*) FROM river.river_job
					WHERE kind = ANY($1) AND state <> 'completed'`, []string{jobs.KindLeaseRelease, jobs.KindAttemptExpire})
				return released == acted && unfinished == 0, fleettest.Statusf("%d of %d released, %d row jobs unfinished", released, acted, unfinished)
			})

			// Row jobs by kind and execution.
			jobRows, err := db.Pool.Query(ctx, `SELECT kind, args->>'execution_id', count(*) FROM river.river_job
				WHERE kind = ANY($1) GROUP BY 1, 2`, []string{jobs.KindLeaseRelease, jobs.KindAttemptExpire})
			if err != nil {
				t.Fatal(err)
			}
			jobsOf := map[string]map[string]int64{} // execution → kind → jobs
			var (
				kind, id string
				n        int64
			)
			if _, err := pgx.ForEachRow(jobRows, []any{&kind, &id, &n}, func() error {
				if jobsOf[id] == nil {
					jobsOf[id] = map[string]int64{}
				}
				jobsOf[id][kind] = n
				return nil
			}); err != nil {
				t.Fatal(err)
			}
			total := int64(0)
			for _, r := range rows {
				got := jobsOf[r.id]
				for _, k := range []string{jobs.KindLeaseRelease, jobs.KindAttemptExpire} {
					want := int64(0)
					if r.want != none && kindOf[r.want] == k {
						want = 1
					}
					if got[k] != want {
						t.Errorf("%s row %s: %d %s jobs; want %d (jobs: %v)", r.kind, r.id, got[k], k, want, got)
					}
					total += got[k]
				}
				att := fftest.ReadAttempt(t, db.Pool, r.p, r.id, r.attempt)
				outcome := "NULL"
				if att.Outcome != nil {
					outcome = *att.Outcome
				}
				// Attempt timeout's outcome says whether it retried the
				// execution (interrupted) or ended it (expired).
				wantOutcome := map[string]string{lease: "lease_expired_reclaimable", timeout: "expired", none: "NULL"}[r.want]
				if r.want == timeout && r.kind == "Retries" {
					wantOutcome = "interrupted"
				}
				if outcome != wantOutcome {
					t.Errorf("%s row %s: attempt outcome %s; want %s (%s's action)", r.kind, r.id, outcome, wantOutcome, orNone(r.want))
				}
				if n := len(fftest.LeaseEvents(t, db.Pool, r.id)); r.want != none && n != 1 {
					t.Errorf("%s row %s: %d lease events; want 1", r.kind, r.id, n)
				}
			}
			if total != int64(acted) {
				t.Errorf("%d row jobs for %d rows acted on; want one each", total, acted)
			}
			for _, r := range tt.run {
				waitApplied(t, f.Workers.Stats().For(r.Name), 1)
				if s := f.Workers.Stats().For(r.Name).Snapshot(); s.NoOps != 0 {
					t.Errorf("%s: %d no-op row actions; want none (stats %+v)", r.Name, s.NoOps, s)
				}
			}
		})
	}
}

func orNone(s string) string {
	if s == "" {
		return "no reconciler"
	}
	return s
}

// TestCancelDispatchTakesOnlyGroupsItActsOn: pending cancel rows whose edge
// group's flag is clear are left to cancel_reconcile and get no
// ff.cancel_dispatch.dispatch job, while flag-set groups (their siblings
// cancelled) and orphans (their pending row deleted) do, one each. The
// flag-clear rows are the oldest of their partitions, so the scans that
// dispatched the others walked past them. A regression shows as a dispatch
// job (a no-op, flag_clear) for a flag-clear group, which the fleet, running
// no cancel_reconcile here, would offer again at every tick.
func TestCancelDispatchTakesOnlyGroupsItActsOn(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	parts := somePartitions(4)
	type group struct {
		p                int16
		flow, downstream string
		flag, orphan     bool
		sibling          string
	}
	var groups []group
	for i, p := range parts {
		// Oldest first: flag clear; then flag set (one sibling to cancel);
		// then an orphan.
		clear := group{p: p, flow: fftest.NewUUID(), downstream: fftest.InsertExec(t, db.Pool, fftest.Exec{Partition: p})}
		fftest.InsertEdgeGroup(t, db.Pool, fftest.EdgeGroup{Partition: p, FlowID: clear.flow, DownstreamEID: clear.downstream})
		fftest.InsertPendingCancel(t, db.Pool, p, clear.flow, clear.downstream, int64(10+i))

		set := group{p: p, flow: fftest.NewUUID(), downstream: fftest.InsertExec(t, db.Pool, fftest.Exec{Partition: p}), flag: true,
			sibling: fftest.InsertExec(t, db.Pool, fftest.Exec{Partition: p})}
		fftest.InsertEdgeGroup(t, db.Pool, fftest.EdgeGroup{Partition: p, FlowID: set.flow, DownstreamEID: set.downstream, Flag: true,
			Members: []string{set.sibling}})
		fftest.InsertPendingCancel(t, db.Pool, p, set.flow, set.downstream, int64(20+i))

		orphan := group{p: p, flow: fftest.NewUUID(), downstream: fftest.InsertExec(t, db.Pool, fftest.Exec{Partition: p}), orphan: true}
		fftest.InsertPendingCancel(t, db.Pool, p, orphan.flow, orphan.downstream, int64(30+i))
		groups = append(groups, clear, set, orphan)
	}
	f := fleettest.Start(t, db, fleet.Config{Reconcilers: fleettest.Fast(workers.CancelDispatch)})
	fleettest.WaitFor(t, fleettest.Patient, "flag-set groups dispatched and orphans deleted, their jobs completed", func() (bool, string) {
		left := fftest.Count(t, db.Pool, `SELECT count(*) FROM ff_pending_cancel_groups WHERE partition_key = ANY($1)`, parts)
		unfinished := fftest.Count(t, db.Pool, `SELECT count(*) FROM river.river_job WHERE kind = $1 AND state <> 'completed'`, jobs.KindCancelDispatch)
		return left == len(parts) && unfinished == 0, fleettest.Statusf("%d pending rows left (want %d), %d dispatch jobs unfinished", left, len(parts), unfinished)
	})
	// One more tick of every partition: still nothing for the flag-clear
	// groups.
	waitTicks(t, f, workers.CancelDispatch, 2)
	for _, g := range groups {
		n := fftest.Count(t, db.Pool, `SELECT count(*) FROM river.river_job WHERE kind = $1 AND args->>'flow_id' = $2`, jobs.KindCancelDispatch, g.flow)
		switch {
		case !g.flag && !g.orphan:
			if n != 0 {
				t.Errorf("flag-clear group %s: %d dispatch jobs; want none", g.flow, n)
			}
			if !fftest.PendingCancelExists(t, db.Pool, g.p, g.flow, g.downstream) {
				t.Errorf("flag-clear group %s: pending row deleted by the dispatcher", g.flow)
			}
		default:
			if n != 1 {
				t.Errorf("group %s (flag %v, orphan %v): %d dispatch jobs; want 1", g.flow, g.flag, g.orphan, n)
			}
		}
		if g.flag {
			if ex := fftest.ReadExec(t, db.Pool, g.p, g.sibling); ex.LifecyclePhase != "terminal" {
				t.Errorf("group %s: sibling %s is %s; want cancelled", g.flow, g.sibling, ex.LifecyclePhase)
			}
		}
	}
	s := f.Workers.Stats().For(workers.CancelDispatch.Name).Snapshot()
	if s.NoOps != 0 {
		t.Errorf("%d no-op dispatches; want none (stats %+v)", s.NoOps, s)
	}
}

// TestSharesArePaired: a reconciler that shares rows names one that exists
// and shares them back, and in a fleet running both each takes its share,
// while alone (or with the other stopped) it takes all its rows. A
// regression, a share on one side only, would leave the common rows due
// for both again (or, the wrong way round, for neither).
func TestSharesArePaired(t *testing.T) {
	t.Parallel()
	paired := 0
	for _, r := range workers.All() {
		if r.Shares == nil {
			continue
		}
		other, ok := workers.ByName(r.Shares.With)
		if !ok || other.Shares == nil || other.Shares.With != r.Name {
			t.Errorf("%s shares rows with %q, which does not share them back", r.Name, r.Shares.With)
			continue
		}
		paired++
		both := workers.Running{r.Name: true, other.Name: true}
		if got := r.DueIn(both); got != r.Shares.Due {
			t.Errorf("%s running with %s: due rows %q; want its share %q", r.Name, other.Name, got.What, r.Shares.Due.What)
		}
		for _, running := range []workers.Running{nil, {r.Name: true}, {other.Name: true}} {
			if got := r.DueIn(running); got != r.Due {
				t.Errorf("%s with running %v: due rows %q; want all its rows %q", r.Name, running, got.What, r.Due.What)
			}
		}
	}
	if paired != 2 {
		t.Errorf("%d reconcilers share rows; want lease_expiry and attempt_timeout", paired)
	}
}
