package store_test

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/flowfabric/ffreconcile/internal/ffread"
	"github.com/flowfabric/ffreconcile/internal/fftest"
	"github.com/flowfabric/ffreconcile/internal/testdb"
	"github.com/flowfabric/ffreconcile/store"
)

const backlogGraceMs = 30_000

// leased inserts a live execution of flow whose current attempt holds a
// lease (a worker instance, an unexpired lease), as a claim leaves it.
func leased(t *testing.T, pool *pgxpool.Pool, p int16, flow string, raw map[string]any, now int64) string {
	t.Helper()
	id := fftest.InsertExec(t, pool, fftest.Exec{Partition: p, FlowID: flow, RawFields: raw})
	fftest.InsertAttempt(t, pool, p, id, 0, fftest.Ms(now+60_000))
	if _, err := pool.Exec(context.Background(), `UPDATE ff_attempt SET worker_instance_id = 'wi-1', lease_epoch = 3
		 WHERE partition_key = $1 AND execution_id = $2`, p, id); err != nil {
		t.Fatal(err)
	}
	return id
}

func drain(t *testing.T, db store.Beginner, p int16, flow string, now int64, f store.Filter) store.BacklogResult {
	t.Helper()
	res, err := store.DrainCancelBacklog(context.Background(), db, p, flow, backlogGraceMs, now, f)
	if err != nil {
		t.Fatal(err)
	}
	return res
}

// TestDrainCancelBacklog: a header past its grace is drained as FlowFabric's
// cancel_reconciler drains a flow: a live member is cancelled as FlowFabric's
// operator cancel does it (operator_override, the header's reason, its lease
// revoked with a 'revoked' event), members FlowFabric already cancelled or
// that ended, or whose execution is missing, are acked untouched, bad
// member ids are deleted and named while the others are still drained, and
// the header goes with its last member. A header within its grace, a flow
// missing from ff_flow_core, an empty header, 500 members per pass and a
// second pass are each pinned. A regression shows as a member cancelled
// twice (a second lease event), a member or header left, or a bad id
// stopping its header.
func TestDrainCancelBacklog(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.New(t).Pool
	now := int64(10_000_000)
	const p = int16(21)
	own := map[string]any{"namespace": "acme", "tags": map[string]any{store.InstanceTagKey: "7"}}

	t.Run("Members", func(t *testing.T) {
		flow := fftest.NewUUID()
		fftest.InsertFlow(t, pool, p, flow, "cancelled", map[string]any{"cancel_reason": "flow reason"})
		live := leased(t, pool, p, flow, own, now)
		waiting := fftest.InsertExec(t, pool, fftest.Exec{Partition: p, FlowID: flow, LifecyclePhase: "runnable", OwnershipState: "unowned",
			EligibilityState: "eligible_now", PublicState: "waiting", AttemptState: "pending_first_attempt", RawFields: own})
		already := fftest.InsertExec(t, pool, fftest.Exec{Partition: p, FlowID: flow, LifecyclePhase: "cancelled", OwnershipState: "leased",
			EligibilityState: "cancelled", PublicState: "cancelled", RawFields: own})
		if _, err := pool.Exec(ctx, `UPDATE ff_exec_core SET cancelled_by = 'cancel_flow_header', cancellation_reason = 'earlier'
			 WHERE partition_key = $1 AND execution_id = $2`, p, already); err != nil {
			t.Fatal(err)
		}
		done := fftest.InsertExec(t, pool, fftest.Terminal(p, now-5))
		missing := fftest.NewUUID()
		bad := []string{"garbage", fftest.WireID(p+1, fftest.NewUUID()), fftest.NewUUID()}
		members := append([]string{fftest.WireID(p, live), fftest.WireID(p, waiting), fftest.WireID(p, already),
			fftest.WireID(p, done), fftest.WireID(p, missing)}, bad...)
		fftest.InsertBacklog(t, pool, fftest.Backlog{Partition: p, FlowID: flow, RequestedAtMs: now - backlogGraceMs, Reason: "header reason", Members: members})

		res := drain(t, pool, p, flow, now, store.Filter{})
		sort.Strings(bad)
		sort.Strings(res.BadMembers)
		if res.Outcome != store.BacklogDrained || res.Members != 8 || res.Cancelled != 2 || res.LeasesRevoked != 1 || res.Acked != 8 ||
			!res.HeaderDeleted || !slices.Equal(res.BadMembers, bad) || res.DeadlineMs != now {
			t.Fatalf("drain = %+v", res)
		}
		if left, header := fftest.BacklogMembers(t, pool, p, flow); len(left) != 0 || header {
			t.Fatalf("left: %v, header %v", left, header)
		}
		for _, id := range []string{live, waiting} {
			e := fftest.ReadExec(t, pool, p, id)
			if e.LifecyclePhase != "cancelled" || e.PublicState != "cancelled" || e.OwnershipState != "unowned" ||
				e.EligibilityState != "not_applicable" || e.AttemptState != "cancelled" || fftest.Deref(e.CancelledBy) != "operator_override" ||
				fftest.Deref(e.CancellationReason) != "header reason" || e.TerminalAtMs == nil || *e.TerminalAtMs != now ||
				e.RawFields["last_mutation_at"] != fmt.Sprint(now) {
				t.Errorf("member %s: %+v", id, e)
			}
		}
		var wi *string
		var epoch int64
		if err := pool.QueryRow(ctx, `SELECT worker_instance_id, lease_epoch FROM ff_attempt WHERE partition_key = $1 AND execution_id = $2`,
			p, live).Scan(&wi, &epoch); err != nil {
			t.Fatal(err)
		}
		a := fftest.ReadAttempt(t, pool, p, live, 0)
		if wi != nil || epoch != 4 || a.LeaseExpiresAtMs != nil || fftest.Deref(a.Outcome) != "cancelled" {
			t.Errorf("live member's attempt: worker %v epoch %d %+v", wi, epoch, a)
		}
		if evs := fftest.LeaseEvents(t, pool, live); len(evs) != 1 || evs[0].EventType != "revoked" || evs[0].OccurredAtMs != now ||
			fftest.Deref(evs[0].Namespace) != "acme" || fftest.Deref(evs[0].InstanceTag) != "7" {
			t.Errorf("lease events: %+v", evs)
		}
		if e := fftest.ReadExec(t, pool, p, already); fftest.Deref(e.CancelledBy) != "cancel_flow_header" || fftest.Deref(e.CancellationReason) != "earlier" || e.EligibilityState != "cancelled" {
			t.Errorf("member FlowFabric cancelled was changed: %+v", e)
		}
		if e := fftest.ReadExec(t, pool, p, done); e.LifecyclePhase != "terminal" || e.PublicState != "completed" {
			t.Errorf("ended member was changed: %+v", e)
		}
		if res := drain(t, pool, p, flow, now, store.Filter{}); res.Outcome != store.BacklogGone || res.Changed() {
			t.Errorf("second drain = %+v", res)
		}
	})

	t.Run("Grace", func(t *testing.T) {
		flow := fftest.NewUUID()
		fftest.InsertFlow(t, pool, p, flow, "cancelled", nil)
		id := fftest.InsertExec(t, pool, fftest.Exec{Partition: p, FlowID: flow})
		fftest.InsertBacklog(t, pool, fftest.Backlog{Partition: p, FlowID: flow, RequestedAtMs: now - backlogGraceMs + 1, Members: []string{fftest.WireID(p, id)}})
		if res := drain(t, pool, p, flow, now, store.Filter{}); res.Outcome != store.BacklogNotDue || res.DeadlineMs != now+1 {
			t.Fatalf("within grace: %+v", res)
		}
		if e := fftest.ReadExec(t, pool, p, id); e.LifecyclePhase != "active" {
			t.Fatalf("member changed within grace: %+v", e)
		}
		// grace_until_ms, when set, is the deadline: past here though
		// requested_at_ms + grace is not; the flow's reason is used when
		// the header has none, and the default when neither has.
		if _, err := pool.Exec(ctx, `UPDATE ff_cancel_backlog SET grace_until_ms = $3 WHERE partition_key = $1 AND flow_id = $2`, p, flow, now-1); err != nil {
			t.Fatal(err)
		}
		if res := drain(t, pool, p, flow, now, store.Filter{}); res.Outcome != store.BacklogDrained || res.Cancelled != 1 || !res.HeaderDeleted {
			t.Fatalf("past grace_until_ms: %+v", res)
		}
		if e := fftest.ReadExec(t, pool, p, id); fftest.Deref(e.CancellationReason) != store.BacklogDefaultReason {
			t.Fatalf("reason: %+v", e)
		}
	})

	t.Run("FlowMissingAndEmpty", func(t *testing.T) {
		gone, empty := fftest.NewUUID(), fftest.NewUUID()
		id := fftest.InsertExec(t, pool, fftest.Exec{Partition: p, FlowID: gone})
		fftest.InsertBacklog(t, pool, fftest.Backlog{Partition: p, FlowID: gone, RequestedAtMs: 1, Members: []string{fftest.WireID(p, id), "junk"}})
		if res := drain(t, pool, p, gone, now, store.Filter{}); res.Outcome != store.BacklogFlowMissing || res.Acked != 2 || !res.HeaderDeleted {
			t.Fatalf("flow missing: %+v", res)
		}
		if e := fftest.ReadExec(t, pool, p, id); e.LifecyclePhase != "active" {
			t.Fatalf("member of a missing flow was cancelled: %+v", e)
		}
		fftest.InsertFlow(t, pool, p, empty, "cancelled", nil)
		fftest.InsertBacklog(t, pool, fftest.Backlog{Partition: p, FlowID: empty, RequestedAtMs: 1})
		if res := drain(t, pool, p, empty, now, store.Filter{}); res.Outcome != store.BacklogEmpty || !res.HeaderDeleted {
			t.Fatalf("empty: %+v", res)
		}
	})

	t.Run("FiveHundredAPass", func(t *testing.T) {
		flow := fftest.NewUUID()
		fftest.InsertFlow(t, pool, p, flow, "cancelled", nil)
		var members []string
		for range store.CancelBacklogMembers + 20 {
			members = append(members, fftest.WireID(p, fftest.NewUUID()))
		}
		fftest.InsertBacklog(t, pool, fftest.Backlog{Partition: p, FlowID: flow, RequestedAtMs: 1, Members: members})
		if res := drain(t, pool, p, flow, now, store.Filter{}); res.Acked != store.CancelBacklogMembers || res.HeaderDeleted {
			t.Fatalf("first pass: %+v", res)
		}
		if res := drain(t, pool, p, flow, now, store.Filter{}); res.Acked != 20 || !res.HeaderDeleted {
			t.Fatalf("second pass: %+v", res)
		}
	})

	t.Run("TenantFilter", func(t *testing.T) {
		f := store.Filter{Namespace: "acme", TagKey: store.InstanceTagKey, TagValue: "7"}
		other := map[string]any{"namespace": "beta", "tags": map[string]any{store.InstanceTagKey: "7"}}
		flow, foreign := fftest.NewUUID(), fftest.NewUUID()
		fftest.InsertFlow(t, pool, p, flow, "cancelled", nil)
		fftest.InsertFlow(t, pool, p, foreign, "cancelled", nil)
		mine := fftest.InsertExec(t, pool, fftest.Exec{Partition: p, FlowID: flow, RawFields: own})
		theirs := fftest.InsertExec(t, pool, fftest.Exec{Partition: p, FlowID: flow, RawFields: other})
		missing := fftest.NewUUID()
		fftest.InsertBacklog(t, pool, fftest.Backlog{Partition: p, FlowID: flow, RequestedAtMs: 1,
			Members: []string{fftest.WireID(p, mine), fftest.WireID(p, theirs), fftest.WireID(p, missing), "junk"}})
		only := fftest.InsertExec(t, pool, fftest.Exec{Partition: p, FlowID: foreign, RawFields: other})
		fftest.InsertBacklog(t, pool, fftest.Backlog{Partition: p, FlowID: foreign, RequestedAtMs: 1, Members: []string{fftest.WireID(p, only)}})

		res := drain(t, pool, p, flow, now, f)
		if res.Outcome != store.BacklogDrained || res.Cancelled != 1 || res.Acked != 2 || res.HeaderDeleted || len(res.BadMembers) != 1 {
			t.Fatalf("drain = %+v", res)
		}
		left, header := fftest.BacklogMembers(t, pool, p, flow)
		want := []string{fftest.WireID(p, missing), fftest.WireID(p, theirs)}
		sort.Strings(want)
		if !header || !slices.Equal(left, want) {
			t.Fatalf("left %v (header %v); want %v", left, header, want)
		}
		if e := fftest.ReadExec(t, pool, p, theirs); e.LifecyclePhase != "active" {
			t.Fatalf("another tenant's member was cancelled: %+v", e)
		}
		if res := drain(t, pool, p, foreign, now, f); res.Outcome != store.BacklogOutsideTenant || res.Changed() {
			t.Fatalf("another tenant's header: %+v", res)
		}
		// Both headers left hold only other tenants' members (and one a
		// member whose execution is missing): the filtered depth counts
		// neither, the unfiltered both.
		if n, err := store.CancelBacklogDepth(ctx, pool, f, 1000); err != nil || n != 0 {
			t.Fatalf("depth under the filter = %d, %v; want 0", n, err)
		}
		if n, err := store.CancelBacklogDepth(ctx, pool, store.Filter{}, 1000); err != nil || n != 2 {
			t.Fatalf("depth = %d, %v; want 2", n, err)
		}
	})
}

// TestFlowFabricCancelBacklogAfterTheFleet, on a fresh schema and on
// FlowFabric's migrations with a tenant filter on: FlowFabric's own flow
// cancel (cancel_flow_header) writes the header and members (and flips the
// members); a drain acks them all without a second cancel, and FlowFabric's
// idempotent re-cancel then answers with the flow's members (its fallback
// when no member row is left) and its stored policy and reason. A member
// left live (a header whose members were written by an earlier, failed
// cancel) is cancelled by the drain as FlowFabric's operator cancel would,
// and FlowFabric's readers and its own re-cancel agree. A regression shows
// as a member or header left behind, a member cancelled twice, or a state
// FlowFabric reads differently.
func TestFlowFabricCancelBacklogAfterTheFleet(t *testing.T) {
	t.Parallel()
	testdb.EachSchema(t, func(t *testing.T, db *testdb.DB) {
		ctx := context.Background()
		pool := db.Pool
		now := store.NowMs()
		const p = int16(33)
		f := store.Filter{Namespace: "acme", TagKey: store.InstanceTagKey, TagValue: "7"}
		own := map[string]any{"namespace": "acme", "tags": map[string]any{store.InstanceTagKey: "7"}, "last_mutation_at": "1"}
		flow := fftest.NewUUID()
		fftest.InsertFlow(t, pool, p, flow, "open", nil)
		a := leased(t, pool, p, flow, own, now)
		b := fftest.InsertExec(t, pool, fftest.Exec{Partition: p, FlowID: flow, RawFields: own, LifecyclePhase: "runnable",
			OwnershipState: "unowned", EligibilityState: "eligible_now", PublicState: "waiting", AttemptState: "pending_first_attempt"})
		hdr, err := ffread.CancelFlowHeaderOp(ctx, pool, p, flow, ffread.CancelFlowArgs{CancellationPolicy: "cancel_flow_only", Reason: "stop", NowMs: now - backlogGraceMs})
		if err != nil || hdr.AlreadyTerminal || len(hdr.MemberExecutionIDs) != 2 {
			t.Fatalf("cancel_flow_header: %+v, %v", hdr, err)
		}
		res := drain(t, pool, p, flow, now, f)
		if res.Outcome != store.BacklogDrained || res.Cancelled != 0 || res.Acked != 2 || !res.HeaderDeleted {
			t.Fatalf("drain of FlowFabric's backlog = %+v", res)
		}
		for _, id := range []string{a, b} {
			if e := fftest.ReadExec(t, pool, p, id); fftest.Deref(e.CancelledBy) != "cancel_flow_header" {
				t.Errorf("member %s cancelled again: %+v", id, e)
			}
		}
		if evs := fftest.LeaseEvents(t, pool, a); len(evs) != 0 {
			t.Errorf("lease events of a member FlowFabric's header cancelled: %+v", evs)
		}
		again, err := ffread.CancelFlowHeaderOp(ctx, pool, p, flow, ffread.CancelFlowArgs{CancellationPolicy: "cancel_all", Reason: "again", NowMs: now})
		if err != nil || !again.AlreadyTerminal || fftest.Deref(again.StoredCancellationPolicy) != "cancel_flow_only" ||
			fftest.Deref(again.StoredCancelReason) != "stop" {
			t.Fatalf("re-cancel: %+v, %v", again, err)
		}
		got := slices.Sorted(slices.Values(again.MemberExecutionIDs))
		want := slices.Sorted(slices.Values([]string{fftest.WireID(p, a), fftest.WireID(p, b)}))
		if !slices.Equal(got, want) {
			t.Errorf("re-cancel members = %v; want %v", got, want)
		}

		// A live member under FlowFabric's header (its own cancel
		// failed): the drain cancels it; FlowFabric reads it cancelled,
		// and its re-cancel of the execution is the idempotent success.
		c := leased(t, pool, p, flow, own, now)
		fftest.InsertBacklog(t, pool, fftest.Backlog{Partition: p, FlowID: flow, RequestedAtMs: now - backlogGraceMs, Reason: "stop",
			Members: []string{fftest.WireID(p, c)}})
		if res := drain(t, pool, p, flow, now, f); res.Cancelled != 1 || res.LeasesRevoked != 1 || !res.HeaderDeleted {
			t.Fatalf("drain of a live member = %+v", res)
		}
		info, err := ffread.ReadExecutionInfo(ctx, pool, p, c)
		if err != nil || info.StateVector.PublicState != "cancelled" || info.StateVector.TerminalOutcome != "cancelled" {
			t.Fatalf("FlowFabric reads %+v, %v", info, err)
		}
		if r, err := ffread.CancelExecution(ctx, pool, p, c, ffread.CancelExecutionArgs{Reason: "x"}); err != nil || !r.AlreadyCancelled {
			t.Fatalf("FlowFabric's re-cancel: %+v, %v", r, err)
		}
		if err := ffread.AckCancelMember(ctx, pool, p, flow, fftest.WireID(p, c)); err != nil {
			t.Fatalf("FlowFabric's ack after the drain: %v", err)
		}
	})
}

// TestBacklogMemberCancelRacesFlowFabrics, on both schemas with a tenant
// filter: a drain and FlowFabric's own operator cancel of the same member,
// each holding the execution's row lock while the other waits. FlowFabric
// first: the drain, once it gets the lock, finds the member cancelled and
// acks it without writing (FlowFabric's reason and one revoked event).
// The drain first: FlowFabric's SERIALIZABLE cancel fails on the row the
// drain changed, retries, and answers the idempotent success (the drain's
// reason, one revoked event). A regression (a drain that does not re-read
// under its lock) shows as two revoked events or a reason overwritten.
func TestBacklogMemberCancelRacesFlowFabrics(t *testing.T) {
	t.Parallel()
	testdb.EachSchema(t, func(t *testing.T, db *testdb.DB) {
		ctx := context.Background()
		pool := db.Pool
		now := store.NowMs()
		const p = int16(44)
		f := store.Filter{Namespace: "acme"}
		own := map[string]any{"namespace": "acme", "last_mutation_at": "1"}
		seed := func() (flow, id string) {
			flow = fftest.NewUUID()
			fftest.InsertFlow(t, pool, p, flow, "cancelled", nil)
			id = leased(t, pool, p, flow, own, now)
			fftest.InsertBacklog(t, pool, fftest.Backlog{Partition: p, FlowID: flow, RequestedAtMs: now - backlogGraceMs, Reason: "backlog",
				Members: []string{fftest.WireID(p, id)}})
			return flow, id
		}
		check := func(t *testing.T, flow, id, reason string) {
			t.Helper()
			if e := fftest.ReadExec(t, pool, p, id); e.PublicState != "cancelled" || fftest.Deref(e.CancellationReason) != reason {
				t.Errorf("execution: %+v; want cancelled for %q", e, reason)
			}
			if evs := fftest.LeaseEvents(t, pool, id); len(evs) != 1 || evs[0].EventType != "revoked" {
				t.Errorf("lease events: %+v; want one revoked", evs)
			}
			if left, header := fftest.BacklogMembers(t, pool, p, flow); len(left) != 0 || header {
				t.Errorf("backlog left: %v, header %v", left, header)
			}
		}

		t.Run("FlowFabricFirst", func(t *testing.T) {
			flow, id := seed()
			tx, err := pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback(ctx)
			if _, err := tx.Exec(ctx, "SET TRANSACTION ISOLATION LEVEL SERIALIZABLE"); err != nil {
				t.Fatal(err)
			}
			if _, err := ffread.CancelExecutionTx(ctx, tx, p, id, ffread.CancelExecutionArgs{Reason: "operator", NowMs: now}); err != nil {
				t.Fatal(err)
			}
			done := make(chan struct{})
			var res store.BacklogResult
			var derr error
			go func() {
				defer close(done)
				res, derr = store.DrainCancelBacklog(ctx, pool, p, flow, backlogGraceMs, now, f)
			}()
			fftest.WaitForLockWait(t, pool, "ff_exec_core")
			if err := tx.Commit(ctx); err != nil {
				t.Fatal(err)
			}
			<-done
			if derr != nil || res.Cancelled != 0 || res.Acked != 1 || !res.HeaderDeleted {
				t.Fatalf("drain = %+v, %v", res, derr)
			}
			check(t, flow, id, "operator")
		})

		t.Run("DrainFirst", func(t *testing.T) {
			flow, id := seed()
			tx, err := pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback(ctx)
			// The drain in a savepoint of tx: done, its locks held
			// until tx commits.
			if res, err := store.DrainCancelBacklog(ctx, tx, p, flow, backlogGraceMs, now, f); err != nil || res.Cancelled != 1 {
				t.Fatalf("drain = %+v, %v", res, err)
			}
			done := make(chan struct{})
			var res *ffread.CancelExecutionResult
			var cerr error
			go func() {
				defer close(done)
				res, cerr = ffread.CancelExecution(ctx, pool, p, id, ffread.CancelExecutionArgs{Reason: "operator", NowMs: now})
			}()
			fftest.WaitForLockWait(t, pool, "ff_exec_core")
			if err := tx.Commit(ctx); err != nil {
				t.Fatal(err)
			}
			<-done
			if cerr != nil || !res.AlreadyCancelled {
				t.Fatalf("FlowFabric's cancel after the drain = %+v, %v", res, cerr)
			}
			check(t, flow, id, "backlog")
		})
	})
}
