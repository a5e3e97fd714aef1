package fftest

import (
	"context"
	"slices"
	"strings"
	"testing"

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
	for _, q := range []string{
		`INSERT INTO ff_attempt (partition_key, execution_id, attempt_index) VALUES ($1, $2::uuid, 0)`,
		`INSERT INTO ff_claim_grant (partition_key, grant_id, execution_id, kind, worker_id, worker_instance_id, grant_ttl_ms, issued_at_ms, expires_at_ms)
		 VALUES ($1, decode(md5($2), 'hex'), $2::uuid, 'claim', 'w', 'wi', 1, 1, 2)`,
		`INSERT INTO ff_completion_event (partition_key, execution_id, outcome, occurred_at_ms, dispatched_at_ms) VALUES ($1, $2::uuid, 'success', 1, 2)`,
		`INSERT INTO ff_stream_frame (partition_key, execution_id, attempt_index, ts_ms, seq, fields, mode, created_at_ms) VALUES ($1, $2::uuid, 0, 1, 0, '{}', 'append', 1)`,
		`INSERT INTO ff_stream_meta (partition_key, execution_id, attempt_index) VALUES ($1, $2::uuid, 0)`,
		`INSERT INTO ff_stream_summary (partition_key, execution_id, attempt_index, document_json, last_updated_ms, first_applied_ms) VALUES ($1, $2::uuid, 0, '{}', 1, 1)`,
		`INSERT INTO ff_suspension_current (partition_key, execution_id, suspension_id, suspended_at_ms, condition) VALUES ($1, $2::uuid, gen_random_uuid(), 1, '{}')`,
		`INSERT INTO ff_waitpoint_pending (partition_key, waitpoint_id, execution_id, token_kid, token, created_at_ms) VALUES ($1, gen_random_uuid(), $2::uuid, 'k', 't', 1)`,
		`INSERT INTO ff_cancel_backlog_member (partition_key, flow_id, execution_id) VALUES ($1, $3::uuid, $2)`,
		`INSERT INTO ff_lease_event (execution_id, event_type, occurred_at_ms, partition_key) VALUES ($2, 'acquired', 1, $1)`,
		`INSERT INTO ff_operator_event (execution_id, event_type, occurred_at_ms, partition_key) VALUES ($2, 'replayed', 1, $1)`,
		`INSERT INTO ff_quota_admitted (partition_key, quota_policy_id, execution_id, admitted_at_ms, expires_at_ms) VALUES ($1, 'q', $2, 1, 2)`,
		`INSERT INTO ff_quota_window (partition_key, quota_policy_id, admitted_at_ms, execution_id) VALUES ($1, 'q', 1, $2)`,
		`INSERT INTO ff_signal_event (execution_id, signal_id, delivered_at_ms, partition_key) VALUES ($2, 's', 1, $1)`,
		// The wire id (in $2's place), with the flow in $3.
		`INSERT INTO ff_cancel_backlog_member (partition_key, flow_id, execution_id) VALUES ($1, $3::uuid, $2) -- wire`,
		`INSERT INTO ff_quota_admitted (partition_key, quota_policy_id, execution_id, admitted_at_ms, expires_at_ms) VALUES ($1, 'q', $2, 1, 2) -- wire`,
		`INSERT INTO ff_quota_window (partition_key, quota_policy_id, admitted_at_ms, execution_id) VALUES ($1, 'q', 1, $2) -- wire`,
	} {
		args := []any{partition, execID}
		if strings.HasSuffix(q, "-- wire") {
			args[1] = WireID(partition, execID)
		}
		if strings.Contains(q, "$3") {
			args = append(args, flowID)
		}
		if _, err := db.Exec(context.Background(), q, args...); err != nil {
			t.Fatalf("insert sibling row: %v\n%s", err, q)
		}
	}
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
