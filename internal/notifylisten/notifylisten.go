// Package notifylisten acts on Postgres notifications whose payload is an
// id: it listens on a channel on a connection of its own, gathers the ids
// notified within a couple of milliseconds of each other and hands them to
// its caller in one batch (the dependency reconciler's wake-up on
// FlowFabric's ff_completion notification, see workers.Dependency).
//
// Notifications are a wake-up, not the record: one missed while the
// listening connection was down (or sent before the process started) is
// the caller's ticks' to find.
package notifylisten

import (
	"context"
	"errors"
	"log/slog"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Defaults of Config.
const (
	// DefaultGather: notifications arriving within this of the first are
	// handed over together (one lookup, one insert).
	DefaultGather = 2 * time.Millisecond
	// DefaultMaxBatch bounds one such batch.
	DefaultMaxBatch = 500
	// retryAfter is the pause before listening again after a failure.
	retryAfter = time.Second
)

// Config configures a Listener.
type Config struct {
	// Pool gives the listening connection (held for the listener's life).
	// Required.
	Pool *pgxpool.Pool
	// Channel is the notification channel. Required.
	Channel string
	// What names the notifications in logs, e.g. "completion
	// notifications".
	What string
	// Handle acts on the ids of a batch, on the listening connection (its
	// lookups need no other). An error is logged; the listener goes on.
	// Required.
	Handle func(ctx context.Context, conn *pgx.Conn, ids []int64) error
	// Gather and MaxBatch: see DefaultGather and DefaultMaxBatch.
	Gather   time.Duration
	MaxBatch int
	// Logger. Defaults to slog.Default().
	Logger *slog.Logger
	// Listening, when set, is called each time the connection listens (a
	// test signal: notifications before it reach nobody).
	Listening func()
}

// Listener hands the ids notified on its channel to its Handle.
type Listener struct{ cfg Config }

// New returns a Listener, or an error naming a missing setting.
func New(cfg Config) (*Listener, error) {
	if cfg.Pool == nil || cfg.Handle == nil || cfg.Channel == "" {
		return nil, errors.New("notifylisten: Config.Pool, Config.Channel and Config.Handle are required")
	}
	if cfg.What == "" {
		cfg.What = cfg.Channel + " notifications"
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
		l.cfg.Logger.Warn(l.cfg.What+": listening failed; what is notified meanwhile is left to the ticks",
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
	if _, err := pc.Exec(ctx, "LISTEN "+pgx.Identifier{l.cfg.Channel}.Sanitize()); err != nil {
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
		ids = l.appendID(ids, n.Payload)
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
			ids = l.appendID(ids, n.Payload)
		}
		if pc.IsClosed() {
			return errors.New("listening connection closed")
		}
		if len(ids) == 0 {
			continue
		}
		if err := l.cfg.Handle(ctx, pc, ids); err != nil {
			if pc.IsClosed() {
				return err
			}
			l.cfg.Logger.Warn(l.cfg.What+": handling failed; what was notified is left to the ticks", "ids", len(ids), "error", err)
		}
	}
}

// appendID appends the id a notification carries.
func (l *Listener) appendID(ids []int64, payload string) []int64 {
	id, err := strconv.ParseInt(payload, 10, 64)
	if err != nil {
		l.cfg.Logger.Warn(l.cfg.What+": a notification without an id; ignored", "payload", payload)
		return ids
	}
	return append(ids, id)
}
