package ffread_test

import (
	"context"
	"errors"
	"reflect"
	"testing"
	"time"

	"github.com/flowfabric/ffreconcile/internal/ffread"
	"github.com/flowfabric/ffreconcile/internal/fftest"
	"github.com/flowfabric/ffreconcile/internal/testdb"
	"github.com/flowfabric/ffreconcile/store"
)

// suspended inserts an execution as FlowFabric's suspend leaves it
// (suspend_ops.rs:584-626): suspended, ownership 'released', attempt 0
// released with its epoch bumped to 2 and outcome 'attempt_interrupted',
// and a suspension with memberMap (nil: {}) timing out at timeoutAtMs.
func suspended(t *testing.T, db store.DB, p int16, memberMap any, timeoutAtMs int64) string {
	t.Helper()
	id := fftest.InsertExec(t, db, fftest.Exec{Partition: p, LifecyclePhase: "suspended", OwnershipState: "released",
		EligibilityState: "not_applicable", PublicState: "suspended", AttemptState: "attempt_interrupted",
		RawFields: describable(map[string]any{"current_waitpoint_id": "5d0f8f0e-1d7b-4f55-8d8e-7a8e9c1f2a33"})})
	fftest.InsertAttempt(t, db, p, id, 0, nil)
	setAttempt(t, db, p, id, 0, "worker_id = NULL, worker_instance_id = NULL, lease_epoch = 2, outcome = 'attempt_interrupted'")
	fftest.InsertSuspension(t, db, fftest.Suspension{Partition: p, ExecutionID: id, TimeoutAtMs: fftest.Ms(timeoutAtMs),
		MemberMap: memberMap})
	return id
}

// testDeliverSignalThenClaimResumed walks a suspended execution through
// FlowFabric's signal path: a satisfying signal makes it resumable (and
// leaves its suspension and timeout in place), then claim_resumed makes it
// active with a new lease and an 'acquired' event, and each step reads back
// through read_execution_info, describe and observe_signals as FlowFabric
// shows it. A regression shows as a write FlowFabric does not make (the
// suspension deleted, the timeout cleared, ownership changed), one it makes
// missing (the waitpoints kept, no 'resumable' event), the gate letting a
// second claim through, or the typed resume accepting a resumable row.
func testDeliverSignalThenClaimResumed(t *testing.T, db *testdb.DB) {
	t.Parallel()
	ctx := context.Background()
	pool := db.Pool
	const p = int16(10)
	const now = int64(8_000_000)

	id := suspended(t, pool, p, nil, now+60_000)
	wp := fftest.InsertWaitpoint(t, pool, fftest.Waitpoint{Partition: p, ExecutionID: id, Key: "approval"})
	other := fftest.InsertWaitpoint(t, pool, fftest.Waitpoint{Partition: p, ExecutionID: id, Key: "other"})

	sigID, err := ffread.DeliverSignalSatisfied(ctx, pool, p, id, "approval",
		ffread.Signal{Name: "approved", Category: "human", SourceType: "user", SourceIdentity: "alice", Payload: []byte{0xca, 0xfe}}, now)
	if err != nil {
		t.Fatal(err)
	}

	ex := fftest.ReadExec(t, pool, p, id)
	if ex.PublicState != "resumable" || ex.LifecyclePhase != "runnable" || ex.EligibilityState != "eligible_now" ||
		ex.OwnershipState != "released" || ex.AttemptState != "attempt_interrupted" {
		t.Fatalf("exec after the signal = %+v", ex)
	}
	if fftest.WaitpointExists(t, pool, p, wp) || fftest.WaitpointExists(t, pool, p, other) {
		t.Fatal("waitpoints kept; deliver_signal deletes all of the execution's")
	}
	evs := fftest.CompletionEvents(t, pool, id)
	if len(evs) != 1 || evs[0].Outcome != "resumable" || evs[0].OccurredAtMs != now || evs[0].FlowID != nil || evs[0].Namespace != nil {
		t.Fatalf("completion events = %+v; want one bare 'resumable' at now", evs)
	}
	sus, ok := fftest.ReadSuspension(t, pool, p, id)
	if !ok || sus.TimeoutAtMs == nil || *sus.TimeoutAtMs != now+60_000 {
		t.Fatalf("suspension = %+v, %v; want kept with its timeout", sus, ok)
	}
	wantBlob := map[string]any{"signal_id": sigID, "signal_name": "approved", "signal_category": "human", "source_type": "user",
		"source_identity": "alice", "correlation_id": "", "accepted_at": float64(now), "payload_hex": "cafe"}
	if got := sus.MemberMap.(map[string]any)["approval"]; !reflect.DeepEqual(got, []any{wantBlob}) {
		t.Fatalf("member_map.approval = %v; want [%v]", got, wantBlob)
	}

	sigs, err := ffread.ObserveSignals(ctx, pool, p, id)
	wantSig := ffread.ResumeSignal{WaitpointKey: "approval", SignalID: sigID, SignalName: "approved", SignalCategory: "human",
		SourceType: "user", SourceIdentity: "alice", AcceptedAtMs: now, Payload: []byte{0xca, 0xfe}}
	if err != nil || !reflect.DeepEqual(sigs, []ffread.ResumeSignal{wantSig}) {
		t.Fatalf("observe_signals = %+v, %v; want [%+v]", sigs, err, wantSig)
	}
	info, err := ffread.ReadExecutionInfo(ctx, pool, p, id)
	if err != nil {
		t.Fatal(err)
	}
	if want := (ffread.StateVector{LifecyclePhase: "runnable", OwnershipState: "unowned", EligibilityState: "eligible_now",
		BlockingReason: "none", TerminalOutcome: "none", AttemptState: "attempt_interrupted", PublicState: "resumable"}); info.StateVector != want {
		t.Fatalf("state vector = %+v; want %+v", info.StateVector, want)
	}
	if snap, err := ffread.DescribeExecution(ctx, pool, p, id); err != nil || snap.PublicState != "resumable" {
		t.Fatalf("describe = %+v, %v; want resumable", snap, err)
	}
	if _, err := ffread.ResumeExecution(ctx, pool, p, id, 0); !errors.Is(err, ffread.ErrExecutionNotSuspended) {
		t.Fatalf("typed resume of a resumable row: %v; want ErrExecutionNotSuspended (its lifecycle is runnable)", err)
	}

	before := time.Now().UnixMilli()
	claimed, err := ffread.ClaimResumedExecution(ctx, pool, p, id, "w2", "w2-i1", 30_000)
	if err != nil {
		t.Fatal(err)
	}
	if claimed.LeaseEpoch != 3 || claimed.AttemptIndex != 0 || claimed.LeaseExpiresAtMs < before+30_000 || claimed.LeaseID == "" {
		t.Fatalf("claimed = %+v; want epoch 3, attempt 0, lease expiring 30 s on", claimed)
	}
	ex = fftest.ReadExec(t, pool, p, id)
	if ex.LifecyclePhase != "active" || ex.OwnershipState != "leased" || ex.EligibilityState != "not_applicable" ||
		ex.PublicState != "running" || ex.AttemptState != "running_attempt" {
		t.Fatalf("exec after the claim = %+v", ex)
	}
	row := fftest.ExecJSON(t, pool, p, id)
	if s, _ := row["started_at_ms"].(float64); int64(s) < before {
		t.Fatalf("started_at_ms = %v; want set at the claim", row["started_at_ms"])
	}
	at := attemptJSON(t, pool, p, id, 0)
	if at["worker_id"] != "w2" || at["worker_instance_id"] != "w2-i1" || at["lease_epoch"] != float64(3) ||
		at["outcome"] != nil || at["lease_expires_at_ms"] != float64(claimed.LeaseExpiresAtMs) {
		t.Fatalf("attempt = %v", at)
	}
	lev := fftest.LeaseEvents(t, pool, id)
	if len(lev) != 1 || lev[0].EventType != "acquired" || lev[0].Namespace == nil || *lev[0].Namespace != "tenant-a" ||
		lev[0].InstanceTag == nil || *lev[0].InstanceTag != "inst-1" {
		t.Fatalf("lease events = %+v; want one 'acquired' with namespace and instance tag", lev)
	}
	var leaseID *string
	if err := pool.QueryRow(ctx, `SELECT lease_id FROM ff_lease_event WHERE event_id = $1`, lev[0].EventID).Scan(&leaseID); err != nil ||
		leaseID == nil || *leaseID != claimed.LeaseID {
		t.Fatalf("lease_id = %v, %v; want %s", leaseID, err, claimed.LeaseID)
	}
	if _, ok := fftest.ReadSuspension(t, pool, p, id); !ok {
		t.Fatal("the claim deleted the suspension; FlowFabric leaves it")
	}

	info, err = ffread.ReadExecutionInfo(ctx, pool, p, id)
	if err != nil || info.PublicState != "active" || info.StateVector.AttemptState != "running_attempt" ||
		info.StateVector.OwnershipState != "leased" || info.StartedAt == nil {
		t.Fatalf("read_execution_info after the claim = %+v, %v", info, err)
	}
	_, err = ffread.DescribeExecution(ctx, pool, p, id)
	wantErrText(t, err, "'running' is not a known public state")

	if _, err := ffread.ClaimResumedExecution(ctx, pool, p, id, "w3", "w3-i1", 30_000); !errors.Is(err, ffread.ErrNotAResumedExecution) {
		t.Fatalf("second claim: %v; want ErrNotAResumedExecution", err)
	}
	if _, err := ffread.ClaimResumedExecution(ctx, pool, p, fftest.NewUUID(), "w", "w-i", 1); !errors.Is(err, ffread.ErrNotFound) {
		t.Fatalf("claim of a missing execution: %v; want not found", err)
	}
}

// testDeliverSignalAppends: signals to the same waitpoint key accumulate
// in order, and observe_signals lists keys in byte order. A regression
// shows as a second signal replacing the first or keys in insertion order.
func testDeliverSignalAppends(t *testing.T, db *testdb.DB) {
	t.Parallel()
	ctx := context.Background()
	const p = int16(11)
	id := suspended(t, db.Pool, p, nil, 1)
	for i, d := range []struct{ key, name string }{{"zeta", "first"}, {"zeta", "second"}, {"alpha", "third"}} {
		if _, err := ffread.DeliverSignalSatisfied(ctx, db.Pool, p, id, d.key, ffread.Signal{Name: d.name}, int64(i)); err != nil {
			t.Fatal(err)
		}
	}
	sigs, err := ffread.ObserveSignals(ctx, db.Pool, p, id)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, s := range sigs {
		got = append(got, s.WaitpointKey+"/"+s.SignalName)
	}
	if want := []string{"alpha/third", "zeta/first", "zeta/second"}; !reflect.DeepEqual(got, want) {
		t.Fatalf("signals = %v; want %v", got, want)
	}
	if n := len(fftest.CompletionEvents(t, db.Pool, id)); n != 3 {
		t.Fatalf("%d completion events; each satisfied delivery writes one", n)
	}
}

// testDeliverSignalRefuses: deliver_signal's own refusals, each leaving the
// execution untouched: no suspension (NotFound), a member_map that is not
// an object, and an entry that is not an array (the object FlowFabric's
// pending-waitpoint expiry writes, or null). A regression shows as such a
// member_map overwritten or the execution made resumable anyway.
func testDeliverSignalRefuses(t *testing.T, db *testdb.DB) {
	t.Parallel()
	ctx := context.Background()
	const p = int16(12)

	tests := []struct {
		name      string
		memberMap any // nil: no suspension at all
		wantErr   string
	}{
		{name: "NoSuspension", wantErr: "not found: suspension"},
		{name: "MemberMapArray", memberMap: []any{}, wantErr: "validation: Corruption: member_map not a JSON object"},
		{name: "EntryObject", memberMap: map[string]any{"k": map[string]any{"status": "never_committed"}},
			wantErr: "validation: Corruption: member_map[wp_key] not a JSON array"},
		{name: "EntryNull", memberMap: map[string]any{"k": nil}, wantErr: "validation: Corruption: member_map[wp_key] not a JSON array"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var id string
			if tt.memberMap == nil {
				id = fftest.InsertExec(t, db.Pool, fftest.Exec{Partition: p, LifecyclePhase: "suspended", PublicState: "suspended"})
			} else {
				id = suspended(t, db.Pool, p, tt.memberMap, 1)
			}
			before := fftest.ExecJSON(t, db.Pool, p, id)
			_, err := ffread.DeliverSignalSatisfied(ctx, db.Pool, p, id, "k", ffread.Signal{Name: "s"}, 5)
			if err == nil || err.Error() != tt.wantErr {
				t.Fatalf("err = %v; want %s", err, tt.wantErr)
			}
			if after := fftest.ExecJSON(t, db.Pool, p, id); !reflect.DeepEqual(before, after) {
				t.Fatal("execution changed on a refused delivery")
			}
			if n := len(fftest.CompletionEvents(t, db.Pool, id)); n != 0 {
				t.Fatalf("%d completion events on a refused delivery", n)
			}
		})
	}
}

// testObserveSignals: which member_map entries observe_signals returns. An
// entry needs a UUID signal_id and a string signal_name, so the timeout
// entry FlowFabric's auto-resume appends is invisible; anything not an
// array or object is skipped; accepted_at must be an integer. A
// regression shows as such entries surfacing, or valid ones dropped.
func testObserveSignals(t *testing.T, db *testdb.DB) {
	t.Parallel()
	ctx := context.Background()
	const p = int16(13)
	const sid = "0b0e8d4c-4a55-4c2e-9f43-0c3c7a6f3c11"

	tests := []struct {
		name      string
		memberMap any // nil: no suspension
		want      []ffread.ResumeSignal
	}{
		{name: "NoSuspension", want: []ffread.ResumeSignal{}},
		{name: "NotAnObject", memberMap: []any{1}, want: []ffread.ResumeSignal{}},
		{name: "TimeoutEntryHasNoSignalID", memberMap: map[string]any{"__timeout__": []any{map[string]any{
			"signal_name": "timeout", "payload": nil, "delivered_at_ms": 5, "source": "suspension_timeout"}}},
			want: []ffread.ResumeSignal{}},
		{name: "FiltersEntries", memberMap: map[string]any{
			"a": []any{
				map[string]any{"signal_id": "not-a-uuid", "signal_name": "x"},
				map[string]any{"signal_id": sid, "signal_name": 7},
				"string entry",
				map[string]any{"signal_id": sid, "signal_name": "kept", "accepted_at": 1.5, "payload_hex": "zz"},
			},
			"b": map[string]any{"status": "never_committed"},
		}, want: []ffread.ResumeSignal{{WaitpointKey: "a", SignalID: sid, SignalName: "kept"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			id := fftest.InsertExec(t, db.Pool, fftest.Exec{Partition: p})
			if tt.memberMap != nil {
				fftest.InsertSuspension(t, db.Pool, fftest.Suspension{Partition: p, ExecutionID: id, MemberMap: tt.memberMap})
			}
			got, err := ffread.ObserveSignals(ctx, db.Pool, p, id)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Fatalf("signals = %+v; want %+v", got, tt.want)
			}
		})
	}
}

// testResumeExecution: the typed resume of a suspended execution with a
// suspension makes it runnable (waiting now, or delayed with no deadline
// to promote it), clears the raw_fields waitpoint and suspension ids and
// deletes the suspension (not its waitpoints); anything else is refused
// with FlowFabric's typed errors and changes nothing. A regression shows
// as the suspension kept, a deadline written, or a non-suspended row
// resumed.
func testResumeExecution(t *testing.T, db *testdb.DB) {
	t.Parallel()
	ctx := context.Background()
	const p = int16(14)

	ok := []struct {
		name                                string
		delay                               int64
		public, eligibility, blockingReason string
	}{
		{name: "Now", delay: 0, public: "waiting", eligibility: "eligible_now", blockingReason: "waiting_for_worker"},
		{name: "NegativeDelayIsNow", delay: -5, public: "waiting", eligibility: "eligible_now", blockingReason: "waiting_for_worker"},
		{name: "Delayed", delay: 5_000, public: "delayed", eligibility: "not_eligible_until_time", blockingReason: "waiting_for_resume_delay"},
	}
	for _, tt := range ok {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			id := suspended(t, db.Pool, p, nil, 1)
			wp := fftest.InsertWaitpoint(t, db.Pool, fftest.Waitpoint{Partition: p, ExecutionID: id, Key: "k"})
			got, err := ffread.ResumeExecution(ctx, db.Pool, p, id, tt.delay)
			if err != nil || got != tt.public {
				t.Fatalf("= %q, %v; want %q", got, err, tt.public)
			}
			row := fftest.ExecJSON(t, db.Pool, p, id)
			if row["lifecycle_phase"] != "runnable" || row["ownership_state"] != "unowned" || row["eligibility_state"] != tt.eligibility ||
				row["attempt_state"] != "attempt_interrupted" || row["blocking_reason"] != tt.blockingReason ||
				row["public_state"] != tt.public || row["deadline_at_ms"] != nil {
				t.Fatalf("exec = %v", row)
			}
			raw := row["raw_fields"].(map[string]any)
			if raw["current_waitpoint_id"] != "" || raw["current_suspension_id"] != "" || raw["namespace"] != "tenant-a" {
				t.Fatalf("raw_fields = %v; want the ids cleared, the rest kept", raw)
			}
			if _, ok := fftest.ReadSuspension(t, db.Pool, p, id); ok {
				t.Fatal("suspension kept")
			}
			if !fftest.WaitpointExists(t, db.Pool, p, wp) {
				t.Fatal("waitpoint deleted; resume_execution leaves waitpoints")
			}
			info, err := ffread.ReadExecutionInfo(ctx, db.Pool, p, id)
			if err != nil || info.PublicState != tt.public || info.StateVector.BlockingReason != tt.blockingReason {
				t.Fatalf("read_execution_info = %+v, %v", info, err)
			}
		})
	}

	refused := []struct {
		name    string
		setup   func(t *testing.T) string
		wantErr error
	}{
		{name: "NoSuspensionRow", wantErr: ffread.ErrExecutionNotSuspended, setup: func(t *testing.T) string {
			return fftest.InsertExec(t, db.Pool, fftest.Exec{Partition: p, LifecyclePhase: "suspended", PublicState: "suspended"})
		}},
		{name: "Active", wantErr: ffread.ErrExecutionNotSuspended, setup: func(t *testing.T) string {
			id := fftest.InsertExec(t, db.Pool, fftest.Exec{Partition: p})
			fftest.InsertSuspension(t, db.Pool, fftest.Suspension{Partition: p, ExecutionID: id})
			return id
		}},
		{name: "Missing", wantErr: ffread.ErrNotFound, setup: func(*testing.T) string { return fftest.NewUUID() }},
	}
	for _, tt := range refused {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			id := tt.setup(t)
			_, err := ffread.ResumeExecution(ctx, db.Pool, p, id, 0)
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("err = %v; want %v", err, tt.wantErr)
			}
		})
	}
}
