// Package migrations creates the database objects the worker needs: River's
// own tables (through rivermigrate, in their own Postgres schema) and, for
// development, tests and new installs, FlowFabric-compatible ff_* tables.
//
// The ff_* DDL mirrors FlowFabric's Postgres backend (ff-backend-postgres
// 0.15) column for column, so the worker runs unchanged on a database that
// FlowFabric itself migrated. It never alters a table that already exists.
package migrations

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/flowfabric/ffreconcile/jobs"
)

// ffTable describes one FlowFabric table: the parent DDL, whether it is hash
// partitioned, and the indexes and triggers created after it.
type ffTable struct {
	name        string
	partitioned bool
	// paddedChildren: children are named <table>_p000.._p255 (the worker
	// registry's tables) instead of <table>_p0.._p255.
	paddedChildren bool
	columns        string   // body of CREATE TABLE (...)
	indexes        []string // CREATE INDEX statements, created on the parent
	post           []string // functions and triggers
}

var ffTables = []ffTable{
	{
		name:        "ff_exec_core",
		partitioned: true,
		columns: `
    partition_key          smallint NOT NULL,
    execution_id           uuid     NOT NULL,
    flow_id                uuid,
    lane_id                text     NOT NULL,
    required_capabilities  text[]   NOT NULL DEFAULT '{}',
    attempt_index          integer  NOT NULL DEFAULT 0,
    lifecycle_phase        text     NOT NULL,
    ownership_state        text     NOT NULL,
    eligibility_state      text     NOT NULL,
    public_state           text     NOT NULL,
    attempt_state          text     NOT NULL,
    blocking_reason        text,
    cancellation_reason    text,
    cancelled_by           text,
    priority               integer  NOT NULL DEFAULT 0,
    created_at_ms          bigint   NOT NULL,
    terminal_at_ms         bigint,
    deadline_at_ms         bigint,
    payload                bytea,
    result                 bytea,
    policy                 jsonb,
    raw_fields             jsonb    NOT NULL DEFAULT '{}',
    started_at_ms          bigint,
    lease_reclaim_count    integer  NOT NULL DEFAULT 0,
    PRIMARY KEY (partition_key, execution_id)`,
		indexes: []string{
			`CREATE INDEX ff_exec_core_lane_phase_idx ON ff_exec_core (partition_key, lane_id, lifecycle_phase)`,
			`CREATE INDEX ff_exec_core_caps_gin_idx ON ff_exec_core USING GIN (required_capabilities)`,
			`CREATE INDEX ff_exec_core_flow_idx ON ff_exec_core (partition_key, flow_id) WHERE flow_id IS NOT NULL`,
			// Scans of executions by deadline (delay-until or execution deadline) read this index.
			`CREATE INDEX ff_exec_core_deadline_idx ON ff_exec_core (partition_key, deadline_at_ms) WHERE deadline_at_ms IS NOT NULL`,
		},
	},
	{
		name:        "ff_attempt",
		partitioned: true,
		columns: `
    partition_key        smallint NOT NULL,
    execution_id         uuid     NOT NULL,
    attempt_index        integer  NOT NULL,
    worker_id            text,
    worker_instance_id   text,
    lease_epoch          bigint   NOT NULL DEFAULT 0,
    lease_expires_at_ms  bigint,
    started_at_ms        bigint,
    terminal_at_ms       bigint,
    outcome              text,
    usage                jsonb,
    policy               jsonb,
    raw_fields           jsonb    NOT NULL DEFAULT '{}',
    PRIMARY KEY (partition_key, execution_id, attempt_index)`,
		indexes: []string{
			// Scans of attempts by lease deadline read this index.
			`CREATE INDEX ff_attempt_lease_expiry_idx ON ff_attempt (partition_key, lease_expires_at_ms) WHERE lease_expires_at_ms IS NOT NULL`,
			`CREATE INDEX ff_attempt_worker_idx ON ff_attempt (partition_key, worker_id) WHERE worker_id IS NOT NULL`,
		},
	},
	{
		name:        "ff_suspension_current",
		partitioned: true,
		columns: `
    partition_key     smallint NOT NULL,
    execution_id      uuid     NOT NULL,
    suspension_id     uuid     NOT NULL,
    suspended_at_ms   bigint   NOT NULL,
    timeout_at_ms     bigint,
    reason_code       text,
    condition         jsonb    NOT NULL,
    satisfied_set     jsonb    NOT NULL DEFAULT '[]',
    member_map        jsonb    NOT NULL DEFAULT '{}',
    timeout_behavior  text,
    PRIMARY KEY (partition_key, execution_id)`,
		indexes: []string{
			`CREATE INDEX ff_suspension_current_suspended_at_idx ON ff_suspension_current (partition_key, suspended_at_ms)`,
			// Scans of suspensions by timeout read this index.
			`CREATE INDEX ff_suspension_current_timeout_idx ON ff_suspension_current (partition_key, timeout_at_ms) WHERE timeout_at_ms IS NOT NULL`,
		},
	},
	{
		// The flow graph's edges: the dependency reconciler reads an
		// upstream's outgoing edges and a downstream's siblings.
		name:        "ff_edge",
		partitioned: true,
		columns: `
    partition_key  smallint NOT NULL,
    flow_id        uuid     NOT NULL,
    edge_id        uuid     NOT NULL,
    upstream_eid   uuid     NOT NULL,
    downstream_eid uuid     NOT NULL,
    policy         jsonb    NOT NULL,
    policy_version integer  NOT NULL DEFAULT 0,
    PRIMARY KEY (partition_key, flow_id, edge_id)`,
		indexes: []string{
			`CREATE INDEX ff_edge_downstream_idx ON ff_edge (partition_key, flow_id, downstream_eid) INCLUDE (upstream_eid, policy_version)`,
			// A dispatch reads an upstream's outgoing edges through this index.
			`CREATE INDEX ff_edge_upstream_idx ON ff_edge (partition_key, flow_id, upstream_eid)`,
		},
	},
	{
		name:        "ff_edge_group",
		partitioned: true,
		columns: `
    partition_key                    smallint NOT NULL,
    flow_id                          uuid     NOT NULL,
    downstream_eid                   uuid     NOT NULL,
    policy                           jsonb    NOT NULL,
    k_target                         integer  NOT NULL DEFAULT 0,
    success_count                    integer  NOT NULL DEFAULT 0,
    fail_count                       integer  NOT NULL DEFAULT 0,
    skip_count                       integer  NOT NULL DEFAULT 0,
    running_count                    integer  NOT NULL DEFAULT 0,
    cancel_siblings_pending_flag     boolean  NOT NULL DEFAULT false,
    cancel_siblings_pending_members  text[]   NOT NULL DEFAULT '{}',
    PRIMARY KEY (partition_key, flow_id, downstream_eid)`,
	},
	{
		name:        "ff_pending_cancel_groups",
		partitioned: true,
		columns: `
    partition_key   smallint NOT NULL,
    flow_id         uuid     NOT NULL,
    downstream_eid  uuid     NOT NULL,
    enqueued_at_ms  bigint   NOT NULL,
    PRIMARY KEY (partition_key, flow_id, downstream_eid)`,
		indexes: []string{
			// Scans of pending cancel groups, oldest first, read this index.
			`CREATE INDEX ff_pending_cancel_groups_enqueued_idx ON ff_pending_cancel_groups (partition_key, enqueued_at_ms)`,
		},
	},
	{
		name:        "ff_completion_event",
		partitioned: true,
		columns: `
    partition_key     smallint NOT NULL,
    event_id          bigint   GENERATED ALWAYS AS IDENTITY,
    execution_id      uuid     NOT NULL,
    flow_id           uuid,
    outcome           text     NOT NULL,
    namespace         text,
    instance_tag      text,
    occurred_at_ms    bigint   NOT NULL,
    committed_at_ms   bigint   NOT NULL DEFAULT (extract(epoch FROM clock_timestamp()) * 1000)::bigint,
    dispatched_at_ms  bigint,
    PRIMARY KEY (partition_key, event_id)`,
		indexes: []string{
			`CREATE INDEX ff_completion_event_event_id_idx ON ff_completion_event (event_id)`,
			`CREATE INDEX ff_completion_event_pending_dispatch_idx ON ff_completion_event (partition_key, committed_at_ms) WHERE dispatched_at_ms IS NULL`,
			`CREATE INDEX ff_completion_event_lookup_idx ON ff_completion_event (partition_key, execution_id, occurred_at_ms)`,
		},
		post: []string{
			`CREATE OR REPLACE FUNCTION ff_notify_completion_event() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('ff_completion', NEW.event_id::text);
    RETURN NEW;
END
$$`,
			`CREATE TRIGGER ff_completion_event_notify_trg AFTER INSERT ON ff_completion_event
    FOR EACH ROW EXECUTE FUNCTION ff_notify_completion_event()`,
		},
	},
	{
		name:        "ff_lease_event",
		partitioned: false,
		columns: `
    event_id        bigserial PRIMARY KEY,
    execution_id    text      NOT NULL,
    lease_id        text,
    event_type      text      NOT NULL,
    occurred_at_ms  bigint    NOT NULL,
    partition_key   integer   NOT NULL,
    namespace       text,
    instance_tag    text`,
		indexes: []string{
			`CREATE INDEX ff_lease_event_partition_key_idx ON ff_lease_event (partition_key, event_id)`,
			`CREATE INDEX ff_lease_event_namespace_idx ON ff_lease_event (partition_key, namespace) WHERE namespace IS NOT NULL`,
			`CREATE INDEX ff_lease_event_instance_tag_idx ON ff_lease_event (partition_key, instance_tag) WHERE instance_tag IS NOT NULL`,
		},
		post: []string{
			`CREATE OR REPLACE FUNCTION ff_notify_lease_event() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('ff_lease_event', NEW.event_id::text);
    RETURN NEW;
END
$$`,
			`CREATE TRIGGER ff_lease_event_notify_trg AFTER INSERT ON ff_lease_event
    FOR EACH ROW EXECUTE FUNCTION ff_notify_lease_event()`,
		},
	},
	{
		name:        "ff_waitpoint_pending",
		partitioned: true,
		columns: `
    partition_key          smallint NOT NULL,
    waitpoint_id           uuid     NOT NULL,
    execution_id           uuid     NOT NULL,
    token_kid              text     NOT NULL,
    token                  text     NOT NULL,
    created_at_ms          bigint   NOT NULL,
    expires_at_ms          bigint,
    condition              jsonb,
    waitpoint_key          text     NOT NULL DEFAULT '',
    state                  text     NOT NULL DEFAULT 'pending',
    required_signal_names  text[]   NOT NULL DEFAULT '{}',
    activated_at_ms        bigint,
    PRIMARY KEY (partition_key, waitpoint_id)`,
		indexes: []string{
			// Scans of waitpoints by expiry read this index.
			`CREATE INDEX ff_waitpoint_pending_expires_idx ON ff_waitpoint_pending (partition_key, expires_at_ms) WHERE expires_at_ms IS NOT NULL`,
			`CREATE INDEX ff_waitpoint_pending_exec_idx ON ff_waitpoint_pending (partition_key, execution_id)`,
		},
	},
	{
		name:        "ff_budget_policy",
		partitioned: true,
		columns: `
    partition_key      smallint NOT NULL,
    budget_id          text     NOT NULL,
    policy_json        jsonb    NOT NULL,
    created_at_ms      bigint   NOT NULL,
    updated_at_ms      bigint   NOT NULL,
    scope_type         text     NOT NULL DEFAULT '',
    scope_id           text     NOT NULL DEFAULT '',
    enforcement_mode   text     NOT NULL DEFAULT '',
    breach_count       bigint   NOT NULL DEFAULT 0,
    soft_breach_count  bigint   NOT NULL DEFAULT 0,
    last_breach_at_ms  bigint,
    last_breach_dim    text,
    next_reset_at_ms   bigint,
    PRIMARY KEY (partition_key, budget_id)`,
		indexes: []string{
			// Scans of budgets by next reset read this index.
			`CREATE INDEX ff_budget_policy_reset_due_idx ON ff_budget_policy (partition_key, next_reset_at_ms) WHERE next_reset_at_ms IS NOT NULL`,
		},
	},
	{
		name:        "ff_budget_usage",
		partitioned: true,
		columns: `
    partition_key     smallint NOT NULL,
    budget_id         text     NOT NULL,
    dimensions_key    text     NOT NULL,
    current_value     bigint   NOT NULL DEFAULT 0,
    last_reset_at_ms  bigint,
    updated_at_ms     bigint   NOT NULL,
    PRIMARY KEY (partition_key, budget_id, dimensions_key)`,
	},
	{
		name:           "ff_worker_registry",
		partitioned:    true,
		paddedChildren: true,
		columns: `
    partition_key       smallint NOT NULL,
    namespace           text     NOT NULL,
    worker_instance_id  text     NOT NULL,
    worker_id           text     NOT NULL,
    lanes               text[]   NOT NULL,
    capabilities_csv    text     NOT NULL,
    last_heartbeat_ms   bigint   NOT NULL,
    liveness_ttl_ms     bigint   NOT NULL,
    registered_at_ms    bigint   NOT NULL,
    PRIMARY KEY (partition_key, namespace, worker_instance_id)`,
		indexes: []string{
			`CREATE INDEX ff_worker_registry_ns_inst_idx ON ff_worker_registry (namespace, worker_instance_id)`,
		},
	},
	{
		name:           "ff_worker_registry_event",
		partitioned:    true,
		paddedChildren: true,
		columns: `
    partition_key       smallint NOT NULL,
    namespace           text     NOT NULL,
    worker_instance_id  text     NOT NULL,
    event_kind          text     NOT NULL,
    event_at_ms         bigint   NOT NULL,
    reason              text,
    PRIMARY KEY (partition_key, namespace, worker_instance_id, event_at_ms, event_kind)`,
	},
	// The execution-scoped tables below are read by no reconciler: retention
	// deletes a trimmed execution's rows from them, as FlowFabric's trim
	// does (store/retention.go).
	{
		name:        "ff_claim_grant",
		partitioned: true,
		columns: `
    partition_key        smallint NOT NULL,
    grant_id             bytea    NOT NULL,
    execution_id         uuid     NOT NULL,
    kind                 text     NOT NULL CHECK (kind IN ('claim','reclaim')),
    worker_id            text     NOT NULL,
    worker_instance_id   text     NOT NULL,
    lane_id              text,
    capability_hash      text,
    worker_capabilities  jsonb    NOT NULL DEFAULT '[]'::jsonb,
    route_snapshot_json  text,
    admission_summary    text,
    grant_ttl_ms         bigint   NOT NULL,
    issued_at_ms         bigint   NOT NULL,
    expires_at_ms        bigint   NOT NULL,
    PRIMARY KEY (partition_key, grant_id)`,
		indexes: []string{
			`CREATE INDEX ff_claim_grant_execution_idx ON ff_claim_grant (partition_key, execution_id)`,
			`CREATE INDEX ff_claim_grant_expiry_idx ON ff_claim_grant (expires_at_ms)`,
		},
	},
	{
		name:        "ff_stream_frame",
		partitioned: true,
		columns: `
    partition_key  smallint NOT NULL,
    execution_id   uuid     NOT NULL,
    attempt_index  integer  NOT NULL,
    ts_ms          bigint   NOT NULL,
    seq            integer  NOT NULL,
    fields         jsonb    NOT NULL,
    mode           text     NOT NULL,
    created_at_ms  bigint   NOT NULL,
    PRIMARY KEY (partition_key, execution_id, attempt_index, ts_ms, seq)`,
		indexes: []string{
			`CREATE INDEX ff_stream_frame_ts_seq_idx ON ff_stream_frame (partition_key, execution_id, attempt_index, ts_ms, seq)`,
		},
		post: []string{
			`CREATE OR REPLACE FUNCTION ff_notify_stream_frame() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    chan text;
BEGIN
    chan := 'ff_stream_' || NEW.execution_id::text || '_' || NEW.attempt_index::text;
    PERFORM pg_notify(chan, NEW.ts_ms::text || '-' || NEW.seq::text);
    RETURN NEW;
END
$$`,
			`CREATE TRIGGER ff_stream_frame_notify_trg AFTER INSERT ON ff_stream_frame
    FOR EACH ROW EXECUTE FUNCTION ff_notify_stream_frame()`,
		},
	},
	{
		name:        "ff_stream_summary",
		partitioned: true,
		columns: `
    partition_key     smallint NOT NULL,
    execution_id      uuid     NOT NULL,
    attempt_index     integer  NOT NULL,
    document_json     jsonb    NOT NULL,
    version           integer  NOT NULL DEFAULT 0,
    patch_kind        text,
    last_updated_ms   bigint   NOT NULL,
    first_applied_ms  bigint   NOT NULL,
    PRIMARY KEY (partition_key, execution_id, attempt_index)`,
	},
	{
		name:        "ff_stream_meta",
		partitioned: true,
		columns: `
    partition_key        smallint         NOT NULL,
    execution_id         uuid             NOT NULL,
    attempt_index        integer          NOT NULL,
    ema_rate_hz          double precision NOT NULL DEFAULT 0,
    last_append_ts_ms    bigint           NOT NULL DEFAULT 0,
    maxlen_applied_last  integer          NOT NULL DEFAULT 0,
    PRIMARY KEY (partition_key, execution_id, attempt_index)`,
	},
	// The tables of the background duties FlowFabric promises on
	// Postgres and never runs: flow summaries (flow_summary), the cancel
	// backlog (cancel_backlog), quota admission (quota_reconcile) and budget
	// dedup keys (budget_dedup_expiry).
	{
		name:        "ff_flow_core",
		partitioned: true,
		columns: `
    partition_key     smallint NOT NULL,
    flow_id           uuid     NOT NULL,
    graph_revision    bigint   NOT NULL DEFAULT 0,
    public_flow_state text     NOT NULL,
    created_at_ms     bigint   NOT NULL,
    terminal_at_ms    bigint,
    raw_fields        jsonb    NOT NULL DEFAULT '{}'::jsonb,
    PRIMARY KEY (partition_key, flow_id)`,
	},
	{
		name:        "ff_flow_summary",
		partitioned: true,
		columns: `
    partition_key             smallint NOT NULL,
    flow_id                   uuid     NOT NULL,
    total_members             bigint   NOT NULL DEFAULT 0,
    sampled_members           integer  NOT NULL DEFAULT 0,
    members_completed         integer  NOT NULL DEFAULT 0,
    members_failed            integer  NOT NULL DEFAULT 0,
    members_cancelled         integer  NOT NULL DEFAULT 0,
    members_expired           integer  NOT NULL DEFAULT 0,
    members_skipped           integer  NOT NULL DEFAULT 0,
    members_active            integer  NOT NULL DEFAULT 0,
    members_suspended         integer  NOT NULL DEFAULT 0,
    members_waiting           integer  NOT NULL DEFAULT 0,
    members_delayed           integer  NOT NULL DEFAULT 0,
    members_rate_limited      integer  NOT NULL DEFAULT 0,
    members_waiting_children  integer  NOT NULL DEFAULT 0,
    public_flow_state         text     NOT NULL,
    last_summary_update_at    bigint   NOT NULL,
    PRIMARY KEY (partition_key, flow_id)`,
	},
	{
		name:        "ff_cancel_backlog",
		partitioned: true,
		columns: `
    partition_key        smallint NOT NULL,
    flow_id              uuid     NOT NULL,
    requested_at_ms      bigint   NOT NULL,
    requester            text     NOT NULL DEFAULT '',
    reason               text     NOT NULL DEFAULT '',
    grace_until_ms       bigint,
    cancellation_policy  text     NOT NULL,
    status               text     NOT NULL DEFAULT 'pending',
    PRIMARY KEY (partition_key, flow_id)`,
		indexes: []string{
			`CREATE INDEX ff_cancel_backlog_grace_idx ON ff_cancel_backlog (partition_key, grace_until_ms) WHERE grace_until_ms IS NOT NULL`,
		},
	},
	{
		name:        "ff_quota_policy",
		partitioned: true,
		columns: `
    partition_key                 smallint NOT NULL,
    quota_policy_id               text     NOT NULL,
    requests_per_window_seconds   bigint   NOT NULL,
    max_requests_per_window       bigint   NOT NULL,
    active_concurrency_cap        bigint   NOT NULL,
    active_concurrency            bigint   NOT NULL DEFAULT 0,
    created_at_ms                 bigint   NOT NULL,
    updated_at_ms                 bigint   NOT NULL,
    PRIMARY KEY (partition_key, quota_policy_id)`,
	},
	{
		name:        "ff_budget_usage_dedup",
		partitioned: true,
		columns: `
    partition_key  smallint NOT NULL,
    dedup_key      text     NOT NULL,
    outcome_json   jsonb    NOT NULL,
    applied_at_ms  bigint   NOT NULL,
    expires_at_ms  bigint   NOT NULL,
    PRIMARY KEY (partition_key, dedup_key)`,
		indexes: []string{
			`CREATE INDEX ff_budget_usage_dedup_expires_idx ON ff_budget_usage_dedup (partition_key, expires_at_ms)`,
		},
	},
	{
		name:        "ff_cancel_backlog_member",
		partitioned: true,
		columns: `
    partition_key  smallint NOT NULL,
    flow_id        uuid     NOT NULL,
    execution_id   text     NOT NULL,
    PRIMARY KEY (partition_key, flow_id, execution_id)`,
	},
	{
		name:        "ff_quota_window",
		partitioned: true,
		columns: `
    partition_key    smallint NOT NULL,
    quota_policy_id  text     NOT NULL,
    dimension        text     NOT NULL DEFAULT '',
    admitted_at_ms   bigint   NOT NULL,
    execution_id     text     NOT NULL,
    PRIMARY KEY (partition_key, quota_policy_id, dimension, admitted_at_ms, execution_id)`,
	},
	{
		name:        "ff_quota_admitted",
		partitioned: true,
		columns: `
    partition_key    smallint NOT NULL,
    quota_policy_id  text     NOT NULL,
    execution_id     text     NOT NULL,
    admitted_at_ms   bigint   NOT NULL,
    expires_at_ms    bigint   NOT NULL,
    PRIMARY KEY (partition_key, quota_policy_id, execution_id)`,
		indexes: []string{
			`CREATE INDEX ff_quota_admitted_expires_idx ON ff_quota_admitted (partition_key, expires_at_ms)`,
		},
	},
	{
		name:        "ff_signal_event",
		partitioned: false,
		columns: `
    event_id         bigserial PRIMARY KEY,
    execution_id     text      NOT NULL,
    signal_id        text      NOT NULL,
    waitpoint_id     text,
    source_identity  text,
    delivered_at_ms  bigint    NOT NULL,
    partition_key    integer   NOT NULL,
    namespace        text,
    instance_tag     text`,
		indexes: []string{
			`CREATE INDEX ff_signal_event_partition_key_idx ON ff_signal_event (partition_key, event_id)`,
			`CREATE INDEX ff_signal_event_namespace_idx ON ff_signal_event (partition_key, namespace) WHERE namespace IS NOT NULL`,
			`CREATE INDEX ff_signal_event_instance_tag_idx ON ff_signal_event (partition_key, instance_tag) WHERE instance_tag IS NOT NULL`,
		},
		post: []string{
			`CREATE OR REPLACE FUNCTION ff_notify_signal_event() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('ff_signal_event', NEW.event_id::text);
    RETURN NEW;
END
$$`,
			`CREATE TRIGGER ff_signal_event_notify_trg AFTER INSERT ON ff_signal_event
    FOR EACH ROW EXECUTE FUNCTION ff_notify_signal_event()`,
		},
	},
	{
		name:        "ff_operator_event",
		partitioned: false,
		columns: `
    event_id        bigserial PRIMARY KEY,
    execution_id    text      NOT NULL,
    event_type      text      NOT NULL
        CHECK (event_type IN ('priority_changed', 'replayed', 'flow_cancel_requested')),
    details         jsonb,
    occurred_at_ms  bigint    NOT NULL,
    partition_key   integer   NOT NULL,
    namespace       text,
    instance_tag    text`,
		indexes: []string{
			`CREATE INDEX ff_operator_event_partition_key_idx ON ff_operator_event (partition_key, event_id)`,
			`CREATE INDEX ff_operator_event_namespace_idx ON ff_operator_event (partition_key, namespace) WHERE namespace IS NOT NULL`,
			`CREATE INDEX ff_operator_event_instance_tag_idx ON ff_operator_event (partition_key, instance_tag) WHERE instance_tag IS NOT NULL`,
		},
		post: []string{
			`CREATE OR REPLACE FUNCTION ff_notify_operator_event() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('ff_operator_event', NEW.event_id::text);
    RETURN NEW;
END
$$`,
			`CREATE TRIGGER ff_operator_event_notify_trg AFTER INSERT ON ff_operator_event
    FOR EACH ROW EXECUTE FUNCTION ff_notify_operator_event()`,
		},
	},
}

// FFTableNames lists the FlowFabric tables this project creates and uses.
func FFTableNames() []string {
	names := make([]string, len(ffTables))
	for i, t := range ffTables {
		names[i] = t.name
	}
	return names
}

// FFResult reports what ApplyFF did to each table.
type FFResult struct {
	Created []string // tables created by this call
	Existed []string // tables found already present and left untouched
}

// ApplyFF creates every missing ff_* table with its 256 hash partitions,
// indexes and NOTIFY triggers. Each table is created in its own transaction
// (as FlowFabric does) so one migration never needs more than about 800 locks,
// well under the default lock table. A table that already exists is left
// exactly as it is, so running ApplyFF twice is a no-op and it never alters a
// table FlowFabric created.
func ApplyFF(ctx context.Context, pool *pgxpool.Pool) (*FFResult, error) {
	res := &FFResult{}
	for _, t := range ffTables {
		created, err := applyTable(ctx, pool, t)
		if err != nil {
			return res, fmt.Errorf("create %s: %w", t.name, err)
		}
		if created {
			res.Created = append(res.Created, t.name)
		} else {
			res.Existed = append(res.Existed, t.name)
		}
	}
	return res, nil
}

func applyTable(ctx context.Context, pool *pgxpool.Pool, t ffTable) (bool, error) {
	created := false
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		// Serialise concurrent migrators (two fleet members starting at once)
		// so the existence check and the CREATE are atomic.
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtext('ffreconcile.migrate_ff'))`); err != nil {
			return err
		}
		var exists bool
		if err := tx.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, t.name).Scan(&exists); err != nil {
			return err
		}
		if exists {
			return nil
		}
		for _, stmt := range tableDDL(t) {
			if _, err := tx.Exec(ctx, stmt); err != nil {
				return fmt.Errorf("%w\nstatement: %s", err, firstLine(stmt))
			}
		}
		created = true
		return nil
	})
	return created, err
}

// tableDDL returns the statements that create one table from scratch.
func tableDDL(t ffTable) []string {
	var stmts []string
	create := fmt.Sprintf("CREATE TABLE %s (%s\n)", t.name, t.columns)
	if t.partitioned {
		create += " PARTITION BY HASH (partition_key)"
	}
	stmts = append(stmts, create)
	// Indexes created on the parent before the children attach are created on
	// every child as it is added.
	stmts = append(stmts, t.indexes...)
	if t.partitioned {
		var b strings.Builder
		child := "%s_p%d"
		if t.paddedChildren {
			child = "%s_p%03d"
		}
		for i := range jobs.PartitionCount {
			fmt.Fprintf(&b, "CREATE TABLE "+child+" PARTITION OF %s FOR VALUES WITH (MODULUS %d, REMAINDER %d);\n",
				t.name, i, t.name, jobs.PartitionCount, i)
		}
		stmts = append(stmts, b.String())
	}
	return append(stmts, t.post...)
}

func firstLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[:i] + " ..."
	}
	return s
}

// Fingerprint identifies all the DDL this package creates: the ff_* tables,
// the worker heartbeat table and every object of ours (Object); tests name
// their template database after it, so that any change to the DDL rebuilds
// the template.
func Fingerprint() string { return fingerprint(ffTables, ourDDL+objectsDDL()) }

// ourDDL is the DDL of the heartbeat table, ours but no reconciler's.
const ourDDL = workerTableDDL + workerTableConfigDDL + workerTableConnTagDDL

func fingerprint(tables []ffTable, workerDDL string) string {
	h := sha256.New()
	for _, t := range tables {
		for _, s := range tableDDL(t) {
			h.Write([]byte(s))
			h.Write([]byte{0})
		}
	}
	h.Write([]byte(workerDDL))
	return hex.EncodeToString(h.Sum(nil))[:12]
}
