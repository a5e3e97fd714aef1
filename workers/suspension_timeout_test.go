package workers_test

import (
	"context"
	"fmt"
	"reflect"
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

// TestSuspensionTimeoutFleet runs every timeout behaviour through a fleet:
// terminal behaviours write one completion event with the execution's
// tenant, an unknown behaviour is applied as fail with a warning naming the
// row, auto-resume appends a signal per timeout (two after the timeout is set
// again), a missing execution writes no event, and a suspension not due is
// left alone.
func TestSuspensionTimeoutFleet(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	pool := db.Pool
	now := store.NowMs()
	suspended := func(p int16, flow string) fftest.Exec {
		return fftest.Exec{Partition: p, FlowID: flow, LifecyclePhase: "suspended", OwnershipState: "unowned",
			PublicState: "suspended", AttemptState: "attempt_interrupted", Namespace: "ns-1",
			Tags: map[string]string{"cairn.instance_id": "inst-9"}}
	}

	type terminal struct {
		p        int16
		id, flow string
		reason   string
		outcome  string
	}
	var terms []terminal
	for i, b := range []struct {
		behavior        *string
		reason, outcome string
	}{
		{nil, "suspension_timeout_fail", "expired"},
		{fftest.Str("fail"), "suspension_timeout_fail", "expired"},
		{fftest.Str("cancel"), "suspension_timeout_cancel", "cancelled"},
		{fftest.Str("expire"), "suspension_timeout_expire", "expired"},
		{fftest.Str("escalate"), "suspension_timeout_escalate", "expired"},
		{fftest.Str("bogus"), "suspension_timeout_fail", "expired"},
	} {
		p, flow := int16(10*i+3), fftest.NewUUID()
		id := fftest.InsertExec(t, pool, suspended(p, flow))
		fftest.InsertSuspension(t, pool, fftest.Suspension{Partition: p, ExecutionID: id,
			TimeoutAtMs: fftest.Ms(now - 1000 + int64(i)), Behavior: b.behavior})
		terms = append(terms, terminal{p, id, flow, b.reason, b.outcome})
	}
	bogus := terms[len(terms)-1].id
	resume := fftest.InsertExec(t, pool, suspended(77, ""))
	fftest.InsertSuspension(t, pool, fftest.Suspension{Partition: 77, ExecutionID: resume, TimeoutAtMs: fftest.Ms(now - 500),
		Behavior: fftest.Str(store.TimeoutAutoResume)})
	orphan := fftest.NewUUID()
	fftest.InsertSuspension(t, pool, fftest.Suspension{Partition: 78, ExecutionID: orphan, TimeoutAtMs: fftest.Ms(now - 500)})
	later := fftest.InsertExec(t, pool, suspended(79, ""))
	fftest.InsertSuspension(t, pool, fftest.Suspension{Partition: 79, ExecutionID: later, TimeoutAtMs: fftest.Ms(now + 3_600_000)})

	logger, logs := captureLogger(t)
	f := fleettest.Start(t, db, fleet.Config{Reconcilers: fleettest.Fast(workers.SuspensionTimeout), Logger: logger})

	timeoutSignals := func() int {
		su, ok := fftest.ReadSuspension(t, pool, 77, resume)
		if !ok || su.TimeoutAtMs != nil {
			return 0
		}
		mm, _ := su.MemberMap.(map[string]any)
		arr, _ := mm["__timeout__"].([]any)
		return len(arr)
	}
	// Polls read in-process counters or single rows: a count over a
	// 256-partition table locks every child and index, and many such polls
	// from parallel tests exhaust the server's lock table.
	applied := func() int64 { return f.Workers.Stats().For(workers.SuspensionTimeout.Name).Applied.Load() }
	fleettest.WaitFor(t, fleettest.Patient, "every due suspension handled", func() (bool, string) {
		return applied() >= int64(len(terms)+2), fleettest.Statusf("%d applied", applied())
	})
	if n := fftest.Count(t, pool, `SELECT count(*) FROM ff_suspension_current
		WHERE partition_key = ANY($1) AND timeout_at_ms < $2`, []int16{3, 13, 23, 33, 43, 53, 77, 78}, now); n != 0 || timeoutSignals() != 1 {
		t.Fatalf("%d due suspensions left, %d timeout signals; want 0 and 1", n, timeoutSignals())
	}
	for _, tc := range terms {
		ex := fftest.ReadExec(t, pool, tc.p, tc.id)
		if ex.LifecyclePhase != "terminal" || ex.CancellationReason == nil || *ex.CancellationReason != tc.reason {
			t.Fatalf("exec %s = %+v; want terminal with %s", tc.id, ex, tc.reason)
		}
		evs := fftest.CompletionEvents(t, pool, tc.id)
		if len(evs) != 1 || evs[0].Outcome != tc.outcome || evs[0].FlowID == nil || *evs[0].FlowID != tc.flow ||
			evs[0].Namespace == nil || *evs[0].Namespace != "ns-1" || evs[0].InstanceTag == nil || *evs[0].InstanceTag != "inst-9" {
			t.Fatalf("events of %s = %+v; want one %s with flow, namespace ns-1, tag inst-9", tc.id, evs, tc.outcome)
		}
	}
	if _, ok := fftest.ReadSuspension(t, pool, 78, orphan); ok {
		t.Fatal("suspension of a missing execution not deleted")
	}
	if n := len(fftest.CompletionEvents(t, pool, orphan)); n != 0 {
		t.Fatalf("%d events for a missing execution; want 0", n)
	}
	if !strings.Contains(logs(), "unknown suspension timeout behaviour") || !strings.Contains(logs(), bogus) {
		t.Fatalf("no warning naming the row with the unknown behaviour; logs:\n%s", logs())
	}
	if !strings.Contains(logs(), orphan) {
		t.Fatalf("no warning naming the suspension whose execution is missing; logs:\n%s", logs())
	}

	// Time out the auto-resumed suspension again: a second signal.
	if _, err := pool.Exec(context.Background(), `UPDATE ff_suspension_current SET timeout_at_ms = $1
		WHERE partition_key = 77 AND execution_id = $2`, store.NowMs()-1, resume); err != nil {
		t.Fatal(err)
	}
	fleettest.WaitFor(t, fleettest.Patient, "a second timeout signal", func() (bool, string) {
		n := timeoutSignals()
		return n == 2, fleettest.Statusf("%d signals", n)
	})
	if ex := fftest.ReadExec(t, pool, 77, resume); ex.LifecyclePhase != "suspended" {
		t.Fatalf("auto-resumed execution = %s; want suspended", ex.LifecyclePhase)
	}
	if n := len(fftest.CompletionEvents(t, pool, resume)); n != 0 {
		t.Fatalf("%d events for an auto-resumed execution; want 0", n)
	}
	if su, ok := fftest.ReadSuspension(t, pool, 79, later); !ok || su.TimeoutAtMs == nil {
		t.Fatal("a suspension not yet due was touched")
	}
	st := f.Workers.Stats().For(workers.SuspensionTimeout.Name).Snapshot()
	if want := int64(len(terms) + 3); st.Applied != want || st.Errors != 0 {
		t.Fatalf("stats = %+v; want %d applied, no errors", st, want)
	}
}

// TestSuspensionTimeoutTwoClientsExactlyOnce runs two fleet processes on one
// database while suspensions keep timing out: each execution gets exactly
// one completion event, although the timed-out ones also have two duplicate
// expire jobs each (no unique key), which both processes run at once; the
// test fails unless both ran row jobs and the duplicates were no-ops.
func TestSuspensionTimeoutTwoClientsExactlyOnce(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	pool := db.Pool
	const rows = 300
	now := store.NowMs()
	behaviors := []*string{nil, fftest.Str("fail"), fftest.Str("cancel"), fftest.Str("expire"), fftest.Str("escalate")}
	parts := somePartitions(40)
	var dups []string
	for i := range rows {
		p := parts[i%len(parts)]
		id := fftest.InsertExec(t, pool, fftest.Exec{Partition: p, LifecyclePhase: "suspended", Namespace: "ns"})
		at := now - 1000
		if i%2 == 1 {
			at = now + int64(i)*2000/rows
		} else {
			dups = append(dups, fmt.Sprintf(`{"partition": %d, "execution_id": %q}`, p, id))
		}
		fftest.InsertSuspension(t, pool, fftest.Suspension{Partition: p, ExecutionID: id, TimeoutAtMs: fftest.Ms(at),
			Behavior: behaviors[i%len(behaviors)]})
	}
	duplicateRowJobs(t, db, jobs.KindSuspensionExpire, dups, 2)
	cfg := fleet.Config{Reconcilers: fleettest.Fast(workers.SuspensionTimeout), BatchSize: 50}
	f1 := fleettest.Start(t, db, cfg)
	f2 := fleettest.Start(t, db, cfg)

	applied := func() int64 {
		return f1.Workers.Stats().For(workers.SuspensionTimeout.Name).Applied.Load() +
			f2.Workers.Stats().For(workers.SuspensionTimeout.Name).Applied.Load()
	}
	fleettest.WaitFor(t, 2*time.Minute, "every suspension timed out", func() (bool, string) {
		return applied() >= rows, fleettest.Statusf("%d applied", applied())
	})
	if n := fftest.Count(t, pool, `SELECT count(*) FROM ff_suspension_current WHERE partition_key = ANY($1)`, parts); n != 0 {
		t.Fatalf("%d suspensions left", n)
	}
	if n := fftest.Count(t, pool, `SELECT count(*) FROM ff_completion_event WHERE partition_key = ANY($1)`, parts); n != rows {
		t.Fatalf("%d completion events for %d suspensions; want exactly one each", n, rows)
	}
	if n := fftest.Count(t, pool, `SELECT count(*) FROM (SELECT execution_id FROM ff_completion_event
		WHERE partition_key = ANY($1) GROUP BY 1 HAVING count(*) > 1) d`, parts); n != 0 {
		t.Fatalf("%d executions have more than one completion event", n)
	}
	if n := fftest.Count(t, pool, `SELECT count(*) FROM ff_exec_core WHERE partition_key = ANY($1)
		AND lifecycle_phase <> 'terminal'`, parts); n != 0 {
		t.Fatalf("%d executions not terminal", n)
	}
	s1 := f1.Workers.Stats().For(workers.SuspensionTimeout.Name).Snapshot()
	s2 := f2.Workers.Stats().For(workers.SuspensionTimeout.Name).Snapshot()
	if s1.Applied+s2.Applied != rows {
		t.Fatalf("applied %d + %d; want %d", s1.Applied, s2.Applied, rows)
	}
	requireBothRaced(t, workers.SuspensionTimeout, f1, f2, len(dups))
}

// TestSuspensionTimeoutFilterLimitsTheFleet: a fleet limited to one tenant
// never touches other tenants' suspensions, nor those without an execution.
func TestSuspensionTimeoutFilterLimitsTheFleet(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	pool := db.Pool
	now := store.NowMs()
	mine := fftest.InsertExec(t, pool, fftest.Exec{Partition: 1, LifecyclePhase: "suspended", Namespace: "mine",
		Tags: map[string]string{"cairn.instance_id": "i-1"}})
	wrongTag := fftest.InsertExec(t, pool, fftest.Exec{Partition: 1, LifecyclePhase: "suspended", Namespace: "mine",
		Tags: map[string]string{"cairn.instance_id": "i-2"}})
	other := fftest.InsertExec(t, pool, fftest.Exec{Partition: 2, LifecyclePhase: "suspended", Namespace: "other"})
	orphan := fftest.NewUUID()
	fftest.InsertSuspension(t, pool, fftest.Suspension{Partition: 1, ExecutionID: mine, TimeoutAtMs: fftest.Ms(now - 10)})
	fftest.InsertSuspension(t, pool, fftest.Suspension{Partition: 1, ExecutionID: wrongTag, TimeoutAtMs: fftest.Ms(now - 10)})
	fftest.InsertSuspension(t, pool, fftest.Suspension{Partition: 2, ExecutionID: other, TimeoutAtMs: fftest.Ms(now - 10)})
	fftest.InsertSuspension(t, pool, fftest.Suspension{Partition: 3, ExecutionID: orphan, TimeoutAtMs: fftest.Ms(now - 10)})

	f := fleettest.Start(t, db, fleet.Config{
		Reconcilers: fleettest.Fast(workers.SuspensionTimeout),
		Filter:      store.Filter{Namespace: "mine", TagKey: "cairn.instance_id", TagValue: "i-1"},
	})
	fleettest.WaitFor(t, fleettest.Patient, "the tenant's suspension timed out", func() (bool, string) {
		_, ok := fftest.ReadSuspension(t, pool, 1, mine)
		return !ok, "still suspended"
	})
	waitTicks(t, f, workers.SuspensionTimeout, 2)
	if n := fftest.Count(t, pool, `SELECT count(*) FROM ff_suspension_current WHERE partition_key IN (1, 2, 3)`); n != 3 {
		t.Fatalf("%d suspensions left; want 3 (other tag, other tenant, orphan)", n)
	}
	if n := fftest.Count(t, pool, `SELECT count(*) FROM ff_completion_event WHERE partition_key IN (1, 2, 3)`); n != 1 {
		t.Fatalf("%d completion events; want 1", n)
	}
}

// TestSuspensionTimeoutLeavesResumedExecutionsAlone is the race FlowFabric's
// deliver_signal leaves behind, run through a fleet: a satisfied suspension
// keeps its lapsed timeout while its execution is runnable (resumable), or
// already claimed again and running. The fleet leaves both executions as they
// are, writes no completion event for them, and enqueues one row job for each
// suspension, ever: its action clears the timeout, so later ticks find
// nothing due. A still-suspended execution beside them times out as always.
// A regression shows as a resumed execution ended (suspension_timeout_fail,
// an `expired` event: FlowFabric's reconciler and this fleet before), or as
// a row job per suspension per tick.
func TestSuspensionTimeoutLeavesResumedExecutionsAlone(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	pool := db.Pool
	now := store.NowMs()
	resumed := map[string]fftest.Exec{
		"resumable": {Partition: 4, LifecyclePhase: "runnable", OwnershipState: "released", EligibilityState: "eligible_now",
			PublicState: "resumable", AttemptState: "attempt_interrupted", Namespace: "ns"},
		"claimed again": {Partition: 5, LifecyclePhase: "active", OwnershipState: "leased", EligibilityState: "not_applicable",
			PublicState: "running", AttemptState: "running_attempt", Namespace: "ns"},
	}
	ids := map[string]string{}
	before := map[string]map[string]any{}
	for name, e := range resumed {
		id := fftest.InsertExec(t, pool, e)
		fftest.InsertAttempt(t, pool, e.Partition, id, 0, nil)
		fftest.InsertSuspension(t, pool, fftest.Suspension{Partition: e.Partition, ExecutionID: id, TimeoutAtMs: fftest.Ms(now - 1000)})
		ids[name], before[name] = id, fftest.ExecJSON(t, pool, e.Partition, id)
	}
	control := fftest.InsertExec(t, pool, fftest.Exec{Partition: 6, LifecyclePhase: "suspended", OwnershipState: "released",
		EligibilityState: "not_applicable", PublicState: "suspended", AttemptState: "attempt_interrupted", Namespace: "ns"})
	fftest.InsertSuspension(t, pool, fftest.Suspension{Partition: 6, ExecutionID: control, TimeoutAtMs: fftest.Ms(now - 1000)})

	f := fleettest.Start(t, db, fleet.Config{Reconcilers: fleettest.Fast(workers.SuspensionTimeout)})
	stats := f.Workers.Stats().For(workers.SuspensionTimeout.Name)
	fleettest.WaitFor(t, fleettest.Patient, "the suspended execution timed out and both resumed ones passed over", func() (bool, string) {
		s := stats.Snapshot()
		return s.Applied == 1 && s.NoOpsByReason["not_suspended"] == 2, fleettest.Statusf("%+v", s)
	})
	waitTicks(t, f, workers.SuspensionTimeout, 3)

	for name, e := range resumed {
		id := ids[name]
		if after := fftest.ExecJSON(t, pool, e.Partition, id); !reflect.DeepEqual(after, before[name]) {
			t.Errorf("%s execution changed:\nbefore %v\nafter  %v", name, before[name], after)
		}
		if n := len(fftest.CompletionEvents(t, pool, id)); n != 0 {
			t.Errorf("%s execution: %d completion events; want 0", name, n)
		}
		if su, ok := fftest.ReadSuspension(t, pool, e.Partition, id); !ok || su.TimeoutAtMs != nil {
			t.Errorf("%s execution's suspension = %+v (exists %v); want kept, its timeout cleared", name, su, ok)
		}
		if n := fftest.Count(t, pool, `SELECT count(*) FROM river.river_job WHERE kind = $1 AND args->>'execution_id' = $2`,
			jobs.KindSuspensionExpire, id); n != 1 {
			t.Errorf("%s execution: %d row jobs over %d ticks; want 1", name, n, stats.Ticks.Load())
		}
	}
	if ex := fftest.ReadExec(t, pool, 6, control); ex.LifecyclePhase != "terminal" || ex.PublicState != "failed" {
		t.Errorf("suspended execution = %s/%s; want terminal/failed", ex.LifecyclePhase, ex.PublicState)
	}
}
