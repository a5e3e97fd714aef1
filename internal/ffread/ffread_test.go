package ffread_test

import (
	"context"
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/flowfabric/ffreconcile/internal/ffread"
	"github.com/flowfabric/ffreconcile/internal/fftest"
	"github.com/flowfabric/ffreconcile/internal/testdb"
	"github.com/flowfabric/ffreconcile/store"
)

// wire is FlowFabric's execution id wire form, as its messages quote it.
func wire(p int16, id string) string { return fmt.Sprintf("{fp:%d}:%s", p, id) }

// setExec sets one ff_exec_core column of a row, for the columns and
// literals fftest.Exec does not cover (blocking_reason, NULLs, odd values).
func setExec(t *testing.T, db store.DB, p int16, id, column string, value any) {
	t.Helper()
	if _, err := db.Exec(context.Background(), `UPDATE ff_exec_core SET `+pgx.Identifier{column}.Sanitize()+` = $3
		 WHERE partition_key = $1 AND execution_id = $2`, p, id, value); err != nil {
		t.Fatalf("set ff_exec_core.%s: %v", column, err)
	}
}

// setAttempt sets columns of an ff_attempt row (a "col = $4, …" list).
func setAttempt(t *testing.T, db store.DB, p int16, id string, index int32, set string, args ...any) {
	t.Helper()
	if _, err := db.Exec(context.Background(), `UPDATE ff_attempt SET `+set+`
		 WHERE partition_key = $1 AND execution_id = $2 AND attempt_index = $3`,
		append([]any{p, id, index}, args...)...); err != nil {
		t.Fatalf("set ff_attempt %s: %v", set, err)
	}
}

// attemptJSON reads a whole ff_attempt row as a JSON object.
func attemptJSON(t *testing.T, db store.DB, p int16, id string, index int32) map[string]any {
	t.Helper()
	var text string
	if err := db.QueryRow(context.Background(), `SELECT to_jsonb(a)::text FROM ff_attempt a
		 WHERE partition_key = $1 AND execution_id = $2 AND attempt_index = $3`, p, id, index).Scan(&text); err != nil {
		t.Fatalf("read ff_attempt %d/%s/%d: %v", p, id, index, err)
	}
	var m map[string]any
	if err := json.Unmarshal([]byte(text), &m); err != nil {
		t.Fatal(err)
	}
	return m
}

// wantErrText fails the test unless err's text contains want.
func wantErrText(t *testing.T, err error, want string) {
	t.Helper()
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("err = %v; want one containing %q", err, want)
	}
}

// publicStateVariants is serde's list of PublicState variants, as its
// "unknown variant" message spells it.
const publicStateVariants = "one of `waiting`, `delayed`, `rate_limited`, `waiting_children`, `active`, `suspended`, " +
	"`resumable`, `completed`, `failed`, `cancelled`, `expired`, `skipped`"

// A clone of the test database costs seconds and these subtests
// milliseconds, so each area's tests share one database: every subtest
// inserts its own executions (fresh UUIDs) and reads only those.

// TestExecCoreReaders runs the exec_core reader tests (read_execution_info,
// read_execution_state, describe_execution) on one database.
func TestExecCoreReaders(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	t.Run("ReadExecutionInfoNormalises", func(t *testing.T) { testReadExecutionInfoNormalises(t, db) })
	t.Run("ReadExecutionInfoFields", func(t *testing.T) { testReadExecutionInfoFields(t, db) })
	t.Run("ReadExecutionInfoTerminalOutcome", func(t *testing.T) { testReadExecutionInfoTerminalOutcome(t, db) })
	t.Run("ReadExecutionState", func(t *testing.T) { testReadExecutionState(t, db) })
	t.Run("DescribeExecution", func(t *testing.T) { testDescribeExecution(t, db) })
}

// TestCancels runs the Handle cancel and operator cancel tests on one
// database.
func TestCancels(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	t.Run("Cancel", func(t *testing.T) { testCancel(t, db) })
	t.Run("CancelExecution", func(t *testing.T) { testCancelExecution(t, db) })
}

// TestSuspensionOps runs the deliver-signal, claim-resumed, observe and
// resume tests on one database.
func TestSuspensionOps(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	t.Run("DeliverSignalThenClaimResumed", func(t *testing.T) { testDeliverSignalThenClaimResumed(t, db) })
	t.Run("DeliverSignalAppends", func(t *testing.T) { testDeliverSignalAppends(t, db) })
	t.Run("DeliverSignalRefuses", func(t *testing.T) { testDeliverSignalRefuses(t, db) })
	t.Run("ObserveSignals", func(t *testing.T) { testObserveSignals(t, db) })
	t.Run("ResumeExecution", func(t *testing.T) { testResumeExecution(t, db) })
}

// testReadExecutionInfoNormalises: every literal a Postgres write path
// stores decodes to the variant normalise_* maps it to, one column at a
// time on an otherwise canonical row, and a literal that is no variant is
// the Corruption error naming the column. A regression shows as a
// Postgres literal ('running', 'released', 'pending_claim', 'cancelled')
// rejected or passed through raw, a non-variant ('pending',
// 'terminal_failed', a capitalised one) accepted, or blocking_reason NULL
// or "" read as anything but none.
func testReadExecutionInfoNormalises(t *testing.T, db *testdb.DB) {
	t.Parallel()
	ctx := context.Background()
	const p = int16(3)

	tests := []struct {
		column, literal string
		null            bool // store NULL instead of literal
		want            string
		wantErr         string
	}{
		{column: "lifecycle_phase", literal: "cancelled", want: "terminal"},
		{column: "lifecycle_phase", literal: "terminal", want: "terminal"},
		{column: "lifecycle_phase", literal: "pending", want: "runnable"},
		{column: "lifecycle_phase", literal: "runnable", want: "runnable"},
		{column: "lifecycle_phase", literal: "eligible", want: "runnable"},
		{column: "lifecycle_phase", literal: "blocked", want: "runnable"},
		{column: "lifecycle_phase", literal: "active", want: "active"},
		{column: "lifecycle_phase", literal: "suspended", want: "suspended"},
		{column: "lifecycle_phase", literal: "submitted", want: "submitted"},
		{column: "lifecycle_phase", literal: "Active",
			wantErr: "validation: Corruption: exec_core: lifecycle_phase: 'Active' is not a known value: unknown variant `Active`, " +
				"expected one of `submitted`, `runnable`, `active`, `suspended`, `terminal` at line 1 column 8"},
		{column: "ownership_state", literal: "released", want: "unowned"},
		{column: "ownership_state", literal: "unowned", want: "unowned"},
		{column: "ownership_state", literal: "leased", want: "leased"},
		{column: "ownership_state", literal: "lease_expired_reclaimable", want: "lease_expired_reclaimable"},
		{column: "ownership_state", literal: "lease_revoked", want: "lease_revoked"},
		{column: "ownership_state", literal: "claimed", wantErr: "exec_core: ownership_state: 'claimed' is not a known value: unknown variant `claimed`"},
		{column: "eligibility_state", literal: "cancelled", want: "not_applicable"},
		{column: "eligibility_state", literal: "pending_claim", want: "eligible_now"},
		{column: "eligibility_state", literal: "eligible_now", want: "eligible_now"},
		{column: "eligibility_state", literal: "not_eligible_until_time", want: "not_eligible_until_time"},
		{column: "eligibility_state", literal: "blocked_by_dependencies", want: "blocked_by_dependencies"},
		{column: "eligibility_state", literal: "blocked", wantErr: "exec_core: eligibility_state: 'blocked' is not a known value"},
		{column: "public_state", literal: "running", want: "active"},
		{column: "public_state", literal: "active", want: "active"},
		{column: "public_state", literal: "resumable", want: "resumable"},
		{column: "public_state", literal: "waiting_children", want: "waiting_children"},
		{column: "public_state", literal: "cancelled", want: "cancelled"},
		// serde reads the literal as the inside of a JSON string, escapes
		// and all.
		{column: "public_state", literal: `act\u0069ve`, want: "active"},
		{column: "public_state", literal: "pending",
			wantErr: "validation: Corruption: exec_core: public_state: 'pending' is not a known value: unknown variant `pending`, " +
				"expected " + publicStateVariants + " at line 1 column 9"},
		{column: "public_state", literal: "claimed", wantErr: "exec_core: public_state: 'claimed' is not a known value"},
		{column: "attempt_state", literal: "pending", want: "pending_first_attempt"},
		{column: "attempt_state", literal: "pending_claim", want: "pending_first_attempt"},
		{column: "attempt_state", literal: "running", want: "running_attempt"},
		{column: "attempt_state", literal: "cancelled", want: "attempt_terminal"},
		{column: "attempt_state", literal: "attempt_interrupted", want: "attempt_interrupted"},
		// claim_grant.rs:521 writes it; no normaliser maps it.
		{column: "attempt_state", literal: "terminal_failed", wantErr: "exec_core: attempt_state: 'terminal_failed' is not a known value"},
		{column: "blocking_reason", null: true, want: "none"},
		{column: "blocking_reason", literal: "", want: "none"},
		{column: "blocking_reason", literal: "waiting_for_signal", want: "waiting_for_signal"},
		{column: "blocking_reason", literal: "waiting_for_worker ", wantErr: "exec_core: blocking_reason: 'waiting_for_worker ' is not a known value"},
	}
	for _, tt := range tests {
		name := tt.column + "/" + tt.literal
		if tt.null {
			name = tt.column + "/NULL"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			id := fftest.InsertExec(t, db.Pool, fftest.Exec{Partition: p})
			var v any = tt.literal
			if tt.null {
				v = nil
			}
			setExec(t, db.Pool, p, id, tt.column, v)

			info, err := ffread.ReadExecutionInfo(ctx, db.Pool, p, id)
			if tt.wantErr != "" {
				wantErrText(t, err, tt.wantErr)
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			got := map[string]string{
				"lifecycle_phase":   info.StateVector.LifecyclePhase,
				"ownership_state":   info.StateVector.OwnershipState,
				"eligibility_state": info.StateVector.EligibilityState,
				"public_state":      info.StateVector.PublicState,
				"attempt_state":     info.StateVector.AttemptState,
				"blocking_reason":   info.StateVector.BlockingReason,
			}[tt.column]
			if got != tt.want {
				t.Fatalf("%s %q decoded as %q; want %q", tt.column, tt.literal, got, tt.want)
			}
			if info.PublicState != info.StateVector.PublicState {
				t.Fatalf("PublicState %q differs from the state vector's %q", info.PublicState, info.StateVector.PublicState)
			}
		})
	}
}

// testReadExecutionInfoFields: the non-state fields come from the row and
// raw_fields as FlowFabric reads them (only JSON strings count), and a
// missing row is nil without error. A regression shows as a field read
// from the wrong place (a number in raw_fields taken for a string, the
// attempt index or times lost) or a missing row turned into an error.
func testReadExecutionInfoFields(t *testing.T, db *testdb.DB) {
	t.Parallel()
	ctx := context.Background()
	const p = int16(4)
	flow := fftest.NewUUID()
	id := fftest.InsertExec(t, db.Pool, fftest.Exec{Partition: p, FlowID: flow, AttemptIndex: 2, TerminalAtMs: fftest.Ms(77),
		RawFields: map[string]any{"namespace": "tenant-a", "execution_kind": "kind-x", "blocking_detail": 5}})
	setExec(t, db.Pool, p, id, "started_at_ms", int64(42))
	setExec(t, db.Pool, p, id, "priority", int32(7))

	info, err := ffread.ReadExecutionInfo(ctx, db.Pool, p, id)
	if err != nil {
		t.Fatal(err)
	}
	if info.Namespace != "tenant-a" || info.ExecutionKind != "kind-x" || info.BlockingDetail != "" ||
		info.LaneID != "default" || info.Priority != 7 || info.CreatedAt != "1" ||
		info.StartedAt == nil || *info.StartedAt != "42" || info.CompletedAt == nil || *info.CompletedAt != "77" ||
		info.CurrentAttemptIndex != 2 || info.FlowID == nil || *info.FlowID != flow || info.ExecutionID != id {
		t.Fatalf("info = %+v", info)
	}

	missing, err := ffread.ReadExecutionInfo(ctx, db.Pool, p, fftest.NewUUID())
	if missing != nil || err != nil {
		t.Fatalf("missing row: %+v, %v; want nil, nil", missing, err)
	}
}

// testReadExecutionInfoTerminalOutcome: derive_terminal_outcome for each
// current-attempt outcome. Terminal rows take the attempt's outcome when it
// is one of the five terminal ones and none otherwise; a 'cancelled'
// lifecycle is cancelled whatever the attempt says; a non-terminal row is
// none. A regression shows as a reconciler's 'interrupted' read as an
// outcome, the lifecycle-'cancelled' shortcut lost, or a non-current
// attempt's outcome used.
func testReadExecutionInfoTerminalOutcome(t *testing.T, db *testdb.DB) {
	t.Parallel()
	ctx := context.Background()
	const p = int16(5)

	tests := []struct {
		name      string
		phase     string
		outcome   *string
		noAttempt bool
		want      string
	}{
		{name: "Success", phase: "terminal", outcome: fftest.Str("success"), want: "success"},
		{name: "Failed", phase: "terminal", outcome: fftest.Str("failed"), want: "failed"},
		{name: "Cancelled", phase: "terminal", outcome: fftest.Str("cancelled"), want: "cancelled"},
		{name: "Expired", phase: "terminal", outcome: fftest.Str("expired"), want: "expired"},
		{name: "Skipped", phase: "terminal", outcome: fftest.Str("skipped"), want: "skipped"},
		{name: "Interrupted", phase: "terminal", outcome: fftest.Str("interrupted"), want: "none"},
		{name: "AttemptInterrupted", phase: "terminal", outcome: fftest.Str("attempt_interrupted"), want: "none"},
		{name: "LeaseExpiredReclaimable", phase: "terminal", outcome: fftest.Str("lease_expired_reclaimable"), want: "none"},
		{name: "Retry", phase: "terminal", outcome: fftest.Str("retry"), want: "none"},
		{name: "NullOutcome", phase: "terminal", want: "none"},
		{name: "NoAttemptRow", phase: "terminal", noAttempt: true, want: "none"},
		{name: "CancelledPhaseBeatsSuccess", phase: "cancelled", outcome: fftest.Str("success"), want: "cancelled"},
		{name: "CancelledPhaseNoAttempt", phase: "cancelled", noAttempt: true, want: "cancelled"},
		{name: "ActiveIgnoresOutcome", phase: "active", outcome: fftest.Str("success"), want: "none"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			id := fftest.InsertExec(t, db.Pool, fftest.Exec{Partition: p, LifecyclePhase: tt.phase, AttemptIndex: 1})
			if !tt.noAttempt {
				// A stale outcome on an earlier attempt must not count.
				fftest.InsertAttempt(t, db.Pool, p, id, 0, nil)
				setAttempt(t, db.Pool, p, id, 0, "outcome = 'success'")
				fftest.InsertAttempt(t, db.Pool, p, id, 1, nil)
				setAttempt(t, db.Pool, p, id, 1, "outcome = $4", tt.outcome)
			}
			info, err := ffread.ReadExecutionInfo(ctx, db.Pool, p, id)
			if err != nil {
				t.Fatal(err)
			}
			if info.StateVector.TerminalOutcome != tt.want {
				t.Fatalf("terminal_outcome = %q; want %q", info.StateVector.TerminalOutcome, tt.want)
			}
		})
	}
}

// testReadExecutionState: the one-column read normalises as
// read_execution_info does and reports a missing row as not found. A
// regression shows as 'running' rejected, 'pending' accepted, or a missing
// row as an error.
func testReadExecutionState(t *testing.T, db *testdb.DB) {
	t.Parallel()
	ctx := context.Background()
	const p = int16(6)

	tests := []struct {
		literal, want, wantErr string
	}{
		{literal: "running", want: "active"},
		{literal: "suspended", want: "suspended"},
		{literal: "resumable", want: "resumable"},
		{literal: "pending", wantErr: "validation: Corruption: exec_core: public_state: 'pending' is not a known value"},
	}
	for _, tt := range tests {
		t.Run(tt.literal, func(t *testing.T) {
			t.Parallel()
			id := fftest.InsertExec(t, db.Pool, fftest.Exec{Partition: p, PublicState: tt.literal})
			got, ok, err := ffread.ReadExecutionState(ctx, db.Pool, p, id)
			if tt.wantErr != "" {
				wantErrText(t, err, tt.wantErr)
				return
			}
			if err != nil || !ok || got != tt.want {
				t.Fatalf("= %q, %v, %v; want %q", got, ok, err, tt.want)
			}
		})
	}
	t.Run("Missing", func(t *testing.T) {
		t.Parallel()
		got, ok, err := ffread.ReadExecutionState(ctx, db.Pool, p, fftest.NewUUID())
		if got != "" || ok || err != nil {
			t.Fatalf("= %q, %v, %v; want not found", got, ok, err)
		}
	})
}

// describable is raw_fields as FlowFabric's create_execution seeds it, so
// describe_execution's required last_mutation_at is there.
func describable(extra map[string]any) map[string]any {
	m := map[string]any{"namespace": "tenant-a", "execution_kind": "k", "last_mutation_at": "1000",
		"total_attempt_count": "2", "tags": map[string]any{"cairn.instance_id": "inst-1", "n": 5}}
	for k, v := range extra {
		m[k] = v
	}
	return m
}

// testDescribeExecution: describe reads public_state raw, so the 'running'
// the claim paths write is a Corruption error there while read_* shows it
// as active; the rest of the decoder's gates (lane, the flow id it cannot
// parse, last_mutation_at) fail the same way, and a describable row reads
// back with the raw blocking reason. A regression shows as describe
// normalising 'running', a flow member described, a row without
// last_mutation_at accepted, or a missing row as an error.
func testDescribeExecution(t *testing.T, db *testdb.DB) {
	t.Parallel()
	ctx := context.Background()
	const p = int16(7)

	tests := []struct {
		name     string
		exec     fftest.Exec
		set      map[string]any // ff_exec_core columns to set after insert
		want     ffread.ExecutionSnapshot
		wantErr  string
		wantInfo string // ReadExecutionInfo's public state of the same row
	}{
		{name: "Active", exec: fftest.Exec{PublicState: "active", RawFields: describable(map[string]any{"blocking_detail": "d"})},
			want: ffread.ExecutionSnapshot{LaneID: "default", Namespace: "tenant-a", PublicState: "active", BlockingDetail: "d",
				CreatedAtMs: 1, LastMutationAtMs: 1000, TotalAttemptCount: 2, Tags: map[string]string{"cairn.instance_id": "inst-1"}},
			wantInfo: "active"},
		{name: "RunningIsCorruption", exec: fftest.Exec{PublicState: "running", RawFields: describable(nil)},
			wantErr: "validation: Corruption: describe_execution: exec_core: public_state: 'running' is not a known public state: " +
				"unknown variant `running`, expected " + publicStateVariants + " at line 1 column 9",
			wantInfo: "active"},
		{name: "BlockingReasonIsRaw", exec: fftest.Exec{PublicState: "waiting", RawFields: describable(nil)},
			set: map[string]any{"blocking_reason": "not_a_reason"},
			want: ffread.ExecutionSnapshot{LaneID: "default", Namespace: "tenant-a", PublicState: "waiting", BlockingReason: "not_a_reason",
				CreatedAtMs: 1, LastMutationAtMs: 1000, TotalAttemptCount: 2, Tags: map[string]string{"cairn.instance_id": "inst-1"}}},
		{name: "CurrentAttemptAndWaitpoint", exec: fftest.Exec{PublicState: "suspended", RawFields: describable(map[string]any{
			"current_attempt_id": "0b0e8d4c-4a55-4c2e-9f43-0c3c7a6f3c11", "current_attempt_index": "1",
			"current_waitpoint_id": "5d0f8f0e-1d7b-4f55-8d8e-7a8e9c1f2a33"})},
			want: ffread.ExecutionSnapshot{LaneID: "default", Namespace: "tenant-a", PublicState: "suspended",
				CreatedAtMs: 1, LastMutationAtMs: 1000, TotalAttemptCount: 2, Tags: map[string]string{"cairn.instance_id": "inst-1"},
				CurrentAttempt:     &ffread.AttemptSummary{AttemptID: "0b0e8d4c-4a55-4c2e-9f43-0c3c7a6f3c11", AttemptIndex: 1},
				CurrentWaitpointID: "5d0f8f0e-1d7b-4f55-8d8e-7a8e9c1f2a33"}},
		{name: "FlowMemberFails", exec: fftest.Exec{PublicState: "waiting", FlowID: fftest.NewUUID(), RawFields: describable(nil)},
			wantErr: "validation: Corruption: describe_execution: exec_core: flow_id: is not a valid UUID (key corruption?): " +
				"invalid character: expected an optional prefix of `urn:uuid:` followed by [0-9a-fA-F-], found `{` at 1",
			wantInfo: "waiting"},
		{name: "NoLastMutationAt", exec: fftest.Exec{PublicState: "waiting", Namespace: "tenant-a"},
			wantErr: "describe_execution: exec_core: last_mutation_at: is missing or empty (key corruption?)"},
		{name: "BadTotalAttemptCount", exec: fftest.Exec{PublicState: "waiting", RawFields: describable(map[string]any{"total_attempt_count": "-1"})},
			wantErr: "describe_execution: exec_core: total_attempt_count: is not a valid u32 ('-1'): invalid digit found in string"},
		{name: "EmptyLane", exec: fftest.Exec{PublicState: "waiting", RawFields: describable(nil)}, set: map[string]any{"lane_id": ""},
			wantErr: "describe_execution: exec_core: lane_id: fails LaneId validation (key corruption?): lane_id is empty"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			tt.exec.Partition = p
			id := fftest.InsertExec(t, db.Pool, tt.exec)
			for col, v := range tt.set {
				setExec(t, db.Pool, p, id, col, v)
			}
			snap, err := ffread.DescribeExecution(ctx, db.Pool, p, id)
			if tt.wantErr != "" {
				wantErrText(t, err, tt.wantErr)
			} else {
				if err != nil {
					t.Fatal(err)
				}
				tt.want.Partition, tt.want.ExecutionID = p, id
				if !reflect.DeepEqual(*snap, tt.want) {
					t.Fatalf("snapshot = %+v\nwant       %+v", *snap, tt.want)
				}
			}
			if tt.wantInfo != "" {
				info, err := ffread.ReadExecutionInfo(ctx, db.Pool, p, id)
				if err != nil || info.PublicState != tt.wantInfo {
					t.Fatalf("read_execution_info of the same row: %+v, %v; want public state %s", info, err, tt.wantInfo)
				}
			}
		})
	}
	t.Run("Missing", func(t *testing.T) {
		t.Parallel()
		snap, err := ffread.DescribeExecution(ctx, db.Pool, p, fftest.NewUUID())
		if snap != nil || err != nil {
			t.Fatalf("= %+v, %v; want nil, nil", snap, err)
		}
	})
}

// testCancel: the Handle cancel. A live row is cancelled in one
// transaction (terminal, public 'cancelled', the attempt's outcome cleared,
// its lease left alone); a terminal row is a no-op when already cancelled
// and FlowFabric's "already terminal in state" error otherwise, quoting
// whatever public_state a reconciler left; lifecycle 'cancelled' is not
// terminal to it. A regression shows as a second cancel of a cancelled row
// failing, an expired row cancelled over, a missing row succeeding, or the
// written row differing from FlowFabric's (including the resulting
// terminal_outcome none that read_execution_info then derives).
func testCancel(t *testing.T, db *testdb.DB) {
	t.Parallel()
	ctx := context.Background()
	const p = int16(8)

	t.Run("Live", func(t *testing.T) {
		t.Parallel()
		id := fftest.InsertExec(t, db.Pool, fftest.Exec{Partition: p, RawFields: describable(nil)})
		fftest.InsertAttempt(t, db.Pool, p, id, 0, fftest.Ms(9_999_999_999_999))
		setAttempt(t, db.Pool, p, id, 0, "outcome = 'retry'")

		if err := ffread.Cancel(ctx, db.Pool, p, id, "user asked"); err != nil {
			t.Fatal(err)
		}
		ex := fftest.ReadExec(t, db.Pool, p, id)
		if ex.LifecyclePhase != "terminal" || ex.OwnershipState != "unowned" || ex.EligibilityState != "not_applicable" ||
			ex.PublicState != "cancelled" || ex.AttemptState != "cancelled" || ex.TerminalAtMs == nil ||
			ex.CancellationReason == nil || *ex.CancellationReason != "user asked" || ex.CancelledBy == nil || *ex.CancelledBy != "worker" {
			t.Fatalf("exec = %+v", ex)
		}
		if lm, _ := ex.RawFields["last_mutation_at"].(string); lm != fmt.Sprint(*ex.TerminalAtMs) {
			t.Fatalf("last_mutation_at = %v; want the string of terminal_at_ms %d", ex.RawFields["last_mutation_at"], *ex.TerminalAtMs)
		}
		at := fftest.ReadAttempt(t, db.Pool, p, id, 0)
		if at.Outcome != nil || at.LeaseExpiresAtMs == nil {
			t.Fatalf("attempt = outcome %v, lease %v; want outcome cleared, lease untouched", at.Outcome, at.LeaseExpiresAtMs)
		}
		if evs := fftest.LeaseEvents(t, db.Pool, id); len(evs) != 0 {
			t.Fatalf("lease events = %+v; the Handle cancel writes none", evs)
		}
		// What a reader then sees: cancelled, but no terminal outcome (the
		// phase is 'terminal', not 'cancelled', and the outcome is NULL).
		info, err := ffread.ReadExecutionInfo(ctx, db.Pool, p, id)
		if err != nil || info.StateVector.LifecyclePhase != "terminal" || info.PublicState != "cancelled" ||
			info.StateVector.AttemptState != "attempt_terminal" || info.StateVector.TerminalOutcome != "none" {
			t.Fatalf("read_execution_info = %+v, %v", info, err)
		}
		if err := ffread.Cancel(ctx, db.Pool, p, id, "again"); err != nil {
			t.Fatalf("second cancel: %v; want the idempotent nil", err)
		}
	})

	tests := []struct {
		name, phase, public string
		wantErr             string // "" : nil, the row unchanged
	}{
		{name: "TerminalCancelled", phase: "terminal", public: "cancelled"},
		{name: "TerminalExpired", phase: "terminal", public: "expired", wantErr: "already terminal in state 'expired'"},
		{name: "TerminalCompleted", phase: "terminal", public: "completed", wantErr: "already terminal in state 'completed'"},
		// attempt_timeout left the claim's literal behind.
		{name: "TerminalStaleRunning", phase: "terminal", public: "running", wantErr: "already terminal in state 'running'"},
		// suspension_timeout left the suspend's literal behind.
		{name: "TerminalStaleSuspended", phase: "terminal", public: "suspended", wantErr: "already terminal in state 'suspended'"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			id := fftest.InsertExec(t, db.Pool, fftest.Exec{Partition: p, LifecyclePhase: tt.phase, PublicState: tt.public,
				OwnershipState: "unowned", TerminalAtMs: fftest.Ms(5)})
			before := fftest.ExecJSON(t, db.Pool, p, id)
			err := ffread.Cancel(ctx, db.Pool, p, id, "r")
			if tt.wantErr == "" && err != nil {
				t.Fatal(err)
			}
			if tt.wantErr != "" {
				want := "validation: InvalidInput: cancel: execution_id=" + wire(p, id) + ": " + tt.wantErr
				if err == nil || err.Error() != want {
					t.Fatalf("err = %v; want %s", err, want)
				}
			}
			if after := fftest.ExecJSON(t, db.Pool, p, id); !reflect.DeepEqual(before, after) {
				t.Fatalf("row changed:\nbefore %v\nafter  %v", before, after)
			}
		})
	}

	t.Run("LifecycleCancelledIsCancelledAgain", func(t *testing.T) {
		t.Parallel()
		id := fftest.InsertExec(t, db.Pool, fftest.Exec{Partition: p, LifecyclePhase: "cancelled", PublicState: "cancelled",
			OwnershipState: "unowned", TerminalAtMs: fftest.Ms(5)})
		setExec(t, db.Pool, p, id, "cancelled_by", "operator_override")
		if err := ffread.Cancel(ctx, db.Pool, p, id, "worker's reason"); err != nil {
			t.Fatal(err)
		}
		ex := fftest.ReadExec(t, db.Pool, p, id)
		if ex.LifecyclePhase != "terminal" || *ex.CancelledBy != "worker" || *ex.TerminalAtMs == 5 {
			t.Fatalf("exec = %+v; want re-stamped terminal by the worker", ex)
		}
	})

	t.Run("Missing", func(t *testing.T) {
		t.Parallel()
		id := fftest.NewUUID()
		err := ffread.Cancel(ctx, db.Pool, p, id, "r")
		want := fmt.Sprintf("validation: InvalidInput: cancel: execution_id=%s: row not found on partition_key=%d", wire(p, id), p)
		if err == nil || err.Error() != want {
			t.Fatalf("err = %v; want %s", err, want)
		}
	})
}
