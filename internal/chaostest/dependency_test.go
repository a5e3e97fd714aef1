package chaostest

import (
	"context"
	"fmt"
	"testing"
	"time"

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
	if _, err := pool.Exec(ctx, `
		WITH ev AS (
		    SELECT gen_random_uuid() AS up FROM generate_series(1, $1)
		), downs AS (
		    SELECT ev.up, gen_random_uuid() AS down FROM ev, generate_series(1, 3)
		), ux AS (
		    INSERT INTO ff_exec_core (partition_key, execution_id, flow_id, lane_id, lifecycle_phase, ownership_state,
		           eligibility_state, public_state, attempt_state, created_at_ms)
		    SELECT $2, up, $3, 'chaos', 'terminal', 'unowned', 'not_applicable', 'completed', 'attempt_terminal', 1 FROM ev
		), dx AS (
		    INSERT INTO ff_exec_core (partition_key, execution_id, flow_id, lane_id, lifecycle_phase, ownership_state,
		           eligibility_state, public_state, attempt_state, created_at_ms)
		    SELECT $2, down, $3, 'chaos', 'blocked', 'unowned', 'blocked_by_dependencies', 'waiting', 'pending', 1 FROM downs
		), hot AS (
		    INSERT INTO ff_edge (partition_key, flow_id, edge_id, upstream_eid, downstream_eid, policy)
		    SELECT $2, $3, gen_random_uuid(), up, $4, '{"kind":"quorum"}' FROM ev
		), own AS (
		    INSERT INTO ff_edge (partition_key, flow_id, edge_id, upstream_eid, downstream_eid, policy)
		    SELECT $2, $3, gen_random_uuid(), up, down, '{"kind":"all_of"}' FROM downs
		), gr AS (
		    INSERT INTO ff_edge_group (partition_key, flow_id, downstream_eid, policy, running_count)
		    SELECT $2, $3, down, '{"kind":"all_of"}', 1 FROM downs
		)
		INSERT INTO ff_completion_event (partition_key, execution_id, flow_id, outcome, occurred_at_ms, committed_at_ms)
		SELECT $2, up, $3, 'success', 1, 1 FROM ev`, n, p, flow, hot); err != nil {
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
