// Package demo feeds a realistic workload into the ff_* tables so that a
// fleet started with `make run` has something to reconcile and River UI and
// `worker status` have something to show: expiring leases, timing-out
// suspensions of every behaviour, delayed executions coming due, quorum
// edge groups with pending sibling cancels, executions reaching their
// deadline, expiring waitpoints, budgets due for a reset, worker
// registrations going stale and cancel backlogs past their grace, spread
// over all partitions.
//
// The rows are written with package ffseed rather than by package store on
// purpose. store holds the statements the reconcilers run against a
// production FlowFabric database; these rows play FlowFabric itself, written
// the way its engine would. They are fixtures, never written by the fleet,
// and keeping them out of store keeps store's contract (every statement is
// one a reconciler needs) true.
package demo

import (
	"context"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/flowfabric/ffreconcile/internal/ffseed"
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
		if err := f.add(b, k, nowMs, &c); err != nil {
			return Counts{}, fmt.Errorf("demo: %w", err)
		}
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

// add queues the rows of one item.
func (f *Feeder) add(b *pgx.Batch, k Kind, nowMs int64, c *Counts) error {
	p := f.partition()
	due := func(ms int64) int64 { c.LastDueMs = max(c.LastDueMs, ms); return ms }
	var rows []ffseed.Row
	switch k {
	case LeaseExpired, LeaseExpiring:
		expires := f.between(nowMs, -3000, 0)
		if k == LeaseExpiring {
			expires = f.between(nowMs, 1000, 5000)
		}
		id := f.uuid()
		var policy any
		if k == LeaseExpiring {
			policy = json.RawMessage(`{"retry_policy": {"max_retries": 2}}`)
		}
		rows = append(rows, f.exec(ffseed.Exec{Partition: p, ID: id, LifecyclePhase: "active", OwnershipState: "leased",
			EligibilityState: "not_applicable", PublicState: "running", AttemptState: "running_attempt",
			StartedAtMs: ffseed.Ms(nowMs - 30_000), Policy: policy}, nowMs),
			ffseed.Attempt{Partition: p, ExecutionID: id, WorkerID: fmt.Sprintf("demo-worker-%d", f.rng.IntN(8)),
				WorkerInstanceID: "demo-worker-i1", LeaseEpoch: 1, LeaseExpiresAtMs: ffseed.Ms(due(expires)),
				StartedAtMs: ffseed.Ms(nowMs - 30_000)})
	case Suspension:
		behavior := Behaviors[f.behavior]
		f.behavior = (f.behavior + 1) % len(Behaviors)
		if behavior == UnknownBehavior && !f.Malformed {
			behavior = "fail"
		}
		c.Behaviors[behavior]++
		var bh *string
		if behavior != "" {
			bh = &behavior
		}
		id := f.uuid()
		// Drawn in the order the rows are written, so that a seed deals
		// the same rows.
		e := f.exec(suspended(p, id, nowMs), nowMs)
		sid := f.uuid()
		rows = append(rows, e, suspension(p, id, sid, due(f.between(nowMs, -2000, 4000)), bh, nowMs))
	case Delayed:
		rows = append(rows, f.exec(ffseed.Exec{Partition: p, ID: f.uuid(), LifecyclePhase: "runnable", OwnershipState: "unowned",
			EligibilityState: "not_eligible_until_time", PublicState: "delayed", AttemptState: "pending_retry_attempt",
			DeadlineAtMs: ffseed.Ms(due(f.between(nowMs, -2000, 4000)))}, nowMs))
	case CancelGroup:
		// An any_of(1) group whose first upstream just succeeded: the
		// winner is terminal, the other upstreams are still live, and
		// FlowFabric has raised the flag listing them for cancellation.
		flow, downstream := f.uuid(), f.uuid()
		rows = append(rows, f.exec(ffseed.Exec{Partition: p, ID: f.uuid(), FlowID: flow, LifecyclePhase: "terminal",
			OwnershipState: "unowned", EligibilityState: "not_applicable", PublicState: "completed",
			AttemptState: "attempt_terminal", TerminalAtMs: ffseed.Ms(nowMs - 100)}, nowMs))
		siblings := make([]string, 2+f.rng.IntN(2))
		for i := range siblings {
			siblings[i] = f.uuid()
			rows = append(rows, f.exec(waiting(p, siblings[i], flow), nowMs))
		}
		rows = append(rows, f.exec(waiting(p, downstream, flow), nowMs),
			cancelGroup(p, flow, downstream, true, siblings),
			ffseed.PendingCancel{Partition: p, FlowID: flow, DownstreamEID: downstream, EnqueuedAtMs: due(nowMs)})
		c.Siblings += len(siblings)
	case OrphanPending, StalePending:
		// OrphanPending: a pending row left behind after its edge group was
		// removed. The downstream execution exists (cancelled with its
		// flow), so a tenant filter can place the row. StalePending: a flow
		// cancel wrote the pending row without raising the flag.
		flow, downstream := f.uuid(), f.uuid()
		rows = append(rows, f.exec(ffseed.Exec{Partition: p, ID: downstream, FlowID: flow, LifecyclePhase: "terminal",
			OwnershipState: "unowned", EligibilityState: "not_applicable", PublicState: "cancelled", AttemptState: "cancelled",
			TerminalAtMs: ffseed.Ms(nowMs - 1000)}, nowMs))
		if k == StalePending {
			rows = append(rows, cancelGroup(p, flow, downstream, false, nil))
		}
		rows = append(rows, ffseed.PendingCancel{Partition: p, FlowID: flow, DownstreamEID: downstream, EnqueuedAtMs: due(nowMs)})
	case DeadlinePassing:
		// Running, its lease renewed for minutes, but over its deadline.
		id := f.uuid()
		rows = append(rows, f.exec(ffseed.Exec{Partition: p, ID: id, LifecyclePhase: "active", OwnershipState: "leased",
			EligibilityState: "not_applicable", PublicState: "running", AttemptState: "running_attempt",
			StartedAtMs: ffseed.Ms(nowMs - 60_000), DeadlineAtMs: ffseed.Ms(due(f.between(nowMs, -2000, 4000)))}, nowMs),
			ffseed.Attempt{Partition: p, ExecutionID: id, WorkerID: "demo-worker-0", WorkerInstanceID: "demo-worker-i1",
				LeaseEpoch: 3, LeaseExpiresAtMs: ffseed.Ms(nowMs + 600_000), StartedAtMs: ffseed.Ms(nowMs - 60_000)})
	case WaitpointExpiring:
		id := f.uuid()
		fail := "fail"
		rows = append(rows, f.exec(suspended(p, id, nowMs), nowMs),
			suspension(p, id, f.uuid(), nowMs+WaitpointSuspensionTimeout.Milliseconds(), &fail, nowMs),
			ffseed.Waitpoint{Partition: p, ID: f.uuid(), ExecutionID: id, TokenKid: "demo-kid", Token: "demo-token",
				CreatedAtMs: nowMs - 60_000, ExpiresAtMs: ffseed.Ms(due(f.between(nowMs, -2000, 4000))), Key: "approval",
				State: "active", RequiredSignalNames: []string{"approval"}, ActivatedAtMs: ffseed.Ms(nowMs - 60_000)})
	case BudgetDue:
		bp := int16(f.rng.IntN(DemoBudgetPartitions))
		id := "demo-budget-" + f.uuid()[:8]
		interval := f.BudgetResetInterval
		if interval <= 0 {
			interval = DefaultBudgetResetInterval
		}
		rows = append(rows, ffseed.Budget{Partition: bp, ID: id,
			Policy:      map[string]int64{"hard_limit": 1000, "reset_interval_ms": interval.Milliseconds()},
			CreatedAtMs: nowMs - 60_000, UpdatedAtMs: nowMs - 60_000, ScopeType: "flow", ScopeID: f.uuid(),
			EnforcementMode: "hard", BreachCount: 1, LastBreachAtMs: ffseed.Ms(nowMs - 60_000), LastBreachDim: "tokens",
			NextResetAtMs: ffseed.Ms(due(f.between(nowMs, -2000, 4000)))})
		for _, dim := range []string{"tokens", "calls"} {
			rows = append(rows, ffseed.BudgetUsage{Partition: bp, BudgetID: id, Dimensions: dim,
				CurrentValue: 1 + f.rng.Int64N(1000), UpdatedAtMs: nowMs - 1000})
		}
	case FlowStep:
		flow, up, down, down2 := f.uuid(), f.uuid(), f.uuid(), f.uuid()
		outcome, public := "success", "completed"
		if f.flowFail {
			outcome, public = "failed", "failed"
			c.FlowsFailed++
		}
		f.flowFail = !f.flowFail
		rows = append(rows, f.exec(ffseed.Exec{Partition: p, ID: up, FlowID: flow, LifecyclePhase: "terminal",
			OwnershipState: "unowned", EligibilityState: "not_applicable", PublicState: public, AttemptState: "attempt_terminal",
			TerminalAtMs: ffseed.Ms(nowMs - 1000)}, nowMs))
		for _, d := range []struct{ id, on string }{{down, up}, {down2, down}} {
			rows = append(rows, f.exec(ffseed.Exec{Partition: p, ID: d.id, FlowID: flow, LifecyclePhase: "blocked",
				OwnershipState: "unowned", EligibilityState: "blocked_by_dependencies", PublicState: "waiting",
				AttemptState: "pending"}, nowMs),
				ffseed.Edge{Partition: p, FlowID: flow, EdgeID: f.uuid(), UpstreamEID: d.on, DownstreamEID: d.id, Policy: ffseed.AllOf},
				ffseed.EdgeGroup{Partition: p, FlowID: flow, DownstreamEID: d.id, Policy: ffseed.AllOf, KTarget: 1, Running: 1})
		}
		// The flow's own row, its tenant laid out as FlowFabric's
		// create_flow writes it (namespace, and the tag as a top-level
		// key): the flow summary projects it. Its completion event is
		// committed DependencyStale before it falls due, as FlowFabric's
		// engine would have written it (its namespace and tag in the
		// event's own columns, which the tenant filter reads).
		dueMs := due(f.between(nowMs, -2000, 4000))
		rows = append(rows, ffseed.FlowCore{Partition: p, FlowID: flow, CreatedAtMs: nowMs - 60_000,
			RawFields: map[string]string{"namespace": Namespace, InstanceTagKey: InstanceTag}},
			ffseed.CompletionEvent{Partition: p, ExecutionID: up, FlowID: flow, Outcome: outcome, Namespace: Namespace,
				InstanceTag: InstanceTag, OccurredAtMs: dueMs - DependencyStale.Milliseconds(),
				CommittedAtMs: dueMs - DependencyStale.Milliseconds()})
	case GrantExpiring:
		// As FlowFabric's scheduler leaves it: the execution pending its
		// claim (the only column it writes), the grant's id a 32-byte
		// digest.
		id := f.uuid()
		rows = append(rows, f.exec(ffseed.Exec{Partition: p, ID: id, LifecyclePhase: "runnable", OwnershipState: "unowned",
			EligibilityState: "pending_claim", PublicState: "waiting", AttemptState: "pending_first_attempt"}, nowMs),
			ffseed.ClaimGrant{Partition: p, ID: append(ffseed.MD5(f.uuid()), ffseed.MD5(f.uuid())...), ExecutionID: id,
				WorkerID: "demo-worker", WorkerInstanceID: "demo-worker-1", GrantTTLMs: 5000,
				ExpiresAtMs: due(f.between(nowMs, -2000, 4000))})
	case AdmissionExpiring:
		// check_admission's rows for two admissions: the policy's counter,
		// each admission (the execution's wire id) and its window row.
		qp, policy := int16(f.rng.IntN(DemoBudgetPartitions)), "demo-quota-"+f.uuid()
		rows = append(rows, ffseed.QuotaPolicy{Partition: qp, ID: policy, WindowSeconds: 60, MaxRequests: 100,
			ConcurrencyCap: 2, ActiveConcurrency: 2, CreatedAtMs: nowMs - 120_000, UpdatedAtMs: nowMs - 120_000})
		expires := due(f.between(nowMs, -2000, 4000))
		for range 2 {
			exec := ffseed.WireID(p, f.uuid())
			rows = append(rows, ffseed.QuotaAdmitted{Partition: qp, PolicyID: policy, ExecutionID: exec,
				AdmittedAtMs: expires - 60_000, ExpiresAtMs: expires},
				ffseed.QuotaWindow{Partition: qp, PolicyID: policy, AdmittedAtMs: expires - 60_000, ExecutionID: exec})
		}
	case DedupExpiring:
		dp, key := int16(f.rng.IntN(DemoBudgetPartitions)), "demo-usage-"+f.uuid()
		expires := due(f.between(nowMs, -2000, 4000))
		rows = append(rows, ffseed.BudgetDedup{Partition: dp, Key: key, AppliedAtMs: expires - 86_400_000, ExpiresAtMs: expires})
	case CancelBacklog:
		flow, member := f.uuid(), f.uuid()
		requested := due(f.between(nowMs, -2000, 4000)) - CancelBacklogGrace.Milliseconds()
		rows = append(rows, ffseed.FlowCore{Partition: p, FlowID: flow, State: "cancelled", CreatedAtMs: nowMs - 120_000,
			TerminalAtMs: ffseed.Ms(requested),
			RawFields:    map[string]string{"cancellation_policy": "cancel_flow_only", "cancel_reason": "demo cancel"}},
			f.exec(ffseed.Exec{Partition: p, ID: member, FlowID: flow, LifecyclePhase: "runnable", OwnershipState: "unowned",
				EligibilityState: "eligible_now", PublicState: "waiting", AttemptState: "pending_first_attempt"}, nowMs),
			ffseed.CancelBacklog{Partition: p, FlowID: flow, RequestedAtMs: requested, Reason: "demo cancel",
				Policy: "cancel_flow_only"},
			ffseed.CancelBacklogMember{Partition: p, FlowID: flow, ExecutionID: ffseed.WireID(p, member)})
	case WorkerStale:
		// Partitioned as FlowFabric does: FNV-1a of the instance id.
		inst := "demo-worker-" + f.uuid()[:8]
		h := fnv.New64a()
		h.Write([]byte(inst))
		const ttl = 15_000
		rows = append(rows, ffseed.WorkerRegistration{Partition: int16(h.Sum64() % 256), Namespace: Namespace, InstanceID: inst,
			WorkerID: "demo-worker", CapabilitiesCSV: "gpu,llm", LastHeartbeatMs: due(f.between(nowMs, -2000, 4000)) - ttl,
			TTLMs: ttl, RegisteredAtMs: nowMs - 300_000})
	}
	c.Rows += len(rows)
	return ffseed.QueueAll(b, rows...)
}

// exec returns e as the demo writes an execution: its tenant in raw_fields
// with its last mutation, a random lane, created two minutes ago.
func (f *Feeder) exec(e ffseed.Exec, nowMs int64) ffseed.Exec {
	e.RawFields = map[string]any{
		"namespace":        Namespace,
		"tags":             map[string]string{InstanceTagKey: InstanceTag},
		"last_mutation_at": fmt.Sprint(nowMs),
	}
	e.LaneID = []string{"default", "batch", "interactive"}[f.rng.IntN(3)]
	e.CreatedAtMs = nowMs - 120_000
	return e
}

// waiting is a live execution of flow, eligible and waiting.
func waiting(p int16, id, flow string) ffseed.Exec {
	return ffseed.Exec{Partition: p, ID: id, FlowID: flow, LifecyclePhase: "runnable", OwnershipState: "unowned",
		EligibilityState: "eligible_now", PublicState: "waiting", AttemptState: "pending"}
}

// suspended is an execution suspended a minute into its attempt.
func suspended(p int16, id string, nowMs int64) ffseed.Exec {
	return ffseed.Exec{Partition: p, ID: id, LifecyclePhase: "suspended", OwnershipState: "unowned",
		EligibilityState: "not_applicable", PublicState: "suspended", AttemptState: "attempt_interrupted",
		StartedAtMs: ffseed.Ms(nowMs - 60_000)}
}

// suspension is the suspension sid of execution id, waiting for the
// approval signal since a minute ago.
func suspension(p int16, id, sid string, timeoutMs int64, behavior *string, nowMs int64) ffseed.Suspension {
	return ffseed.Suspension{Partition: p, ExecutionID: id, SuspensionID: sid, SuspendedAtMs: nowMs - 60_000,
		TimeoutAtMs: ffseed.Ms(timeoutMs), ReasonCode: "waiting_for_signal",
		Condition: json.RawMessage(`{"kind": "signal", "name": "approval"}`), Behavior: behavior}
}

// cancelGroup is an any_of(1) group of downstream with one success, its
// flag and members as given, the members still running.
func cancelGroup(p int16, flow, downstream string, flag bool, members []string) ffseed.EdgeGroup {
	return ffseed.EdgeGroup{Partition: p, FlowID: flow, DownstreamEID: downstream, Policy: ffseed.AnyOfCancelRemaining,
		KTarget: 1, Success: 1, Running: int32(len(members)), Flag: flag, Members: members}
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
