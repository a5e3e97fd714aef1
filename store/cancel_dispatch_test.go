package store_test

import (
	"context"
	"slices"
	"strconv"
	"testing"

	"github.com/flowfabric/ffreconcile/internal/fftest"
	"github.com/flowfabric/ffreconcile/internal/testdb"
	"github.com/flowfabric/ffreconcile/store"
)

// cancelFixture is an edge group whose siblings are: two live (one with a
// raw_fields that is not an object), one already cancelled by a user, one
// completed, plus a member string that is not a UUID and one whose execution
// row is missing.
type cancelFixture struct {
	p                         int16
	flow, down                string
	live, liveOdd, userCancel string
	done, missing             string
}

func newCancelFixture(t *testing.T, db store.DB, p int16, flag bool, enqueuedAt int64) cancelFixture {
	t.Helper()
	f := cancelFixture{p: p, flow: fftest.NewUUID()}
	f.down = fftest.InsertExec(t, db, fftest.Exec{Partition: p, FlowID: f.flow, LifecyclePhase: "runnable",
		OwnershipState: "unowned", EligibilityState: "blocked_by_dependencies", PublicState: "waiting", AttemptState: "pending",
		Namespace: "tenant-a"})
	f.live = fftest.InsertExec(t, db, fftest.Exec{Partition: p, FlowID: f.flow, Namespace: "tenant-a"})
	f.liveOdd = fftest.InsertExec(t, db, fftest.Exec{Partition: p, FlowID: f.flow, RawFields: "odd"})
	f.userCancel = fftest.InsertExec(t, db, fftest.Exec{Partition: p, FlowID: f.flow, LifecyclePhase: "cancelled",
		OwnershipState: "unowned", PublicState: "cancelled", AttemptState: "cancelled"})
	if _, err := db.Exec(context.Background(), `UPDATE ff_exec_core SET cancellation_reason = 'user_request', cancelled_by = 'alice',
		terminal_at_ms = 42 WHERE partition_key = $1 AND execution_id = $2`, p, f.userCancel); err != nil {
		t.Fatal(err)
	}
	f.done = fftest.InsertExec(t, db, fftest.Exec{Partition: p, FlowID: f.flow, LifecyclePhase: "terminal",
		OwnershipState: "unowned", PublicState: "completed", AttemptState: "attempt_terminal"})
	f.missing = fftest.NewUUID()
	fftest.InsertEdgeGroup(t, db, fftest.EdgeGroup{Partition: p, FlowID: f.flow, DownstreamEID: f.down, Flag: flag,
		Members: []string{f.live, f.liveOdd, f.userCancel, f.done, "not-a-uuid", f.missing}})
	fftest.InsertPendingCancel(t, db, p, f.flow, f.down, enqueuedAt)
	return f
}

func (f cancelFixture) dispatch(t *testing.T, db store.Beginner, now int64) store.DispatchResult {
	t.Helper()
	res, err := store.DispatchCancelGroup(context.Background(), db, f.p, f.flow, f.down, now, store.Filter{})
	if err != nil {
		t.Fatal(err)
	}
	return res
}

func (f cancelFixture) reconcile(t *testing.T, db store.Beginner) store.ReconcileResult {
	t.Helper()
	res, err := store.ReconcileCancelGroup(context.Background(), db, f.p, f.flow, f.down, store.Filter{})
	if err != nil {
		t.Fatal(err)
	}
	return res
}

// checkDispatched checks the state a dispatch at now leaves.
func (f cancelFixture) checkDispatched(t *testing.T, db store.DB, now int64) {
	t.Helper()
	for _, id := range []string{f.live, f.liveOdd} {
		ex := fftest.ReadExec(t, db, f.p, id)
		if ex.LifecyclePhase != "terminal" || ex.OwnershipState != "unowned" || ex.EligibilityState != "not_applicable" ||
			ex.PublicState != "cancelled" || ex.AttemptState != "cancelled" ||
			ex.TerminalAtMs == nil || *ex.TerminalAtMs != now ||
			ex.CancellationReason == nil || *ex.CancellationReason != "sibling_quorum_satisfied" ||
			ex.CancelledBy == nil || *ex.CancelledBy != "engine" {
			t.Fatalf("sibling %s = %+v; want cancelled as the seed writes it", id, ex)
		}
	}
	if ex := fftest.ReadExec(t, db, f.p, f.live); ex.RawFields["last_mutation_at"] != strconv.FormatInt(now, 10) || ex.RawFields["namespace"] != "tenant-a" {
		t.Fatalf("raw_fields = %v; want last_mutation_at set as text, namespace kept", ex.RawFields)
	}
	if ex := fftest.ReadExec(t, db, f.p, f.liveOdd); ex.RawFieldsText != `"odd"` {
		t.Fatalf("raw_fields = %s; want it kept", ex.RawFieldsText)
	}
	uc := fftest.ReadExec(t, db, f.p, f.userCancel)
	if uc.LifecyclePhase != "cancelled" || *uc.CancellationReason != "user_request" || *uc.CancelledBy != "alice" ||
		*uc.TerminalAtMs != 42 || uc.RawFields["last_mutation_at"] != nil {
		t.Fatalf("already-cancelled sibling changed: %+v", uc)
	}
	if d := fftest.ReadExec(t, db, f.p, f.done); d.PublicState != "completed" || d.CancellationReason != nil {
		t.Fatalf("completed sibling changed: %+v", d)
	}
	if d := fftest.ReadExec(t, db, f.p, f.down); d.LifecyclePhase != "runnable" {
		t.Fatalf("downstream execution changed: %+v", d)
	}
	g := fftest.ReadEdgeGroup(t, db, f.p, f.flow, f.down)
	if g.Flag || len(g.Members) != 0 {
		t.Fatalf("edge group = %+v; want flag and members cleared", g)
	}
	if fftest.PendingCancelExists(t, db, f.p, f.flow, f.down) {
		t.Fatal("pending row not deleted")
	}
}

func TestDispatchCancelGroup(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testdb.New(t)
	pool := db.Pool
	const now = int64(5000)

	t.Run("CancelsLiveSiblingsOnce", func(t *testing.T) {
		f := newCancelFixture(t, pool, 80, true, 1)
		res := f.dispatch(t, pool, now)
		if res.Outcome != store.Dispatched || !res.PendingDeleted || res.Members != 6 || res.Cancelled != 2 ||
			res.RawFieldsMalformed != 1 || !slices.Equal(res.BadMembers, []string{"not-a-uuid"}) || !res.Changed() {
			t.Fatalf("result = %+v; want dispatched, 2 of 6 cancelled, 1 malformed raw_fields, 1 bad member", res)
		}
		f.checkDispatched(t, pool, now)

		// A second run (the job ran twice) finds the flag clear.
		if res := f.dispatch(t, pool, now+1); res.Outcome != store.LeftForReconciler || res.Changed() {
			t.Fatalf("second run = %+v; want left for the reconciler", res)
		}
		f.checkDispatched(t, pool, now)
	})

	t.Run("OrphanIsDeleted", func(t *testing.T) {
		flow, down := fftest.NewUUID(), fftest.NewUUID()
		fftest.InsertPendingCancel(t, pool, 81, flow, down, 1)
		res, err := store.DispatchCancelGroup(ctx, pool, 81, flow, down, now, store.Filter{})
		if err != nil || res.Outcome != store.Orphaned || !res.PendingDeleted {
			t.Fatalf("result = %+v, %v; want orphaned, deleted", res, err)
		}
		if fftest.PendingCancelExists(t, pool, 81, flow, down) {
			t.Fatal("orphan pending row kept")
		}
		if res, err := store.DispatchCancelGroup(ctx, pool, 81, flow, down, now, store.Filter{}); err != nil || res.Changed() {
			t.Fatalf("second run = %+v, %v; want no change", res, err)
		}
	})

	t.Run("FlagClearIsLeftForTheReconciler", func(t *testing.T) {
		f := newCancelFixture(t, pool, 82, false, 1)
		res := f.dispatch(t, pool, now)
		if res.Outcome != store.LeftForReconciler || res.Changed() {
			t.Fatalf("result = %+v; want left for the reconciler", res)
		}
		if !fftest.PendingCancelExists(t, pool, 82, f.flow, f.down) {
			t.Fatal("pending row deleted by the dispatcher")
		}
		if ex := fftest.ReadExec(t, pool, 82, f.live); ex.LifecyclePhase != "active" {
			t.Fatalf("sibling cancelled with the flag clear: %+v", ex)
		}
		res2 := f.reconcile(t, pool)
		if res2.Outcome != store.StaleDeleted || res2.GroupMissing {
			t.Fatalf("reconcile = %+v; want stale deleted", res2)
		}
		if fftest.PendingCancelExists(t, pool, 82, f.flow, f.down) {
			t.Fatal("pending row kept by the reconciler")
		}
	})

	t.Run("LockedGroupIsLeftForLaterThenCancelledOnce", func(t *testing.T) {
		f := newCancelFixture(t, pool, 83, true, 1)
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx) //nolint:errcheck
		if _, err := tx.Exec(ctx, `SELECT 1 FROM ff_edge_group WHERE partition_key = $1 AND flow_id = $2 AND downstream_eid = $3 FOR UPDATE`,
			f.p, f.flow, f.down); err != nil {
			t.Fatal(err)
		}
		res := f.dispatch(t, pool, now)
		if res.Outcome != store.LeftLocked || res.Changed() {
			t.Fatalf("result under another lock = %+v; want left locked", res)
		}
		if !fftest.PendingCancelExists(t, pool, 83, f.flow, f.down) {
			t.Fatal("pending row deleted while the group was locked")
		}
		if ex := fftest.ReadExec(t, pool, 83, f.live); ex.LifecyclePhase != "active" {
			t.Fatalf("sibling cancelled while the group was locked: %+v", ex)
		}
		if err := tx.Rollback(ctx); err != nil {
			t.Fatal(err)
		}

		res = f.dispatch(t, pool, now)
		if res.Outcome != store.Dispatched || res.Cancelled != 2 {
			t.Fatalf("later pass = %+v; want dispatched, 2 cancelled", res)
		}
		f.checkDispatched(t, pool, now)
		if n := fftest.Count(t, pool, `SELECT count(*) FROM ff_exec_core WHERE partition_key = 83
			AND cancellation_reason = 'sibling_quorum_satisfied'`); n != 2 {
			t.Fatalf("%d siblings cancelled by the dispatcher; want 2", n)
		}
	})
}

func TestParseMembers(t *testing.T) {
	t.Parallel()
	const canon = "6f1c0b1e-1234-4abc-8def-0123456789ab"
	ids, bad := store.ParseMembers([]string{
		canon,
		"6F1C0B1E-1234-4ABC-8DEF-0123456789AB",
		"6f1c0b1e12344abc8def0123456789ab",
		"{6f1c0b1e-1234-4abc-8def-0123456789ab}",
		"urn:uuid:6f1c0b1e-1234-4abc-8def-0123456789ab",
		"", "nope", "6f1c0b1e-1234-4abc-8def-0123456789ag", "6f1c0b1e+1234-4abc-8def-0123456789ab",
	})
	if len(ids) != 5 {
		t.Fatalf("ids = %v; want 5", ids)
	}
	for _, id := range ids {
		if id != canon {
			t.Fatalf("id %q; want %q", id, canon)
		}
	}
	if len(bad) != 4 {
		t.Fatalf("bad = %q; want 4", bad)
	}
}

// TestCancelGroupWithNullMembers: NULL elements in the members array (the
// column allows them, FlowFabric never writes them) are skipped as malformed
// members; the group is still dispatched and reconciled instead of failing
// on every retry.
func TestCancelGroupWithNullMembers(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testdb.New(t)
	flow := fftest.NewUUID()
	live := fftest.InsertExec(t, db.Pool, fftest.Exec{Partition: 4, FlowID: flow})
	down := fftest.InsertExec(t, db.Pool, fftest.Exec{Partition: 4, FlowID: flow})
	if _, err := db.Pool.Exec(ctx, `
		INSERT INTO ff_edge_group (partition_key, flow_id, downstream_eid, policy, cancel_siblings_pending_flag, cancel_siblings_pending_members)
		VALUES (4, $1, $2, '{}', true, ARRAY[NULL, $3, NULL]::text[])`, flow, down, live); err != nil {
		t.Fatal(err)
	}
	fftest.InsertPendingCancel(t, db.Pool, 4, flow, down, 1)

	res, err := store.DispatchCancelGroup(ctx, db.Pool, 4, flow, down, store.NowMs(), store.Filter{})
	if err != nil {
		t.Fatalf("dispatch: %v", err)
	}
	if res.Outcome != store.Dispatched || res.Cancelled != 1 || len(res.BadMembers) != 2 || res.BadMembers[0] != store.NullMember {
		t.Fatalf("dispatch = %+v; want dispatched, 1 cancelled, 2 NULL members skipped", res)
	}
	if ex := fftest.ReadExec(t, db.Pool, 4, live); ex.LifecyclePhase != "terminal" {
		t.Fatalf("live sibling not cancelled: %+v", ex)
	}
}
