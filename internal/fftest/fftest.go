// Package fftest seeds and reads ff_* rows in tests, the way FlowFabric
// writes them, so tests state only what matters to them.
package fftest

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/flowfabric/ffreconcile/internal/ffseed"
	"github.com/flowfabric/ffreconcile/store"
)

// NewUUID returns a random (version 4) UUID string.
func NewUUID() string { return ffseed.NewUUID() }

// Exec is an ff_exec_core row (ffseed.Exec). Zero fields take
// FlowFabric-like defaults for an active, leased execution.
type Exec = ffseed.Exec

// InsertExec inserts e and returns its id.
func InsertExec(t testing.TB, db store.DB, e Exec) string {
	t.Helper()
	e = e.Defaults()
	insert(t, db, e)
	return e.ID
}

// insert inserts r with ffseed.Insert; an error fails the test.
func insert(t testing.TB, db store.DB, rows ...ffseed.Row) {
	t.Helper()
	if err := ffseed.InsertAll(context.Background(), db, rows...); err != nil {
		t.Fatal(err)
	}
}

// InsertAttempt inserts an ff_attempt row of worker w1 whose lease expires
// at expiresAtMs (nil: released).
func InsertAttempt(t testing.TB, db store.DB, partition int16, execID string, attemptIndex int32, expiresAtMs *int64) {
	t.Helper()
	insert(t, db, ffseed.Attempt{Partition: partition, ExecutionID: execID, AttemptIndex: attemptIndex, WorkerID: "w1",
		WorkerInstanceID: "w1-i1", LeaseEpoch: 1, LeaseExpiresAtMs: expiresAtMs, StartedAtMs: Ms(1)})
}

// Ms returns a pointer to v, for nullable *_ms fields.
func Ms(v int64) *int64 { return &v }

// ExecRow is what tests read back from ff_exec_core.
type ExecRow struct {
	LifecyclePhase, OwnershipState, EligibilityState, PublicState, AttemptState string
	BlockingReason, CancellationReason, CancelledBy                             *string
	TerminalAtMs, DeadlineAtMs                                                  *int64
	RawFields                                                                   map[string]any
	RawFieldsText                                                               string
}

// Deref returns *s, or "<nil>" for nil, for comparisons and messages.
func Deref(s *string) string {
	if s == nil {
		return "<nil>"
	}
	return *s
}

// ReadExec reads one execution; it fails the test when the row is missing.
func ReadExec(t testing.TB, db store.DB, partition int16, id string) ExecRow {
	t.Helper()
	var r ExecRow
	err := db.QueryRow(context.Background(), `
		SELECT lifecycle_phase, ownership_state, eligibility_state, public_state, attempt_state,
		       blocking_reason, cancellation_reason, cancelled_by, terminal_at_ms, deadline_at_ms, raw_fields::text
		  FROM ff_exec_core WHERE partition_key = $1 AND execution_id = $2`, partition, id).
		Scan(&r.LifecyclePhase, &r.OwnershipState, &r.EligibilityState, &r.PublicState, &r.AttemptState,
			&r.BlockingReason, &r.CancellationReason, &r.CancelledBy, &r.TerminalAtMs, &r.DeadlineAtMs, &r.RawFieldsText)
	if err != nil {
		t.Fatalf("read ff_exec_core %d/%s: %v", partition, id, err)
	}
	_ = json.Unmarshal([]byte(r.RawFieldsText), &r.RawFields)
	return r
}

// AttemptRow is what tests read back from ff_attempt.
type AttemptRow struct {
	LeaseExpiresAtMs *int64
	Outcome          *string
}

// ReadAttempt reads one attempt.
func ReadAttempt(t testing.TB, db store.DB, partition int16, id string, attemptIndex int32) AttemptRow {
	t.Helper()
	var r AttemptRow
	err := db.QueryRow(context.Background(), `
		SELECT lease_expires_at_ms, outcome FROM ff_attempt
		 WHERE partition_key = $1 AND execution_id = $2 AND attempt_index = $3`, partition, id, attemptIndex).
		Scan(&r.LeaseExpiresAtMs, &r.Outcome)
	if err != nil {
		t.Fatalf("read ff_attempt %d/%s/%d: %v", partition, id, attemptIndex, err)
	}
	return r
}

// LeaseEvent is one ff_lease_event row.
type LeaseEvent struct {
	EventID      int64
	ExecutionID  string
	EventType    string
	OccurredAtMs int64
	Partition    int32
	Namespace    *string
	InstanceTag  *string
}

// LeaseEvents returns the lease events of an execution, oldest first.
func LeaseEvents(t testing.TB, db store.DB, id string) []LeaseEvent {
	t.Helper()
	rows, err := db.Query(context.Background(), `
		SELECT event_id, execution_id, event_type, occurred_at_ms, partition_key, namespace, instance_tag
		  FROM ff_lease_event WHERE execution_id = $1 ORDER BY event_id`, id)
	if err != nil {
		t.Fatal(err)
	}
	evs, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (LeaseEvent, error) {
		var e LeaseEvent
		err := r.Scan(&e.EventID, &e.ExecutionID, &e.EventType, &e.OccurredAtMs, &e.Partition, &e.Namespace, &e.InstanceTag)
		return e, err
	})
	if err != nil {
		t.Fatal(err)
	}
	return evs
}

// Count runs a count(*) query.
func Count(t testing.TB, db store.DB, sql string, args ...any) int {
	t.Helper()
	var n int
	if err := db.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return n
}

// Str returns a pointer to s.
func Str(s string) *string { return &s }

// Delayed returns an execution parked by FlowFabric's attempt::delay():
// runnable, unowned, not_eligible_until_time, public state delayed, with
// deadline_at_ms holding its delay-until.
func Delayed(partition int16, delayUntilMs int64) Exec {
	return Exec{Partition: partition, LifecyclePhase: "runnable", OwnershipState: "unowned",
		EligibilityState: "not_eligible_until_time", PublicState: "delayed", AttemptState: "pending_retry_attempt",
		DeadlineAtMs: Ms(delayUntilMs)}
}

// ExecJSON reads a whole ff_exec_core row as a JSON object (column name to
// value), so a test can check that an action changed only what it should.
func ExecJSON(t testing.TB, db store.DB, partition int16, id string) map[string]any {
	t.Helper()
	var text string
	err := db.QueryRow(context.Background(),
		`SELECT to_jsonb(e)::text FROM ff_exec_core e WHERE partition_key = $1 AND execution_id = $2`, partition, id).Scan(&text)
	if err != nil {
		t.Fatalf("read ff_exec_core %d/%s: %v", partition, id, err)
	}
	var m map[string]any
	if err := json.Unmarshal([]byte(text), &m); err != nil {
		t.Fatal(err)
	}
	return m
}

// Suspension is an ff_suspension_current row. Zero fields take defaults: a
// fresh suspension id, suspended at 1, condition {}, member_map {}.
type Suspension struct {
	Partition   int16
	ExecutionID string
	TimeoutAtMs *int64
	// Behavior is timeout_behavior; nil stores NULL (which means fail).
	Behavior *string
	// MemberMap is stored as JSON; nil stores {}.
	MemberMap any
}

// InsertSuspension inserts s (reason code test, condition {}, suspended
// at 1).
func InsertSuspension(t testing.TB, db store.DB, s Suspension) {
	t.Helper()
	insert(t, db, ffseed.Suspension{Partition: s.Partition, ExecutionID: s.ExecutionID, TimeoutAtMs: s.TimeoutAtMs,
		ReasonCode: "test", MemberMap: s.MemberMap, Behavior: s.Behavior})
}

// SuspensionRow is what tests read back from ff_suspension_current.
type SuspensionRow struct {
	TimeoutAtMs   *int64
	Behavior      *string
	MemberMapText string
	MemberMap     any
}

// ReadSuspension reads one suspension; ok is false when the row is missing.
func ReadSuspension(t testing.TB, db store.DB, partition int16, execID string) (r SuspensionRow, ok bool) {
	t.Helper()
	err := db.QueryRow(context.Background(), `
		SELECT timeout_at_ms, timeout_behavior, member_map::text FROM ff_suspension_current
		 WHERE partition_key = $1 AND execution_id = $2`, partition, execID).
		Scan(&r.TimeoutAtMs, &r.Behavior, &r.MemberMapText)
	if errors.Is(err, pgx.ErrNoRows) {
		return SuspensionRow{}, false
	}
	if err != nil {
		t.Fatalf("read ff_suspension_current %d/%s: %v", partition, execID, err)
	}
	_ = json.Unmarshal([]byte(r.MemberMapText), &r.MemberMap)
	return r, true
}

// CompletionEvent is one ff_completion_event row.
type CompletionEvent struct {
	EventID      int64
	Partition    int16
	ExecutionID  string
	FlowID       *string
	Outcome      string
	Namespace    *string
	InstanceTag  *string
	OccurredAtMs int64
}

// CompletionEvents returns the completion events of an execution, oldest
// first.
func CompletionEvents(t testing.TB, db store.DB, execID string) []CompletionEvent {
	t.Helper()
	rows, err := db.Query(context.Background(), `
		SELECT event_id, partition_key, execution_id::text, flow_id::text, outcome, namespace, instance_tag, occurred_at_ms
		  FROM ff_completion_event WHERE execution_id = $1 ORDER BY event_id`, execID)
	if err != nil {
		t.Fatal(err)
	}
	evs, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (CompletionEvent, error) {
		var e CompletionEvent
		err := r.Scan(&e.EventID, &e.Partition, &e.ExecutionID, &e.FlowID, &e.Outcome, &e.Namespace, &e.InstanceTag, &e.OccurredAtMs)
		return e, err
	})
	if err != nil {
		t.Fatal(err)
	}
	return evs
}

// EdgeGroup is an ff_edge_group row with the pending-cancel columns.
type EdgeGroup struct {
	Partition     int16
	FlowID        string
	DownstreamEID string
	Flag          bool
	Members       []string // stored as given; nil stores {}
}

// InsertEdgeGroup inserts g: an any_of(1) group cancelling its remaining
// upstreams.
func InsertEdgeGroup(t testing.TB, db store.DB, g EdgeGroup) {
	t.Helper()
	insert(t, db, ffseed.EdgeGroup{Partition: g.Partition, FlowID: g.FlowID, DownstreamEID: g.DownstreamEID,
		Policy: ffseed.AnyOfCancelRemaining, KTarget: 1, Flag: g.Flag, Members: g.Members})
}

// EdgeGroupRow is what tests read back from ff_edge_group.
type EdgeGroupRow struct {
	Flag    bool
	Members []string
}

// ReadEdgeGroup reads one edge group; it fails the test when it is missing.
func ReadEdgeGroup(t testing.TB, db store.DB, partition int16, flowID, downstreamEID string) EdgeGroupRow {
	t.Helper()
	var r EdgeGroupRow
	err := db.QueryRow(context.Background(), `
		SELECT cancel_siblings_pending_flag, cancel_siblings_pending_members FROM ff_edge_group
		 WHERE partition_key = $1 AND flow_id = $2 AND downstream_eid = $3`, partition, flowID, downstreamEID).
		Scan(&r.Flag, &r.Members)
	if err != nil {
		t.Fatalf("read ff_edge_group %d/%s/%s: %v", partition, flowID, downstreamEID, err)
	}
	return r
}

// InsertPendingCancel inserts an ff_pending_cancel_groups row.
func InsertPendingCancel(t testing.TB, db store.DB, partition int16, flowID, downstreamEID string, enqueuedAtMs int64) {
	t.Helper()
	insert(t, db, ffseed.PendingCancel{Partition: partition, FlowID: flowID, DownstreamEID: downstreamEID,
		EnqueuedAtMs: enqueuedAtMs})
}

// PendingCancelExists reports whether a pending cancel group row exists.
func PendingCancelExists(t testing.TB, db store.DB, partition int16, flowID, downstreamEID string) bool {
	t.Helper()
	return Count(t, db, `SELECT count(*) FROM ff_pending_cancel_groups
		 WHERE partition_key = $1 AND flow_id = $2 AND downstream_eid = $3`, partition, flowID, downstreamEID) > 0
}

// WaitForLockWait waits, for up to a minute, until a backend of db's own
// database waits on a lock while running a statement whose text contains
// pattern (ILIKE, so % matches anything). Tests of a row action racing a
// holder of its row use it to know the action is blocked before the holder
// commits. It names the database because the suite runs tests side by side
// on one server: a lock wait in another test's database would release the
// wait early, and the test then passes without the race it is named for, or
// fails by chance.
func WaitForLockWait(t testing.TB, db store.DB, pattern string) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for Count(t, db, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND pid <> pg_backend_pid()
			  AND wait_event_type = 'Lock' AND query ILIKE '%' || $1 || '%'`, pattern) == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("no statement matching %q in this test's database ever waited on a lock", pattern)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
