package chaostest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/flowfabric/ffreconcile/internal/ffseed"
	"github.com/flowfabric/ffreconcile/store"
)

// testAppName marks the test's own connections, which the backend
// termination fault spares: the fault is aimed at the fleet, and a feeder
// insert whose commit is cut off could not tell whether it committed.
const testAppName = "ffchaos-test"

// openTestPool opens the test's pool. Custom plans keep each statement on
// the one partition it names: on Postgres 15 a generic plan locks all 256
// children at every execution, which the small lock table of the test
// server cannot afford next to a running fleet.
func openTestPool(ctx context.Context, dbURL string) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(dbURL)
	if err != nil {
		return nil, err
	}
	cfg.MaxConns = 4
	cfg.ConnConfig.RuntimeParams["application_name"] = testAppName
	cfg.ConnConfig.RuntimeParams["plan_cache_mode"] = "force_custom_plan"
	return pgxpool.NewWithConfig(ctx, cfg)
}

// retryShortOfLocks runs fn again (up to 5 times) when the server's lock
// table is full ("out of shared memory", SQLSTATE 53200): whole-table
// statements over 256 partitions need ~1,000–2,300 slots each and other
// tests share the server.
func retryShortOfLocks(ctx context.Context, fn func() error) error {
	var err error
	for i := range 5 {
		if err = fn(); err == nil {
			return nil
		}
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "53200" {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(time.Duration(i+1) * 500 * time.Millisecond):
		}
	}
	return err
}

// Timeout behaviours the feeder writes, in turn.
var feedBehaviors = []string{store.TimeoutFail, store.TimeoutCancel, store.TimeoutExpire, store.TimeoutAutoResume}

type leaseItem struct {
	p        int16
	id       string
	attempts int // attempts given an expiring lease: 1, or 2 after a re-lease
	at       time.Time
	tried    bool // a re-lease was attempted
}

type suspensionItem struct {
	p        int16
	id       string
	behavior string
	arms     int // timeouts it was given (auto-resume suspensions get re-armed)
	lastArm  time.Time
}

type delayedItem struct {
	p  int16
	id string
}

type groupItem struct {
	p                        int16
	flow, downstream, winner string
	siblings                 []string
}

// feeder plays FlowFabric: it keeps inserting due rows of the four kinds,
// and re-arms some rows the fleet already handled (a second lease on an
// execution whose first expired, another timeout on an auto-resumed
// suspension) so that exactly-once is checked per lease and per timeout,
// not just per row. The statements follow internal/demo's fixtures, but
// every row is due at insert or within a second, and the feeder keeps each
// row's key to check it afterwards.
type feeder struct {
	pool *pgxpool.Pool
	rng  *rand.Rand

	mu          sync.Mutex
	leases      []*leaseItem
	suspensions []*suspensionItem
	delayed     []*delayedItem
	groups      []*groupItem
	relet       int // second leases given
	rearmed     int // extra timeouts given
	lastDueMs   int64
	behavior    int
}

func newFeeder(pool *pgxpool.Pool, seed uint64) *feeder {
	return &feeder{pool: pool, rng: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))}
}

// perSlice is how many items of each kind one 250 ms slice inserts:
// about 12 leases, 12 suspensions, 8 delayed executions and 4 cancel groups
// (14 executions) a second.
var perSlice = struct{ leases, suspensions, delayed, groups int }{3, 3, 2, 1}

// run feeds until ctx ends. It returns the first error that retries did not
// cure.
func (f *feeder) run(ctx context.Context) error {
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	lastRearm := time.Now()
	for {
		if err := f.insertSlice(ctx); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		if time.Since(lastRearm) >= time.Second {
			lastRearm = time.Now()
			if err := f.rearm(ctx); err != nil {
				if ctx.Err() != nil {
					return nil
				}
				return err
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
	}
}

func (f *feeder) uuid() string {
	var b [16]byte
	for i := range b {
		b[i] = byte(f.rng.Uint32())
	}
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}

// soon is a deadline due at insert or within a second: [now-500ms, now+1s).
func (f *feeder) soon(nowMs int64) int64 {
	ms := nowMs - 500 + f.rng.Int64N(1500)
	f.lastDueMs = max(f.lastDueMs, ms)
	return ms
}

// slice is one batch of items, recorded only once committed.
type slice struct {
	leases      []*leaseItem
	suspensions []*suspensionItem
	delayed     []*delayedItem
	groups      []*groupItem
}

func (f *feeder) insertSlice(ctx context.Context) error {
	now := time.Now()
	nowMs := now.UnixMilli()
	b := &seedBatch{}
	var s slice
	f.mu.Lock()
	for range perSlice.leases {
		it := &leaseItem{p: f.partition(), id: f.uuid(), attempts: 1, at: now}
		queueExec(b, it.p, it.id, "", "active", "leased", "not_applicable", "running", "running_attempt", 0, nowMs)
		b.add(ffseed.Attempt{Partition: it.p, ExecutionID: it.id, WorkerID: "chaos-worker", WorkerInstanceID: "chaos-worker-i1",
			LeaseEpoch: 1, LeaseExpiresAtMs: ffseed.Ms(f.soon(nowMs)), StartedAtMs: ffseed.Ms(nowMs - 30_000)})
		s.leases = append(s.leases, it)
	}
	for range perSlice.suspensions {
		it := &suspensionItem{p: f.partition(), id: f.uuid(), behavior: feedBehaviors[f.behavior], arms: 1, lastArm: now}
		f.behavior = (f.behavior + 1) % len(feedBehaviors)
		queueExec(b, it.p, it.id, "", "suspended", "unowned", "not_applicable", "suspended", "attempt_interrupted", 0, nowMs)
		b.add(ffseed.Suspension{Partition: it.p, ExecutionID: it.id, SuspensionID: f.uuid(), SuspendedAtMs: nowMs - 60_000,
			TimeoutAtMs: ffseed.Ms(f.soon(nowMs)), ReasonCode: "waiting_for_signal",
			Condition: json.RawMessage(`{"kind": "signal", "name": "approval"}`), Behavior: ffseed.Str(it.behavior)})
		s.suspensions = append(s.suspensions, it)
	}
	for range perSlice.delayed {
		it := &delayedItem{p: f.partition(), id: f.uuid()}
		queueExec(b, it.p, it.id, "", "runnable", "unowned", "not_eligible_until_time", "delayed", "pending_retry_attempt", f.soon(nowMs), nowMs)
		s.delayed = append(s.delayed, it)
	}
	for range perSlice.groups {
		// An any_of(1) group whose first upstream just succeeded: the
		// winner is terminal, the other upstreams are live, and FlowFabric
		// raised the flag listing them for cancellation.
		g := &groupItem{p: f.partition(), flow: f.uuid(), downstream: f.uuid(), winner: f.uuid()}
		queueExec(b, g.p, g.winner, g.flow, "terminal", "unowned", "not_applicable", "completed", "attempt_terminal", 0, nowMs)
		for range 2 + f.rng.IntN(2) {
			id := f.uuid()
			g.siblings = append(g.siblings, id)
			queueExec(b, g.p, id, g.flow, "runnable", "unowned", "eligible_now", "waiting", "pending", 0, nowMs)
		}
		queueExec(b, g.p, g.downstream, g.flow, "runnable", "unowned", "blocked_by_dependencies", "waiting", "pending", 0, nowMs)
		b.add(ffseed.EdgeGroup{Partition: g.p, FlowID: g.flow, DownstreamEID: g.downstream,
			Policy: `{"kind": "any_of", "on_satisfied": "cancel_remaining"}`, KTarget: 1, Success: 1,
			Running: int32(len(g.siblings)), Flag: true, Members: g.siblings})
		b.add(ffseed.PendingCancel{Partition: g.p, FlowID: g.flow, DownstreamEID: g.downstream, EnqueuedAtMs: nowMs})
		s.groups = append(s.groups, g)
	}
	f.mu.Unlock()

	err := retryShortOfLocks(ctx, func() error {
		tx, err := f.pool.Begin(ctx)
		if err != nil {
			return err
		}
		defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // no-op after commit
		if err := b.send(ctx, tx); err != nil {
			return err
		}
		return tx.Commit(ctx)
	})
	if err != nil {
		return fmt.Errorf("feeder: insert slice: %w", err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.leases = append(f.leases, s.leases...)
	f.suspensions = append(f.suspensions, s.suspensions...)
	f.delayed = append(f.delayed, s.delayed...)
	f.groups = append(f.groups, s.groups...)
	return nil
}

func (f *feeder) partition() int16 { return int16(f.rng.IntN(256)) }

// seedBatch queues ff_* rows (ffseed) on one batch, keeping the first
// error for its sender.
type seedBatch struct {
	pgx.Batch
	err error
}

func (b *seedBatch) add(row ffseed.Row) {
	if b.err == nil {
		b.err = ffseed.Queue(&b.Batch, row)
	}
}

// send sends the batch on db, after the first error of its rows if any.
func (b *seedBatch) send(ctx context.Context, db interface {
	SendBatch(context.Context, *pgx.Batch) pgx.BatchResults
}) error {
	if b.err != nil {
		return b.err
	}
	return db.SendBatch(ctx, &b.Batch).Close()
}

func queueExec(b *seedBatch, p int16, id, flow, phase, ownership, eligibility, public, attempt string, deadlineMs, nowMs int64) {
	x := ffseed.Exec{Partition: p, ID: id, FlowID: flow, LifecyclePhase: phase, OwnershipState: ownership,
		EligibilityState: eligibility, PublicState: public, AttemptState: attempt, CreatedAtMs: nowMs - 120_000,
		RawFields: map[string]any{
			"namespace":        "chaos",
			"tags":             map[string]string{"cairn.instance_id": "chaos-1"},
			"last_mutation_at": fmt.Sprint(nowMs),
		}}
	if deadlineMs != 0 {
		x.DeadlineAtMs = ffseed.Ms(deadlineMs)
	}
	b.add(x)
}

// rearm gives a second lease to a few executions whose first one the fleet
// released (FlowFabric's reclaim: attempt 1 with its own lease, expiring
// at once), and another timeout to a few auto-resumed suspensions. Each is
// one conditional statement on one row, so a row the fleet has not handled
// yet is left as is and tried again later.
func (f *feeder) rearm(ctx context.Context) error {
	now := time.Now()
	f.mu.Lock()
	var leases []*leaseItem
	for _, l := range f.leases {
		if len(leases) == 3 {
			break
		}
		if !l.tried && now.Sub(l.at) > 3*time.Second && f.rng.IntN(4) == 0 {
			l.tried = true
			leases = append(leases, l)
		}
	}
	var susps []*suspensionItem
	for _, s := range f.suspensions {
		if len(susps) == 3 {
			break
		}
		if s.behavior == store.TimeoutAutoResume && s.arms < 3 && now.Sub(s.lastArm) > 3*time.Second {
			susps = append(susps, s)
		}
	}
	f.mu.Unlock()

	for _, l := range leases {
		nowMs := time.Now().UnixMilli()
		f.mu.Lock()
		due := f.soon(nowMs)
		f.mu.Unlock()
		relet := false
		err := retryShortOfLocks(ctx, func() error {
			tx, err := f.pool.Begin(ctx)
			if err != nil {
				return err
			}
			defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // no-op after commit
			tag, err := tx.Exec(ctx, `
				UPDATE ff_exec_core
				   SET lifecycle_phase = 'active', ownership_state = 'leased', eligibility_state = 'not_applicable',
				       public_state = 'running', attempt_state = 'running_attempt', attempt_index = 1
				 WHERE partition_key = $1 AND execution_id = $2
				   AND lifecycle_phase = 'runnable' AND attempt_state = 'attempt_interrupted'`, l.p, l.id)
			if err != nil || tag.RowsAffected() == 0 {
				return err
			}
			if err := ffseed.Insert(ctx, tx, ffseed.Attempt{Partition: l.p, ExecutionID: l.id, AttemptIndex: 1,
				WorkerID: "chaos-worker", WorkerInstanceID: "chaos-worker-i2", LeaseEpoch: 2, LeaseExpiresAtMs: ffseed.Ms(due),
				StartedAtMs: ffseed.Ms(nowMs - 1000)}); err != nil {
				return err
			}
			if err := tx.Commit(ctx); err != nil {
				return err
			}
			relet = true
			return nil
		})
		if err != nil {
			return fmt.Errorf("feeder: re-lease %d/%s: %w", l.p, l.id, err)
		}
		if relet {
			f.mu.Lock()
			l.attempts = 2
			f.relet++
			f.mu.Unlock()
		}
	}
	for _, s := range susps {
		f.mu.Lock()
		due := f.soon(time.Now().UnixMilli())
		f.mu.Unlock()
		var tag pgconn.CommandTag
		err := retryShortOfLocks(ctx, func() (err error) {
			tag, err = f.pool.Exec(ctx, `
				UPDATE ff_suspension_current SET timeout_at_ms = $3
				 WHERE partition_key = $1 AND execution_id = $2
				   AND timeout_at_ms IS NULL AND timeout_behavior = 'auto_resume_with_timeout_signal'`, s.p, s.id, due)
			return err
		})
		if err != nil {
			return fmt.Errorf("feeder: re-arm suspension %d/%s: %w", s.p, s.id, err)
		}
		f.mu.Lock()
		s.lastArm = time.Now()
		if tag.RowsAffected() == 1 {
			s.arms++
			f.rearmed++
		}
		f.mu.Unlock()
	}
	return nil
}

// lastDue is the latest deadline given: after it every row is due.
func (f *feeder) lastDue() time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return time.UnixMilli(f.lastDueMs)
}

// ---- verification ----

// dbState is every ff_* row the checks need, read with the fleet stopped:
// one whole-table statement per table, one after another.
type dbState struct {
	execs       map[string]execState // by execution id
	attempts    map[string]map[int32]attemptState
	suspensions map[string]suspensionState
	leaseEvents map[string]int            // "expired" events by execution id
	completions map[string]map[string]int // outcome counts by execution id
	edgeGroups  map[string]edgeState      // by flow/downstream
	pending     map[string]bool           // by flow/downstream
}

type execState struct {
	phase, ownership, eligibility, public, attempt string
	reason, by                                     *string
	deadline                                       *int64
	leaseExpiredStamped                            bool
}

type attemptState struct {
	expires *int64
	outcome *string
}

type suspensionState struct {
	timeout      *int64
	timeoutCount int // entries of member_map.__timeout__, -1 when not an array
}

type edgeState struct {
	flag    bool
	members []string
}

func readState(ctx context.Context, pool *pgxpool.Pool) (*dbState, error) {
	s := &dbState{execs: map[string]execState{}, attempts: map[string]map[int32]attemptState{},
		suspensions: map[string]suspensionState{}, leaseEvents: map[string]int{}, completions: map[string]map[string]int{},
		edgeGroups: map[string]edgeState{}, pending: map[string]bool{}}
	type read struct {
		sql  string
		scan func(pgx.Rows) error
	}
	reads := []read{
		{`SELECT execution_id::text, lifecycle_phase, ownership_state, eligibility_state, public_state, attempt_state,
		         cancellation_reason, cancelled_by, deadline_at_ms,
		         jsonb_typeof(raw_fields) = 'object' AND raw_fields ? 'lease_expired_at_ms'
		    FROM ff_exec_core`, func(r pgx.Rows) error {
			var id string
			var e execState
			if err := r.Scan(&id, &e.phase, &e.ownership, &e.eligibility, &e.public, &e.attempt, &e.reason, &e.by,
				&e.deadline, &e.leaseExpiredStamped); err != nil {
				return err
			}
			s.execs[id] = e
			return nil
		}},
		{`SELECT execution_id::text, attempt_index, lease_expires_at_ms, outcome FROM ff_attempt`, func(r pgx.Rows) error {
			var id string
			var n int32
			var a attemptState
			if err := r.Scan(&id, &n, &a.expires, &a.outcome); err != nil {
				return err
			}
			if s.attempts[id] == nil {
				s.attempts[id] = map[int32]attemptState{}
			}
			s.attempts[id][n] = a
			return nil
		}},
		{`SELECT execution_id::text, timeout_at_ms,
		         CASE WHEN jsonb_typeof(member_map->'__timeout__') = 'array' THEN jsonb_array_length(member_map->'__timeout__')
		              WHEN member_map ? '__timeout__' THEN -1 ELSE 0 END
		    FROM ff_suspension_current`, func(r pgx.Rows) error {
			var id string
			var su suspensionState
			if err := r.Scan(&id, &su.timeout, &su.timeoutCount); err != nil {
				return err
			}
			s.suspensions[id] = su
			return nil
		}},
		{`SELECT execution_id, count(*) FROM ff_lease_event WHERE event_type = 'expired' GROUP BY 1`, func(r pgx.Rows) error {
			var id string
			var n int
			if err := r.Scan(&id, &n); err != nil {
				return err
			}
			s.leaseEvents[id] = n
			return nil
		}},
		{`SELECT execution_id::text, outcome, count(*) FROM ff_completion_event GROUP BY 1, 2`, func(r pgx.Rows) error {
			var id, outcome string
			var n int
			if err := r.Scan(&id, &outcome, &n); err != nil {
				return err
			}
			if s.completions[id] == nil {
				s.completions[id] = map[string]int{}
			}
			s.completions[id][outcome] = n
			return nil
		}},
		{`SELECT flow_id::text, downstream_eid::text, cancel_siblings_pending_flag, cancel_siblings_pending_members
		    FROM ff_edge_group`, func(r pgx.Rows) error {
			var flow, down string
			var g edgeState
			if err := r.Scan(&flow, &down, &g.flag, &g.members); err != nil {
				return err
			}
			s.edgeGroups[flow+"/"+down] = g
			return nil
		}},
		{`SELECT flow_id::text, downstream_eid::text FROM ff_pending_cancel_groups`, func(r pgx.Rows) error {
			var flow, down string
			if err := r.Scan(&flow, &down); err != nil {
				return err
			}
			s.pending[flow+"/"+down] = true
			return nil
		}},
	}
	for _, rd := range reads {
		err := retryShortOfLocks(ctx, func() error {
			rows, err := pool.Query(ctx, rd.sql)
			if err != nil {
				return err
			}
			defer rows.Close()
			for rows.Next() {
				if err := rd.scan(rows); err != nil {
					return err
				}
			}
			return rows.Err()
		})
		if err != nil {
			return nil, fmt.Errorf("read state: %w", err)
		}
	}
	return s, nil
}

// kindResult is what the checks found for one kind of row.
type kindResult struct {
	Inserted    int `json:"inserted"`
	Rearmed     int `json:"rearmed,omitempty"` // second leases, extra timeouts
	Acted       int `json:"acted"`             // rows whose every due lease or timeout was acted on exactly once
	Lost        int `json:"lost"`
	Duplicates  int `json:"duplicates"`
	HalfApplied int `json:"half_applied"`
	Siblings    int `json:"siblings_cancelled,omitempty"`

	examples []string
}

func (k *kindResult) bad(counter *int, format string, a ...any) {
	*counter++
	if len(k.examples) < 8 {
		k.examples = append(k.examples, fmt.Sprintf(format, a...))
	}
}

// verify checks every row the feeder inserted against the final state.
func (f *feeder) verify(s *dbState) map[string]*kindResult {
	f.mu.Lock()
	defer f.mu.Unlock()
	res := map[string]*kindResult{
		"lease_expiry":       {Inserted: len(f.leases), Rearmed: f.relet},
		"suspension_timeout": {Inserted: len(f.suspensions), Rearmed: f.rearmed},
		"delayed_promotion":  {Inserted: len(f.delayed)},
		"cancel_dispatch":    {Inserted: len(f.groups)},
	}

	r := res["lease_expiry"]
	for _, l := range f.leases {
		ok := true
		released := 0
		for n := range int32(l.attempts) {
			a, found := s.attempts[l.id][n]
			switch {
			case !found:
				r.bad(&r.Lost, "lease %d/%s attempt %d: attempt row missing", l.p, l.id, n)
				ok = false
			case a.expires != nil:
				r.bad(&r.Lost, "lease %d/%s attempt %d: lease still set (%d)", l.p, l.id, n, *a.expires)
				ok = false
			case a.outcome == nil || *a.outcome != "lease_expired_reclaimable":
				r.bad(&r.HalfApplied, "lease %d/%s attempt %d: released without outcome (%v)", l.p, l.id, n, a.outcome)
				ok = false
			default:
				released++
			}
		}
		e := s.execs[l.id]
		if released > 0 && (e.phase != "runnable" || e.ownership != "unowned" || e.eligibility != "eligible_now" ||
			e.attempt != "attempt_interrupted" || !e.leaseExpiredStamped) {
			r.bad(&r.HalfApplied, "lease %d/%s: attempt released but execution %s/%s/%s/%s (stamped %v)",
				l.p, l.id, e.phase, e.ownership, e.eligibility, e.attempt, e.leaseExpiredStamped)
			ok = false
		}
		switch ev := s.leaseEvents[l.id]; {
		case ev > released:
			r.bad(&r.Duplicates, "lease %d/%s: %d expired events for %d released attempts", l.p, l.id, ev, released)
			ok = false
		case ev < released:
			r.bad(&r.HalfApplied, "lease %d/%s: %d expired events for %d released attempts", l.p, l.id, ev, released)
			ok = false
		}
		if ok {
			r.Acted++
		}
	}

	r = res["suspension_timeout"]
	for _, su := range f.suspensions {
		e, ev := s.execs[su.id], s.completions[su.id]
		events := 0
		for _, n := range ev {
			events += n
		}
		row, exists := s.suspensions[su.id]
		if su.behavior == store.TimeoutAutoResume {
			switch {
			case !exists:
				r.bad(&r.HalfApplied, "suspension %d/%s (auto-resume): row gone", su.p, su.id)
			case row.timeout != nil:
				r.bad(&r.Lost, "suspension %d/%s (auto-resume): timeout still set after %d signals of %d", su.p, su.id, row.timeoutCount, su.arms)
			case row.timeoutCount > su.arms:
				r.bad(&r.Duplicates, "suspension %d/%s (auto-resume): %d timeout signals for %d timeouts", su.p, su.id, row.timeoutCount, su.arms)
			case row.timeoutCount < su.arms:
				r.bad(&r.HalfApplied, "suspension %d/%s (auto-resume): timeout cleared with %d signals for %d timeouts", su.p, su.id, row.timeoutCount, su.arms)
			case e.phase != "suspended" || events != 0:
				r.bad(&r.HalfApplied, "suspension %d/%s (auto-resume): execution %s with %d completion events", su.p, su.id, e.phase, events)
			default:
				r.Acted++
			}
			continue
		}
		outcome := "expired"
		if su.behavior == store.TimeoutCancel {
			outcome = "cancelled"
		}
		terminal := e.phase == "terminal" && e.reason != nil && *e.reason == "suspension_timeout_"+su.behavior
		switch {
		case exists && !terminal && events == 0:
			r.bad(&r.Lost, "suspension %d/%s (%s): still suspended (timeout %v)", su.p, su.id, su.behavior, row.timeout)
		case exists:
			r.bad(&r.HalfApplied, "suspension %d/%s (%s): row kept but execution %s with %d events", su.p, su.id, su.behavior, e.phase, events)
		case !terminal:
			r.bad(&r.HalfApplied, "suspension %d/%s (%s): row deleted but execution %s (reason %v)", su.p, su.id, su.behavior, e.phase, e.reason)
		case events == 0:
			r.bad(&r.HalfApplied, "suspension %d/%s (%s): terminal without a completion event", su.p, su.id, su.behavior)
		case events > 1:
			r.bad(&r.Duplicates, "suspension %d/%s (%s): %d completion events %v", su.p, su.id, su.behavior, events, ev)
		case ev[outcome] != 1:
			r.bad(&r.HalfApplied, "suspension %d/%s (%s): completion event %v; want outcome %s", su.p, su.id, su.behavior, ev, outcome)
		default:
			r.Acted++
		}
	}

	r = res["delayed_promotion"]
	for _, d := range f.delayed {
		e := s.execs[d.id]
		switch {
		case e.eligibility == "eligible_now" && e.deadline == nil && e.phase == "runnable":
			r.Acted++
		case e.eligibility == "not_eligible_until_time":
			r.bad(&r.Lost, "delayed %d/%s: still delayed (deadline %v)", d.p, d.id, e.deadline)
		default:
			r.bad(&r.HalfApplied, "delayed %d/%s: %s/%s deadline %v", d.p, d.id, e.phase, e.eligibility, e.deadline)
		}
	}

	r = res["cancel_dispatch"]
	for _, g := range f.groups {
		key := g.flow + "/" + g.downstream
		eg := s.edgeGroups[key]
		cancelled := 0
		for _, id := range g.siblings {
			e := s.execs[id]
			if e.phase == "terminal" && e.public == "cancelled" && e.reason != nil && *e.reason == store.SiblingQuorumSatisfied &&
				e.by != nil && *e.by == "engine" {
				cancelled++
			}
		}
		w, down := s.execs[g.winner], s.execs[g.downstream]
		switch {
		case s.pending[key] && eg.flag && cancelled == 0:
			r.bad(&r.Lost, "group %d/%s: still pending", g.p, key)
		case s.pending[key] || eg.flag || len(eg.members) != 0:
			r.bad(&r.HalfApplied, "group %d/%s: pending %v, flag %v, members %v, %d of %d siblings cancelled",
				g.p, key, s.pending[key], eg.flag, eg.members, cancelled, len(g.siblings))
		case cancelled != len(g.siblings):
			r.bad(&r.HalfApplied, "group %d/%s: drained with %d of %d siblings cancelled", g.p, key, cancelled, len(g.siblings))
		case w.phase != "terminal" || w.public != "completed" || w.reason != nil || down.phase != "runnable":
			r.bad(&r.HalfApplied, "group %d/%s: winner %s/%s or downstream %s changed", g.p, key, w.phase, w.public, down.phase)
		default:
			r.Acted++
			r.Siblings += cancelled
		}
	}
	return res
}

// pinLease inserts a lease that expires in 1.5 s, tracks it, and locks its
// attempt row in tx: the row job that releases it will wait on the lock.
func (f *feeder) pinLease(ctx context.Context) (tx pgx.Tx, p int16, id string, err error) {
	now := time.Now()
	nowMs := now.UnixMilli()
	f.mu.Lock()
	it := &leaseItem{p: f.partition(), id: f.uuid(), attempts: 1, at: now, tried: true}
	f.mu.Unlock()
	b := &seedBatch{}
	queueExec(b, it.p, it.id, "", "active", "leased", "not_applicable", "running", "running_attempt", 0, nowMs)
	b.add(ffseed.Attempt{Partition: it.p, ExecutionID: it.id, WorkerID: "chaos-worker", WorkerInstanceID: "chaos-worker-pinned",
		LeaseEpoch: 1, LeaseExpiresAtMs: ffseed.Ms(nowMs + 1500), StartedAtMs: ffseed.Ms(nowMs - 30_000)})
	if err := b.send(ctx, f.pool); err != nil {
		return nil, 0, "", fmt.Errorf("pin lease: insert: %w", err)
	}
	f.mu.Lock()
	f.leases = append(f.leases, it)
	f.mu.Unlock()
	tx, err = f.pool.Begin(ctx)
	if err != nil {
		return nil, 0, "", fmt.Errorf("pin lease: %w", err)
	}
	if _, err := tx.Exec(ctx, `SELECT 1 FROM ff_attempt WHERE partition_key = $1 AND execution_id = $2 AND attempt_index = 0
		   FOR UPDATE`, it.p, it.id); err != nil {
		_ = tx.Rollback(ctx)
		return nil, 0, "", fmt.Errorf("pin lease: lock: %w", err)
	}
	return tx, it.p, it.id, nil
}

// spoil breaks three rows the fleet handled, one per kind of failure the
// checks look for: a second lease event, a delayed execution put back, a
// completion event removed. verify must then find exactly these.
func (f *feeder) spoil(ctx context.Context, pool *pgxpool.Pool) error {
	f.mu.Lock()
	l, d := f.leases[0], f.delayed[0]
	var su *suspensionItem
	for _, s := range f.suspensions {
		if s.behavior != store.TimeoutAutoResume {
			su = s
			break
		}
	}
	f.mu.Unlock()
	b := &seedBatch{}
	b.add(ffseed.LeaseEvent{ExecutionID: l.id, EventType: "expired", OccurredAtMs: 1, Partition: int32(l.p)})
	b.Queue(`UPDATE ff_exec_core SET eligibility_state = 'not_eligible_until_time', deadline_at_ms = 1
	 WHERE partition_key = $1 AND execution_id = $2`, d.p, d.id)
	b.Queue(`DELETE FROM ff_completion_event WHERE partition_key = $1 AND execution_id = $2`, su.p, su.id)
	return b.send(ctx, pool)
}
