package store_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/flowfabric/ffreconcile/internal/fftest"
	"github.com/flowfabric/ffreconcile/internal/testdb"
	"github.com/flowfabric/ffreconcile/store"
)

func TestReconcileCancelGroup(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testdb.New(t)
	pool := db.Pool

	t.Run("MissingGroupIsDeleted", func(t *testing.T) {
		flow, down := fftest.NewUUID(), fftest.NewUUID()
		fftest.InsertPendingCancel(t, pool, 90, flow, down, 1)
		res, err := store.ReconcileCancelGroup(ctx, pool, 90, flow, down, store.Filter{})
		if err != nil || res.Outcome != store.StaleDeleted || !res.GroupMissing {
			t.Fatalf("result = %+v, %v; want stale deleted, group missing", res, err)
		}
		if fftest.PendingCancelExists(t, pool, 90, flow, down) {
			t.Fatal("pending row kept")
		}
		if res, err := store.ReconcileCancelGroup(ctx, pool, 90, flow, down, store.Filter{}); err != nil || res.Outcome != store.PendingGone {
			t.Fatalf("second run = %+v, %v; want pending gone", res, err)
		}
	})

	t.Run("LiveMemberIsLeft", func(t *testing.T) {
		f := newCancelFixture(t, pool, 91, true, 1)
		res := f.reconcile(t, pool)
		if res.Outcome != store.LeftLive || res.Live != 2 || res.Changed() || !slices.Equal(res.BadMembers, []string{"not-a-uuid"}) {
			t.Fatalf("result = %+v; want left with 2 live members", res)
		}
		g := fftest.ReadEdgeGroup(t, pool, 91, f.flow, f.down)
		if !g.Flag || len(g.Members) != 6 || !fftest.PendingCancelExists(t, pool, 91, f.flow, f.down) {
			t.Fatalf("group = %+v; want it untouched with its pending row", g)
		}
		if ex := fftest.ReadExec(t, pool, 91, f.live); ex.LifecyclePhase != "active" {
			t.Fatal("the reconciler cancelled a sibling")
		}
	})

	t.Run("AllMembersSettledIsCleared", func(t *testing.T) {
		p := int16(92)
		flow := fftest.NewUUID()
		down := fftest.InsertExec(t, pool, fftest.Exec{Partition: p, FlowID: flow})
		done := fftest.InsertExec(t, pool, fftest.Exec{Partition: p, FlowID: flow, LifecyclePhase: "terminal"})
		cancelled := fftest.InsertExec(t, pool, fftest.Exec{Partition: p, FlowID: flow, LifecyclePhase: "cancelled"})
		fftest.InsertEdgeGroup(t, pool, fftest.EdgeGroup{Partition: p, FlowID: flow, DownstreamEID: down, Flag: true,
			Members: []string{done, cancelled, fftest.NewUUID(), "junk"}})
		fftest.InsertPendingCancel(t, pool, p, flow, down, 1)
		res, err := store.ReconcileCancelGroup(ctx, pool, p, flow, down, store.Filter{})
		if err != nil || res.Outcome != store.Cleared || !slices.Equal(res.BadMembers, []string{"junk"}) {
			t.Fatalf("result = %+v, %v; want cleared", res, err)
		}
		if g := fftest.ReadEdgeGroup(t, pool, p, flow, down); g.Flag || len(g.Members) != 0 {
			t.Fatalf("group = %+v; want cleared", g)
		}
		if fftest.PendingCancelExists(t, pool, p, flow, down) {
			t.Fatal("pending row kept")
		}
	})

	t.Run("NoParseableMemberIsCleared", func(t *testing.T) {
		flow, down := fftest.NewUUID(), fftest.NewUUID()
		fftest.InsertEdgeGroup(t, pool, fftest.EdgeGroup{Partition: 93, FlowID: flow, DownstreamEID: down, Flag: true,
			Members: []string{"x", ""}})
		fftest.InsertPendingCancel(t, pool, 93, flow, down, 1)
		res, err := store.ReconcileCancelGroup(ctx, pool, 93, flow, down, store.Filter{})
		if err != nil || res.Outcome != store.Cleared || len(res.BadMembers) != 2 {
			t.Fatalf("result = %+v, %v; want cleared with 2 bad members", res, err)
		}
	})

	// WaitsForADispatchInProgress: the reconciler waits on the edge group
	// lock of a dispatch in progress and decides on its committed result.
	t.Run("WaitsForADispatchInProgress", func(t *testing.T) {
		f := newCancelFixture(t, pool, 94, true, 1)
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx) //nolint:errcheck
		// What a dispatch does, left uncommitted.
		if _, err := tx.Exec(ctx, `UPDATE ff_edge_group SET cancel_siblings_pending_flag = false, cancel_siblings_pending_members = '{}'
			WHERE partition_key = $1 AND flow_id = $2 AND downstream_eid = $3`, f.p, f.flow, f.down); err != nil {
			t.Fatal(err)
		}
		if _, err := tx.Exec(ctx, `DELETE FROM ff_pending_cancel_groups WHERE partition_key = $1 AND flow_id = $2 AND downstream_eid = $3`,
			f.p, f.flow, f.down); err != nil {
			t.Fatal(err)
		}
		done := make(chan store.ReconcileResult, 1)
		errc := make(chan error, 1)
		go func() {
			res, err := store.ReconcileCancelGroup(ctx, pool, f.p, f.flow, f.down, store.Filter{})
			if err != nil {
				errc <- err
				return
			}
			done <- res
		}()
		waitForLockWait(t, pool, "ff_edge_group")
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		select {
		case res := <-done:
			if res.Outcome != store.PendingGone {
				t.Fatalf("result = %+v; want pending gone (the dispatch drained it)", res)
			}
		case err := <-errc:
			t.Fatal(err)
		case <-time.After(10 * time.Second):
			t.Fatal("reconcile did not finish")
		}
	})
}
