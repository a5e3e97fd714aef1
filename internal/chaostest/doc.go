// Package chaostest runs the fleet under faults and bad input.
//
// TestFleetChaos builds the real worker binary, runs three `worker run`
// processes against one database while a feeder keeps inserting due rows of
// every kind, kills workers (the leader among them) and every Postgres
// backend of the database, and then checks that every row was acted on
// exactly once. `make test` runs a short form (about 20 s of feed);
// `make test-fleet` runs the long form (FF_CHAOS_LONG=1, about 90 s of feed
// and a wait for River's rescuer). FF_CHAOS_REPORT names a file that
// receives the figures as JSON.
//
// TestBadInput runs a fleet against malformed rows next to good ones, and
// the real binary against bad configuration.
//
// The package has tests only; this file holds its documentation.
package chaostest
