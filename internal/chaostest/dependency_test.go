package chaostest

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/flowfabric/ffreconcile/internal/ffseed"
	"github.com/flowfabric/ffreconcile/internal/fftest"
	"github.com/flowfabric/ffreconcile/internal/fleettest"
	"github.com/flowfabric/ffreconcile/internal/testdb"
)

// TestDependencyKilledMidCascadeLosesNoHop: two `worker run` processes
// dispatch 1,500 completion events, each with an edge into one hot fan-in
// group shared by all of them and edges to three downstreams of its own;
// one process is SIGKILLed while it is running dispatch jobs, and a new
// incarnation starts. Every event ends dispatched once and every edge
// advanced exactly once: the hot group counts 1,500 successes, each own
// group one. FlowFabric's dispatcher, which commits the claim before the
// hops, leaves claimed events with hops never applied when killed so; a
// regression here shows as a group short of its count (a hop lost) or over
// it (a hop applied twice).
func TestDependencyKilledMidCascadeLosesNoHop(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testdb.New(t)
	pool := db.Pool
	const n = 1500
	p, flow := int16(77), fftest.NewUUID()
	hot := fftest.InsertExec(t, pool, fftest.Blocked(p, flow))
	fftest.InsertGroup(t, pool, fftest.Group{Partition: p, FlowID: flow, DownstreamEID: hot,
		Policy: fmt.Sprintf(`{"kind":"quorum","k":%d,"on_satisfied":"let_run"}`, n), Running: n})
	// Upstreams, edges, own downstreams and events in bulk.
	var execs []ffseed.Exec
	var edges []ffseed.Edge
	var groups []ffseed.EdgeGroup
	var events []ffseed.CompletionEvent
	for range n {
		up := ffseed.Exec{Partition: p, ID: ffseed.NewUUID(), FlowID: flow, LaneID: "chaos", LifecyclePhase: "terminal",
			OwnershipState: "unowned", EligibilityState: "not_applicable", PublicState: "completed", AttemptState: "attempt_terminal"}
		execs = append(execs, up)
		edges = append(edges, ffseed.Edge{Partition: p, FlowID: flow, UpstreamEID: up.ID, DownstreamEID: hot, Policy: `{"kind":"quorum"}`})
		for range 3 {
			down := ffseed.Exec{Partition: p, ID: ffseed.NewUUID(), FlowID: flow, LaneID: "chaos", LifecyclePhase: "blocked",
				OwnershipState: "unowned", EligibilityState: "blocked_by_dependencies", PublicState: "waiting", AttemptState: "pending"}
			execs = append(execs, down)
			edges = append(edges, ffseed.Edge{Partition: p, FlowID: flow, UpstreamEID: up.ID, DownstreamEID: down.ID, Policy: ffseed.AllOf})
			groups = append(groups, ffseed.EdgeGroup{Partition: p, FlowID: flow, DownstreamEID: down.ID, Policy: ffseed.AllOf, Running: 1})
		}
		events = append(events, ffseed.CompletionEvent{Partition: p, ExecutionID: up.ID, FlowID: flow, OccurredAtMs: 1, CommittedAtMs: 1})
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := errors.Join(ffseed.InsertMany(ctx, tx, execs), ffseed.InsertMany(ctx, tx, edges),
		ffseed.InsertMany(ctx, tx, groups), ffseed.InsertMany(ctx, tx, events), tx.Commit(ctx)); err != nil {
		t.Fatal(err)
	}

	args := []string{"--reconcilers", "dependency", "--dependency-interval", "1s"}
	a := startWorker(t, db.URL, "dep-a", args...)
	startWorker(t, db.URL, "dep-b", args...)

	// Kill a while it runs dispatch jobs, once some events are done.
	dispatched := func() int {
		return fftest.Count(t, pool, `SELECT count(*) FROM ff_completion_event WHERE dispatched_at_ms IS NOT NULL`)
	}
	runningOfA := func() int {
		return fftest.Count(t, pool, `SELECT count(*) FROM `+testdb.RiverSchema+`.river_job
			WHERE kind = 'ff.dependency.dispatch' AND state = 'running' AND attempted_by[array_upper(attempted_by, 1)] = 'dep-a'`)
	}
	killedRunning := 0
	fleettest.WaitFor(t, 6*time.Minute, "dep-a running dispatch jobs with 100 events dispatched and more left", func() (bool, string) {
		d := dispatched()
		if d >= n {
			return true, "all dispatched before the kill"
		}
		// Some events committed, dep-a in the middle of others: every
		// event's dispatch takes the hot group's lock in turn, so the
		// 1,500 take seconds and the poll lands inside them.
		if r := runningOfA(); r > 0 && d >= 100 {
			killedRunning = r
			a.kill()
			return true, ""
		}
		return false, fleettest.Statusf("%d dispatched", d)
	})
	if killedRunning == 0 {
		t.Fatalf("every event was dispatched before dep-a was seen running a dispatch job: nothing was killed mid-cascade")
	}
	t.Logf("dep-a SIGKILLed running %d dispatch jobs, %d of %d events dispatched", killedRunning, dispatched(), n)
	if err := a.startReady(90 * time.Second); err != nil {
		t.Fatal(err)
	}

	fleettest.WaitFor(t, 9*time.Minute, "every event dispatched", func() (bool, string) {
		d := dispatched()
		return d == n, fleettest.Statusf("%d of %d dispatched", d, n)
	})
	if g := fftest.ReadGroup(t, pool, p, flow, hot); g.Success != n || g.Running != 0 {
		t.Fatalf("hot group %+v, want %d successes: a hop was lost or applied twice", g, n)
	}
	if bad := fftest.Count(t, pool, `SELECT count(*) FROM ff_edge_group
		WHERE partition_key = $1 AND downstream_eid <> $2 AND (success_count <> 1 OR running_count <> 0)`, p, hot); bad != 0 {
		t.Fatalf("%d own groups not advanced exactly once", bad)
	}
	if ready := fftest.Count(t, pool, `SELECT count(*) FROM ff_exec_core
		WHERE partition_key = $1 AND lane_id = 'chaos' AND eligibility_state = 'eligible_now'`, p); ready != 3*n {
		t.Fatalf("%d own downstreams eligible, want %d", ready, 3*n)
	}
}
