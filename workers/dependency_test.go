package workers_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/flowfabric/ffreconcile/internal/fftest"
	"github.com/flowfabric/ffreconcile/internal/fleet"
	"github.com/flowfabric/ffreconcile/internal/fleettest"
	"github.com/flowfabric/ffreconcile/internal/testdb"
	"github.com/flowfabric/ffreconcile/store"
	"github.com/flowfabric/ffreconcile/workers"
)

// staleMs is a committed_at_ms old enough for any stale threshold the tests
// use.
func staleMs() int64 { return store.NowMs() - time.Hour.Milliseconds() }

// TestDependencyChainDrainsAtOnce: a failed upstream makes a chain of five
// all_of downstreams impossible, one after another. Only the first event is
// older than the stale threshold (an hour): the skipped events the fleet
// writes are dispatched by jobs inserted in the same commit, so the whole
// chain drains in one tick, under a tenant filter too (the skip events carry
// their downstream's namespace). FlowFabric moves such a chain one hop per tick,
// each skip event first waiting out the threshold. A regression leaves the
// chain stopped at its first hop until the threshold passes, or a hop
// waiting for a poll (River notifies one insert per fetch cooldown).
func TestDependencyChainDrainsAtOnce(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	pool := db.Pool
	p, flow := int16(21), fftest.NewUUID()
	up := fftest.InsertExec(t, pool, fftest.Exec{Partition: p, FlowID: flow, Namespace: "acme"})
	chain := []string{up}
	for range 5 {
		d := fftest.Blocked(p, flow)
		d.Namespace = "acme"
		id := fftest.InsertExec(t, pool, d)
		fftest.Link(t, pool, p, flow, `{"kind":"all_of"}`, id, chain[len(chain)-1])
		chain = append(chain, id)
	}
	fftest.InsertCompletion(t, pool, fftest.Completion{Partition: p, ExecutionID: up, FlowID: flow, Outcome: "failed",
		Namespace: fftest.Str("acme"), CommittedAtMs: staleMs()})

	// Queues poll once a minute: each hop's job must be started by a
	// notification or the fleet's wake-up, not found by a poll.
	f := fleettest.Start(t, db, fleet.Config{Reconcilers: fleettest.Fast(workers.Dependency), Settings: workers.Values{workers.DependencyStaleThreshold: time.Hour},
		Filter: store.Filter{Namespace: "acme"}, FetchPollInterval: time.Minute})
	last := chain[len(chain)-1]
	fleettest.WaitFor(t, fleettest.Patient, "the chain's last downstream skipped", func() (bool, string) {
		evs := fftest.CompletionEvents(t, pool, last)
		return len(evs) == 1 && fftest.Dispatched(t, pool, p, evs[0].EventID), fleettest.Statusf("%+v", fftest.ReadExec(t, pool, p, last))
	})
	for _, d := range chain[1:] {
		if ex := fftest.ReadExec(t, pool, p, d); ex.PublicState != "skipped" {
			t.Fatalf("downstream %s: %+v", d, ex)
		}
	}
	if st := f.Workers.Stats().For(workers.Dependency.Name).Snapshot(); st.Applied != 6 || st.Errors != 0 {
		t.Fatalf("stats %+v, want 6 events dispatched", st)
	}
}

// TestDependencyPrimaryDispatchesOnNotification: with no stale threshold
// the fleet is FlowFabric's primary dispatcher. Its ticks are an hour apart,
// so only FlowFabric's ff_completion notification can start the dispatch of
// an event committed after the fleet started. A regression leaves the event
// for the next tick.
func TestDependencyPrimaryDispatchesOnNotification(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	pool := db.Pool
	listening := make(chan struct{}, 1)
	fleettest.Start(t, db, fleet.Config{
		Reconcilers:       map[string]time.Duration{workers.Dependency.Name: time.Hour},
		Settings:          workers.Values{workers.DependencyStaleThreshold: workers.Off},
		FetchPollInterval: time.Minute, // started by notification, not found by a poll
		Listening: func() {
			select {
			case listening <- struct{}{}:
			default:
			}
		},
	})
	select {
	case <-listening:
	case <-time.After(30 * time.Second):
		t.Fatal("the completion listener never listened")
	}
	p, flow := int16(22), fftest.NewUUID()
	up := fftest.InsertExec(t, pool, fftest.Exec{Partition: p, FlowID: flow})
	down := fftest.InsertExec(t, pool, fftest.Blocked(p, flow))
	fftest.Link(t, pool, p, flow, `{"kind":"all_of"}`, down, up)
	id := fftest.InsertCompletion(t, pool, fftest.Completion{Partition: p, ExecutionID: up, FlowID: flow, Outcome: "success"})
	fleettest.WaitFor(t, fleettest.Patient, "the notified event dispatched", func() (bool, string) {
		return fftest.Dispatched(t, pool, p, id), ""
	})
	if ex := fftest.ReadExec(t, pool, p, down); ex.EligibilityState != "eligible_now" {
		t.Fatalf("downstream %+v", ex)
	}
}

// TestDependencyWithTheCancelPair runs the cascade and the sibling-cancel
// dispatcher end to end: an any_of / cancel_remaining downstream satisfied by
// the cascade queues its live siblings, and cancel_dispatch cancels them. A
// regression leaves the siblings running (no pending group, or members the
// dispatcher cannot use).
func TestDependencyWithTheCancelPair(t *testing.T) {
	t.Parallel()
	testdb.EachSchema(t, func(t *testing.T, db *testdb.DB) {
		pool := db.Pool
		p, flow := int16(23), fftest.NewUUID()
		down := fftest.InsertExec(t, pool, fftest.Blocked(p, flow))
		var ups []string
		for range 3 {
			ups = append(ups, fftest.InsertExec(t, pool, fftest.Exec{Partition: p, FlowID: flow}))
		}
		fftest.Link(t, pool, p, flow, `{"kind":"any_of","on_satisfied":"cancel_remaining"}`, down, ups...)
		fftest.InsertCompletion(t, pool, fftest.Completion{Partition: p, ExecutionID: ups[0], FlowID: flow, Outcome: "success",
			CommittedAtMs: staleMs()})
		fleettest.Start(t, db, fleet.Config{Reconcilers: fleettest.Fast(workers.Dependency, workers.CancelDispatch, workers.CancelReconcile)})
		fleettest.WaitFor(t, fleettest.Patient, "both siblings cancelled", func() (bool, string) {
			n := fftest.Count(t, pool, `SELECT count(*) FROM ff_exec_core WHERE flow_id = $1 AND public_state = 'cancelled'
				AND cancellation_reason = 'sibling_quorum_satisfied'`, flow)
			return n == 2, fleettest.Statusf("%d cancelled", n)
		})
		if ex := fftest.ReadExec(t, pool, p, down); ex.EligibilityState != "eligible_now" {
			t.Fatalf("downstream %+v", ex)
		}
		if ex := fftest.ReadExec(t, pool, p, ups[0]); ex.PublicState == "cancelled" {
			t.Fatal("the winner was cancelled")
		}
	})
}

// TestDependencyHotGroupFromTwoProcesses: 300 events into one fan-in group,
// dispatched by two fleet processes at once (each its own pools and River
// client), arrive exactly: every event claimed once, the counters 300. A
// regression is a counter off by the events two processes both counted or
// neither did.
func TestDependencyHotGroupFromTwoProcesses(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	pool := db.Pool
	const n = 300
	p, flow := int16(24), fftest.NewUUID()
	down := fftest.InsertExec(t, pool, fftest.Blocked(p, flow))
	var ups []string
	for range n {
		ups = append(ups, fftest.InsertExec(t, pool, fftest.Exec{Partition: p, FlowID: flow}))
	}
	fftest.Link(t, pool, p, flow, fmt.Sprintf(`{"kind":"quorum","k":%d}`, n), down, ups...)
	for _, u := range ups {
		fftest.InsertCompletion(t, pool, fftest.Completion{Partition: p, ExecutionID: u, FlowID: flow, Outcome: "success", CommittedAtMs: staleMs()})
	}
	cfg := fleet.Config{Reconcilers: fleettest.Fast(workers.Dependency), BatchSize: 50}
	f1, f2 := fleettest.Start(t, db, cfg), fleettest.Start(t, db, cfg)
	fleettest.WaitFor(t, 3*time.Minute, "every event dispatched", func() (bool, string) {
		left := fftest.Count(t, pool, `SELECT count(*) FROM ff_completion_event WHERE flow_id = $1 AND dispatched_at_ms IS NULL`, flow)
		return left == 0, fleettest.Statusf("%d left", left)
	})
	g := fftest.ReadGroup(t, pool, p, flow, down)
	if g.Success != n || g.Running != 0 {
		t.Fatalf("group %+v, want %d successes", g, n)
	}
	s1 := f1.Workers.Stats().For(workers.Dependency.Name).Snapshot()
	s2 := f2.Workers.Stats().For(workers.Dependency.Name).Snapshot()
	if s1.Applied+s2.Applied != n || s1.Errors+s2.Errors != 0 {
		t.Fatalf("applied %d + %d, errors %d + %d; want %d applied in all", s1.Applied, s2.Applied, s1.Errors, s2.Errors, n)
	}
	if s1.Applied == 0 || s2.Applied == 0 {
		t.Logf("one process dispatched every event (%d, %d): the race was not exercised this run", s1.Applied, s2.Applied)
	}
}
