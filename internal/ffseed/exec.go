package ffseed

import (
	"context"
	"fmt"
)

// Exec is an ff_exec_core row. Zero fields take FlowFabric-like defaults
// for an active, leased execution.
type Exec struct {
	Partition int16
	// ID is the execution id; "": a fresh UUID.
	ID string
	// FlowID: "" stores NULL (a standalone execution).
	FlowID string
	// LaneID: "" stores default.
	LaneID string
	// The state columns: "" stores active, leased, not_applicable,
	// running and running_attempt.
	LifecyclePhase   string
	OwnershipState   string
	EligibilityState string
	PublicState      string
	AttemptState     string
	AttemptIndex     int32
	// CreatedAtMs: 0 stores 1.
	CreatedAtMs  int64
	DeadlineAtMs *int64
	StartedAtMs  *int64
	TerminalAtMs *int64
	// Policy is stored as JSON: marshalled (a string is a JSON string), a
	// json.RawMessage as it is; nil stores NULL.
	Policy any
	// RawFields is stored as JSON like Policy; nil builds {"namespace":
	// Namespace, "tags": Tags} from the two fields below (omitting empty
	// ones).
	RawFields any
	Namespace string
	Tags      map[string]string
}

// Table names ff_exec_core.
func (Exec) Table() string { return "ff_exec_core" }

// Defaults returns e with its zero fields filled, a fresh ID among them:
// call it to learn the id of a row before inserting it.
func (e Exec) Defaults() Exec {
	if e.ID == "" {
		e.ID = NewUUID()
	}
	e.LaneID = orText(e.LaneID, "default")
	e.LifecyclePhase = orText(e.LifecyclePhase, "active")
	e.OwnershipState = orText(e.OwnershipState, "leased")
	e.EligibilityState = orText(e.EligibilityState, "not_applicable")
	e.PublicState = orText(e.PublicState, "running")
	e.AttemptState = orText(e.AttemptState, "running_attempt")
	e.CreatedAtMs = orInt(e.CreatedAtMs, 1)
	if e.RawFields == nil {
		m := map[string]any{}
		if e.Namespace != "" {
			m["namespace"] = e.Namespace
		}
		if len(e.Tags) > 0 {
			m["tags"] = e.Tags
		}
		e.RawFields = m
	}
	return e
}

func (e Exec) columns() ([]column, error) {
	e = e.Defaults()
	raw, err := jsonText(e.Table(), "raw_fields", e.RawFields, "{}")
	if err != nil {
		return nil, err
	}
	var policy any
	if e.Policy != nil {
		p, err := jsonText(e.Table(), "policy", e.Policy, "")
		if err != nil {
			return nil, err
		}
		policy = p
	}
	return []column{
		i16("partition_key", e.Partition), uuidCol("execution_id", e.ID), uuidCol("flow_id", nullText(e.FlowID)),
		text("lane_id", e.LaneID), text("lifecycle_phase", e.LifecyclePhase), text("ownership_state", e.OwnershipState),
		text("eligibility_state", e.EligibilityState), text("public_state", e.PublicState),
		text("attempt_state", e.AttemptState), i32("attempt_index", e.AttemptIndex), i64("created_at_ms", e.CreatedAtMs),
		msCol("deadline_at_ms", e.DeadlineAtMs), msCol("started_at_ms", e.StartedAtMs),
		msCol("terminal_at_ms", e.TerminalAtMs), jsonb("policy", policy), jsonb("raw_fields", raw),
	}, nil
}

// Attempt is an ff_attempt row. Zero fields store NULL (or the column's
// default, lease_epoch 0).
type Attempt struct {
	Partition        int16
	ExecutionID      string
	AttemptIndex     int32
	WorkerID         string // "": NULL
	WorkerInstanceID string // "": NULL
	LeaseEpoch       int64
	LeaseExpiresAtMs *int64
	StartedAtMs      *int64
	TerminalAtMs     *int64
	Outcome          string // "": NULL
}

// Table names ff_attempt.
func (Attempt) Table() string { return "ff_attempt" }

func (a Attempt) columns() ([]column, error) {
	return []column{
		i16("partition_key", a.Partition), uuidCol("execution_id", a.ExecutionID), i32("attempt_index", a.AttemptIndex),
		text("worker_id", nullText(a.WorkerID)), text("worker_instance_id", nullText(a.WorkerInstanceID)),
		i64("lease_epoch", a.LeaseEpoch), msCol("lease_expires_at_ms", a.LeaseExpiresAtMs),
		msCol("started_at_ms", a.StartedAtMs), msCol("terminal_at_ms", a.TerminalAtMs), text("outcome", nullText(a.Outcome)),
	}, nil
}

// Suspension is an ff_suspension_current row.
type Suspension struct {
	Partition   int16
	ExecutionID string
	// SuspensionID: "": a fresh UUID.
	SuspensionID string
	// SuspendedAtMs: 0 stores 1.
	SuspendedAtMs int64
	TimeoutAtMs   *int64
	ReasonCode    string // "": NULL
	// Condition is stored as JSON like Exec.Policy; nil stores {}.
	Condition any
	// MemberMap is stored as JSON like Exec.Policy; nil stores {}.
	MemberMap any
	// Behavior is timeout_behavior; nil stores NULL (which means fail).
	Behavior *string
}

// Table names ff_suspension_current.
func (Suspension) Table() string { return "ff_suspension_current" }

func (s Suspension) columns() ([]column, error) {
	if s.SuspensionID == "" {
		s.SuspensionID = NewUUID()
	}
	cond, err := jsonText(s.Table(), "condition", s.Condition, "{}")
	if err != nil {
		return nil, err
	}
	mm, err := jsonText(s.Table(), "member_map", s.MemberMap, "{}")
	if err != nil {
		return nil, err
	}
	return []column{
		i16("partition_key", s.Partition), uuidCol("execution_id", s.ExecutionID), uuidCol("suspension_id", s.SuspensionID),
		i64("suspended_at_ms", orInt(s.SuspendedAtMs, 1)), msCol("timeout_at_ms", s.TimeoutAtMs),
		text("reason_code", nullText(s.ReasonCode)), jsonb("condition", cond), jsonb("member_map", mm),
		text("timeout_behavior", nullTextPtr(s.Behavior)),
	}, nil
}

// Waitpoint is an ff_waitpoint_pending row.
type Waitpoint struct {
	Partition int16
	// ID: "": a fresh UUID.
	ID          string
	ExecutionID string
	// TokenKid and Token: "" stores kid-1 and token.
	TokenKid, Token string
	// CreatedAtMs: 0 stores 1.
	CreatedAtMs int64
	ExpiresAtMs *int64
	// Key is waitpoint_key: ” (FlowFabric then keys the member_map by the
	// waitpoint id) unless set.
	Key string
	// State: "" stores pending.
	State               string
	RequiredSignalNames []string // nil: {}
	ActivatedAtMs       *int64
}

// Table names ff_waitpoint_pending.
func (Waitpoint) Table() string { return "ff_waitpoint_pending" }

// Defaults returns w with its zero fields filled, a fresh ID among them.
func (w Waitpoint) Defaults() Waitpoint {
	if w.ID == "" {
		w.ID = NewUUID()
	}
	w.TokenKid = orText(w.TokenKid, "kid-1")
	w.Token = orText(w.Token, "token")
	w.CreatedAtMs = orInt(w.CreatedAtMs, 1)
	w.State = orText(w.State, "pending")
	w.RequiredSignalNames = orStrings(w.RequiredSignalNames, []string{})
	return w
}

func (w Waitpoint) columns() ([]column, error) {
	w = w.Defaults()
	return []column{
		i16("partition_key", w.Partition), uuidCol("waitpoint_id", w.ID), uuidCol("execution_id", w.ExecutionID),
		text("token_kid", w.TokenKid), text("token", w.Token), i64("created_at_ms", w.CreatedAtMs),
		msCol("expires_at_ms", w.ExpiresAtMs), text("waitpoint_key", w.Key), text("state", w.State),
		texts("required_signal_names", w.RequiredSignalNames), msCol("activated_at_ms", w.ActivatedAtMs),
	}, nil
}

// Edge is an ff_edge row.
type Edge struct {
	Partition int16
	FlowID    string
	// EdgeID: "": a fresh UUID.
	EdgeID                     string
	UpstreamEID, DownstreamEID string
	// Policy is JSON text; "" stores {"kind": "all_of"}.
	Policy string
}

// Table names ff_edge.
func (Edge) Table() string { return "ff_edge" }

func (e Edge) columns() ([]column, error) {
	if e.EdgeID == "" {
		e.EdgeID = NewUUID()
	}
	return []column{
		i16("partition_key", e.Partition), uuidCol("flow_id", e.FlowID), uuidCol("edge_id", e.EdgeID),
		uuidCol("upstream_eid", e.UpstreamEID), uuidCol("downstream_eid", e.DownstreamEID),
		jsonb("policy", orText(e.Policy, AllOf)),
	}, nil
}

// Edge policies as FlowFabric writes them.
const (
	// AllOf is an all_of dependency.
	AllOf = `{"kind": "all_of"}`
	// AnyOfCancelRemaining is an any_of(1) quorum that cancels its
	// remaining upstreams once satisfied.
	AnyOfCancelRemaining = `{"kind": "any_of", "on_satisfied": "cancel_remaining"}`
)

// EdgeGroup is an ff_edge_group row: a downstream's counters and its
// pending sibling cancel.
type EdgeGroup struct {
	Partition     int16
	FlowID        string
	DownstreamEID string
	// Policy is JSON text; "" stores {"kind": "all_of"}.
	Policy              string
	KTarget             int32
	Success, Fail, Skip int32
	Running             int32
	// Flag is cancel_siblings_pending_flag.
	Flag bool
	// Members is cancel_siblings_pending_members, stored as given; nil
	// stores {}.
	Members []string
}

// Table names ff_edge_group.
func (EdgeGroup) Table() string { return "ff_edge_group" }

func (g EdgeGroup) columns() ([]column, error) {
	return []column{
		i16("partition_key", g.Partition), uuidCol("flow_id", g.FlowID), uuidCol("downstream_eid", g.DownstreamEID),
		jsonb("policy", orText(g.Policy, AllOf)), i32("k_target", g.KTarget), i32("success_count", g.Success),
		i32("fail_count", g.Fail), i32("skip_count", g.Skip), i32("running_count", g.Running),
		boolCol("cancel_siblings_pending_flag", g.Flag),
		texts("cancel_siblings_pending_members", orStrings(g.Members, []string{})),
	}, nil
}

// PendingCancel is an ff_pending_cancel_groups row.
type PendingCancel struct {
	Partition     int16
	FlowID        string
	DownstreamEID string
	EnqueuedAtMs  int64
}

// Table names ff_pending_cancel_groups.
func (PendingCancel) Table() string { return "ff_pending_cancel_groups" }

func (p PendingCancel) columns() ([]column, error) {
	return []column{
		i16("partition_key", p.Partition), uuidCol("flow_id", p.FlowID), uuidCol("downstream_eid", p.DownstreamEID),
		i64("enqueued_at_ms", p.EnqueuedAtMs),
	}, nil
}

// CompletionEvent is an ff_completion_event row (its event_id is the
// table's identity).
type CompletionEvent struct {
	Partition   int16
	ExecutionID string
	// FlowID: "" stores NULL (a standalone execution).
	FlowID string
	// Outcome: "" stores success.
	Outcome      string
	Namespace    string // "": NULL
	InstanceTag  string // "": NULL
	OccurredAtMs int64
	// CommittedAtMs: 0 stores the column's default, the database clock at
	// insert.
	CommittedAtMs  int64
	DispatchedAtMs *int64
}

// Table names ff_completion_event.
func (CompletionEvent) Table() string { return "ff_completion_event" }

// clockMs is committed_at_ms's column default.
const clockMs = `(extract(epoch FROM clock_timestamp()) * 1000)::bigint`

func (c CompletionEvent) columns() ([]column, error) {
	var committed any
	if c.CommittedAtMs != 0 {
		committed = c.CommittedAtMs
	}
	return []column{
		i16("partition_key", c.Partition), uuidCol("execution_id", c.ExecutionID), uuidCol("flow_id", nullText(c.FlowID)),
		text("outcome", orText(c.Outcome, "success")), text("namespace", nullText(c.Namespace)),
		text("instance_tag", nullText(c.InstanceTag)), i64("occurred_at_ms", c.OccurredAtMs),
		{name: "committed_at_ms", typ: "bigint", val: committed, expr: "COALESCE(%s, " + clockMs + ")"},
		msCol("dispatched_at_ms", c.DispatchedAtMs),
	}, nil
}

// InsertCompletion inserts c and returns its event id.
func InsertCompletion(ctx context.Context, db DB, c CompletionEvent) (int64, error) {
	sql, args, err := insertSQL(c)
	if err != nil {
		return 0, err
	}
	var id int64
	if err := db.QueryRow(ctx, sql+" RETURNING event_id", args...).Scan(&id); err != nil {
		return 0, fmt.Errorf("ffseed: insert %s: %w", c.Table(), err)
	}
	return id, nil
}

// LeaseEvent is an ff_lease_event row (its event_id is the table's
// sequence).
type LeaseEvent struct {
	ExecutionID string
	LeaseID     string // "": NULL
	// EventType: "" stores acquired.
	EventType    string
	OccurredAtMs int64
	Partition    int32
	Namespace    string // "": NULL
	InstanceTag  string // "": NULL
}

// Table names ff_lease_event.
func (LeaseEvent) Table() string { return "ff_lease_event" }

func (e LeaseEvent) columns() ([]column, error) {
	return []column{
		text("execution_id", e.ExecutionID), text("lease_id", nullText(e.LeaseID)),
		text("event_type", orText(e.EventType, "acquired")), i64("occurred_at_ms", e.OccurredAtMs),
		i32("partition_key", e.Partition), text("namespace", nullText(e.Namespace)),
		text("instance_tag", nullText(e.InstanceTag)),
	}, nil
}
