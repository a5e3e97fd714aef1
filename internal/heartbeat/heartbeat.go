// Package heartbeat keeps a worker process's row in the heartbeat table
// (<river schema>.ffreconcile_worker) fresh, so `worker status` can list the
// processes of the fleet. River's open-source edition records only the
// elected leader; this fills the gap without touching River's tables.
package heartbeat

import (
	"context"
	"errors"
	"log/slog"
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

// Process is a registered process's heartbeat (see Register).
type Process struct{ b *beater }

// Register records the process clientID in schema's heartbeat table with
// config, its fleet configuration as JSON, once accept (when not nil) has
// approved the other live processes of the schema (those that beat within
// LiveFor; see store.RegisterWorkerHeartbeat), and returns the Process
// whose Run keeps the row fresh. An error from accept is returned as is,
// with nothing recorded.
//
// db is any pool; use one that a backlog of jobs cannot starve (River's
// pool rather than the reconcilers' work pool), or heartbeats of a busy
// process turn late.
func Register(ctx context.Context, db DB, schema, clientID string, config []byte,
	accept func(live []store.WorkerHeartbeat) error, logger *slog.Logger) (*Process, error) {
	if err := migrations.ValidateSchemaName(schema); err != nil {
		return nil, err
	}
	if clientID == "" {
		return nil, errors.New("heartbeat: client ID is empty")
	}
	if logger == nil {
		logger = slog.Default()
	}
	if accept == nil {
		accept = func([]store.WorkerHeartbeat) error { return nil }
	}
	b := newBeater(db, schema, clientID, config, logger)
	started, err := store.RegisterWorkerHeartbeat(ctx, db, schema, b.row, LiveFor, accept)
	if err != nil {
		return nil, err
	}
	b.row.StartedAt = started
	return &Process{b: b}, nil
}

// Run beats every `every` (DefaultInterval when 0 or negative) until ctx
// ends, then deletes the process's row. Each beat also deletes up to a
// bounded number of stale rows (older than StaleAfter). A failed beat is
// logged and retried at the next one: a database blip must not stop a
// worker, and a missing row only makes `worker status` show the process as
// absent.
func (p *Process) Run(ctx context.Context, every time.Duration) {
	if every <= 0 {
		every = DefaultInterval
	}
	p.b.loop(ctx, every)
}

func newBeater(db store.DB, schema, clientID string, config []byte, logger *slog.Logger) *beater {
	hostname, err := os.Hostname()
	if err != nil || hostname == "" {
		hostname = "unknown"
	}
	return &beater{
		db: db, schema: schema, logger: logger,
		row: store.WorkerHeartbeat{ClientID: clientID, Hostname: hostname, PID: os.Getpid(), Version: Version(), Config: config},
	}
}

// loop beats every `every` until ctx ends, then deletes the row.
func (b *beater) loop(ctx context.Context, every time.Duration) {
	ticker := time.NewTicker(every)
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			b.stop()
			return
		case <-ticker.C:
			b.beat(ctx)
		}
	}
}

type beater struct {
	db     store.DB
	schema string
	logger *slog.Logger
	row    store.WorkerHeartbeat // StartedAt is zero until the first successful beat
	// failures counts consecutive failed beats, to log the first of a run
	// and then about once a minute rather than every beat.
	failures int
}

// beat records the row and trims stale ones. Its statements are not
// cancelled with ctx but bounded by beatTimeout: a statement cancelled
// client-side can still commit on the server after stop's delete, which
// would leave the row of a stopped process behind (seen under load).
func (b *beater) beat(ctx context.Context) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), beatTimeout)
	defer cancel()
	started, err := store.UpsertWorkerHeartbeat(ctx, b.db, b.schema, b.row)
	if err == nil {
		b.row.StartedAt = started
		var n int64
		n, err = store.DeleteStaleWorkerHeartbeats(ctx, b.db, b.schema, StaleAfter, cleanupLimit)
		if n > 0 {
			b.logger.Info("deleted heartbeats of workers gone without a clean stop", "rows", n, "older_than", StaleAfter)
		}
	}
	if err != nil {
		if b.failures%12 == 0 {
			b.logger.Warn("worker heartbeat failed; retrying", "client_id", b.row.ClientID, "error", err,
				"consecutive_failures", b.failures+1)
		}
		b.failures++
		return
	}
	if b.failures > 0 {
		b.logger.Info("worker heartbeat recovered", "client_id", b.row.ClientID, "failed_beats", b.failures)
		b.failures = 0
	}
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
