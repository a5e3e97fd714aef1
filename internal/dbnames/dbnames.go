// Package dbnames holds the names of our own tables and the check of a River
// schema name: what both migrations (which creates them) and store (which
// reads and writes them) need. It imports nothing, so that store, and
// leasehistory, which other services import, do not pull in River's migrator
// with the migrations package.
package dbnames

import (
	"fmt"
	"regexp"
)

// WorkerTable is the table, in River's schema, where each worker process
// records its heartbeat. River's open-source edition keeps no table of live
// clients (only the elected leader, in river_leader), so `worker status`
// could not otherwise tell which processes are running.
const WorkerTable = "ffreconcile_worker"

// OutboxTrimTable is our table, next to FlowFabric's (the search path's
// schema), recording how far outbox retention has deleted each outbox: a
// lease-history consumer whose cursor is behind that point is told that
// events were deleted, instead of silently skipping them.
const OutboxTrimTable = "ffreconcile_outbox_trim"

// schemaNameRE: a schema name is interpolated into DDL and queries (it
// cannot be a parameter), so it is validated first; it matches River's own
// check for Config.Schema.
var schemaNameRE = regexp.MustCompile(`^[a-zA-Z_][a-zA-Z0-9_]{0,62}$`)

// ValidateSchemaName reports whether name is usable as River's schema.
func ValidateSchemaName(name string) error {
	if !schemaNameRE.MatchString(name) {
		return fmt.Errorf("invalid River schema name %q: use letters, digits and underscores, starting with a letter or underscore (at most 63 characters)", name)
	}
	return nil
}
