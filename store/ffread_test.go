package store_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/flowfabric/ffreconcile/internal/ffread"
	"github.com/flowfabric/ffreconcile/internal/fftest"
	"github.com/flowfabric/ffreconcile/internal/testdb"
	"github.com/flowfabric/ffreconcile/store"
)

// readBack is what FlowFabric's readers answer for an execution.
type readBack struct {
	// info is read_execution_info's state vector and public state.
	info ffread.StateVector
	// state is read_execution_state's answer.
	state string
	// describe is describe_execution's public state, or its error.
	describe string
	// cancel is the Handle cancel's answer on a terminal row: "ok" (the
	// idempotent success) or its error text.
	cancel string
}

// readThroughFlowFabric reads execution id back through FlowFabric's own
// readers, transcribed in internal/ffread, failing the test on a decoding
// error (a value FlowFabric's reader cannot read). The cancel is tried only
// on a terminal row (it would cancel a live one).
func readThroughFlowFabric(t *testing.T, db ffread.TxDB, p int16, id string) readBack {
	t.Helper()
	ctx := context.Background()
	info, err := ffread.ReadExecutionInfo(ctx, db, p, id)
	if err != nil || info == nil {
		t.Fatalf("read_execution_info: %v, %v", info, err)
	}
	state, ok, err := ffread.ReadExecutionState(ctx, db, p, id)
	if err != nil || !ok {
		t.Fatalf("read_execution_state: %q, %v, %v", state, ok, err)
	}
	rb := readBack{info: info.StateVector, state: state}
	if snap, err := ffread.DescribeExecution(ctx, db, p, id); err != nil {
		rb.describe = err.Error()
	} else {
		rb.describe = snap.PublicState
	}
	if info.StateVector.LifecyclePhase == "terminal" {
		rb.cancel = "ok"
		if err := ffread.Cancel(ctx, db, p, id, "client retry"); err != nil {
			rb.cancel = err.Error()
		}
	}
	return rb
}

// TestFlowFabricReadsWhatTheFleetWrote runs each action of the fleet that
// changes an execution and reads the row back through FlowFabric's own
// Postgres readers (internal/ffread: read_execution_info with its
// normalising and derive_terminal_outcome, read_execution_state,
// describe_execution, the Handle cancel's idempotency), on this project's
// schema and on FlowFabric's migrations. Each row is seeded as FlowFabric's
// claim or suspend leaves it (public_state `running`, `suspended`,
// `delayed`, a replayed member's `waiting_children`). A regression shows as
// FlowFabric's reader telling a state the row is not in (`active` on a
// runnable or terminal row, `suspended` on a terminal one), no terminal
// outcome for an execution the fleet ended, describe failing on the claim's
// `running`, or a re-cancel of an execution the fleet cancelled answered
// with an error instead of Ok.
func TestFlowFabricReadsWhatTheFleetWrote(t *testing.T) {
	t.Parallel()
	testdb.EachSchema(t, func(t *testing.T, db *testdb.DB) {
		ctx := context.Background()
		pool := db.Pool
		now := store.NowMs()
		must := func(err error) {
			t.Helper()
			if err != nil {
				t.Fatal(err)
			}
		}
		// created is raw_fields as FlowFabric's create_execution seeds
		// them: describe_execution requires last_mutation_at.
		created := func() map[string]any { return map[string]any{"namespace": "tenant-a", "last_mutation_at": "1"} }
		// running is an execution as FlowFabric's Handle claim leaves
		// it.
		running := func(p int16, e fftest.Exec) string {
			e.Partition, e.RawFields = p, created()
			e.LifecyclePhase, e.OwnershipState, e.EligibilityState = "active", "leased", "not_applicable"
			e.PublicState, e.AttemptState = "running", "running_attempt"
			return fftest.InsertExec(t, pool, e)
		}
		suspended := func(p int16, behavior string) string {
			id := fftest.InsertExec(t, pool, fftest.Exec{Partition: p, RawFields: created(), LifecyclePhase: "suspended",
				OwnershipState: "released", EligibilityState: "not_applicable", PublicState: "suspended",
				AttemptState: "attempt_interrupted"})
			fftest.InsertAttempt(t, pool, p, id, 0, nil)
			must2(pool.Exec(ctx, `UPDATE ff_attempt SET outcome = 'attempt_interrupted' WHERE partition_key = $1 AND execution_id = $2`, p, id))
			fftest.InsertSuspension(t, pool, fftest.Suspension{Partition: p, ExecutionID: id, TimeoutAtMs: fftest.Ms(now - 1),
				Behavior: fftest.Str(behavior)})
			return id
		}
		expire := func(p int16, id string) {
			t.Helper()
			res, err := store.ExpireSuspension(ctx, pool, p, id, now, store.Filter{})
			must(err)
			if !res.Applied {
				t.Fatalf("suspension not expired: %+v", res)
			}
		}
		retries := func(n int) any { return map[string]any{"retry_policy": map[string]any{"max_retries": n}} }

		tests := []struct {
			name string
			act  func(p int16) string // runs the action, returns the execution
			want ffread.StateVector
			// cancel is the re-cancel's answer on a terminal row.
			cancel string
			// flowMember: FlowFabric's describe_execution fails on
			// every flow member on Postgres (it hands its decoder the
			// flow id as {fp:N}:<uuid>, which the decoder parses as a
			// bare UUID), whatever the fleet writes.
			flowMember bool
		}{
			{
				name: "LeaseExpiry",
				act: func(p int16) string {
					id := running(p, fftest.Exec{})
					fftest.InsertAttempt(t, pool, p, id, 0, fftest.Ms(now-1))
					res, err := store.ReleaseExpiredLease(ctx, pool, p, id, 0, now, store.Filter{})
					must(err)
					if !res.ExecFlipped {
						t.Fatalf("not flipped: %+v", res)
					}
					return id
				},
				want: ffread.StateVector{LifecyclePhase: "runnable", OwnershipState: "unowned", EligibilityState: "eligible_now",
					BlockingReason: "waiting_for_worker", TerminalOutcome: "none", AttemptState: "attempt_interrupted", PublicState: "waiting"},
			},
			{
				name: "AttemptTimeoutRetried",
				act: func(p int16) string {
					id := running(p, fftest.Exec{Policy: retries(2)})
					fftest.InsertAttempt(t, pool, p, id, 0, fftest.Ms(now-1))
					res, err := store.ExpireAttempts(ctx, pool, p, []store.LeaseRef{{ExecutionID: id}}, now, store.Filter{})
					must(err)
					if !res[0].Retried {
						t.Fatalf("not retried: %+v", res[0])
					}
					return id
				},
				want: ffread.StateVector{LifecyclePhase: "runnable", OwnershipState: "unowned", EligibilityState: "eligible_now",
					BlockingReason: "waiting_for_worker", TerminalOutcome: "none", AttemptState: "pending_retry_attempt", PublicState: "waiting"},
			},
			{
				name: "AttemptTimeoutSpent",
				act: func(p int16) string {
					id := running(p, fftest.Exec{Policy: retries(1), AttemptIndex: 1})
					fftest.InsertAttempt(t, pool, p, id, 1, fftest.Ms(now-1))
					res, err := store.ExpireAttempts(ctx, pool, p, []store.LeaseRef{{ExecutionID: id, AttemptIndex: 1}}, now, store.Filter{})
					must(err)
					if !res[0].Applied || res[0].Retried {
						t.Fatalf("not ended: %+v", res[0])
					}
					return id
				},
				want: ffread.StateVector{LifecyclePhase: "terminal", OwnershipState: "unowned", EligibilityState: "not_applicable",
					BlockingReason: "none", TerminalOutcome: "expired", AttemptState: "attempt_terminal", PublicState: "expired"},
				cancel: "already terminal in state 'expired'",
			},
			{
				name: "ExecutionDeadline",
				act: func(p int16) string {
					id := running(p, fftest.Exec{DeadlineAtMs: fftest.Ms(now - 1)})
					fftest.InsertAttempt(t, pool, p, id, 0, fftest.Ms(now+60_000))
					res, err := store.ExpireDeadlines(ctx, pool, p, []string{id}, now, store.Filter{})
					must(err)
					if !res[0].Applied {
						t.Fatalf("not expired: %+v", res[0])
					}
					return id
				},
				want: ffread.StateVector{LifecyclePhase: "terminal", OwnershipState: "unowned", EligibilityState: "not_applicable",
					BlockingReason: "none", TerminalOutcome: "expired", AttemptState: "attempt_terminal", PublicState: "expired"},
				cancel: "already terminal in state 'expired'",
			},
			{
				name: "SuspensionTimeoutFail",
				act:  func(p int16) string { id := suspended(p, store.TimeoutFail); expire(p, id); return id },
				want: ffread.StateVector{LifecyclePhase: "terminal", OwnershipState: "unowned", EligibilityState: "not_applicable",
					BlockingReason: "none", TerminalOutcome: "failed", AttemptState: "attempt_terminal", PublicState: "failed"},
				cancel: "already terminal in state 'failed'",
			},
			{
				name: "SuspensionTimeoutCancel",
				act:  func(p int16) string { id := suspended(p, store.TimeoutCancel); expire(p, id); return id },
				want: ffread.StateVector{LifecyclePhase: "terminal", OwnershipState: "unowned", EligibilityState: "not_applicable",
					BlockingReason: "none", TerminalOutcome: "cancelled", AttemptState: "attempt_terminal", PublicState: "cancelled"},
				cancel: "ok",
			},
			{
				name: "SuspensionTimeoutExpire",
				act:  func(p int16) string { id := suspended(p, store.TimeoutExpire); expire(p, id); return id },
				want: ffread.StateVector{LifecyclePhase: "terminal", OwnershipState: "unowned", EligibilityState: "not_applicable",
					BlockingReason: "none", TerminalOutcome: "expired", AttemptState: "attempt_terminal", PublicState: "expired"},
				cancel: "already terminal in state 'expired'",
			},
			{
				name: "SuspensionTimeoutEscalate",
				act:  func(p int16) string { id := suspended(p, store.TimeoutEscalate); expire(p, id); return id },
				want: ffread.StateVector{LifecyclePhase: "terminal", OwnershipState: "unowned", EligibilityState: "not_applicable",
					BlockingReason: "none", TerminalOutcome: "expired", AttemptState: "attempt_terminal", PublicState: "expired"},
				cancel: "already terminal in state 'expired'",
			},
			{
				name: "SuspensionTimeoutAutoResume",
				act:  func(p int16) string { id := suspended(p, store.TimeoutAutoResume); expire(p, id); return id },
				want: ffread.StateVector{LifecyclePhase: "suspended", OwnershipState: "unowned", EligibilityState: "not_applicable",
					BlockingReason: "none", TerminalOutcome: "none", AttemptState: "attempt_interrupted", PublicState: "suspended"},
			},
			{
				name: "DelayedPromotion",
				act: func(p int16) string {
					e := fftest.Delayed(p, now-1)
					e.RawFields = created()
					id := fftest.InsertExec(t, pool, e)
					must2(pool.Exec(ctx, `UPDATE ff_exec_core SET blocking_reason = 'waiting_for_retry_backoff'
						WHERE partition_key = $1 AND execution_id = $2`, p, id))
					res, err := store.PromoteDelayed(ctx, pool, p, id, now, store.Filter{})
					must(err)
					if !res.Promoted() {
						t.Fatalf("not promoted: %+v", res)
					}
					return id
				},
				want: ffread.StateVector{LifecyclePhase: "runnable", OwnershipState: "unowned", EligibilityState: "eligible_now",
					BlockingReason: "waiting_for_worker", TerminalOutcome: "none", AttemptState: "pending_retry_attempt", PublicState: "waiting"},
			},
			{
				// A member replayed out of a skip waits for its
				// dependencies again (FlowFabric's replay writes
				// waiting_children), then is satisfied.
				name: "DependencySatisfied",
				act: func(p int16) string {
					f := newFlow(t, pool, p, `{"kind":"all_of"}`, 1, "tenant-a")
					must2(pool.Exec(ctx, `UPDATE ff_exec_core SET lifecycle_phase = 'runnable', public_state = 'waiting_children',
						blocking_reason = 'waiting_for_children', attempt_state = 'pending_replay_attempt',
						raw_fields = raw_fields || '{"last_mutation_at": "1"}'
						WHERE partition_key = $1 AND execution_id = $2`, p, f.down))
					dispatch(t, pool, p, f.emit(t, pool, 0, "success"))
					return f.down
				},
				want: ffread.StateVector{LifecyclePhase: "runnable", OwnershipState: "unowned", EligibilityState: "eligible_now",
					BlockingReason: "waiting_for_worker", TerminalOutcome: "none", AttemptState: "pending_replay_attempt", PublicState: "waiting"},
				flowMember: true,
			},
			{
				name: "DependencyImpossible",
				act: func(p int16) string {
					f := newFlow(t, pool, p, `{"kind":"all_of"}`, 1, "tenant-a")
					must2(pool.Exec(ctx, `UPDATE ff_exec_core SET blocking_reason = 'waiting_for_children',
						raw_fields = raw_fields || '{"last_mutation_at": "1"}'
						WHERE partition_key = $1 AND execution_id = $2`, p, f.down))
					dispatch(t, pool, p, f.emit(t, pool, 0, "failed"))
					return f.down
				},
				// FlowFabric's skip writes no attempt outcome (the
				// downstream never ran): no terminal outcome, as there.
				want: ffread.StateVector{LifecyclePhase: "terminal", OwnershipState: "unowned", EligibilityState: "not_applicable",
					BlockingReason: "none", TerminalOutcome: "none", AttemptState: "attempt_terminal", PublicState: "skipped"},
				cancel:     "already terminal in state 'skipped'",
				flowMember: true,
			},
			{
				name: "SiblingCancel",
				act: func(p int16) string {
					flow, down := fftest.NewUUID(), fftest.NewUUID()
					sib := running(p, fftest.Exec{})
					must2(pool.Exec(ctx, `UPDATE ff_exec_core SET blocking_reason = 'waiting_for_worker'
						WHERE partition_key = $1 AND execution_id = $2`, p, sib))
					fftest.InsertEdgeGroup(t, pool, fftest.EdgeGroup{Partition: p, FlowID: flow, DownstreamEID: down, Flag: true,
						Members: []string{sib}})
					fftest.InsertPendingCancel(t, pool, p, flow, down, now)
					res, err := store.DispatchCancelGroup(ctx, pool, p, flow, down, now, store.Filter{})
					must(err)
					if !res.Changed() {
						t.Fatalf("not dispatched: %+v", res)
					}
					return sib
				},
				// FlowFabric's dispatcher writes attempt_state
				// `cancelled` (normalised to attempt_terminal) and
				// lifecycle `terminal`, leaving the attempt outcome.
				want: ffread.StateVector{LifecyclePhase: "terminal", OwnershipState: "unowned", EligibilityState: "not_applicable",
					BlockingReason: "none", TerminalOutcome: "none", AttemptState: "attempt_terminal", PublicState: "cancelled"},
				cancel: "ok",
			},
		}
		for i, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				p := int16(10 + 3*i)
				id := tt.act(p)
				got := readThroughFlowFabric(t, pool, p, id)
				if got.info != tt.want {
					t.Errorf("read_execution_info:\ngot  %+v\nwant %+v", got.info, tt.want)
				}
				wantDescribe := tt.want.PublicState
				if tt.flowMember && strings.Contains(got.describe, "flow_id") {
					wantDescribe = got.describe
				}
				if got.state != tt.want.PublicState || got.describe != wantDescribe {
					t.Errorf("read_execution_state %q, describe_execution %q; want %q", got.state, got.describe, tt.want.PublicState)
				}
				switch {
				case tt.cancel == "" && got.cancel != "":
					t.Errorf("cancel tried on a live row: %s", got.cancel)
				case tt.cancel == "ok" && got.cancel != "ok", tt.cancel != "ok" && !strings.Contains(got.cancel, tt.cancel):
					t.Errorf("re-cancel answered %q; want %q", got.cancel, tt.cancel)
				}
			})
		}
	})
}

// TestFlowFabricResumePathsAfterTheFleet: FlowFabric's own resume paths still
// work on what the fleet leaves. A signal resumes an execution whose
// suspension timeout has lapsed (deliver_signal's writes), the fleet's
// suspension timeout then finds it resumable and only clears the timeout,
// and claim_resumed_execution claims it, its worker observing the signal;
// a still-suspended execution the fleet left alone (its timeout not yet
// lapsed) is resumed by the typed resume_execution. And an execution the
// fleet ended is refused by both, as FlowFabric refuses a terminal one. A
// regression shows as a resumed execution the fleet ended (the claim then
// refused: not a resumed execution), a signal lost to the claimed worker,
// or a terminal execution claimed back.
func TestFlowFabricResumePathsAfterTheFleet(t *testing.T) {
	t.Parallel()
	testdb.EachSchema(t, func(t *testing.T, db *testdb.DB) {
		ctx := context.Background()
		pool := db.Pool
		now := store.NowMs()
		suspend := func(p int16, timeoutAtMs int64) string {
			id := fftest.InsertExec(t, pool, fftest.Exec{Partition: p, Namespace: "tenant-a", LifecyclePhase: "suspended",
				OwnershipState: "released", EligibilityState: "not_applicable", PublicState: "suspended",
				AttemptState: "attempt_interrupted"})
			fftest.InsertAttempt(t, pool, p, id, 0, nil)
			fftest.InsertSuspension(t, pool, fftest.Suspension{Partition: p, ExecutionID: id, TimeoutAtMs: fftest.Ms(timeoutAtMs)})
			return id
		}

		t.Run("SignalThenFleetThenClaimResumed", func(t *testing.T) {
			const p = int16(3)
			id := suspend(p, now-1)
			if _, err := ffread.DeliverSignalSatisfied(ctx, pool, p, id, "wp-key", ffread.Signal{Name: "approved"}, now); err != nil {
				t.Fatal(err)
			}
			res, err := store.ExpireSuspension(ctx, pool, p, id, now, store.Filter{})
			if err != nil || res.Applied || res.NotSuspended != "runnable" {
				t.Fatalf("fleet's action = %+v, %v; want the resumable execution left alone", res, err)
			}
			if _, err := ffread.ClaimResumedExecution(ctx, pool, p, id, "worker-1", "worker-1/0", 30_000); err != nil {
				t.Fatalf("claim_resumed_execution after the fleet: %v", err)
			}
			sigs, err := ffread.ObserveSignals(ctx, pool, p, id)
			if err != nil || len(sigs) != 1 || sigs[0].SignalName != "approved" {
				t.Fatalf("observe_signals = %+v, %v; want the approved signal", sigs, err)
			}
			// The claimed execution's suspension is never due again.
			if rows, err := store.TimedOutSuspensions.Scan(ctx, pool, p, now+60_000, nil, 10, store.Filter{}); err != nil || len(rows) != 0 {
				t.Fatalf("due suspensions after the claim = %v, %v; want none", rows, err)
			}
			info, err := ffread.ReadExecutionInfo(ctx, pool, p, id)
			if err != nil || info.StateVector.LifecyclePhase != "active" || info.PublicState != "active" {
				t.Fatalf("claimed execution reads %+v, %v; want active", info, err)
			}
		})

		t.Run("TypedResumeOfAnExecutionTheFleetLeft", func(t *testing.T) {
			const p = int16(4)
			id := suspend(p, now+60_000)
			if res, err := store.ExpireSuspension(ctx, pool, p, id, now, store.Filter{}); err != nil || res.Applied {
				t.Fatalf("fleet's action = %+v, %v; want a no-op (not due)", res, err)
			}
			ps, err := ffread.ResumeExecution(ctx, pool, p, id, 0)
			if err != nil || ps != "waiting" {
				t.Fatalf("resume_execution = %q, %v; want waiting", ps, err)
			}
		})

		t.Run("EndedExecutionIsNotResumed", func(t *testing.T) {
			const p = int16(5)
			id := suspend(p, now-1)
			if res, err := store.ExpireSuspension(ctx, pool, p, id, now, store.Filter{}); err != nil || !res.Applied {
				t.Fatalf("fleet's action = %+v, %v; want the timeout applied", res, err)
			}
			if _, err := ffread.ResumeExecution(ctx, pool, p, id, 0); !errors.Is(err, ffread.ErrExecutionNotSuspended) {
				t.Fatalf("resume_execution of an ended execution = %v; want %v", err, ffread.ErrExecutionNotSuspended)
			}
			if _, err := ffread.ClaimResumedExecution(ctx, pool, p, id, "w", "w/0", 30_000); !errors.Is(err, ffread.ErrNotAResumedExecution) {
				t.Fatalf("claim_resumed_execution of an ended execution = %v; want %v", err, ffread.ErrNotAResumedExecution)
			}
		})
	})
}
