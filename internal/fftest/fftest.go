// Package fftest seeds and reads ff_* rows in tests, the way FlowFabric
// writes them, so tests state only what matters to them.
package fftest

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/flowfabric/ffreconcile/store"
)

// NewUUID returns a random (version 4) UUID string.
func NewUUID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}

// Exec is an ff_exec_core row. Zero fields take FlowFabric-like defaults
// for an active, leased execution.
type Exec struct {
	Partition        int16
	ID               string
	FlowID           string // empty: NULL
	LifecyclePhase   string
	OwnershipState   string
	EligibilityState string
	PublicState      string
	AttemptState     string
	DeadlineAtMs     *int64
	// RawFields is stored as JSON; nil builds {"namespace": Namespace,
	// "tags": Tags} from the two fields below (omitting empty ones).
	RawFields any
	Namespace string
	Tags      map[string]string
}

// InsertExec inserts e and returns its id.
func InsertExec(t testing.TB, db store.DB, e Exec) string {
	t.Helper()
	if e.ID == "" {
		e.ID = NewUUID()
	}
	def := func(s *string, v string) {
		if *s == "" {
			*s = v
		}
	}
	def(&e.LifecyclePhase, "active")
	def(&e.OwnershipState, "leased")
	def(&e.EligibilityState, "not_applicable")
	def(&e.PublicState, "running")
	def(&e.AttemptState, "running_attempt")
	raw := e.RawFields
	if raw == nil {
		m := map[string]any{}
		if e.Namespace != "" {
			m["namespace"] = e.Namespace
		}
		if len(e.Tags) > 0 {
			m["tags"] = e.Tags
		}
		raw = m
	}
	rawJSON, err := json.Marshal(raw)
	if err != nil {
		t.Fatal(err)
	}
	var flow any
	if e.FlowID != "" {
		flow = e.FlowID
	}
	_, err = db.Exec(context.Background(), `
		INSERT INTO ff_exec_core (partition_key, execution_id, flow_id, lane_id, lifecycle_phase, ownership_state,
		       eligibility_state, public_state, attempt_state, created_at_ms, deadline_at_ms, raw_fields)
		VALUES ($1, $2, $3, 'default', $4, $5, $6, $7, $8, 1, $9, $10::jsonb)`,
		e.Partition, e.ID, flow, e.LifecyclePhase, e.OwnershipState, e.EligibilityState, e.PublicState,
		e.AttemptState, e.DeadlineAtMs, string(rawJSON))
	if err != nil {
		t.Fatalf("insert ff_exec_core: %v", err)
	}
	return e.ID
}

// InsertAttempt inserts an ff_attempt row whose lease expires at
// expiresAtMs (nil: released).
func InsertAttempt(t testing.TB, db store.DB, partition int16, execID string, attemptIndex int32, expiresAtMs *int64) {
	t.Helper()
	_, err := db.Exec(context.Background(), `
		INSERT INTO ff_attempt (partition_key, execution_id, attempt_index, worker_id, worker_instance_id,
		       lease_epoch, lease_expires_at_ms, started_at_ms)
		VALUES ($1, $2, $3, 'w1', 'w1-i1', 1, $4, 1)`, partition, execID, attemptIndex, expiresAtMs)
	if err != nil {
		t.Fatalf("insert ff_attempt: %v", err)
	}
}

// Ms returns a pointer to v, for nullable *_ms fields.
func Ms(v int64) *int64 { return &v }

// ExecRow is what tests read back from ff_exec_core.
type ExecRow struct {
	LifecyclePhase, OwnershipState, EligibilityState, PublicState, AttemptState string
	CancellationReason, CancelledBy                                             *string
	TerminalAtMs, DeadlineAtMs                                                  *int64
	RawFields                                                                   map[string]any
	RawFieldsText                                                               string
}

// ReadExec reads one execution; it fails the test when the row is missing.
func ReadExec(t testing.TB, db store.DB, partition int16, id string) ExecRow {
	t.Helper()
	var r ExecRow
	err := db.QueryRow(context.Background(), `
		SELECT lifecycle_phase, ownership_state, eligibility_state, public_state, attempt_state,
		       cancellation_reason, cancelled_by, terminal_at_ms, deadline_at_ms, raw_fields::text
		  FROM ff_exec_core WHERE partition_key = $1 AND execution_id = $2`, partition, id).
		Scan(&r.LifecyclePhase, &r.OwnershipState, &r.EligibilityState, &r.PublicState, &r.AttemptState,
			&r.CancellationReason, &r.CancelledBy, &r.TerminalAtMs, &r.DeadlineAtMs, &r.RawFieldsText)
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
