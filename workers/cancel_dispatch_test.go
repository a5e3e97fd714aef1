package workers_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/flowfabric/ffreconcile/internal/fftest"
	"github.com/flowfabric/ffreconcile/internal/fleet"
	"github.com/flowfabric/ffreconcile/internal/fleettest"
	"github.com/flowfabric/ffreconcile/internal/testdb"
	"github.com/flowfabric/ffreconcile/jobs"
	"github.com/flowfabric/ffreconcile/store"
	"github.com/flowfabric/ffreconcile/workers"
)

// group is an edge group with a pending row and its siblings.
type group struct {
	p             int16
	flow, down    string
	live          []string // siblings still running
	userCancelled string   // a sibling a user already cancelled ("" if none)
}

// insertGroup seeds an edge group of partition p with its pending row: a
// downstream execution and nLive running siblings in namespace, a sibling a
// user already cancelled when withCancelled, and extra member strings as
// given.
func insertGroup(t *testing.T, db store.DB, p int16, nLive int, withCancelled, flag bool, namespace string, extra ...string) group {
	t.Helper()
	g := group{p: p, flow: fftest.NewUUID()}
	g.down = fftest.InsertExec(t, db, fftest.Exec{Partition: p, FlowID: g.flow, LifecyclePhase: "runnable",
		OwnershipState: "unowned", EligibilityState: "blocked_by_dependencies", PublicState: "waiting",
		AttemptState: "pending", Namespace: namespace})
	members := append([]string(nil), extra...)
	for range nLive {
		id := fftest.InsertExec(t, db, fftest.Exec{Partition: p, FlowID: g.flow, Namespace: namespace})
		g.live = append(g.live, id)
		members = append(members, id)
	}
	if withCancelled {
		g.userCancelled = fftest.InsertExec(t, db, fftest.Exec{Partition: p, FlowID: g.flow, LifecyclePhase: "cancelled",
			OwnershipState: "unowned", PublicState: "cancelled", AttemptState: "cancelled", Namespace: namespace})
		if _, err := db.Exec(context.Background(), `UPDATE ff_exec_core SET cancellation_reason = 'user_request',
			cancelled_by = 'alice' WHERE partition_key = $1 AND execution_id = $2`, p, g.userCancelled); err != nil {
			t.Fatal(err)
		}
		members = append(members, g.userCancelled)
	}
	fftest.InsertEdgeGroup(t, db, fftest.EdgeGroup{Partition: p, FlowID: g.flow, DownstreamEID: g.down, Flag: flag, Members: members})
	fftest.InsertPendingCancel(t, db, p, g.flow, g.down, store.NowMs()-1000)
	return g
}

func (g group) pending(t *testing.T, db store.DB) bool {
	t.Helper()
	return fftest.PendingCancelExists(t, db, g.p, g.flow, g.down)
}

// cancelledByDispatch counts g's siblings cancelled by a dispatch.
func (g group) cancelledByDispatch(t *testing.T, db store.DB) int {
	t.Helper()
	return fftest.Count(t, db, `SELECT count(*) FROM ff_exec_core WHERE partition_key = $1 AND flow_id = $2
		AND lifecycle_phase = 'terminal' AND public_state = 'cancelled' AND cancellation_reason = 'sibling_quorum_satisfied'
		AND cancelled_by = 'engine'`, g.p, g.flow)
}

// checkUserCancelKept checks the user-cancelled sibling kept its reason and
// author.
func (g group) checkUserCancelKept(t *testing.T, db store.DB) {
	t.Helper()
	if g.userCancelled == "" {
		return
	}
	ex := fftest.ReadExec(t, db, g.p, g.userCancelled)
	if ex.LifecyclePhase != "cancelled" || *ex.CancellationReason != "user_request" || *ex.CancelledBy != "alice" {
		t.Fatalf("already-cancelled sibling changed: %+v", ex)
	}
}

// TestCancelDispatchLockedGroupIsLeftForLater: while another transaction
// holds the edge group, dispatch jobs complete without touching it and its
// pending row stays; once released, a later tick enqueues a new job that
// cancels the siblings exactly once.
func TestCancelDispatchLockedGroupIsLeftForLater(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testdb.New(t)
	pool := db.Pool
	g := insertGroup(t, pool, 12, 3, true, true, "")

	holder, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Rollback(ctx) //nolint:errcheck
	if _, err := holder.Exec(ctx, `SELECT 1 FROM ff_edge_group WHERE partition_key = $1 AND flow_id = $2 AND downstream_eid = $3 FOR UPDATE`,
		g.p, g.flow, g.down); err != nil {
		t.Fatal(err)
	}

	f := fleettest.Start(t, db, fleet.Config{Reconcilers: fleettest.Fast(workers.CancelDispatch)})
	dispatchJobs := func(state string) int {
		return fftest.Count(t, pool, `SELECT count(*) FROM river.river_job WHERE kind = $1 AND args->>'flow_id' = $2
			AND ($3 = '' OR state::text = $3)`, jobs.KindCancelDispatch, g.flow, state)
	}
	fleettest.WaitFor(t, fleettest.Patient, "a dispatch job completed while the group is locked", func() (bool, string) {
		n := dispatchJobs("completed")
		return n >= 1, fleettest.Statusf("%d completed dispatch jobs", n)
	})
	if !g.pending(t, pool) {
		t.Fatal("pending row deleted while the group was locked")
	}
	if n := g.cancelledByDispatch(t, pool); n != 0 {
		t.Fatalf("%d siblings cancelled while the group was locked", n)
	}
	st := f.Workers.Stats().For(workers.CancelDispatch.Name).Snapshot()
	if st.NoOps < 1 || st.Applied != 0 || st.Errors != 0 {
		t.Fatalf("stats = %+v; want a no-op, nothing applied, no errors", st)
	}
	// Each of them for the lock: a regression counts them as gone or as a
	// clear flag, and the metric sends an operator after the wrong cause.
	if len(st.NoOpsByReason) != 1 || st.NoOpsByReason[workers.NoOpLocked.String()] < 1 {
		t.Fatalf("no-ops by reason = %v; want only %s", st.NoOpsByReason, workers.NoOpLocked)
	}
	completedWhileLocked := dispatchJobs("completed")

	if err := holder.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	fleettest.WaitFor(t, fleettest.Patient, "the group dispatched", func() (bool, string) {
		return !g.pending(t, pool), "pending row still there"
	})
	if n := g.cancelledByDispatch(t, pool); n != len(g.live) {
		t.Fatalf("%d siblings cancelled; want %d", n, len(g.live))
	}
	g.checkUserCancelKept(t, pool)
	if eg := fftest.ReadEdgeGroup(t, pool, g.p, g.flow, g.down); eg.Flag || len(eg.Members) != 0 {
		t.Fatalf("edge group = %+v; want cleared", eg)
	}
	// The successful pass was a new job, enqueued by a later scan.
	if n := dispatchJobs(""); n <= completedWhileLocked {
		t.Fatalf("%d dispatch jobs in all, %d completed while locked; want a later job", n, completedWhileLocked)
	}
	waitApplied(t, f.Workers.Stats().For(workers.CancelDispatch.Name), 1)
	if st := f.Workers.Stats().For(workers.CancelDispatch.Name).Snapshot(); st.Applied != 1 {
		t.Fatalf("applied = %d; want exactly 1", st.Applied)
	}
}

// TestCancelDispatchAndReconcile runs both reconcilers: flagged groups are
// dispatched by the dispatcher (non-UUID members skipped with a warning),
// flag-clear groups are left by the dispatcher and deleted by the
// reconciler, and orphan pending rows are deleted.
func TestCancelDispatchAndReconcile(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	pool := db.Pool
	flagged := []group{
		insertGroup(t, pool, 20, 2, true, true, ""),
		insertGroup(t, pool, 21, 1, false, true, "", "not-a-uuid"),
	}
	cleared := []group{
		insertGroup(t, pool, 20, 2, false, false, ""),
		insertGroup(t, pool, 22, 0, true, false, ""),
	}
	orphanFlow, orphanDown := fftest.NewUUID(), fftest.NewUUID()
	fftest.InsertPendingCancel(t, pool, 23, orphanFlow, orphanDown, 1)

	logger, logs := captureLogger(t)
	f := fleettest.Start(t, db, fleet.Config{
		Reconcilers: fleettest.Fast(workers.CancelDispatch, workers.CancelReconcile),
		Logger:      logger,
	})
	applied := func() int64 {
		return f.Workers.Stats().For(workers.CancelDispatch.Name).Applied.Load() +
			f.Workers.Stats().For(workers.CancelReconcile.Name).Applied.Load()
	}
	fleettest.WaitFor(t, fleettest.Patient, "every pending row handled", func() (bool, string) {
		return applied() >= int64(len(flagged)+len(cleared)+1), fleettest.Statusf("%d applied", applied())
	})
	if n := fftest.Count(t, pool, `SELECT count(*) FROM ff_pending_cancel_groups WHERE partition_key IN (20, 21, 22, 23)`); n != 0 {
		t.Fatalf("%d pending rows left", n)
	}
	for _, g := range flagged {
		if n := g.cancelledByDispatch(t, pool); n != len(g.live) {
			t.Fatalf("group %s: %d siblings cancelled; want %d", g.flow, n, len(g.live))
		}
		g.checkUserCancelKept(t, pool)
	}
	for _, g := range cleared {
		if n := g.cancelledByDispatch(t, pool); n != 0 {
			t.Fatalf("flag-clear group %s: %d siblings cancelled; want 0", g.flow, n)
		}
		for _, id := range g.live {
			if ex := fftest.ReadExec(t, pool, g.p, id); ex.LifecyclePhase != "active" {
				t.Fatalf("sibling of a flag-clear group changed: %+v", ex)
			}
		}
	}
	if l := logs(); !strings.Contains(l, "not-a-uuid") || !strings.Contains(l, flagged[1].flow) {
		t.Fatalf("no warning naming the group and its bad member; logs:\n%s", l)
	}
	d := f.Workers.Stats().For(workers.CancelDispatch.Name).Snapshot()
	r := f.Workers.Stats().For(workers.CancelReconcile.Name).Snapshot()
	// The orphan goes to whichever gets there first; flag-clear groups only
	// to the reconciler; flagged groups only to the dispatcher (the
	// reconciler leaves groups with a live member).
	if d.Applied+r.Applied != int64(len(flagged)+len(cleared)+1) || d.Applied < int64(len(flagged)) ||
		r.Applied < int64(len(cleared)) || d.Errors+r.Errors != 0 || d.Skipped != 1 {
		t.Fatalf("dispatch %+v, reconcile %+v; want %d+%d+1 applied, 1 skipped member, no errors", d, r, len(flagged), len(cleared))
	}
}

// TestCancelReconcileLeavesLiveGroups runs the reconciler alone: a flagged
// group with a live member is left for the dispatcher, a flagged group whose
// members are all settled is cleared, a flag-clear group is deleted.
func TestCancelReconcileLeavesLiveGroups(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	pool := db.Pool
	live := insertGroup(t, pool, 30, 1, true, true, "")
	settled := insertGroup(t, pool, 31, 0, true, true, "")
	stale := insertGroup(t, pool, 32, 1, false, false, "")

	f := fleettest.Start(t, db, fleet.Config{Reconcilers: fleettest.Fast(workers.CancelReconcile)})
	fleettest.WaitFor(t, fleettest.Patient, "settled and stale groups reconciled", func() (bool, string) {
		return !settled.pending(t, pool) && !stale.pending(t, pool), "pending rows still there"
	})
	waitTicks(t, f, workers.CancelReconcile, 2)
	if !live.pending(t, pool) {
		t.Fatal("group with a live member lost its pending row")
	}
	if eg := fftest.ReadEdgeGroup(t, pool, live.p, live.flow, live.down); !eg.Flag || len(eg.Members) != 2 {
		t.Fatalf("group with a live member = %+v; want untouched", eg)
	}
	if ex := fftest.ReadExec(t, pool, live.p, live.live[0]); ex.LifecyclePhase != "active" {
		t.Fatal("the reconciler cancelled a sibling")
	}
	if eg := fftest.ReadEdgeGroup(t, pool, settled.p, settled.flow, settled.down); eg.Flag || len(eg.Members) != 0 {
		t.Fatalf("settled group = %+v; want cleared", eg)
	}
}

// TestCancelFilterLimitsTheFleet: with a tenant filter, both reconcilers
// act only on groups whose downstream execution is the tenant's; other
// tenants' groups and groups whose downstream execution is missing are left.
func TestCancelFilterLimitsTheFleet(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	pool := db.Pool
	mine := insertGroup(t, pool, 40, 2, false, true, "mine")
	mineStale := insertGroup(t, pool, 41, 1, false, false, "mine")
	other := insertGroup(t, pool, 40, 2, false, true, "other")
	otherStale := insertGroup(t, pool, 42, 1, false, false, "other")
	orphanFlow, orphanDown := fftest.NewUUID(), fftest.NewUUID()
	fftest.InsertPendingCancel(t, pool, 43, orphanFlow, orphanDown, 1)

	f := fleettest.Start(t, db, fleet.Config{
		Reconcilers: fleettest.Fast(workers.CancelDispatch, workers.CancelReconcile),
		Filter:      store.Filter{Namespace: "mine"},
	})
	fleettest.WaitFor(t, fleettest.Patient, "the tenant's groups handled", func() (bool, string) {
		return !mine.pending(t, pool) && !mineStale.pending(t, pool), "pending rows still there"
	})
	waitTicks(t, f, workers.CancelDispatch, 2)
	waitTicks(t, f, workers.CancelReconcile, 1)
	if n := mine.cancelledByDispatch(t, pool); n != 2 {
		t.Fatalf("%d of the tenant's siblings cancelled; want 2", n)
	}
	if !other.pending(t, pool) || !otherStale.pending(t, pool) || !fftest.PendingCancelExists(t, pool, 43, orphanFlow, orphanDown) {
		t.Fatal("a group outside the filter was handled")
	}
	if n := other.cancelledByDispatch(t, pool); n != 0 {
		t.Fatalf("%d siblings of another tenant cancelled", n)
	}
}

// TestCancelDispatchTwoClientsExactlyOnce runs two fleet processes with
// both reconcilers while groups keep arriving: every group is dispatched
// exactly once (a second dispatch would find the flag clear and count
// nothing), every live sibling is cancelled and already-cancelled ones keep
// their reason and author. The first half of the groups also have two
// duplicate dispatch jobs each (no unique key), which both processes run at
// once; the test fails unless both ran row jobs and the duplicates were
// no-ops.
func TestCancelDispatchTwoClientsExactlyOnce(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	pool := db.Pool
	const groups = 120
	parts := somePartitions(40)
	var gs []group
	for i := range groups / 2 {
		gs = append(gs, insertGroup(t, pool, parts[i%len(parts)], 3, i%3 == 0, true, ""))
	}
	var dups []string
	for _, g := range gs {
		dups = append(dups, fmt.Sprintf(`{"partition": %d, "flow_id": %q, "downstream_eid": %q}`, g.p, g.flow, g.down))
	}
	duplicateRowJobs(t, db, jobs.KindCancelDispatch, dups, 2)
	cfg := fleet.Config{Reconcilers: fleettest.Fast(workers.CancelDispatch, workers.CancelReconcile), BatchSize: 20}
	f1 := fleettest.Start(t, db, cfg)
	f2 := fleettest.Start(t, db, cfg)
	for i := groups / 2; i < groups; i++ {
		gs = append(gs, insertGroup(t, pool, parts[i%len(parts)], 3, i%3 == 0, true, ""))
	}

	applied := func() int64 {
		return f1.Workers.Stats().For(workers.CancelDispatch.Name).Applied.Load() +
			f2.Workers.Stats().For(workers.CancelDispatch.Name).Applied.Load()
	}
	fleettest.WaitFor(t, 2*time.Minute, "every group dispatched", func() (bool, string) {
		return applied() >= groups, fleettest.Statusf("%d applied", applied())
	})
	if n := fftest.Count(t, pool, `SELECT count(*) FROM ff_pending_cancel_groups WHERE partition_key = ANY($1)`, parts); n != 0 {
		t.Fatalf("%d pending rows left", n)
	}
	if n := fftest.Count(t, pool, `SELECT count(*) FROM ff_exec_core WHERE partition_key = ANY($1)
		AND cancellation_reason = 'sibling_quorum_satisfied'`, parts); n != 3*groups {
		t.Fatalf("%d siblings cancelled; want %d", n, 3*groups)
	}
	for _, g := range gs {
		g.checkUserCancelKept(t, pool)
	}
	if n := fftest.Count(t, pool, `SELECT count(*) FROM ff_edge_group WHERE partition_key = ANY($1)
		AND cancel_siblings_pending_flag`, parts); n != 0 {
		t.Fatalf("%d groups still flagged", n)
	}
	s1 := f1.Workers.Stats().For(workers.CancelDispatch.Name).Snapshot()
	s2 := f2.Workers.Stats().For(workers.CancelDispatch.Name).Snapshot()
	if s1.Applied+s2.Applied != groups || s1.Errors+s2.Errors != 0 {
		t.Fatalf("dispatch applied %d + %d (errors %d + %d); want %d, no errors", s1.Applied, s2.Applied, s1.Errors, s2.Errors, groups)
	}
	requireBothRaced(t, workers.CancelDispatch, f1, f2, len(dups))
	r1 := f1.Workers.Stats().For(workers.CancelReconcile.Name).Snapshot()
	r2 := f2.Workers.Stats().For(workers.CancelReconcile.Name).Snapshot()
	if r1.Applied+r2.Applied != 0 {
		t.Fatalf("reconciler applied %d + %d; want 0 (every group had live members until dispatched)", r1.Applied, r2.Applied)
	}
}
