package leasehistory

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/flowfabric/ffreconcile/store"
)

// Defaults for zero Options fields.
const (
	DefaultPollInterval        = time.Second
	DefaultReconnectBackoff    = 250 * time.Millisecond
	DefaultReconnectBackoffMax = 5 * time.Second
	DefaultGapWait             = 5 * time.Second
)

const (
	// holdRecheck is how often a subscription stopped at a missing event id
	// looks again, notifications or not: the writer's commit may not be
	// followed by any insert, and a rollback sends no notification.
	holdRecheck = 30 * time.Millisecond
	// listenIdleRecheck bounds an idle LISTEN wait, so a quiet subscription
	// still touches its connection now and then.
	listenIdleRecheck = 30 * time.Second
)

// NumPartitions is the number of FlowFabric flow partitions (0..255).
const NumPartitions = 256

// Options configure a subscription. The zero value tails every partition
// from now over LISTEN/NOTIFY.
type Options struct {
	// Partitions to deliver. Defaults to all, 0..255.
	Partitions []int
	// Cursor to resume after; EncodeCursor(0) replays the whole history.
	// Defaults to now: the highest event id committed when Subscribe is
	// called.
	Cursor Cursor
	// Namespace, when set, delivers only events whose namespace column
	// equals it; rows with a NULL namespace never match.
	Namespace string
	// InstanceTag, when set, delivers only events whose instance_tag column
	// (the value of the cairn.instance_id tag) equals it; NULLs never match.
	InstanceTag string

	// Logger receives warnings (skipped rows, gaps passed by the bound,
	// reconnects). Defaults to slog.Default().
	Logger *slog.Logger

	// Poll reads on a timer instead of LISTEN, for connections through
	// transaction-mode poolers (PgBouncer) where LISTEN does not work.
	// Every query is then a single statement on a pooled connection.
	Poll bool
	// PollInterval is the poll period. Defaults to DefaultPollInterval.
	PollInterval time.Duration

	// ReconnectBackoff is the first wait after a failed connection or
	// query; it doubles on each further failure up to ReconnectBackoffMax.
	// Default to DefaultReconnectBackoff and DefaultReconnectBackoffMax.
	ReconnectBackoff    time.Duration
	ReconnectBackoffMax time.Duration

	// GapWait bounds how long delivery waits at a missing event id whose
	// writer cannot be shown to have ended (see the package
	// documentation). Defaults to DefaultGapWait.
	GapWait time.Duration

	// AcceptTrimmed: events after the cursor deleted by outbox retention
	// are reported with an EventTrimmed notice and the stream goes on,
	// instead of Subscribe (or the running subscription) failing with a
	// *TrimmedError. See "Across a trim" in docs/lease-history.md.
	AcceptTrimmed bool

	// StopWhenCaughtUp makes a bounded read: Subscribe notes the highest
	// committed event id, the subscription delivers everything up to it
	// and then ends (Events is closed, Err returns nil). It never listens,
	// and the first database error ends it (Err returns it).
	StopWhenCaughtUp bool

	// signals, set by tests only (export_test.go), reports what the reader
	// is doing, so tests wait for it rather than sleep.
	signals *testSignals
}

// testSignals are hooks a test sets to learn what the reader is doing (as
// River's maintenance services' TestSignals). Each is called on the
// subscription's goroutine; nil ones are skipped.
type testSignals struct {
	// holdListed: delivery is stopped at a missing event id and has listed
	// the running transactions it waits for (those that may still commit
	// the missing ids), after the read that found it.
	holdListed func(vxids []string)
}

// Subscription is a running subscription. Receive from Events until it is
// closed, then check Err.
type Subscription struct {
	events chan Event
	done   chan struct{}
	cancel context.CancelFunc
	r      *reader
	err    error // set before done is closed
}

// Events returns the channel events are delivered on, in event_id order.
// It is unbuffered, so an event has been received when the next one is
// read. It is closed when the subscription ends: its context is
// cancelled, Close is called, a bounded read is complete, or a bounded read
// fails.
func (s *Subscription) Events() <-chan Event { return s.events }

// Err returns why the subscription ended once Events is closed: nil after
// cancellation, Close or a completed bounded read.
func (s *Subscription) Err() error {
	<-s.done
	return s.err
}

// Cursor returns the subscription's position: every event up to it has been
// received from Events or was filtered out. It runs ahead of the last
// received Event.Cursor when trailing rows were filtered out, so after Events
// is closed it is the cursor to resume from. While events are still flowing,
// persist Event.Cursor instead, once each event is handled.
func (s *Subscription) Cursor() Cursor { return EncodeCursor(s.r.pos.Load()) }

// Close stops the subscription, waits for it to release its connection and
// returns Err.
func (s *Subscription) Close() error {
	s.cancel()
	return s.Err()
}

// leaseEventDB is the query surface the reader needs; *pgxpool.Pool and
// *pgx.Conn satisfy it.
type leaseEventDB interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	Exec(ctx context.Context, sql string, arguments ...any) (pgconn.CommandTag, error)
}

// Subscribe starts a subscription to the lease history. It validates opts
// (a malformed cursor is refused with an error wrapping ErrMalformedCursor)
// and, for an empty cursor, resolves "now" before returning, so every event
// committed after Subscribe returns is delivered.
//
// The subscription runs until ctx is cancelled or Close is called. Connection
// losses are not terminal: an EventDisconnected event is delivered, and the
// subscription reconnects with backoff and resumes after the last delivered
// event.
func Subscribe(ctx context.Context, pool *pgxpool.Pool, opts Options) (*Subscription, error) {
	if pool == nil {
		return nil, errors.New("leasehistory: nil pool")
	}
	f, err := newFilter(opts)
	if err != nil {
		return nil, err
	}
	o := opts
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	for _, d := range []struct {
		p   *time.Duration
		def time.Duration
	}{
		{&o.PollInterval, DefaultPollInterval},
		{&o.ReconnectBackoff, DefaultReconnectBackoff},
		{&o.ReconnectBackoffMax, DefaultReconnectBackoffMax},
		{&o.GapWait, DefaultGapWait},
	} {
		if *d.p < 0 {
			return nil, fmt.Errorf("leasehistory: negative duration option %v", *d.p)
		}
		if *d.p == 0 {
			*d.p = d.def
		}
	}
	o.ReconnectBackoffMax = max(o.ReconnectBackoffMax, o.ReconnectBackoff)

	r := &reader{filter: f, logger: o.Logger, gapWait: o.GapWait, now: time.Now, acceptTrimmed: o.AcceptTrimmed,
		signals: o.signals}
	if o.Cursor.IsZero() {
		maxID, err := store.MaxLeaseEventID(ctx, pool)
		if err != nil {
			return nil, fmt.Errorf("leasehistory: resolve start cursor: %w", err)
		}
		r.setCursor(maxID)
	} else {
		id, err := DecodeCursor(o.Cursor)
		if err != nil {
			return nil, fmt.Errorf("leasehistory: %w", err)
		}
		r.setCursor(id)
		// A cursor already behind a trim is refused here, synchronously;
		// with AcceptTrimmed the notice is the first event.
		if !o.AcceptTrimmed {
			if err := r.checkTrimmed(ctx, pool, nil); err != nil {
				return nil, err
			}
		}
	}
	if o.StopWhenCaughtUp {
		maxID, err := store.MaxLeaseEventID(ctx, pool)
		if err != nil {
			return nil, fmt.Errorf("leasehistory: resolve end of history: %w", err)
		}
		r.stopping, r.stopAt = true, maxID
	}

	runCtx, cancel := context.WithCancel(ctx)
	s := &Subscription{
		events: make(chan Event),
		done:   make(chan struct{}),
		cancel: cancel,
		r:      r,
	}
	go func() {
		defer close(s.done)
		defer close(s.events)
		defer cancel()
		s.err = s.run(runCtx, pool, &o)
	}()
	return s, nil
}

func newFilter(o Options) (filter, error) {
	f := filter{namespace: o.Namespace, instanceTag: o.InstanceTag}
	if len(o.Partitions) > 0 {
		f.partitions = new([256]bool)
		for _, p := range o.Partitions {
			if p < 0 || p >= NumPartitions {
				return filter{}, fmt.Errorf("leasehistory: partition %d out of range 0..%d", p, NumPartitions-1)
			}
			f.partitions[p] = true
		}
	}
	return f, nil
}

func (s *Subscription) run(ctx context.Context, pool *pgxpool.Pool, o *Options) error {
	emit := func(ev Event) error {
		select {
		case s.events <- ev:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	if o.StopWhenCaughtUp {
		return s.runBounded(ctx, pool, emit)
	}
	backoff := o.ReconnectBackoff
	for {
		var healthy bool
		var err error
		if o.Poll {
			healthy, err = s.pollSession(ctx, pool, o.PollInterval, emit)
		} else {
			healthy, err = s.listenSession(ctx, pool, emit)
		}
		if ctx.Err() != nil {
			return nil
		}
		var trimmed *TrimmedError
		if errors.As(err, &trimmed) {
			return trimmed
		}
		if healthy {
			backoff = o.ReconnectBackoff
		}
		cursor := s.Cursor()
		o.Logger.Warn("leasehistory: lost database connection; reconnecting",
			"error", err, "cursor", cursor.String(), "retry_in", backoff)
		if emit(Event{Type: EventDisconnected, Err: err, Cursor: cursor}) != nil {
			return nil
		}
		if !sleep(ctx, backoff) {
			return nil
		}
		backoff = min(2*backoff, o.ReconnectBackoffMax)
	}
}

// runBounded delivers up to stopAt and returns.
func (s *Subscription) runBounded(ctx context.Context, pool *pgxpool.Pool, emit func(Event) error) error {
	for {
		holding, err := s.r.pump(ctx, pool, emit)
		if ctx.Err() != nil {
			return nil
		}
		var trimmed *TrimmedError
		if errors.As(err, &trimmed) {
			return trimmed
		}
		if err != nil {
			return fmt.Errorf("leasehistory: %w", err)
		}
		if !holding {
			return nil
		}
		if !sleep(ctx, holdRecheck) {
			return nil
		}
	}
}

// pollSession reads on a timer until a query fails. healthy reports that at
// least one read succeeded (the backoff starts over).
func (s *Subscription) pollSession(ctx context.Context, pool *pgxpool.Pool, interval time.Duration, emit func(Event) error) (healthy bool, err error) {
	for {
		holding, err := s.r.pump(ctx, pool, emit)
		if err != nil {
			return healthy, err
		}
		healthy = true
		wait := interval
		if holding {
			wait = min(wait, holdRecheck)
		}
		if !sleep(ctx, wait) {
			return healthy, ctx.Err()
		}
	}
}

// listenSession takes a connection out of the pool, LISTENs, replays what it
// missed and then re-reads on every notification, until the connection
// fails. The connection is closed rather than returned to the pool so that
// no LISTEN outlives the subscription on a pooled connection.
func (s *Subscription) listenSession(ctx context.Context, pool *pgxpool.Pool, emit func(Event) error) (healthy bool, err error) {
	pc, err := pool.Acquire(ctx)
	if err != nil {
		return false, fmt.Errorf("acquire listener connection: %w", err)
	}
	conn := pc.Hijack()
	defer func() {
		closeCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
		defer cancel()
		_ = conn.Close(closeCtx)
	}()

	// LISTEN before the catch-up read, so a commit between the two still
	// wakes us.
	if err := store.ListenLeaseEvents(ctx, conn); err != nil {
		return false, err
	}
	healthy = true
	for {
		holding, err := s.r.pump(ctx, conn, emit)
		if err != nil {
			return healthy, err
		}
		wait := listenIdleRecheck
		if holding {
			wait = holdRecheck
		}
		if err := s.awaitNotification(ctx, conn, wait); err != nil {
			return healthy, err
		}
	}
}

// awaitNotification returns when a notification for an event after the
// cursor arrives or wait has passed; it fails when the connection does.
func (s *Subscription) awaitNotification(ctx context.Context, conn *pgx.Conn, wait time.Duration) error {
	waitCtx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	for {
		n, err := conn.WaitForNotification(waitCtx)
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if waitCtx.Err() != nil && !conn.IsClosed() {
				return nil // timed out; the connection is still usable
			}
			return fmt.Errorf("wait for notification: %w", err)
		}
		// The payload is the new event id. It is only a hint: a stale one
		// (already delivered) need not cost a query; anything else,
		// including a payload we cannot parse, triggers a read.
		if id, perr := strconv.ParseInt(n.Payload, 10, 64); perr == nil && id <= s.r.pos.Load() {
			continue
		}
		return nil
	}
}

// sleep waits d or until ctx is done; it reports whether d passed.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
