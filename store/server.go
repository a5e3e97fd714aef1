package store

import (
	"context"
	"fmt"
)

// ServerSettings are the server settings a fleet process checks when it
// starts and the benchmark records with its results.
type ServerSettings struct {
	// Version is server_version, e.g. "15.19 (Debian 15.19-0+deb12u1)".
	Version string
	// MaxLocksPerTransaction × MaxConnections is the size of the lock
	// table every session shares.
	MaxLocksPerTransaction, MaxConnections int
	// Autovacuum: the autovacuum launcher runs. Off, nothing reclaims the
	// space of River's deleted jobs or of the reconcilers' updated rows.
	Autovacuum bool
}

// ReadServerSettings reads the server's settings. Cost: three settings, no
// table.
func ReadServerSettings(ctx context.Context, db DB) (ServerSettings, error) {
	var s ServerSettings
	err := db.QueryRow(ctx, `
		SELECT current_setting('server_version'),
		       current_setting('max_locks_per_transaction')::int,
		       current_setting('max_connections')::int,
		       current_setting('autovacuum')::bool`).Scan(&s.Version, &s.MaxLocksPerTransaction, &s.MaxConnections, &s.Autovacuum)
	if err != nil {
		return s, fmt.Errorf("read server settings: %w", err)
	}
	return s, nil
}
