package ffread_test

import (
	"context"
	"errors"
	"reflect"
	"testing"

	"github.com/flowfabric/ffreconcile/internal/ffread"
	"github.com/flowfabric/ffreconcile/internal/fftest"
	"github.com/flowfabric/ffreconcile/internal/testdb"
)

// testCancelExecution: the operator cancel. A leased execution is
// cancelled with lifecycle 'cancelled', its lease released (epoch bumped,
// outcome 'cancelled') and one 'revoked' lease event carrying namespace and
// instance tag; an unleased one is cancelled without touching its attempt
// or writing an event; COALESCE keeps an earlier reason, canceller and
// terminal time; terminal or cancelled rows are the idempotent success
// when public_state is 'cancelled' and FlowFabric's error otherwise; the
// lease fence applies to every source but operator_override. A regression
// shows as a second cancel failing, a missing or extra lease event, the
// attempt touched without a lease, a stale public_state cancelled over, or
// the fence skipped or applied to operator_override.
func testCancelExecution(t *testing.T, db *testdb.DB) {
	t.Parallel()
	ctx := context.Background()
	const p = int16(9)
	const now = int64(7_000_000)

	// leased inserts an active execution whose attempt 0 holds a lease
	// (worker w1-i1, lease_epoch 1).
	leased := func(t *testing.T) string {
		id := fftest.InsertExec(t, db.Pool, fftest.Exec{Partition: p, Namespace: "tenant-a",
			Tags: map[string]string{"cairn.instance_id": "inst-1"}})
		fftest.InsertAttempt(t, db.Pool, p, id, 0, fftest.Ms(now+30_000))
		return id
	}

	t.Run("LeasedOperatorOverride", func(t *testing.T) {
		t.Parallel()
		id := leased(t)
		res, err := ffread.CancelExecution(ctx, db.Pool, p, id, ffread.CancelExecutionArgs{Reason: "ops", NowMs: now})
		if err != nil {
			t.Fatal(err)
		}
		if *res != (ffread.CancelExecutionResult{PublicState: "cancelled", LeaseRevoked: true}) {
			t.Fatalf("result = %+v", res)
		}
		ex := fftest.ReadExec(t, db.Pool, p, id)
		if ex.LifecyclePhase != "cancelled" || ex.OwnershipState != "unowned" || ex.EligibilityState != "not_applicable" ||
			ex.PublicState != "cancelled" || ex.AttemptState != "cancelled" || ex.TerminalAtMs == nil || *ex.TerminalAtMs != now ||
			*ex.CancellationReason != "ops" || *ex.CancelledBy != "operator_override" || ex.RawFields["last_mutation_at"] != "7000000" {
			t.Fatalf("exec = %+v", ex)
		}
		at := attemptJSON(t, db.Pool, p, id, 0)
		if at["worker_instance_id"] != nil || at["lease_expires_at_ms"] != nil || at["lease_epoch"] != float64(2) ||
			at["terminal_at_ms"] != float64(now) || at["outcome"] != "cancelled" || at["worker_id"] != "w1" {
			t.Fatalf("attempt = %v; want lease released, epoch 2, outcome cancelled, worker_id kept", at)
		}
		evs := fftest.LeaseEvents(t, db.Pool, id)
		if len(evs) != 1 || evs[0].EventType != "revoked" || evs[0].OccurredAtMs != now || evs[0].Partition != int32(p) ||
			evs[0].Namespace == nil || *evs[0].Namespace != "tenant-a" || evs[0].InstanceTag == nil || *evs[0].InstanceTag != "inst-1" {
			t.Fatalf("lease events = %+v; want one revoked with namespace and instance tag", evs)
		}
		info, err := ffread.ReadExecutionInfo(ctx, db.Pool, p, id)
		if err != nil || info.StateVector.LifecyclePhase != "terminal" || info.StateVector.TerminalOutcome != "cancelled" ||
			info.PublicState != "cancelled" || info.StateVector.AttemptState != "attempt_terminal" {
			t.Fatalf("read_execution_info = %+v, %v", info, err)
		}

		again, err := ffread.CancelExecution(ctx, db.Pool, p, id, ffread.CancelExecutionArgs{Reason: "again", NowMs: now + 1})
		if err != nil || !again.AlreadyCancelled || again.LeaseRevoked {
			t.Fatalf("second cancel = %+v, %v; want already cancelled", again, err)
		}
		if n := len(fftest.LeaseEvents(t, db.Pool, id)); n != 1 {
			t.Fatalf("%d lease events after the second cancel; want still 1", n)
		}
	})

	t.Run("UnleasedKeepsAttempt", func(t *testing.T) {
		t.Parallel()
		id := fftest.InsertExec(t, db.Pool, fftest.Exec{Partition: p, LifecyclePhase: "runnable", OwnershipState: "unowned",
			EligibilityState: "eligible_now", PublicState: "waiting", AttemptState: "attempt_interrupted"})
		fftest.InsertAttempt(t, db.Pool, p, id, 0, nil)
		setAttempt(t, db.Pool, p, id, 0, "worker_instance_id = '', outcome = 'interrupted'")
		setExec(t, db.Pool, p, id, "cancellation_reason", "earlier")
		before := attemptJSON(t, db.Pool, p, id, 0)

		// The empty worker instance is no lease, so even lease_holder
		// needs no fence.
		res, err := ffread.CancelExecution(ctx, db.Pool, p, id, ffread.CancelExecutionArgs{Reason: "new", Source: "lease_holder", NowMs: now})
		if err != nil || res.LeaseRevoked || res.AlreadyCancelled {
			t.Fatalf("= %+v, %v", res, err)
		}
		ex := fftest.ReadExec(t, db.Pool, p, id)
		if ex.LifecyclePhase != "cancelled" || *ex.CancellationReason != "earlier" || *ex.CancelledBy != "lease_holder" {
			t.Fatalf("exec = %+v; want cancelled, the earlier reason kept", ex)
		}
		if after := attemptJSON(t, db.Pool, p, id, 0); !reflect.DeepEqual(before, after) {
			t.Fatalf("attempt changed: %v -> %v", before, after)
		}
		if evs := fftest.LeaseEvents(t, db.Pool, id); len(evs) != 0 {
			t.Fatalf("lease events = %+v; want none", evs)
		}
	})

	terminal := []struct {
		name, phase, public string
		wantErr             string
	}{
		{name: "LifecycleCancelled", phase: "cancelled", public: "cancelled"},
		{name: "TerminalCancelled", phase: "terminal", public: "cancelled"},
		{name: "TerminalExpired", phase: "terminal", public: "expired", wantErr: "already terminal in state 'expired'"},
		{name: "TerminalStaleSuspended", phase: "terminal", public: "suspended", wantErr: "already terminal in state 'suspended'"},
		{name: "CancelledStaleRunning", phase: "cancelled", public: "running", wantErr: "already terminal in state 'running'"},
	}
	for _, tt := range terminal {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			id := fftest.InsertExec(t, db.Pool, fftest.Exec{Partition: p, LifecyclePhase: tt.phase, PublicState: tt.public,
				OwnershipState: "unowned", TerminalAtMs: fftest.Ms(5)})
			before := fftest.ExecJSON(t, db.Pool, p, id)
			res, err := ffread.CancelExecution(ctx, db.Pool, p, id, ffread.CancelExecutionArgs{Reason: "r", NowMs: now})
			if tt.wantErr == "" {
				if err != nil || !res.AlreadyCancelled || res.PublicState != "cancelled" {
					t.Fatalf("= %+v, %v; want already cancelled", res, err)
				}
			} else {
				want := "validation: InvalidInput: cancel_execution: execution_id=" + wire(p, id) + ": " + tt.wantErr
				if err == nil || err.Error() != want {
					t.Fatalf("err = %v; want %s", err, want)
				}
			}
			if after := fftest.ExecJSON(t, db.Pool, p, id); !reflect.DeepEqual(before, after) {
				t.Fatalf("row changed:\nbefore %v\nafter  %v", before, after)
			}
		})
	}

	fence := []struct {
		name    string
		source  string
		epoch   *uint64
		wantErr error  // errors.Is target
		wantMsg string // or error text
	}{
		{name: "OperatorOverrideNeedsNoFence", source: "operator_override"},
		{name: "LeaseHolderRightEpoch", source: "lease_holder", epoch: epoch(1)},
		{name: "LeaseHolderNoEpoch", source: "lease_holder",
			wantMsg: "lease_epoch required when source != operator_override and execution is active"},
		{name: "LeaseHolderStaleEpoch", source: "lease_holder", epoch: epoch(2), wantErr: ffread.ErrStaleLease},
		{name: "CustomSourceStaleEpoch", source: "my_tool", epoch: epoch(0), wantErr: ffread.ErrStaleLease},
	}
	for _, tt := range fence {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			id := leased(t)
			before := fftest.ExecJSON(t, db.Pool, p, id)
			res, err := ffread.CancelExecution(ctx, db.Pool, p, id,
				ffread.CancelExecutionArgs{Reason: "r", Source: tt.source, LeaseEpoch: tt.epoch, NowMs: now})
			switch {
			case tt.wantErr != nil:
				if !errors.Is(err, tt.wantErr) {
					t.Fatalf("err = %v; want %v", err, tt.wantErr)
				}
			case tt.wantMsg != "":
				wantErrText(t, err, tt.wantMsg)
			default:
				if err != nil || !res.LeaseRevoked {
					t.Fatalf("= %+v, %v; want cancelled with the lease revoked", res, err)
				}
				if ex := fftest.ReadExec(t, db.Pool, p, id); *ex.CancelledBy != tt.source {
					t.Fatalf("cancelled_by = %s; want %s", *ex.CancelledBy, tt.source)
				}
				return
			}
			if after := fftest.ExecJSON(t, db.Pool, p, id); !reflect.DeepEqual(before, after) {
				t.Fatalf("row changed on a refused cancel")
			}
		})
	}

	t.Run("Missing", func(t *testing.T) {
		t.Parallel()
		_, err := ffread.CancelExecution(ctx, db.Pool, p, fftest.NewUUID(), ffread.CancelExecutionArgs{Reason: "r"})
		var nf *ffread.NotFoundError
		if !errors.Is(err, ffread.ErrNotFound) || !errors.As(err, &nf) || nf.Entity != "execution" {
			t.Fatalf("err = %v; want not found: execution", err)
		}
	})
}

// epoch returns a pointer to a lease epoch.
func epoch(v uint64) *uint64 { return &v }
