package migrations

import (
	"regexp"
	"strings"
	"testing"
)

// TestFingerprintCoversAllTheDDL: the fingerprint tests name their template
// database after changes with any part of the DDL: a column, an index, a
// trigger of any table, the worker heartbeat or outbox trim table, the
// retention index, or the promote function. A fingerprint that
// missed one would let tests run on a template built from older DDL.
func TestFingerprintCoversAllTheDDL(t *testing.T) {
	t.Parallel()
	base := Fingerprint()
	if !regexp.MustCompile(`^[0-9a-f]{12}$`).MatchString(base) {
		t.Fatalf("Fingerprint = %q; want 12 hex digits", base)
	}
	all := ourDDL + objectsDDL()
	if fingerprint(ffTables, all) != base {
		t.Fatal("Fingerprint is not the fingerprint of this package's DDL")
	}
	changed := func(edit func(t *ffTable)) []ffTable {
		tables := make([]ffTable, len(ffTables))
		copy(tables, ffTables)
		last := tables[len(tables)-1]
		last.indexes = append([]string(nil), last.indexes...)
		last.post = append([]string(nil), last.post...)
		edit(&last)
		tables[len(tables)-1] = last
		return tables
	}
	tests := []struct {
		name   string
		tables []ffTable
		worker string
	}{
		{"Column", changed(func(t *ffTable) { t.columns += ",\n    extra text" }), all},
		{"Index", changed(func(t *ffTable) { t.indexes = append(t.indexes, "CREATE INDEX x ON y (z)") }), all},
		{"Trigger", changed(func(t *ffTable) { t.post = append(t.post, "CREATE TRIGGER x") }), all},
		{"Partitioning", changed(func(t *ffTable) { t.partitioned = !t.partitioned }), all},
		{"WorkerTable", ffTables, strings.Replace(all, "version      text", "version      varchar", 1)},
		{"WorkerTableConnTag", ffTables, strings.Replace(all, "conn_tag text", "conn_tag varchar", 1)},
		{"OutboxTrimTable", ffTables, strings.Replace(all, "trimmed_through bigint", "trimmed_through numeric", 1)},
		{"RetentionIndex", ffTables, strings.Replace(all, "lifecycle_phase IN ('terminal', 'cancelled')", "lifecycle_phase = 'ended'", 1)},
		{"CancelBacklogIndex", ffTables, strings.Replace(all, "(partition_key, requested_at_ms)", "(requested_at_ms)", 1)},
		{"PromoteFunction", ffTables, strings.Replace(all, "clock_timestamp()", "now()", 1)},
	}
	for _, tt := range tests {
		if tt.worker == all && (tt.name == "WorkerTable" || tt.name == "WorkerTableConnTag" || tt.name == "OutboxTrimTable" || tt.name == "RetentionIndex" || tt.name == "CancelBacklogIndex" || tt.name == "PromoteFunction") {
			t.Fatal("the worker table edit changed nothing: fix the test")
		}
		if got := fingerprint(tt.tables, tt.worker); got == base {
			t.Errorf("%s: a changed DDL keeps the fingerprint %s", tt.name, got)
		}
	}
}
