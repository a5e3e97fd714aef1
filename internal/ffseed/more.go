package ffseed

import "crypto/rand"

// Budget is an ff_budget_policy row.
type Budget struct {
	Partition int16
	// ID: "": budget-<8 random hex digits>.
	ID string
	// Policy is policy_json, stored as JSON like Exec.Policy; nil stores {}.
	Policy any
	// CreatedAtMs and UpdatedAtMs: 0 stores 1.
	CreatedAtMs, UpdatedAtMs int64
	// Scope and enforcement: the column defaults (”) unless set.
	ScopeType, ScopeID, EnforcementMode string
	BreachCount, SoftBreachCount        int64
	LastBreachAtMs                      *int64
	LastBreachDim                       string // "": NULL
	NextResetAtMs                       *int64
}

// Table names ff_budget_policy.
func (Budget) Table() string { return "ff_budget_policy" }

// Defaults returns b with its zero fields filled, a fresh ID among them.
func (b Budget) Defaults() Budget {
	if b.ID == "" {
		b.ID = "budget-" + NewUUID()[:8]
	}
	b.CreatedAtMs = orInt(b.CreatedAtMs, 1)
	b.UpdatedAtMs = orInt(b.UpdatedAtMs, 1)
	return b
}

func (b Budget) columns() ([]column, error) {
	b = b.Defaults()
	policy, err := jsonText(b.Table(), "policy_json", b.Policy, "{}")
	if err != nil {
		return nil, err
	}
	return []column{
		i16("partition_key", b.Partition), text("budget_id", b.ID), jsonb("policy_json", policy),
		i64("created_at_ms", b.CreatedAtMs), i64("updated_at_ms", b.UpdatedAtMs), text("scope_type", b.ScopeType),
		text("scope_id", b.ScopeID), text("enforcement_mode", b.EnforcementMode), i64("breach_count", b.BreachCount),
		i64("soft_breach_count", b.SoftBreachCount), msCol("last_breach_at_ms", b.LastBreachAtMs),
		text("last_breach_dim", nullText(b.LastBreachDim)), msCol("next_reset_at_ms", b.NextResetAtMs),
	}, nil
}

// BudgetUsage is an ff_budget_usage row.
type BudgetUsage struct {
	Partition     int16
	BudgetID      string
	Dimensions    string
	CurrentValue  int64
	LastResetAtMs *int64
	// UpdatedAtMs: 0 stores 1.
	UpdatedAtMs int64
}

// Table names ff_budget_usage.
func (BudgetUsage) Table() string { return "ff_budget_usage" }

func (u BudgetUsage) columns() ([]column, error) {
	return []column{
		i16("partition_key", u.Partition), text("budget_id", u.BudgetID), text("dimensions_key", u.Dimensions),
		i64("current_value", u.CurrentValue), msCol("last_reset_at_ms", u.LastResetAtMs),
		i64("updated_at_ms", orInt(u.UpdatedAtMs, 1)),
	}, nil
}

// BudgetDedup is an ff_budget_usage_dedup row: a report_usage idempotency
// key.
type BudgetDedup struct {
	Partition int16
	Key       string
	// Outcome is outcome_json, stored as JSON like Exec.Policy; nil stores
	// {"outcome": "applied"}.
	Outcome any
	// AppliedAtMs: 0 stores ExpiresAtMs - 1000.
	AppliedAtMs, ExpiresAtMs int64
}

// Table names ff_budget_usage_dedup.
func (BudgetDedup) Table() string { return "ff_budget_usage_dedup" }

func (d BudgetDedup) columns() ([]column, error) {
	outcome, err := jsonText(d.Table(), "outcome_json", d.Outcome, `{"outcome": "applied"}`)
	if err != nil {
		return nil, err
	}
	return []column{
		i16("partition_key", d.Partition), text("dedup_key", d.Key), jsonb("outcome_json", outcome),
		i64("applied_at_ms", orInt(d.AppliedAtMs, d.ExpiresAtMs-1000)), i64("expires_at_ms", d.ExpiresAtMs),
	}, nil
}

// WorkerRegistration is an ff_worker_registry row.
type WorkerRegistration struct {
	Partition int16
	// Namespace: "" stores default.
	Namespace string
	// InstanceID: "": inst-<8 random hex digits>.
	InstanceID string
	// WorkerID: "" stores worker-1.
	WorkerID string
	// Lanes: nil stores {default}.
	Lanes           []string
	CapabilitiesCSV string
	LastHeartbeatMs int64
	// TTLMs is liveness_ttl_ms: 0 stores 30 s.
	TTLMs int64
	// RegisteredAtMs: 0 stores 1.
	RegisteredAtMs int64
}

// Table names ff_worker_registry.
func (WorkerRegistration) Table() string { return "ff_worker_registry" }

// Defaults returns w with its zero fields filled, a fresh InstanceID among
// them.
func (w WorkerRegistration) Defaults() WorkerRegistration {
	if w.InstanceID == "" {
		w.InstanceID = "inst-" + NewUUID()[:8]
	}
	w.Namespace = orText(w.Namespace, "default")
	w.WorkerID = orText(w.WorkerID, "worker-1")
	w.Lanes = orStrings(w.Lanes, []string{"default"})
	w.TTLMs = orInt(w.TTLMs, 30_000)
	w.RegisteredAtMs = orInt(w.RegisteredAtMs, 1)
	return w
}

func (w WorkerRegistration) columns() ([]column, error) {
	w = w.Defaults()
	return []column{
		i16("partition_key", w.Partition), text("namespace", w.Namespace), text("worker_instance_id", w.InstanceID),
		text("worker_id", w.WorkerID), texts("lanes", w.Lanes), text("capabilities_csv", w.CapabilitiesCSV),
		i64("last_heartbeat_ms", w.LastHeartbeatMs), i64("liveness_ttl_ms", w.TTLMs),
		i64("registered_at_ms", w.RegisteredAtMs),
	}, nil
}

// WorkerEvent is an ff_worker_registry_event row.
type WorkerEvent struct {
	Partition  int16
	Namespace  string
	InstanceID string
	Kind       string
	AtMs       int64
	Reason     string // "": NULL
}

// Table names ff_worker_registry_event.
func (WorkerEvent) Table() string { return "ff_worker_registry_event" }

func (e WorkerEvent) columns() ([]column, error) {
	return []column{
		i16("partition_key", e.Partition), text("namespace", e.Namespace), text("worker_instance_id", e.InstanceID),
		text("event_kind", e.Kind), i64("event_at_ms", e.AtMs), text("reason", nullText(e.Reason)),
	}, nil
}

// FlowCore is an ff_flow_core row, as FlowFabric's create_flow writes one.
type FlowCore struct {
	Partition int16
	FlowID    string
	// State is public_flow_state: "" stores open.
	State string
	// CreatedAtMs: 0 stores 1.
	CreatedAtMs  int64
	TerminalAtMs *int64
	// RawFields is stored as JSON like Exec.Policy; nil stores {}.
	RawFields any
}

// Table names ff_flow_core.
func (FlowCore) Table() string { return "ff_flow_core" }

func (f FlowCore) columns() ([]column, error) {
	raw, err := jsonText(f.Table(), "raw_fields", f.RawFields, "{}")
	if err != nil {
		return nil, err
	}
	return []column{
		i16("partition_key", f.Partition), uuidCol("flow_id", f.FlowID), text("public_flow_state", orText(f.State, "open")),
		i64("created_at_ms", orInt(f.CreatedAtMs, 1)), msCol("terminal_at_ms", f.TerminalAtMs), jsonb("raw_fields", raw),
	}, nil
}

// CancelBacklog is an ff_cancel_backlog header, as FlowFabric's
// cancel_flow_header writes it.
type CancelBacklog struct {
	Partition     int16
	FlowID        string
	RequestedAtMs int64
	Requester     string
	Reason        string
	GraceUntilMs  *int64
	// Policy is cancellation_policy: "" stores cancel_all.
	Policy string
	// Status: "" stores pending.
	Status string
}

// Table names ff_cancel_backlog.
func (CancelBacklog) Table() string { return "ff_cancel_backlog" }

func (b CancelBacklog) columns() ([]column, error) {
	return []column{
		i16("partition_key", b.Partition), uuidCol("flow_id", b.FlowID), i64("requested_at_ms", b.RequestedAtMs),
		text("requester", b.Requester), text("reason", b.Reason), msCol("grace_until_ms", b.GraceUntilMs),
		text("cancellation_policy", orText(b.Policy, "cancel_all")), text("status", orText(b.Status, "pending")),
	}, nil
}

// CancelBacklogMember is an ff_cancel_backlog_member row. ExecutionID is
// stored as given: a wire id (WireID) as FlowFabric writes it, or anything
// else for a bad row.
type CancelBacklogMember struct {
	Partition   int16
	FlowID      string
	ExecutionID string
}

// Table names ff_cancel_backlog_member.
func (CancelBacklogMember) Table() string { return "ff_cancel_backlog_member" }

func (m CancelBacklogMember) columns() ([]column, error) {
	return []column{
		i16("partition_key", m.Partition), uuidCol("flow_id", m.FlowID), text("execution_id", m.ExecutionID),
	}, nil
}

// ClaimGrant is an ff_claim_grant row, as FlowFabric's scheduler
// (claim_grant::write_claim_grant) or issue_reclaim_grant writes it.
type ClaimGrant struct {
	Partition int16
	// ID is grant_id: nil stores 32 random bytes (FlowFabric's is the
	// sha256 of the signed grant key).
	ID          []byte
	ExecutionID string
	// Kind: "" stores claim ('claim' or 'reclaim').
	Kind string
	// WorkerID: "" stores w1; WorkerInstanceID: "" stores WorkerID-i1.
	WorkerID, WorkerInstanceID string
	// GrantTTLMs: 0 stores 1000.
	GrantTTLMs int64
	// IssuedAtMs: 0 stores ExpiresAtMs - GrantTTLMs.
	IssuedAtMs, ExpiresAtMs int64
}

// Table names ff_claim_grant.
func (ClaimGrant) Table() string { return "ff_claim_grant" }

// Defaults returns g with its zero fields filled, a fresh ID among them.
func (g ClaimGrant) Defaults() ClaimGrant {
	if g.ID == nil {
		g.ID = make([]byte, 32)
		_, _ = rand.Read(g.ID)
	}
	g.Kind = orText(g.Kind, "claim")
	g.WorkerID = orText(g.WorkerID, "w1")
	g.WorkerInstanceID = orText(g.WorkerInstanceID, g.WorkerID+"-i1")
	g.GrantTTLMs = orInt(g.GrantTTLMs, 1000)
	g.IssuedAtMs = orInt(g.IssuedAtMs, g.ExpiresAtMs-g.GrantTTLMs)
	return g
}

func (g ClaimGrant) columns() ([]column, error) {
	g = g.Defaults()
	// lane_id, capability_hash, route_snapshot_json and admission_summary
	// stay NULL, worker_capabilities its default [], as the scheduler's
	// grants of the seeders have them.
	return []column{
		i16("partition_key", g.Partition), {name: "grant_id", typ: "bytea", val: g.ID},
		uuidCol("execution_id", g.ExecutionID), text("kind", g.Kind), text("worker_id", g.WorkerID),
		text("worker_instance_id", g.WorkerInstanceID), jsonb("worker_capabilities", "[]"),
		i64("grant_ttl_ms", g.GrantTTLMs), i64("issued_at_ms", g.IssuedAtMs), i64("expires_at_ms", g.ExpiresAtMs),
	}, nil
}

// QuotaPolicy is an ff_quota_policy row, as create_quota_policy writes it.
type QuotaPolicy struct {
	Partition         int16
	ID                string
	WindowSeconds     int64
	MaxRequests       int64
	ConcurrencyCap    int64
	ActiveConcurrency int64
	// CreatedAtMs and UpdatedAtMs: 0 stores 1.
	CreatedAtMs, UpdatedAtMs int64
}

// Table names ff_quota_policy.
func (QuotaPolicy) Table() string { return "ff_quota_policy" }

func (p QuotaPolicy) columns() ([]column, error) {
	return []column{
		i16("partition_key", p.Partition), text("quota_policy_id", p.ID), i64("requests_per_window_seconds", p.WindowSeconds),
		i64("max_requests_per_window", p.MaxRequests), i64("active_concurrency_cap", p.ConcurrencyCap),
		i64("active_concurrency", p.ActiveConcurrency), i64("created_at_ms", orInt(p.CreatedAtMs, 1)),
		i64("updated_at_ms", orInt(p.UpdatedAtMs, 1)),
	}, nil
}

// QuotaAdmitted is an ff_quota_admitted row: an admission of ExecutionID (a
// wire id, as check_admission stores it) under a policy.
type QuotaAdmitted struct {
	Partition   int16
	PolicyID    string
	ExecutionID string
	// AdmittedAtMs: 0 stores ExpiresAtMs - 1000.
	AdmittedAtMs, ExpiresAtMs int64
}

// Table names ff_quota_admitted.
func (QuotaAdmitted) Table() string { return "ff_quota_admitted" }

func (a QuotaAdmitted) columns() ([]column, error) {
	return []column{
		i16("partition_key", a.Partition), text("quota_policy_id", a.PolicyID), text("execution_id", a.ExecutionID),
		i64("admitted_at_ms", orInt(a.AdmittedAtMs, a.ExpiresAtMs-1000)), i64("expires_at_ms", a.ExpiresAtMs),
	}, nil
}

// QuotaWindow is an ff_quota_window row (a sliding-window admission; the
// dimension ” unless set, as check_admission writes it).
type QuotaWindow struct {
	Partition    int16
	PolicyID     string
	Dimension    string
	AdmittedAtMs int64
	ExecutionID  string
}

// Table names ff_quota_window.
func (QuotaWindow) Table() string { return "ff_quota_window" }

func (w QuotaWindow) columns() ([]column, error) {
	return []column{
		i16("partition_key", w.Partition), text("quota_policy_id", w.PolicyID), text("dimension", w.Dimension),
		i64("admitted_at_ms", w.AdmittedAtMs), text("execution_id", w.ExecutionID),
	}, nil
}

// OperatorEvent is an ff_operator_event row (its event_id is the table's
// sequence; details stay NULL).
type OperatorEvent struct {
	ExecutionID  string
	EventType    string
	OccurredAtMs int64
	Partition    int32
	Namespace    string // "": NULL
	InstanceTag  string // "": NULL
}

// Table names ff_operator_event.
func (OperatorEvent) Table() string { return "ff_operator_event" }

func (e OperatorEvent) columns() ([]column, error) {
	return []column{
		text("execution_id", e.ExecutionID), text("event_type", e.EventType), i64("occurred_at_ms", e.OccurredAtMs),
		i32("partition_key", e.Partition), text("namespace", nullText(e.Namespace)),
		text("instance_tag", nullText(e.InstanceTag)),
	}, nil
}

// SignalEvent is an ff_signal_event row (its event_id is the table's
// sequence).
type SignalEvent struct {
	ExecutionID    string
	SignalID       string
	WaitpointID    string // "": NULL
	SourceIdentity string // "": NULL
	DeliveredAtMs  int64
	Partition      int32
	Namespace      string // "": NULL
	InstanceTag    string // "": NULL
}

// Table names ff_signal_event.
func (SignalEvent) Table() string { return "ff_signal_event" }

func (e SignalEvent) columns() ([]column, error) {
	return []column{
		text("execution_id", e.ExecutionID), text("signal_id", e.SignalID), text("waitpoint_id", nullText(e.WaitpointID)),
		text("source_identity", nullText(e.SourceIdentity)), i64("delivered_at_ms", e.DeliveredAtMs),
		i32("partition_key", e.Partition), text("namespace", nullText(e.Namespace)),
		text("instance_tag", nullText(e.InstanceTag)),
	}, nil
}

// StreamFrame is an ff_stream_frame row.
type StreamFrame struct {
	Partition    int16
	ExecutionID  string
	AttemptIndex int32
	TsMs         int64
	Seq          int32
	// Fields is stored as JSON like Exec.Policy; nil stores {}.
	Fields any
	// Mode: "" stores append.
	Mode        string
	CreatedAtMs int64
}

// Table names ff_stream_frame.
func (StreamFrame) Table() string { return "ff_stream_frame" }

func (f StreamFrame) columns() ([]column, error) {
	fields, err := jsonText(f.Table(), "fields", f.Fields, "{}")
	if err != nil {
		return nil, err
	}
	return []column{
		i16("partition_key", f.Partition), uuidCol("execution_id", f.ExecutionID), i32("attempt_index", f.AttemptIndex),
		i64("ts_ms", f.TsMs), i32("seq", f.Seq), jsonb("fields", fields), text("mode", orText(f.Mode, "append")),
		i64("created_at_ms", f.CreatedAtMs),
	}, nil
}

// StreamMeta is an ff_stream_meta row, its counters at their defaults.
type StreamMeta struct {
	Partition    int16
	ExecutionID  string
	AttemptIndex int32
}

// Table names ff_stream_meta.
func (StreamMeta) Table() string { return "ff_stream_meta" }

func (m StreamMeta) columns() ([]column, error) {
	return []column{
		i16("partition_key", m.Partition), uuidCol("execution_id", m.ExecutionID), i32("attempt_index", m.AttemptIndex),
	}, nil
}

// StreamSummary is an ff_stream_summary row (version 0, no patch kind).
type StreamSummary struct {
	Partition    int16
	ExecutionID  string
	AttemptIndex int32
	// Document is document_json, stored as JSON like Exec.Policy; nil
	// stores {}.
	Document                      any
	LastUpdatedMs, FirstAppliedMs int64
}

// Table names ff_stream_summary.
func (StreamSummary) Table() string { return "ff_stream_summary" }

func (s StreamSummary) columns() ([]column, error) {
	doc, err := jsonText(s.Table(), "document_json", s.Document, "{}")
	if err != nil {
		return nil, err
	}
	return []column{
		i16("partition_key", s.Partition), uuidCol("execution_id", s.ExecutionID), i32("attempt_index", s.AttemptIndex),
		jsonb("document_json", doc), i64("last_updated_ms", s.LastUpdatedMs), i64("first_applied_ms", s.FirstAppliedMs),
	}, nil
}
