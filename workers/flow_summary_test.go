package workers_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/flowfabric/ffreconcile/internal/ffread"
	"github.com/flowfabric/ffreconcile/internal/fftest"
	"github.com/flowfabric/ffreconcile/internal/fleet"
	"github.com/flowfabric/ffreconcile/internal/fleettest"
	"github.com/flowfabric/ffreconcile/internal/testdb"
	"github.com/flowfabric/ffreconcile/store"
	"github.com/flowfabric/ffreconcile/workers"
)

// seedFlow inserts a flow (its raw_fields raw) with one member per public
// state of states, as FlowFabric's rows read, and returns its id.
func seedFlow(t *testing.T, db store.DB, p int16, raw map[string]any, endedMs int64, states ...string) string {
	t.Helper()
	if raw == nil {
		raw = map[string]any{}
	}
	b, _ := json.Marshal(raw)
	flow := fftest.NewUUID()
	if _, err := db.Exec(context.Background(), `INSERT INTO ff_flow_core (partition_key, flow_id, public_flow_state, created_at_ms, raw_fields)
		VALUES ($1, $2, 'open', 1, $3::jsonb)`, p, flow, string(b)); err != nil {
		t.Fatal(err)
	}
	for _, ps := range states {
		e := fftest.Exec{Partition: p, FlowID: flow, PublicState: ps}
		switch ps {
		case "completed", "failed":
			e.LifecyclePhase, e.OwnershipState, e.EligibilityState, e.AttemptState = "terminal", "unowned", "not_applicable", "attempt_terminal"
			e.TerminalAtMs = fftest.Ms(endedMs)
		case "waiting":
			e.LifecyclePhase, e.OwnershipState, e.EligibilityState, e.AttemptState = "runnable", "unowned", "eligible_now", "pending"
		}
		fftest.InsertExec(t, db, e)
	}
	return flow
}

// TestFlowSummaryKeepsTheRollup runs flow summary in a fleet, on both
// schemas: a flow that ended before the fleet started is projected (the
// backfill), a running flow is projected at every tick, a flow whose last
// member ends is projected with its final counts and then left alone (its
// summary's time stops moving), a flow whose member is replayed out of its
// terminal state is projected again, and a filtered fleet writes only its
// tenant's flows (by the flow's own namespace and top-level tag). A
// regression shows as a flow never projected, a finished flow recomputed at
// every tick (idle cost growing with finished flows), or another tenant's
// flow projected.
func TestFlowSummaryKeepsTheRollup(t *testing.T) {
	t.Parallel()
	testdb.EachSchema(t, func(t *testing.T, db *testdb.DB) {
		ctx := context.Background()
		pool := db.Pool
		old := store.NowMs() - time.Hour.Milliseconds()
		mine := map[string]any{"namespace": "acme", "cairn.instance_id": "i-1"}
		before := seedFlow(t, pool, 2, mine, old, "completed", "failed")
		running := seedFlow(t, pool, 3, mine, old, "running", "waiting", "completed")
		// In the running flow's partition, which every tick passes over.
		ending := seedFlow(t, pool, 3, mine, old, "completed", "running")
		other := seedFlow(t, pool, 5, map[string]any{"namespace": "other"}, old, "waiting")
		untagged := seedFlow(t, pool, 6, map[string]any{"namespace": "acme"}, old, "waiting")

		f := fleettest.Start(t, db, fleet.Config{Reconcilers: fleettest.Fast(workers.FlowSummary),
			Filter: store.Filter{Namespace: "acme", TagKey: "cairn.instance_id", TagValue: "i-1"}})
		summary := func(p int16, flow string) (ffread.FlowSummary, bool) {
			s, ok, err := ffread.ReadFlowSummary(ctx, pool, p, flow)
			if err != nil {
				t.Fatal(err)
			}
			return s, ok
		}
		fleettest.WaitFor(t, 3*time.Minute, "the tenant's flows projected", func() (bool, string) {
			_, a := summary(2, before)
			_, b := summary(3, running)
			_, c := summary(3, ending)
			return a && b && c, fleettest.Statusf("ended before %v, running %v, ending %v", a, b, c)
		})
		if s, _ := summary(2, before); s.PublicFlowState != "failed" || s.TotalMembers != 2 || s.MembersFailed != 1 {
			t.Errorf("flow ended before the fleet: %+v; want failed, 2 members", s)
		}
		if s, _ := summary(3, running); s.PublicFlowState != "running" || s.MembersActive != 1 || s.MembersWaiting != 1 {
			t.Errorf("running flow: %+v; want running (its claim's running member counted as active)", s)
		}
		for p, flow := range map[int16]string{5: other, 6: untagged} {
			if _, ok := summary(p, flow); ok {
				t.Errorf("flow %s of another tenant projected", flow)
			}
		}

		// The last member ends: the final counts, then no more passes.
		if _, err := pool.Exec(ctx, `UPDATE ff_exec_core SET lifecycle_phase = 'terminal', public_state = 'completed',
			terminal_at_ms = $2 WHERE partition_key = 3 AND flow_id = $1`, ending, store.NowMs()); err != nil {
			t.Fatal(err)
		}
		fleettest.WaitFor(t, 3*time.Minute, "the ended flow's final projection", func() (bool, string) {
			s, _ := summary(3, ending)
			return s.PublicFlowState == "completed", fleettest.Statusf("%+v", s)
		})
		// Past the settle point (the passes' clock moved on past it),
		// the flow's members are behind the mark: its summary is
		// written no more, while the running flow's is.
		f.Workers.StubScanClock(func() time.Time {
			return time.Now().Add(time.Duration(store.FlowSummarySettle+1000) * time.Millisecond)
		})
		waitTicks(t, f, workers.FlowSummary, 2)
		settled, _ := summary(3, ending)
		runningBefore, _ := summary(3, running)
		waitTicks(t, f, workers.FlowSummary, 3)
		if s, _ := summary(3, ending); s.LastSummaryUpdateAt != settled.LastSummaryUpdateAt {
			t.Errorf("a finished flow was projected again at %d (last at %d): recomputed at every tick", s.LastSummaryUpdateAt, settled.LastSummaryUpdateAt)
		}
		if s, _ := summary(3, running); s.LastSummaryUpdateAt == runningBefore.LastSummaryUpdateAt {
			t.Errorf("the running flow was not projected again over three ticks")
		}

		// A member replayed out of its terminal state: projected again.
		if _, err := pool.Exec(ctx, `UPDATE ff_exec_core SET lifecycle_phase = 'runnable', public_state = 'waiting_children',
			eligibility_state = 'blocked_by_dependencies', terminal_at_ms = NULL
			WHERE partition_key = 2 AND flow_id = $1 AND public_state = 'failed'`, before); err != nil {
			t.Fatal(err)
		}
		fleettest.WaitFor(t, 3*time.Minute, "the replayed flow projected again", func() (bool, string) {
			s, _ := summary(2, before)
			return s.PublicFlowState == "blocked" && s.MembersWaitingChildren == 1, fleettest.Statusf("%+v", s)
		})
	})
}
