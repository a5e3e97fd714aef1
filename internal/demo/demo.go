// Package demo feeds a realistic workload into the ff_* tables so that a
// fleet started with `make run` has something to reconcile and River UI and
// `worker status` have something to show: expiring leases, timing-out
// suspensions of every behaviour, delayed executions coming due, quorum
// edge groups with pending sibling cancels, executions reaching their
// deadline, expiring waitpoints, budgets due for a reset, worker
// registrations going stale and cancel backlogs past their grace, spread
// over all partitions.
//
// The SQL lives here rather than in package store on purpose. store holds
// the statements the reconcilers run against a production FlowFabric
// database; these statements play FlowFabric itself, writing rows the way
// its engine would. They are fixtures, never run by the fleet, and keeping
// them out of store keeps store's contract (every statement is one a
// reconciler needs) true.
package demo

import (
	"context"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"time"

	"github.com/jackc/pgx/v5"
)

// Tenant of every demo row: a fleet run with --namespace demo or
// --instance-tag cairn.instance_id=demo-1 reconciles them, and one filtered
// to another tenant leaves them alone.
const (
	Namespace      = "demo"
	InstanceTagKey = "cairn.instance_id"
	InstanceTag    = "demo-1"
)

// DemoBudgetPartitions is the number of budget partitions the demo's
// budgets use: FlowFabric's default num_budget_partitions, which the budget
// reset walks by default.
const DemoBudgetPartitions = 32

// DefaultRate is the default number of items per second: about what a
// small FlowFabric deployment produces, and enough to keep every reconciler
// busy without flooding River UI.
const DefaultRate = 30

// UnknownBehavior is a timeout_behavior FlowFabric does not define; the
// suspension-timeout reconciler applies it as fail, with a warning. The
// demo writes it only when asked (Feeder.Malformed).
const UnknownBehavior = "hibernate"

// Behaviors lists the timeout behaviours the demo writes; "" stands for
// NULL (which means fail).
var Behaviors = []string{"", "fail", "cancel", "expire", "escalate", "auto_resume_with_timeout_signal", UnknownBehavior}

// DefaultBudgetResetInterval is the reset interval of the demo's budgets:
// River UI shows each budget's resets recurring.
const DefaultBudgetResetInterval = time.Minute

// WaitpointSuspensionTimeout is how long after it is written the suspension
// of a WaitpointExpiring item times out: well past the test that checks
// waitpoint expiry marked it, however slow the machine.
const WaitpointSuspensionTimeout = 10 * time.Minute

// Kind is one kind of demo item: a row some reconciler will act on.
type Kind int

// Item kinds.
const (
	// LeaseExpired is an active execution whose lease lapsed moments ago,
	// without a retry policy: lease expiry's in the default fleet.
	LeaseExpired Kind = iota
	// LeaseExpiring is an active execution whose lease lapses shortly,
	// declaring two retries: attempt timeout's in the default fleet.
	LeaseExpiring
	// Suspension is a suspended execution whose timeout lapses about now,
	// with one of Behaviors in turn.
	Suspension
	// Delayed is a runnable execution delayed until about now.
	Delayed
	// CancelGroup is a quorum edge group whose quorum was just satisfied:
	// its flag is set, its members are live sibling executions, and a
	// pending cancel row points at it (for the dispatcher).
	CancelGroup
	// OrphanPending is a pending cancel row whose edge group does not exist
	// (for either reconciler to delete).
	OrphanPending
	// StalePending is a pending cancel row whose edge group has its flag
	// clear, as a flow cancel writes it (for the cancel reconciler).
	StalePending
	// DeadlinePassing is an active execution, leased well into the
	// future, whose execution deadline passes about now.
	DeadlinePassing
	// WaitpointExpiring is a suspended execution waiting on a waitpoint
	// that expires about now; its suspension times out ten minutes later
	// (WaitpointSuspensionTimeout), long after waitpoint expiry marked it.
	WaitpointExpiring
	// BudgetDue is a budget with usage in two dimensions whose reset falls
	// due about now, and every Feeder.BudgetResetInterval after (a minute
	// by default).
	BudgetDue
	// WorkerStale is a worker registration whose heartbeat goes past its
	// liveness TTL about now.
	WorkerStale
	// FlowStep is an upstream that just ended, whose completion event
	// nobody dispatched, falling due for dependency (DependencyStale after
	// its commit) about now: a downstream blocked on it (all_of) and one
	// blocked on that downstream. Succeeded and failed in turn: a success
	// makes the first downstream eligible, a failure skips both (a chain).
	FlowStep
	// GrantExpiring is an execution a scheduler granted to a worker that
	// never claimed it (pending_claim), its grant expiring about now.
	GrantExpiring
	// AdmissionExpiring is a quota policy with a concurrency cap, full:
	// two admissions expiring about now, its counter at two, and two
	// sliding-window rows older than its one-minute window.
	AdmissionExpiring
	// DedupExpiring is a budget usage report's idempotency key expiring
	// about now.
	DedupExpiring
	// CancelBacklog is a cancelled flow's cancel backlog whose grace
	// (CancelBacklogGrace) ends about now, as FlowFabric's flow cancel
	// leaves it when its server never acks: a header and one member row,
	// the member a live execution of the flow (its own cancel failed).
	CancelBacklog
	numKinds
)

// CancelBacklogGrace is the cancel backlog's default grace, which the
// demo's backlog headers are dated for.
const CancelBacklogGrace = 30 * time.Second

// DependencyStale is the dependency reconciler's default stale threshold,
// which the demo's completion events are dated for.
const DependencyStale = 15 * time.Second

var kindNames = [numKinds]string{"lease_expired", "lease_expiring", "suspension", "delayed", "cancel_group",
	"orphan_pending", "stale_pending", "deadline_passing", "waitpoint_expiring", "budget_due", "worker_stale", "flow_step",
	"grant_expiring", "admission_expiring", "dedup_expiring", "cancel_backlog"}

func (k Kind) String() string {
	if k >= 0 && k < numKinds {
		return kindNames[k]
	}
	return fmt.Sprintf("Kind(%d)", int(k))
}

// deck is the order items are dealt in, over and over. Any DeckSize
// consecutive items hold every kind and every suspension behaviour (there
// are seven Suspension entries, one per behaviour in turn), so one
// second at the default rate, or one --once batch, has a bit of everything.
// Leases come in both flavours so that River UI shows releases arriving
// steadily rather than only in bursts. An expired lease on an active
// execution is due for both lease expiry and attempt timeout; the default
// fleet gives it to one by the execution's retry policy, so expired leases
// (none) show lease expiry's jobs and expiring ones (two retries) attempt
// timeout's.
var deck = []Kind{
	LeaseExpired, Suspension, Delayed, LeaseExpiring, Suspension, CancelGroup, Suspension, DeadlinePassing,
	LeaseExpired, Delayed, Suspension, Suspension, LeaseExpiring, WaitpointExpiring, Suspension, Delayed,
	Suspension, CancelGroup, OrphanPending, LeaseExpired, StalePending, BudgetDue, CancelBacklog, WorkerStale, FlowStep,
	GrantExpiring, AdmissionExpiring, DedupExpiring,
}

// DeckSize is the smallest batch holding every kind and behaviour.
var DeckSize = len(deck)

// Counts is what was inserted.
type Counts struct {
	// Items per kind.
	Items [numKinds]int
	// Behaviors counts suspensions by timeout behaviour ("" for NULL).
	Behaviors map[string]int
	// Rows is the number of table rows written (executions, attempts,
	// suspensions, edge groups, pending rows).
	Rows int
	// Siblings is the number of live sibling executions listed on cancel
	// groups.
	Siblings int
	// FlowsFailed is the number of FlowStep items whose upstream failed.
	FlowsFailed int
	// LastDueMs is the latest deadline among the items: after it every
	// item is due.
	LastDueMs int64
}

// Total is the number of items.
func (c Counts) Total() int {
	n := 0
	for _, v := range c.Items {
		n += v
	}
	return n
}

// Add adds o to c.
func (c *Counts) Add(o Counts) {
	for i := range c.Items {
		c.Items[i] += o.Items[i]
	}
	if c.Behaviors == nil {
		c.Behaviors = map[string]int{}
	}
	for b, n := range o.Behaviors {
		c.Behaviors[b] += n
	}
	c.Rows += o.Rows
	c.Siblings += o.Siblings
	c.FlowsFailed += o.FlowsFailed
	c.LastDueMs = max(c.LastDueMs, o.LastDueMs)
}

// String is the one-line summary `worker demo` prints.
func (c Counts) String() string {
	return fmt.Sprintf("%d items (%d rows): leases %d expired + %d expiring, suspensions %d, delayed %d, cancel groups %d (%d siblings), "+
		"orphan pending %d, stale pending %d, deadlines %d, waitpoints %d, budgets %d, workers %d, flow steps %d (%d failed), "+
		"claim grants %d, quota admissions %d, budget dedup keys %d, cancel backlogs %d",
		c.Total(), c.Rows, c.Items[LeaseExpired], c.Items[LeaseExpiring], c.Items[Suspension], c.Items[Delayed],
		c.Items[CancelGroup], c.Siblings, c.Items[OrphanPending], c.Items[StalePending], c.Items[DeadlinePassing],
		c.Items[WaitpointExpiring], c.Items[BudgetDue], c.Items[WorkerStale], c.Items[FlowStep], c.FlowsFailed,
		c.Items[GrantExpiring], c.Items[AdmissionExpiring], c.Items[DedupExpiring], c.Items[CancelBacklog])
}

// Beginner starts a transaction: *pgxpool.Pool and *pgx.Conn satisfy it.
type Beginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// Feeder deals items from the deck, keeping its place between batches so
// that successive small batches still cycle through every kind.
type Feeder struct {
	// Malformed: suspensions that would get UnknownBehavior get it (the
	// worker applies it as fail and logs a warning naming the row), and
	// OrphanPending items are dealt (a pending cancel row without its edge
	// group, deleted with a warning); otherwise they get "fail" and are
	// StalePending items. Off by default, so the worker's log holds
	// only what a person should read.
	Malformed bool
	// BudgetResetInterval is the reset interval of the budgets it writes
	// (reset_interval_ms): each budget falls due once as written, then
	// every interval. Defaults to DefaultBudgetResetInterval. The soak sets
	// it beyond its own length, so that budgets, like every other item,
	// fall due a bounded number of times and the stream stays steady.
	BudgetResetInterval time.Duration
	// Lead is added to every deadline the feeder draws. By default (0) an
	// item falls due between a few seconds ago and a few seconds ahead, as
	// FlowFabric writes rows that lapsed moments ago, so its lateness starts
	// before it is written; the soak sets 3 s, so that every row is written
	// before it falls due and lateness is the fleet's alone.
	Lead time.Duration

	db       Beginner
	rng      *rand.Rand
	next     int  // position in deck
	behavior int  // next suspension behaviour
	flowFail bool // the next FlowStep's upstream fails
}

// NewFeeder returns a feeder writing to db. A seed of 0 picks a random one.
func NewFeeder(db Beginner, seed uint64) *Feeder {
	if seed == 0 {
		seed = rand.Uint64()
	}
	return &Feeder{db: db, rng: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))}
}

// Insert writes the next n items in one transaction, with deadlines
// relative to now.
func (f *Feeder) Insert(ctx context.Context, n int, now time.Time) (Counts, error) {
	c := Counts{Behaviors: map[string]int{}}
	if n <= 0 {
		return c, nil
	}
	b := &pgx.Batch{}
	nowMs := now.UnixMilli()
	for range n {
		k := f.deal()
		f.add(b, k, nowMs, &c)
		c.Items[k]++
	}
	tx, err := f.db.Begin(ctx)
	if err != nil {
		return Counts{}, fmt.Errorf("demo: begin: %w", err)
	}
	defer tx.Rollback(context.Background()) //nolint:errcheck // a no-op after commit
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return Counts{}, fmt.Errorf("demo: insert %d items: %w", n, err)
	}
	if err := tx.Commit(ctx); err != nil {
		return Counts{}, fmt.Errorf("demo: commit: %w", err)
	}
	return c, nil
}

// deal returns the next kind of the deck. An orphaned pending row is logged
// by the worker as a warning, so without Malformed a stale one is dealt
// instead.
func (f *Feeder) deal() Kind {
	k := deck[f.next]
	f.next = (f.next + 1) % len(deck)
	if k == OrphanPending && !f.Malformed {
		k = StalePending
	}
	return k
}

// between returns a deadline in [nowMs+loMs, nowMs+hiMs), moved by Lead.
func (f *Feeder) between(nowMs, loMs, hiMs int64) int64 {
	return nowMs + f.Lead.Milliseconds() + loMs + f.rng.Int64N(hiMs-loMs)
}

func (f *Feeder) partition() int16 { return int16(f.rng.IntN(256)) }

func (f *Feeder) uuid() string {
	var b [16]byte
	for i := range b {
		b[i] = byte(f.rng.Uint32())
	}
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}

// add queues the statements of one item.
func (f *Feeder) add(b *pgx.Batch, k Kind, nowMs int64, c *Counts) {
	p := f.partition()
	due := func(ms int64) int64 { c.LastDueMs = max(c.LastDueMs, ms); return ms }
	switch k {
	case LeaseExpired, LeaseExpiring:
		expires := f.between(nowMs, -3000, 0)
		if k == LeaseExpiring {
			expires = f.between(nowMs, 1000, 5000)
		}
		id := f.uuid()
		policy := ""
		if k == LeaseExpiring {
			policy = `{"retry_policy": {"max_retries": 2}}`
		}
		f.exec(b, execRow{p: p, id: id, phase: "active", ownership: "leased", eligibility: "not_applicable",
			public: "running", attempt: "running_attempt", startedMs: nowMs - 30_000, nowMs: nowMs, policy: policy})
		b.Queue(`INSERT INTO ff_attempt (partition_key, execution_id, attempt_index, worker_id, worker_instance_id,
		        lease_epoch, lease_expires_at_ms, started_at_ms)
		 VALUES ($1, $2, 0, $3, $4, 1, $5, $6)`,
			p, id, fmt.Sprintf("demo-worker-%d", f.rng.IntN(8)), "demo-worker-i1", due(expires), nowMs-30_000)
		c.Rows += 2
	case Suspension:
		behavior := Behaviors[f.behavior]
		f.behavior = (f.behavior + 1) % len(Behaviors)
		if behavior == UnknownBehavior && !f.Malformed {
			behavior = "fail"
		}
		c.Behaviors[behavior]++
		var bh any
		if behavior != "" {
			bh = behavior
		}
		id := f.uuid()
		f.exec(b, execRow{p: p, id: id, phase: "suspended", ownership: "unowned", eligibility: "not_applicable",
			public: "suspended", attempt: "attempt_interrupted", startedMs: nowMs - 60_000, nowMs: nowMs})
		b.Queue(`INSERT INTO ff_suspension_current (partition_key, execution_id, suspension_id, suspended_at_ms,
		        timeout_at_ms, reason_code, condition, member_map, timeout_behavior)
		 VALUES ($1, $2, $3, $4, $5, 'waiting_for_signal', '{"kind": "signal", "name": "approval"}'::jsonb, '{}'::jsonb, $6)`,
			p, id, f.uuid(), nowMs-60_000, due(f.between(nowMs, -2000, 4000)), bh)
		c.Rows += 2
	case Delayed:
		f.exec(b, execRow{p: p, id: f.uuid(), phase: "runnable", ownership: "unowned", eligibility: "not_eligible_until_time",
			public: "delayed", attempt: "pending_retry_attempt", deadlineMs: due(f.between(nowMs, -2000, 4000)), nowMs: nowMs})
		c.Rows++
	case CancelGroup:
		// An any_of(1) group whose first upstream just succeeded: the
		// winner is terminal, the other upstreams are still live, and
		// FlowFabric has raised the flag listing them for cancellation.
		flow, downstream := f.uuid(), f.uuid()
		f.exec(b, execRow{p: p, id: f.uuid(), flow: flow, phase: "terminal", ownership: "unowned", eligibility: "not_applicable",
			public: "completed", attempt: "attempt_terminal", terminalMs: nowMs - 100, nowMs: nowMs})
		siblings := make([]string, 2+f.rng.IntN(2))
		for i := range siblings {
			siblings[i] = f.uuid()
			f.exec(b, execRow{p: p, id: siblings[i], flow: flow, phase: "runnable", ownership: "unowned", eligibility: "eligible_now",
				public: "waiting", attempt: "pending", nowMs: nowMs})
		}
		f.exec(b, execRow{p: p, id: downstream, flow: flow, phase: "runnable", ownership: "unowned", eligibility: "eligible_now",
			public: "waiting", attempt: "pending", nowMs: nowMs})
		f.edgeGroup(b, p, flow, downstream, true, siblings, len(siblings))
		f.pending(b, p, flow, downstream, due(nowMs))
		c.Rows += 1 + len(siblings) + 1 + 2
		c.Siblings += len(siblings)
	case OrphanPending:
		// A pending row left behind after its edge group was removed. The
		// downstream execution exists (cancelled with its flow), so a
		// tenant filter can place the row.
		flow, downstream := f.uuid(), f.uuid()
		f.exec(b, execRow{p: p, id: downstream, flow: flow, phase: "terminal", ownership: "unowned", eligibility: "not_applicable",
			public: "cancelled", attempt: "cancelled", terminalMs: nowMs - 1000, nowMs: nowMs})
		f.pending(b, p, flow, downstream, due(nowMs))
		c.Rows += 2
	case StalePending:
		// A flow cancel wrote the pending row without raising the flag.
		flow, downstream := f.uuid(), f.uuid()
		f.exec(b, execRow{p: p, id: downstream, flow: flow, phase: "terminal", ownership: "unowned", eligibility: "not_applicable",
			public: "cancelled", attempt: "cancelled", terminalMs: nowMs - 1000, nowMs: nowMs})
		f.edgeGroup(b, p, flow, downstream, false, nil, 0)
		f.pending(b, p, flow, downstream, due(nowMs))
		c.Rows += 3
	case DeadlinePassing:
		// Running, its lease renewed for minutes, but over its deadline.
		id := f.uuid()
		f.exec(b, execRow{p: p, id: id, phase: "active", ownership: "leased", eligibility: "not_applicable",
			public: "running", attempt: "running_attempt", startedMs: nowMs - 60_000,
			deadlineMs: due(f.between(nowMs, -2000, 4000)), nowMs: nowMs})
		b.Queue(`INSERT INTO ff_attempt (partition_key, execution_id, attempt_index, worker_id, worker_instance_id,
		        lease_epoch, lease_expires_at_ms, started_at_ms)
		 VALUES ($1, $2, 0, 'demo-worker-0', 'demo-worker-i1', 3, $3, $4)`, p, id, nowMs+600_000, nowMs-60_000)
		c.Rows += 2
	case WaitpointExpiring:
		id := f.uuid()
		f.exec(b, execRow{p: p, id: id, phase: "suspended", ownership: "unowned", eligibility: "not_applicable",
			public: "suspended", attempt: "attempt_interrupted", startedMs: nowMs - 60_000, nowMs: nowMs})
		b.Queue(`INSERT INTO ff_suspension_current (partition_key, execution_id, suspension_id, suspended_at_ms,
		        timeout_at_ms, reason_code, condition, member_map, timeout_behavior)
		 VALUES ($1, $2, $3, $4, $5, 'waiting_for_signal', '{"kind": "signal", "name": "approval"}'::jsonb, '{}'::jsonb, 'fail')`,
			p, id, f.uuid(), nowMs-60_000, nowMs+WaitpointSuspensionTimeout.Milliseconds())
		b.Queue(`INSERT INTO ff_waitpoint_pending (partition_key, waitpoint_id, execution_id, token_kid, token, created_at_ms,
		        expires_at_ms, waitpoint_key, state, required_signal_names, activated_at_ms)
		 VALUES ($1, $2, $3, 'demo-kid', 'demo-token', $4, $5, 'approval', 'active', '{approval}', $4)`,
			p, f.uuid(), id, nowMs-60_000, due(f.between(nowMs, -2000, 4000)))
		c.Rows += 3
	case BudgetDue:
		bp := int16(f.rng.IntN(DemoBudgetPartitions))
		id := "demo-budget-" + f.uuid()[:8]
		interval := f.BudgetResetInterval
		if interval <= 0 {
			interval = DefaultBudgetResetInterval
		}
		b.Queue(`INSERT INTO ff_budget_policy (partition_key, budget_id, policy_json, created_at_ms, updated_at_ms,
		        scope_type, scope_id, enforcement_mode, breach_count, last_breach_at_ms, last_breach_dim, next_reset_at_ms)
		 VALUES ($1, $2, jsonb_build_object('hard_limit', 1000, 'reset_interval_ms', $6::bigint), $3, $3, 'flow', $4, 'hard', 1, $3, 'tokens', $5)`,
			bp, id, nowMs-60_000, f.uuid(), due(f.between(nowMs, -2000, 4000)), interval.Milliseconds())
		for _, dim := range []string{"tokens", "calls"} {
			b.Queue(`INSERT INTO ff_budget_usage (partition_key, budget_id, dimensions_key, current_value, updated_at_ms)
			 VALUES ($1, $2, $3, $4, $5)`, bp, id, dim, 1+f.rng.Int64N(1000), nowMs-1000)
		}
		c.Rows += 3
	case FlowStep:
		flow, up, down, down2 := f.uuid(), f.uuid(), f.uuid(), f.uuid()
		outcome, public := "success", "completed"
		if f.flowFail {
			outcome, public = "failed", "failed"
			c.FlowsFailed++
		}
		f.flowFail = !f.flowFail
		f.exec(b, execRow{p: p, id: up, flow: flow, phase: "terminal", ownership: "unowned", eligibility: "not_applicable",
			public: public, attempt: "attempt_terminal", terminalMs: nowMs - 1000, nowMs: nowMs})
		for _, d := range []struct{ id, on string }{{down, up}, {down2, down}} {
			f.exec(b, execRow{p: p, id: d.id, flow: flow, phase: "blocked", ownership: "unowned", eligibility: "blocked_by_dependencies",
				public: "waiting", attempt: "pending", nowMs: nowMs})
			b.Queue(`INSERT INTO ff_edge (partition_key, flow_id, edge_id, upstream_eid, downstream_eid, policy)
			 VALUES ($1, $2, $3, $4, $5, '{"kind": "all_of"}'::jsonb)`, p, flow, f.uuid(), d.on, d.id)
			b.Queue(`INSERT INTO ff_edge_group (partition_key, flow_id, downstream_eid, policy, k_target, running_count)
			 VALUES ($1, $2, $3, '{"kind": "all_of"}'::jsonb, 1, 1)`, p, flow, d.id)
		}
		// The flow's own row, its tenant laid out as FlowFabric's
		// create_flow writes it (namespace, and the tag as a top-level
		// key): the flow summary projects it.
		b.Queue(`INSERT INTO ff_flow_core (partition_key, flow_id, public_flow_state, created_at_ms, raw_fields)
		 VALUES ($1, $2, 'open', $3, jsonb_build_object('namespace', $4::text, $5::text, $6::text))`,
			p, flow, nowMs-60_000, Namespace, InstanceTagKey, InstanceTag)
		// Committed DependencyStale before it falls due, as FlowFabric's
		// engine would have written it (its namespace and tag in the
		// event's own columns, which the tenant filter reads).
		dueMs := due(f.between(nowMs, -2000, 4000))
		b.Queue(`INSERT INTO ff_completion_event (partition_key, execution_id, flow_id, outcome, namespace, instance_tag,
		        occurred_at_ms, committed_at_ms)
		 VALUES ($1, $2, $3, $4, $5, $6, $7, $7)`, p, up, flow, outcome, Namespace, InstanceTag, dueMs-DependencyStale.Milliseconds())
		c.Rows += 3 + 4 + 1 + 1
	case GrantExpiring:
		// As FlowFabric's scheduler leaves it: the execution pending its
		// claim (the only column it writes), the grant's id a 32-byte
		// digest.
		id := f.uuid()
		f.exec(b, execRow{p: p, id: id, phase: "runnable", ownership: "unowned", eligibility: "pending_claim",
			public: "waiting", attempt: "pending_first_attempt", nowMs: nowMs})
		b.Queue(`INSERT INTO ff_claim_grant (partition_key, grant_id, execution_id, kind, worker_id, worker_instance_id,
		        worker_capabilities, grant_ttl_ms, issued_at_ms, expires_at_ms)
		 VALUES ($1, decode(md5($2) || md5($3), 'hex'), $4, 'claim', 'demo-worker', 'demo-worker-1', '[]'::jsonb,
		        5000, $5::bigint - 5000, $5::bigint)`,
			p, f.uuid(), f.uuid(), id, due(f.between(nowMs, -2000, 4000)))
		c.Rows += 2
	case AdmissionExpiring:
		// check_admission's rows for two admissions: the policy's counter,
		// each admission (the execution's wire id) and its window row.
		qp, policy := int16(f.rng.IntN(DemoBudgetPartitions)), "demo-quota-"+f.uuid()
		b.Queue(`INSERT INTO ff_quota_policy (partition_key, quota_policy_id, requests_per_window_seconds, max_requests_per_window,
		        active_concurrency_cap, active_concurrency, created_at_ms, updated_at_ms)
		 VALUES ($1, $2, 60, 100, 2, 2, $3, $3)`, qp, policy, nowMs-120_000)
		expires := due(f.between(nowMs, -2000, 4000))
		for range 2 {
			exec := fmt.Sprintf("{fp:%d}:%s", p, f.uuid())
			b.Queue(`INSERT INTO ff_quota_admitted (partition_key, quota_policy_id, execution_id, admitted_at_ms, expires_at_ms)
			 VALUES ($1, $2, $3, $4::bigint - 60000, $4::bigint)`, qp, policy, exec, expires)
			b.Queue(`INSERT INTO ff_quota_window (partition_key, quota_policy_id, dimension, admitted_at_ms, execution_id)
			 VALUES ($1, $2, '', $3, $4)`, qp, policy, expires-60_000, exec)
		}
		c.Rows += 5
	case DedupExpiring:
		b.Queue(`INSERT INTO ff_budget_usage_dedup (partition_key, dedup_key, outcome_json, applied_at_ms, expires_at_ms)
		 VALUES ($1, $2, '{"outcome": "applied"}'::jsonb, $3::bigint - 86400000, $3::bigint)`,
			int16(f.rng.IntN(DemoBudgetPartitions)), "demo-usage-"+f.uuid(), due(f.between(nowMs, -2000, 4000)))
		c.Rows++
	case CancelBacklog:
		flow, member := f.uuid(), f.uuid()
		requested := due(f.between(nowMs, -2000, 4000)) - CancelBacklogGrace.Milliseconds()
		b.Queue(`INSERT INTO ff_flow_core (partition_key, flow_id, public_flow_state, created_at_ms, terminal_at_ms, raw_fields)
		 VALUES ($1, $2, 'cancelled', $3, $4, jsonb_build_object('cancellation_policy', 'cancel_flow_only', 'cancel_reason', 'demo cancel'))`,
			p, flow, nowMs-120_000, requested)
		f.exec(b, execRow{p: p, id: member, flow: flow, phase: "runnable", ownership: "unowned", eligibility: "eligible_now",
			public: "waiting", attempt: "pending_first_attempt", nowMs: nowMs})
		b.Queue(`INSERT INTO ff_cancel_backlog (partition_key, flow_id, requested_at_ms, requester, reason, cancellation_policy, status)
		 VALUES ($1, $2, $3, '', 'demo cancel', 'cancel_flow_only', 'pending')`, p, flow, requested)
		b.Queue(`INSERT INTO ff_cancel_backlog_member (partition_key, flow_id, execution_id) VALUES ($1, $2, $3)`,
			p, flow, fmt.Sprintf("{fp:%d}:%s", p, member))
		c.Rows += 4
	case WorkerStale:
		// Partitioned as FlowFabric does: FNV-1a of the instance id.
		inst := "demo-worker-" + f.uuid()[:8]
		h := fnv.New64a()
		h.Write([]byte(inst))
		const ttl = 15_000
		b.Queue(`INSERT INTO ff_worker_registry (partition_key, namespace, worker_instance_id, worker_id, lanes,
		        capabilities_csv, last_heartbeat_ms, liveness_ttl_ms, registered_at_ms)
		 VALUES ($1, $2, $3, 'demo-worker', '{default}', 'gpu,llm', $4, $5, $6)`,
			int16(h.Sum64()%256), Namespace, inst, due(f.between(nowMs, -2000, 4000))-ttl, ttl, nowMs-300_000)
		c.Rows++
	}
}

type execRow struct {
	p                                              int16
	id, flow                                       string
	phase, ownership, eligibility, public, attempt string
	deadlineMs, startedMs, terminalMs              int64 // 0: NULL
	nowMs                                          int64
	policy                                         string // JSON; "": NULL
}

func nullMs(v int64) any {
	if v == 0 {
		return nil
	}
	return v
}

func (f *Feeder) exec(b *pgx.Batch, e execRow) {
	raw, _ := json.Marshal(map[string]any{
		"namespace":        Namespace,
		"tags":             map[string]string{InstanceTagKey: InstanceTag},
		"last_mutation_at": fmt.Sprint(e.nowMs),
	})
	var flow any
	if e.flow != "" {
		flow = e.flow
	}
	var policy any
	if e.policy != "" {
		policy = e.policy
	}
	lane := []string{"default", "batch", "interactive"}[f.rng.IntN(3)]
	b.Queue(`INSERT INTO ff_exec_core (partition_key, execution_id, flow_id, lane_id, lifecycle_phase, ownership_state,
	        eligibility_state, public_state, attempt_state, created_at_ms, deadline_at_ms, started_at_ms, terminal_at_ms, raw_fields,
	        policy)
	 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14::jsonb, $15::jsonb)`,
		e.p, e.id, flow, lane, e.phase, e.ownership, e.eligibility, e.public, e.attempt,
		e.nowMs-120_000, nullMs(e.deadlineMs), nullMs(e.startedMs), nullMs(e.terminalMs), string(raw), policy)
}

func (f *Feeder) edgeGroup(b *pgx.Batch, p int16, flow, downstream string, flag bool, members []string, running int) {
	if members == nil {
		members = []string{}
	}
	b.Queue(`INSERT INTO ff_edge_group (partition_key, flow_id, downstream_eid, policy, k_target,
	        success_count, running_count, cancel_siblings_pending_flag, cancel_siblings_pending_members)
	 VALUES ($1, $2, $3, '{"kind": "any_of", "on_satisfied": "cancel_remaining"}'::jsonb, 1, 1, $4, $5, $6)`,
		p, flow, downstream, running, flag, members)
}

func (f *Feeder) pending(b *pgx.Batch, p int16, flow, downstream string, enqueuedMs int64) {
	b.Queue(`INSERT INTO ff_pending_cancel_groups (partition_key, flow_id, downstream_eid, enqueued_at_ms)
	 VALUES ($1, $2, $3, $4)`, p, flow, downstream, enqueuedMs)
}

// Run feeds about rate items per second, spread over the second, until ctx
// ends or duration passes (0: no limit), calling report once a second with
// what that second inserted. It returns what it inserted in all; ctx ending
// is a clean stop, not an error.
func Run(ctx context.Context, f *Feeder, rate int, duration time.Duration, report func(Counts)) (Counts, error) {
	if rate <= 0 {
		return Counts{}, fmt.Errorf("demo: rate %d must be positive", rate)
	}
	if duration > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, duration)
		defer cancel()
	}
	// Five slices a second keep the feed smooth; the quota is computed from
	// the elapsed time, so a slow insert is caught up, not lost.
	const slice = 200 * time.Millisecond
	start := time.Now()
	total := Counts{Behaviors: map[string]int{}}
	second := Counts{Behaviors: map[string]int{}}
	lastReport := start
	ticker := time.NewTicker(slice)
	defer ticker.Stop()
	for {
		now := time.Now()
		want := int(float64(rate) * now.Sub(start).Seconds())
		if want == 0 && total.Total() == 0 {
			want = 1 // something at once, not after the first slice
		}
		if n := want - total.Total(); n > 0 {
			c, err := f.Insert(ctx, n, now)
			if err != nil {
				if ctx.Err() != nil {
					break
				}
				return total, err
			}
			total.Add(c)
			second.Add(c)
		}
		if now.Sub(lastReport) >= time.Second {
			if report != nil {
				report(second)
			}
			second = Counts{Behaviors: map[string]int{}}
			lastReport = now
		}
		select {
		case <-ctx.Done():
		case <-ticker.C:
			continue
		}
		break
	}
	if report != nil && second.Total() > 0 {
		report(second)
	}
	return total, nil
}
