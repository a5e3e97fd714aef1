package workers

import (
	"sort"
	"sync"
	"sync/atomic"
)

// Counters are what one reconciler did in this process since it started.
type Counters struct {
	Ticks         atomic.Int64 // ticks run
	PartitionsDue atomic.Int64 // partitions found holding rows due (or due within the lookahead), summed over ticks
	// PartitionsBusy are due partitions a tick skipped because row jobs of
	// theirs were still queued.
	PartitionsBusy atomic.Int64
	// BusyRescans are busy partitions a tick scanned all the same because
	// they held more due rows than unfinished row jobs: rows no scan had
	// enqueued, which skipping would leave waiting until the queue drained.
	BusyRescans atomic.Int64
	// FollowUpScans are scans a tick enqueued for partitions whose scan had
	// already started (see the jobs package's "Follow-up scans").
	FollowUpScans atomic.Int64
	Scans         atomic.Int64 // partition scans run
	Continuations atomic.Int64 // scans that enqueued their own continuation
	Examined      atomic.Int64 // due rows read by scans
	Enqueued      atomic.Int64 // row jobs inserted
	// EnqueuedAhead are the row jobs among Enqueued inserted before their
	// row's deadline, to start at it.
	EnqueuedAhead atomic.Int64
	AlreadyQueued atomic.Int64 // row jobs skipped: an unfinished job for the row exists
	Applied       atomic.Int64 // row actions that changed the row
	NoOps         atomic.Int64 // row actions whose row no longer qualified (all reasons; see NoOp)
	Skipped       atomic.Int64 // rows skipped as malformed (with a warning)
	// Snoozes are row jobs that started before their row was due and
	// snoozed until it (clock skew, an ad-hoc promotion's "at").
	Snoozes atomic.Int64
	Errors  atomic.Int64 // ticks, scans or row actions that returned an error
	// DeadlockRetries are scan inserts run again at once after Postgres
	// chose them as a deadlock's victim.
	DeadlockRetries atomic.Int64

	// noOpsBy counts NoOps by reason.
	noOpsBy [numNoOpReasons]atomic.Int64
}

// NoOp counts a row action that changed nothing, and why.
func (c *Counters) NoOp(why NoOpReason) {
	c.NoOps.Add(1)
	c.noOpsBy[why].Add(1)
}

// NoOpReason says why a row action changed nothing, as far as its statement
// can tell: the one-statement actions re-check their row's whole condition
// in one WHERE clause and learn only that it no longer held.
type NoOpReason int

// No-op reasons.
const (
	// NoOpNoLongerDue: the row no longer qualified under its lock (a lease
	// renewed, a suspension resolved, a deadline moved, or the row deleted;
	// a one-statement action cannot tell which), or a concurrent change
	// got there first.
	NoOpNoLongerDue NoOpReason = iota
	// NoOpGone: the row was already deleted (a pending cancel group drained
	// by the other cancel reconciler, a promoted execution missing).
	NoOpGone
	// NoOpNotDueYet: the row is not due yet (an ad-hoc promotion whose
	// delay is later than its job).
	NoOpNotDueYet
	// NoOpLocked: another transaction held the row and it was skipped
	// (cancel_dispatch's SKIP LOCKED); the next tick offers it again.
	NoOpLocked
	// NoOpFlagClear: a pending cancel group whose flag is clear, left by
	// cancel_dispatch for cancel_reconcile to delete; offered again at
	// every dispatch tick until then.
	NoOpFlagClear
	// NoOpMembersLive: a pending cancel group with a live member, left by
	// cancel_reconcile for cancel_dispatch.
	NoOpMembersLive
	// NoOpLostRace: the row qualified in the statement's snapshot, but a
	// transaction that committed while the action waited for its lock
	// changed it (delayed_promotion, the one statement that tells this
	// apart: typically a concurrent promotion of the same execution).
	NoOpLostRace
	// NoOpNotSuspended: a suspension whose timeout lapsed belongs to an
	// execution no longer suspended (resumed by a signal, claimed again,
	// or ended): the execution was left untouched and the suspension's
	// timeout cleared, so it is not offered again (suspension_timeout).
	NoOpNotSuspended

	numNoOpReasons
)

var noOpReasonNames = [numNoOpReasons]string{"no_longer_due", "gone", "not_due_yet", "locked", "flag_clear", "members_live", "lost_race", "not_suspended"}

// String returns the reason's label value.
func (r NoOpReason) String() string {
	if r < 0 || r >= numNoOpReasons {
		return "unknown"
	}
	return noOpReasonNames[r]
}

// Snapshot is a copy of Counters for reporting.
type Snapshot struct {
	Ticks          int64 `json:"ticks"`
	PartitionsDue  int64 `json:"partitions_due"`
	PartitionsBusy int64 `json:"partitions_busy"`
	BusyRescans    int64 `json:"busy_rescans"`
	FollowUpScans  int64 `json:"follow_up_scans"`
	Scans          int64 `json:"scans"`
	Continuations  int64 `json:"continuations"`
	Examined       int64 `json:"examined"`
	Enqueued       int64 `json:"enqueued"`
	EnqueuedAhead  int64 `json:"enqueued_ahead"`
	AlreadyQueued  int64 `json:"already_queued"`
	Applied        int64 `json:"applied"`
	NoOps          int64 `json:"noops"`
	Skipped        int64 `json:"skipped"`
	Snoozes        int64 `json:"snoozes"`
	Errors         int64 `json:"errors"`
	// DeadlockRetries: see Counters.
	DeadlockRetries int64 `json:"deadlock_retries"`
	// NoOpsByReason splits NoOps by NoOpReason, by its String (reasons
	// without a no-op are left out).
	NoOpsByReason map[string]int64 `json:"noops_by_reason,omitempty"`
}

// Snapshot copies the counters.
func (c *Counters) Snapshot() Snapshot {
	var by map[string]int64
	for i := range c.noOpsBy {
		if n := c.noOpsBy[i].Load(); n > 0 {
			if by == nil {
				by = map[string]int64{}
			}
			by[NoOpReason(i).String()] = n
		}
	}
	return Snapshot{
		Ticks: c.Ticks.Load(), PartitionsDue: c.PartitionsDue.Load(), PartitionsBusy: c.PartitionsBusy.Load(), BusyRescans: c.BusyRescans.Load(), FollowUpScans: c.FollowUpScans.Load(), Scans: c.Scans.Load(),
		Continuations: c.Continuations.Load(), Examined: c.Examined.Load(), Enqueued: c.Enqueued.Load(), EnqueuedAhead: c.EnqueuedAhead.Load(),
		AlreadyQueued: c.AlreadyQueued.Load(), Applied: c.Applied.Load(), NoOps: c.NoOps.Load(),
		Skipped: c.Skipped.Load(), Snoozes: c.Snoozes.Load(), Errors: c.Errors.Load(), DeadlockRetries: c.DeadlockRetries.Load(),
		NoOpsByReason: by,
	}
}

// Stats holds the counters of every reconciler.
type Stats struct {
	mu sync.Mutex
	m  map[string]*Counters
}

// NewStats returns empty stats.
func NewStats() *Stats { return &Stats{m: map[string]*Counters{}} }

// For returns the counters of one reconciler, creating them on first use.
func (s *Stats) For(name string) *Counters {
	s.mu.Lock()
	defer s.mu.Unlock()
	c, ok := s.m[name]
	if !ok {
		c = &Counters{}
		s.m[name] = c
	}
	return c
}

// Snapshot copies every reconciler's counters, keyed by name.
func (s *Stats) Snapshot() map[string]Snapshot {
	s.mu.Lock()
	names := make([]string, 0, len(s.m))
	for n := range s.m {
		names = append(names, n)
	}
	s.mu.Unlock()
	sort.Strings(names)
	out := make(map[string]Snapshot, len(names))
	for _, n := range names {
		out[n] = s.For(n).Snapshot()
	}
	return out
}
