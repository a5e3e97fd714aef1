package testdb

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"github.com/jackc/pgx/v5"
)

// Leftovers. Every test database is dropped when its test ends, or, with
// reuse (reuse.go), emptied and offered to a later test. Databases are named
// ffr_t_<pid>_<random>, and the first database a process creates drops
// those of processes no longer running (a test binary killed before its
// cleanups ran). Offered databases (ffr_f_*) left at the end of a run are
// dropped by scripts/test-postgres.sh stop.

var sweepOnce sync.Once

// newName names a test database after this process, so that a later
// process can tell its leftovers (see sweepDead).
func newName() string {
	return fmt.Sprintf("ffr_t_%d_%s", os.Getpid(), randomSuffix())
}

// sweepDead drops, once per process, the test databases of processes no
// longer running on this machine, left behind by a test binary that was
// killed. Databases someone is connected to are left alone.
func sweepDead(ctx context.Context, admin *pgx.Conn) {
	sweepOnce.Do(func() {
		rows, err := admin.Query(ctx, `SELECT datname FROM pg_database d WHERE starts_with(datname, 'ffr_t_')
			 AND NOT EXISTS (SELECT 1 FROM pg_stat_activity a WHERE a.datname = d.datname)`)
		if err != nil {
			return
		}
		names, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return
		}
		for _, name := range names {
			if pidAlive(name) {
				continue
			}
			_, _ = admin.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize())
		}
	})
}

// pidAlive reports whether the process that named a test database
// ffr_t_<pid>_<random> is still running; a name of another form (an older
// version's) counts as dead.
func pidAlive(name string) bool {
	rest, ok := strings.CutPrefix(name, "ffr_t_")
	if !ok {
		return false
	}
	pidText, _, ok := strings.Cut(rest, "_")
	if !ok {
		return false
	}
	pid, err := strconv.Atoi(pidText)
	if err != nil || pid <= 0 {
		return false
	}
	err = syscall.Kill(pid, 0)
	return err == nil || err == syscall.EPERM
}
