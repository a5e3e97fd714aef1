package fftest

import (
	"slices"
	"testing"

	"github.com/flowfabric/ffreconcile/internal/ffseed"
	"github.com/flowfabric/ffreconcile/store"
)

// Terminal returns a terminal (succeeded) execution of partition that ended
// at terminalAtMs.
func Terminal(partition int16, terminalAtMs int64) Exec {
	return Exec{Partition: partition, LifecyclePhase: "terminal", OwnershipState: "unowned",
		EligibilityState: "not_applicable", PublicState: "completed", AttemptState: "attempt_terminal",
		TerminalAtMs: Ms(terminalAtMs)}
}

// InsertSiblings inserts one row of execID (of flow flowID, a UUID) into
// every table store.RetentionSiblingTables lists; into the text tables that
// store FlowFabric's wire id (ff_cancel_backlog_member, ff_quota_*) a second
// row under the wire id "{fp:N}:<uuid>", as FlowFabric writes them.
func InsertSiblings(t testing.TB, db store.DB, partition int16, execID, flowID string) {
	t.Helper()
	p, wire := partition, WireID(partition, execID)
	insert(t, db,
		ffseed.Attempt{Partition: p, ExecutionID: execID},
		ffseed.ClaimGrant{Partition: p, ID: ffseed.MD5(execID), ExecutionID: execID, WorkerID: "w", WorkerInstanceID: "wi",
			GrantTTLMs: 1, IssuedAtMs: 1, ExpiresAtMs: 2},
		ffseed.CompletionEvent{Partition: p, ExecutionID: execID, OccurredAtMs: 1, DispatchedAtMs: Ms(2)},
		ffseed.StreamFrame{Partition: p, ExecutionID: execID, TsMs: 1, CreatedAtMs: 1},
		ffseed.StreamMeta{Partition: p, ExecutionID: execID},
		ffseed.StreamSummary{Partition: p, ExecutionID: execID, LastUpdatedMs: 1, FirstAppliedMs: 1},
		ffseed.Suspension{Partition: p, ExecutionID: execID},
		ffseed.Waitpoint{Partition: p, ExecutionID: execID, TokenKid: "k", Token: "t"},
		ffseed.CancelBacklogMember{Partition: p, FlowID: flowID, ExecutionID: execID},
		ffseed.LeaseEvent{ExecutionID: execID, EventType: "acquired", OccurredAtMs: 1, Partition: int32(p)},
		ffseed.OperatorEvent{ExecutionID: execID, EventType: "replayed", OccurredAtMs: 1, Partition: int32(p)},
		ffseed.QuotaAdmitted{Partition: p, PolicyID: "q", ExecutionID: execID, AdmittedAtMs: 1, ExpiresAtMs: 2},
		ffseed.QuotaWindow{Partition: p, PolicyID: "q", AdmittedAtMs: 1, ExecutionID: execID},
		ffseed.SignalEvent{ExecutionID: execID, SignalID: "s", DeliveredAtMs: 1, Partition: int32(p)},
		// Under the wire id.
		ffseed.CancelBacklogMember{Partition: p, FlowID: flowID, ExecutionID: wire},
		ffseed.QuotaAdmitted{Partition: p, PolicyID: "q", ExecutionID: wire, AdmittedAtMs: 1, ExpiresAtMs: 2},
		ffseed.QuotaWindow{Partition: p, PolicyID: "q", AdmittedAtMs: 1, ExecutionID: wire},
	)
}

// WireSiblingTables are the sibling tables InsertSiblings gives a second
// row, under the wire id.
var WireSiblingTables = []string{"ff_cancel_backlog_member", "ff_quota_admitted", "ff_quota_window"}

// SiblingsEach is what SiblingRows returns for an execution InsertSiblings
// gave rows n times over (0: none left): n in every sibling table, 2n in
// WireSiblingTables.
func SiblingsEach(n int) map[string]int {
	m := map[string]int{}
	for _, t := range append(append([]string{}, store.RetentionSiblingTables.UUID...), store.RetentionSiblingTables.Text...) {
		m[t] = n
		if slices.Contains(WireSiblingTables, t) {
			m[t] = 2 * n
		}
	}
	return m
}

// SiblingRowsEach is the number of sibling rows InsertSiblings inserts.
var SiblingRowsEach = len(store.RetentionSiblingTables.UUID) + len(store.RetentionSiblingTables.Text) + len(WireSiblingTables)

// SiblingRows returns, per sibling table, how many rows execID has there
// (in the text tables under its bare uuid or its wire id).
func SiblingRows(t testing.TB, db store.DB, partition int16, execID string) map[string]int {
	t.Helper()
	out := map[string]int{}
	for _, table := range store.RetentionSiblingTables.UUID {
		out[table] = Count(t, db, `SELECT count(*) FROM `+table+` WHERE partition_key = $1 AND execution_id = $2::uuid`, partition, execID)
	}
	for _, table := range store.RetentionSiblingTables.Text {
		out[table] = Count(t, db, `SELECT count(*) FROM `+table+` WHERE partition_key = $1 AND execution_id IN ($2, $3)`,
			partition, execID, WireID(partition, execID))
	}
	return out
}
