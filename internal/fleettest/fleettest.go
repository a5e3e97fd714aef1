// Package fleettest starts real fleet processes (River clients with the
// production configuration) against a test database.
package fleettest

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/flowfabric/ffreconcile/internal/fleet"
	"github.com/flowfabric/ffreconcile/internal/testdb"
	"github.com/flowfabric/ffreconcile/workers"
)

// Start builds and starts a fleet process on db with cfg (DatabaseURL and
// RiverSchema are filled in) and stops it when the test ends.
func Start(t testing.TB, db *testdb.DB, cfg fleet.Config) *fleet.Fleet {
	t.Helper()
	ctx := context.Background()
	cfg.DatabaseURL = db.URL
	cfg.RiverSchema = testdb.RiverSchema
	if cfg.Logger == nil {
		cfg.Logger = Logger(t)
	}
	f, err := fleet.New(ctx, cfg)
	if err != nil {
		t.Fatalf("fleet.New: %v", err)
	}
	if err := f.Start(ctx); err != nil {
		f.Close()
		t.Fatalf("fleet start: %v", err)
	}
	t.Cleanup(func() {
		stopCtx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		defer cancel()
		if err := f.Stop(stopCtx); err != nil {
			t.Logf("fleet stop: %v", err)
		}
		f.Close()
	})
	return f
}

// Logger logs warnings and errors through t (everything with
// FFTEST_VERBOSE=1), so failures show what the fleet said.
func Logger(t testing.TB) *slog.Logger {
	level := slog.LevelWarn
	if os.Getenv("FFTEST_VERBOSE") != "" {
		level = slog.LevelDebug
	}
	return slog.New(slog.NewTextHandler(tWriter{t}, &slog.HandlerOptions{Level: level}))
}

type tWriter struct{ t testing.TB }

func (w tWriter) Write(p []byte) (int, error) {
	defer func() { _ = recover() }() // a log line after the test ended
	w.t.Log(string(p[:len(p)-1]))
	return len(p), nil
}

var _ io.Writer = tWriter{}

// Patient is the wait for a condition that a quiet machine reaches within
// seconds: the parallel suite on a busy 2-core machine runs ticks and
// statements several times slower than alone, and a wait only bounds how
// long a failing test takes (a passing one returns as soon as its
// condition holds). Timeouts of 20-30 s failed a dozen tests per run on
// such a machine.
const Patient = 90 * time.Second

// WaitFor polls cond every 50 ms until it returns true, or fails the test
// with what cond last reported once it has waited timeout.
func WaitFor(t testing.TB, timeout time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		ok, status := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s (last: %s)", timeout, what, status)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// DefaultOn returns the reconcilers a fleet runs by default: all but
// those turned on by a setting (retention, outbox retention).
func DefaultOn() []*workers.Reconciler { return workers.DefaultOn(nil) }

// Fast is a tick configuration for tests: the shortest interval River
// allows (1 s) for the given reconcilers.
func Fast(reconcilers ...*workers.Reconciler) map[string]time.Duration {
	m := make(map[string]time.Duration, len(reconcilers))
	for _, r := range reconcilers {
		m[r.Name] = time.Second
	}
	return m
}

// Statusf formats a WaitFor status.
func Statusf(format string, a ...any) string { return fmt.Sprintf(format, a...) }
