// Package completionwake makes the fleet FlowFabric's primary dispatcher of
// completion events: it listens to the ff_completion notification
// FlowFabric's trigger sends at the commit of every ff_completion_event row
// (payload: the event id) and enqueues the event's dispatch at once, instead
// of waiting for the dependency reconciler's next tick.
//
// Notifications are a wake-up, not the record: one missed while the
// listening connection was down (or sent before the process started) leaves
// its event to the dependency reconciler's ticks, which with a stale
// threshold of 0 take every undispatched event. Every process of a fleet
// listens; their inserts of one event are unique among unfinished jobs, and
// a dispatch that finds the event claimed already changes nothing.
package completionwake

import (
	"context"
	"errors"
	"log/slog"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/flowfabric/ffreconcile/store"
)

// Channel is FlowFabric's completion notification channel
// (ff_notify_completion_event).
const Channel = "ff_completion"

// Defaults of Config.
const (
	// DefaultGather: notifications arriving within this of the first are
	// enqueued together (one lookup, one insert).
	DefaultGather = 2 * time.Millisecond
	// DefaultMaxBatch bounds one such batch.
	DefaultMaxBatch = 500
	// retryAfter is the pause before listening again after a failure.
	retryAfter = time.Second
)

// Config configures a Listener.
type Config struct {
	// Pool gives the listening connection (held for the listener's life)
	// and runs the lookups. Required.
	Pool *pgxpool.Pool
	// Enqueue inserts the dispatch jobs of undispatched events. Required.
	Enqueue func(ctx context.Context, events []store.EventKey) error
	// Filter: only events of this tenant are enqueued.
	Filter store.Filter
	// Gather and MaxBatch: see DefaultGather and DefaultMaxBatch.
	Gather   time.Duration
	MaxBatch int
	// Logger. Defaults to slog.Default().
	Logger *slog.Logger
	// Listening, when set, is called each time the connection listens (a
	// test signal: notifications before it reach nobody).
	Listening func()
}

// Listener enqueues the dispatch of each completion event notified.
type Listener struct{ cfg Config }

// New returns a Listener, or an error naming a missing setting.
func New(cfg Config) (*Listener, error) {
	if cfg.Pool == nil || cfg.Enqueue == nil {
		return nil, errors.New("completionwake: Config.Pool and Config.Enqueue are required")
	}
	if cfg.Gather <= 0 {
		cfg.Gather = DefaultGather
	}
	if cfg.MaxBatch <= 0 {
		cfg.MaxBatch = DefaultMaxBatch
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &Listener{cfg: cfg}, nil
}

// Run listens until ctx ends, listening again a second after any failure.
func (l *Listener) Run(ctx context.Context) {
	for ctx.Err() == nil {
		err := l.listen(ctx)
		if ctx.Err() != nil {
			return
		}
		l.cfg.Logger.Warn("completion notifications: listening failed; events committed meanwhile wait for the dependency tick",
			"error", err, "retry_in", retryAfter)
		select {
		case <-ctx.Done():
		case <-time.After(retryAfter):
		}
	}
}

func (l *Listener) listen(ctx context.Context) error {
	conn, err := l.cfg.Pool.Acquire(ctx)
	if err != nil {
		return err
	}
	// The connection keeps its LISTEN: it never goes back to the pool.
	pc := conn.Hijack()
	defer pc.Close(context.WithoutCancel(ctx))
	if _, err := pc.Exec(ctx, "LISTEN "+Channel); err != nil {
		return err
	}
	if l.cfg.Listening != nil {
		l.cfg.Listening()
	}
	for {
		n, err := pc.WaitForNotification(ctx)
		if err != nil {
			return err
		}
		ids := []int64{}
		ids = appendID(ids, n.Payload, l.cfg.Logger)
		// Gather what arrives right behind it.
		deadline := time.Now().Add(l.cfg.Gather)
		for len(ids) < l.cfg.MaxBatch {
			wctx, cancel := context.WithDeadline(ctx, deadline)
			n, err := pc.WaitForNotification(wctx)
			cancel()
			if err != nil {
				if ctx.Err() != nil {
					return err
				}
				if !errors.Is(err, context.DeadlineExceeded) && pc.IsClosed() {
					return err
				}
				break
			}
			ids = appendID(ids, n.Payload, l.cfg.Logger)
		}
		if pc.IsClosed() {
			return errors.New("listening connection closed")
		}
		if len(ids) == 0 {
			continue
		}
		keys, err := store.UndispatchedEvents(ctx, pc, ids, l.cfg.Filter)
		if err != nil {
			return err
		}
		if len(keys) == 0 {
			continue
		}
		if err := l.cfg.Enqueue(ctx, keys); err != nil {
			l.cfg.Logger.Warn("completion notifications: enqueue failed; the events wait for the dependency tick", "events", len(keys), "error", err)
		}
	}
}

// appendID appends the event id a notification carries.
func appendID(ids []int64, payload string, log *slog.Logger) []int64 {
	id, err := strconv.ParseInt(payload, 10, 64)
	if err != nil {
		log.Warn("completion notification without an event id; ignored", "payload", payload)
		return ids
	}
	return append(ids, id)
}
