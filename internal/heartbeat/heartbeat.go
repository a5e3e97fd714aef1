// Package heartbeat keeps a worker process's row in the heartbeat table
// (<river schema>.ffreconcile_worker) fresh, so `worker status` can list the
// processes of the fleet. River's open-source edition records only the
// elected leader; this fills the gap without touching River's tables.
package heartbeat

import (
	"context"
	"errors"
	"log/slog"
	"math/rand/v2"
	"os"
	"runtime/debug"
	"time"

	"github.com/flowfabric/ffreconcile/migrations"
	"github.com/flowfabric/ffreconcile/store"
)

const (
	// DefaultInterval is how often a process beats.
	DefaultInterval = 5 * time.Second
	// StaleAfter is the age after which a row is taken to belong to a
	// process that died without a clean stop, and is deleted by whichever
	// process beats next. It is far above DefaultInterval so that a process
	// stalled by a slow database is not dropped from the list.
	StaleAfter = 10 * time.Minute
	// cleanupLimit bounds the stale rows one beat deletes.
	cleanupLimit = 100
	// stopTimeout bounds the final delete on a clean stop, whose own
	// context has already ended.
	stopTimeout = 5 * time.Second
	// beatTimeout bounds one beat's statements.
	beatTimeout = 5 * time.Second
	// LiveFor is the age up to which a row counts as a live process when a
	// process registers (Register): three missed beats at DefaultInterval.
	LiveFor = 3 * DefaultInterval
)

// DB is what Register needs: *pgxpool.Pool satisfies it.
type DB interface {
	store.DB
	store.Beginner
}

// Config configures a process's heartbeat.
type Config struct {
	// Schema is River's schema, where the heartbeat table lives. Required.
	Schema string
	// ClientID is the process's River client ID. Required.
	ClientID string
	// ConnTag is the tag the process's connections carry in their
	// application_name (store.ConnTagged); empty when they may not carry
	// it (behind a pooler), and the process is then never judged by its
	// connections.
	ConnTag string
	// Shape is the process's fleet configuration as JSON (nil: none).
	Shape []byte
	// Accept, when set, approves the other live processes of the schema
	// (those that beat within LiveFor) before the process is recorded; an
	// error from it is returned by Register as is, with nothing recorded.
	Accept func(live []store.WorkerHeartbeat) error
	// TakeOver, when set, is called at a beat for each other process found
	// disconnected (store.DepartedWorkers): it died without a clean stop,
	// and TakeOver hands on what it held. Its row is deleted once TakeOver
	// returns without error (and without more to do), and kept for the
	// next beat otherwise. Without TakeOver such a row is left for a
	// process that takes over; stale rows are deleted either way.
	TakeOver func(ctx context.Context, w store.DepartedWorker) (more bool, err error)
	// Logger defaults to slog.Default().
	Logger *slog.Logger
}

// Process is a registered process's heartbeat (see Register).
type Process struct{ b *beater }

// Register records the process in the heartbeat table, once cfg.Accept
// (when set) has approved the other live processes of the schema (see
// store.RegisterWorkerHeartbeat), and returns the Process whose Run keeps
// the row fresh and looks after the rows of processes gone. When the row
// it replaces was a previous process of the same client ID that died
// without a clean stop, cfg.TakeOver (when set) takes over from it first.
//
// db is any pool; use one that a backlog of jobs cannot starve (River's
// pool rather than the reconcilers' work pool), or heartbeats of a busy
// process turn late. Its connections must carry cfg.ConnTag.
func Register(ctx context.Context, db DB, cfg Config) (*Process, error) {
	if err := migrations.ValidateSchemaName(cfg.Schema); err != nil {
		return nil, err
	}
	if cfg.ClientID == "" {
		return nil, errors.New("heartbeat: client ID is empty")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	accept := cfg.Accept
	if accept == nil {
		accept = func([]store.WorkerHeartbeat) error { return nil }
	}
	b := newBeater(db, cfg)
	started, previous, err := store.RegisterWorkerHeartbeat(ctx, db, cfg.Schema, b.row, LiveFor, accept)
	if err != nil {
		return nil, err
	}
	b.row.StartedAt = started
	if previous != nil && b.takeOver != nil {
		// A previous incarnation of this client ID died without a clean
		// stop; its row is now this process's, so no other process will
		// take over from it. Its jobs are the only ones running under the
		// ID, since this process has not started working yet.
		for range 10 {
			more, err := b.takeOver(ctx, *previous)
			if err != nil {
				b.logger.Warn("take over from this client ID's previous process, gone without a clean stop; "+
					"its jobs are left to River's rescuer", "client_id", cfg.ClientID, "error", err)
			}
			if err != nil || !more {
				break
			}
		}
	}
	return &Process{b: b}, nil
}

// Run beats every `every` (DefaultInterval when 0 or negative) until ctx
// ends, then deletes the process's row. Each beat also looks after up to a
// bounded number of rows of other processes gone (store.DepartedWorkers):
// a disconnected one is handed to Config.TakeOver, then deleted; a stale one
// (older than StaleAfter) is deleted. A failed beat is
// logged and retried at the next one: a database blip must not stop a
// worker, and a missing row only makes `worker status` show the process as
// absent.
func (p *Process) Run(ctx context.Context, every time.Duration) {
	if every <= 0 {
		every = DefaultInterval
	}
	p.b.loop(ctx, every)
}

func newBeater(db store.DB, cfg Config) *beater {
	hostname, err := os.Hostname()
	if err != nil || hostname == "" {
		hostname = "unknown"
	}
	return &beater{
		db: db, schema: cfg.Schema, logger: cfg.Logger, takeOver: cfg.TakeOver,
		row: store.WorkerHeartbeat{ClientID: cfg.ClientID, Hostname: hostname, PID: os.Getpid(), Version: Version(),
			Config: cfg.Shape, ConnTag: cfg.ConnTag},
	}
}

// loop beats every `every` until ctx ends, then deletes the row. The first
// beat comes after a random part of the interval: processes started
// together then beat apart, and one that dies is found at the next beat of
// any survivor, on average every/(survivors+1) later rather than every/2.
func (b *beater) loop(ctx context.Context, every time.Duration) {
	wait := time.NewTimer(rand.N(every) + 1)
	defer wait.Stop()
	for {
		select {
		case <-ctx.Done():
			b.stop()
			return
		case <-wait.C:
			wait.Reset(every)
			b.beat(ctx)
		}
	}
}

type beater struct {
	db       store.DB
	schema   string
	logger   *slog.Logger
	takeOver func(ctx context.Context, w store.DepartedWorker) (bool, error)
	row      store.WorkerHeartbeat // StartedAt is zero until the first successful beat
	// failures counts consecutive failed beats, to log the first of a run
	// and then about once a minute rather than every beat.
	failures int
	// beaten, set by tests only (export_test.go), is called after each beat
	// with its error: a test signal, so that tests wait for beats rather
	// than sleep for them.
	beaten func(err error)
}

// beat records the row and looks after those of processes gone. Its
// statements are not cancelled with ctx but bounded by beatTimeout: a
// statement cancelled client-side can still commit on the server after
// stop's delete, which would leave the row of a stopped process behind
// (seen under load).
func (b *beater) beat(ctx context.Context) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), beatTimeout)
	defer cancel()
	started, err := store.UpsertWorkerHeartbeat(ctx, b.db, b.schema, b.row)
	if err == nil {
		b.row.StartedAt = started
		err = b.sweep(ctx)
	}
	if err != nil {
		if b.failures%12 == 0 {
			b.logger.Warn("worker heartbeat failed; retrying", "client_id", b.row.ClientID, "error", err,
				"consecutive_failures", b.failures+1)
		}
		b.failures++
		b.signal(err)
		return
	}
	if b.failures > 0 {
		b.logger.Info("worker heartbeat recovered", "client_id", b.row.ClientID, "failed_beats", b.failures)
		b.failures = 0
	}
	b.signal(nil)
}

// signal calls the test hook, if any.
func (b *beater) signal(err error) {
	if b.beaten != nil {
		b.beaten(err)
	}
}

// sweep hands each disconnected process to takeOver and deletes the rows of
// those taken over and of stale ones. A takeover that fails keeps its row,
// so the next beat (of any process) tries again.
func (b *beater) sweep(ctx context.Context) error {
	gone, err := store.DepartedWorkers(ctx, b.db, b.schema, b.row.ClientID, b.row.ConnTag, StaleAfter, cleanupLimit)
	if err != nil {
		return err
	}
	stale := 0
	for _, w := range gone {
		switch {
		case w.Disconnected && b.takeOver != nil:
			more, err := b.takeOver(ctx, w)
			if err != nil {
				b.logger.Warn("take over from a worker process gone without a clean stop; retrying at the next beat",
					"client_id", w.ClientID, "error", err)
				continue
			}
			if more {
				continue
			}
		case w.Stale:
			stale++
		default:
			// Disconnected, and this process does not take over: the row
			// stays for a process that does, until it is stale.
			continue
		}
		if _, err := store.DeleteWorkerHeartbeat(ctx, b.db, b.schema, w.ClientID, w.StartedAt); err != nil {
			return err
		}
	}
	if stale > 0 {
		b.logger.Info("deleted heartbeats of workers gone without a clean stop", "rows", stale, "older_than", StaleAfter)
	}
	return nil
}

// stop deletes this process's row, so `worker status` stops listing it at
// once instead of after StaleAfter.
func (b *beater) stop() {
	if b.row.StartedAt.IsZero() {
		return // never recorded
	}
	ctx, cancel := context.WithTimeout(context.Background(), stopTimeout)
	defer cancel()
	if _, err := store.DeleteWorkerHeartbeat(ctx, b.db, b.schema, b.row.ClientID, b.row.StartedAt); err != nil {
		b.logger.Warn("delete worker heartbeat on stop", "client_id", b.row.ClientID, "error", err)
	}
}

// Version is the build's version as `worker status` shows it: the main
// module's version when built from a tagged module, else the VCS revision
// (with "+dirty" for a modified tree), else "".
func Version() string {
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return ""
	}
	if v := info.Main.Version; v != "" && v != "(devel)" {
		return v
	}
	var rev, dirty string
	for _, s := range info.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			if s.Value == "true" {
				dirty = "+dirty"
			}
		}
	}
	if len(rev) > 12 {
		rev = rev[:12]
	}
	if rev == "" {
		return ""
	}
	return rev + dirty
}
