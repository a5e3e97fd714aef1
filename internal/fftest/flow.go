package fftest

import (
	"context"
	"testing"

	"github.com/flowfabric/ffreconcile/internal/ffseed"
	"github.com/flowfabric/ffreconcile/store"
)

// Link stages a downstream's dependencies as FlowFabric's
// apply_dependency_to_child does: one ff_edge per upstream, all with policy
// (JSON text), and the downstream's ff_edge_group with that policy and
// running_count the number of upstreams.
func Link(t testing.TB, db store.DB, partition int16, flowID, policy, downstream string, upstreams ...string) {
	t.Helper()
	for _, up := range upstreams {
		InsertEdge(t, db, partition, flowID, up, downstream, policy)
	}
	InsertGroup(t, db, Group{Partition: partition, FlowID: flowID, DownstreamEID: downstream, Policy: policy,
		Running: int32(len(upstreams))})
}

// InsertEdge inserts one ff_edge from upstream to downstream.
func InsertEdge(t testing.TB, db store.DB, partition int16, flowID, upstream, downstream, policy string) {
	t.Helper()
	insert(t, db, ffseed.Edge{Partition: partition, FlowID: flowID, UpstreamEID: upstream, DownstreamEID: downstream,
		Policy: policy})
}

// Group is an ff_edge_group row with its counters.
type Group struct {
	Partition             int16
	FlowID, DownstreamEID string
	Policy                string // JSON text
	Success, Fail, Skip   int32
	Running               int32
	Flag                  bool
	Members               []string
}

// InsertGroup inserts g.
func InsertGroup(t testing.TB, db store.DB, g Group) {
	t.Helper()
	insert(t, db, ffseed.EdgeGroup{Partition: g.Partition, FlowID: g.FlowID, DownstreamEID: g.DownstreamEID,
		Policy: g.Policy, Success: g.Success, Fail: g.Fail, Skip: g.Skip, Running: g.Running, Flag: g.Flag, Members: g.Members})
}

// ReadGroup reads an edge group back; it fails the test when it is missing.
func ReadGroup(t testing.TB, db store.DB, partition int16, flowID, downstream string) Group {
	t.Helper()
	g := Group{Partition: partition, FlowID: flowID, DownstreamEID: downstream}
	if err := db.QueryRow(context.Background(), `
		SELECT policy::text, success_count, fail_count, skip_count, running_count, cancel_siblings_pending_flag,
		       cancel_siblings_pending_members
		  FROM ff_edge_group WHERE partition_key = $1 AND flow_id = $2 AND downstream_eid = $3`,
		partition, flowID, downstream).Scan(&g.Policy, &g.Success, &g.Fail, &g.Skip, &g.Running, &g.Flag, &g.Members); err != nil {
		t.Fatalf("read ff_edge_group %d/%s/%s: %v", partition, flowID, downstream, err)
	}
	return g
}

// Completion is an ff_completion_event row to insert.
type Completion struct {
	Partition   int16
	ExecutionID string
	FlowID      string // "": NULL (a standalone execution)
	Outcome     string
	Namespace   *string
	InstanceTag *string
	// CommittedAtMs overrides the column's default (the database clock at
	// insert) when set.
	CommittedAtMs int64
}

// InsertCompletion inserts c undispatched, occurred at 1, and returns its
// event id.
func InsertCompletion(t testing.TB, db store.DB, c Completion) int64 {
	t.Helper()
	deref := func(s *string) string {
		if s == nil {
			return ""
		}
		return *s
	}
	id, err := ffseed.InsertCompletion(context.Background(), db, ffseed.CompletionEvent{Partition: c.Partition,
		ExecutionID: c.ExecutionID, FlowID: c.FlowID, Outcome: c.Outcome, Namespace: deref(c.Namespace),
		InstanceTag: deref(c.InstanceTag), OccurredAtMs: 1, CommittedAtMs: c.CommittedAtMs})
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// Dispatched reports whether a completion event is claimed
// (dispatched_at_ms set); it fails the test when the event is missing.
func Dispatched(t testing.TB, db store.DB, partition int16, eventID int64) bool {
	t.Helper()
	var d bool
	if err := db.QueryRow(context.Background(), `SELECT dispatched_at_ms IS NOT NULL FROM ff_completion_event
		 WHERE partition_key = $1 AND event_id = $2`, partition, eventID).Scan(&d); err != nil {
		t.Fatalf("read ff_completion_event %d/%d: %v", partition, eventID, err)
	}
	return d
}

// Blocked is a downstream waiting on its dependencies, as FlowFabric stages
// one.
func Blocked(partition int16, flowID string) Exec {
	return Exec{Partition: partition, FlowID: flowID, LifecyclePhase: "blocked", OwnershipState: "unowned",
		EligibilityState: "blocked_by_dependencies", PublicState: "waiting", AttemptState: "pending"}
}

// InsertFlow inserts an ff_flow_core row in public_flow_state state
// ("open" when ""), as FlowFabric's create_flow leaves one, with rawFields
// ({} when nil).
func InsertFlow(t testing.TB, db store.DB, partition int16, flowID, state string, rawFields map[string]any) {
	t.Helper()
	var raw any
	if rawFields != nil {
		raw = rawFields
	}
	insert(t, db, ffseed.FlowCore{Partition: partition, FlowID: flowID, State: state, RawFields: raw})
}

// WireID is FlowFabric's wire form of an execution id, "{fp:N}:<uuid>":
// what ff_cancel_backlog_member and the quota tables store.
func WireID(partition int16, id string) string { return ffseed.WireID(partition, id) }

// Backlog is a cancel backlog header with its member rows, as FlowFabric's
// cancel_flow_header writes them (grace_until_ms left NULL unless set).
type Backlog struct {
	Partition     int16
	FlowID        string
	RequestedAtMs int64
	GraceUntilMs  *int64
	Reason        string
	Policy        string // "cancel_all" when ""
	// Members are member ids as stored: wire ids (WireID), or anything
	// else for a bad row.
	Members []string
}

// InsertBacklog inserts b's header and member rows.
func InsertBacklog(t testing.TB, db store.DB, b Backlog) {
	t.Helper()
	rows := []ffseed.Row{ffseed.CancelBacklog{Partition: b.Partition, FlowID: b.FlowID, RequestedAtMs: b.RequestedAtMs,
		Reason: b.Reason, GraceUntilMs: b.GraceUntilMs, Policy: b.Policy}}
	for _, m := range b.Members {
		rows = append(rows, ffseed.CancelBacklogMember{Partition: b.Partition, FlowID: b.FlowID, ExecutionID: m})
	}
	insert(t, db, rows...)
}

// BacklogMembers returns the member ids of a flow's backlog, sorted, and
// whether its header exists.
func BacklogMembers(t testing.TB, db store.DB, partition int16, flowID string) (members []string, header bool) {
	t.Helper()
	header = Count(t, db, `SELECT count(*) FROM ff_cancel_backlog WHERE partition_key = $1 AND flow_id = $2::uuid`, partition, flowID) == 1
	rows, err := db.Query(context.Background(), `
		SELECT execution_id FROM ff_cancel_backlog_member WHERE partition_key = $1 AND flow_id = $2::uuid ORDER BY 1`, partition, flowID)
	if err != nil {
		t.Fatalf("read ff_cancel_backlog_member: %v", err)
	}
	defer rows.Close()
	for rows.Next() {
		var m string
		if err := rows.Scan(&m); err != nil {
			t.Fatal(err)
		}
		members = append(members, m)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return members, header
}
