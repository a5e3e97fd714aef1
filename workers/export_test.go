package workers

import (
	"sync/atomic"
	"time"

	"github.com/riverqueue/river"

	"github.com/flowfabric/ffreconcile/store"
)

// RowJobOf is r's row job for a row of partition p as r's scans return it,
// as a scan would enqueue it; nil for a reconciler without row jobs
// (retention). Tests enqueue such jobs for rows a scan of theirs never
// would, e.g. another tenant's.
func RowJobOf(r *Reconciler, p int16, row store.DueRow) river.JobArgs {
	if r.rowJob == nil {
		return nil
	}
	return r.rowJob(p, row)
}

// StubClock has the set's ticks, scans and row jobs' waits for their
// deadlines read fn instead of time.Now (see deps.now and deps.rowNow); nil
// restores time.Now. Row actions keep the real clock.
func (s *Set) StubClock(fn func() time.Time) {
	s.StubScanClock(fn)
	stub(&s.d.rowClock, fn)
}

// StubScanClock is StubClock for the ticks and scans alone: row jobs wait
// for their deadlines by time.Now.
func (s *Set) StubScanClock(fn func() time.Time) { stub(&s.d.clock, fn) }

// stub sets clock's stub to fn (nil: none).
func stub(clock *atomic.Pointer[func() time.Time], fn func() time.Time) {
	if fn == nil {
		clock.Store(nil)
		return
	}
	clock.Store(&fn)
}

// JobDeadlineMs is jobDeadlineMs.
var JobDeadlineMs = jobDeadlineMs

// SetTickWait shortens how long a tick waits for the one running in its
// process (TickWait).
func (s *Set) SetTickWait(d time.Duration) { s.d.tickWait = d }

// RowWorker is r's row worker as s registers it, typed by its row args R,
// for a test that works one job with rivertest.Worker instead of a fleet.
// It panics when R is not r's row args.
func RowWorker[R river.JobArgs](s *Set, r *Reconciler) river.Worker[R] {
	return r.newRowWorker(s.d).(river.Worker[R])
}
