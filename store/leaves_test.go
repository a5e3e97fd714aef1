package store

import (
	"regexp"
	"strings"
	"testing"
)

// TestLeavesRewriteEveryTable: every statement a dispatch runs, rewritten
// for a partition, reads and updates no parent table, inserts through the
// parents, and leaves its columns and other names alone (ff_edge is not a
// prefix match of ff_edge_group). A regression leaves a parent in a lane's
// statement, whose generic plan then locks all 256 children at every run,
// or inserts a skip event into a leaf, which has no identity column to
// number it (not-null violation).
func TestLeavesRewriteEveryTable(t *testing.T) {
	t.Parallel()
	lv := &Leaves{byTable: map[string]*[256]string{},
		ref: regexp.MustCompile(`(INSERT INTO )?\b(ff_completion_event|ff_edge|ff_edge_group|ff_exec_core|ff_pending_cancel_groups)\b`)}
	for _, table := range DispatchTables {
		var names [256]string
		for k := range names {
			names[k] = "leaf_of_" + strings.TrimPrefix(table, "ff_") + "_" + string(rune('a'+k%26))
		}
		lv.byTable[table] = &names
	}
	for _, sql := range []string{claimSQL, lockGroupSQL, lockGroupsSQL, hopPendingSQL, hopSatisfiedSQL, hopSatisfiedCancelSQL,
		hopImpossibleSQL, hopGroupSQL, eligibleSQL, decidedSQL} {
		got := lv.sql(sql, 3)
		// An insert's target stays the parent (its identity column).
		if lv.ref.MatchString(strings.ReplaceAll(got, "INSERT INTO ff_", "INSERT INTO ")) {
			t.Errorf("a parent table is left in %s", got)
		}
		if !strings.Contains(got, "leaf_of_") {
			t.Errorf("no leaf named in %s", got)
		}
		if strings.Count(got, "partition_key") != strings.Count(sql, "partition_key") {
			t.Errorf("columns rewritten in %s", got)
		}
		if again := lv.sql(sql, 3); again != got {
			t.Errorf("a second rewrite differs: %s", again)
		}
	}
	if got := lv.sql(hopGroupSQL, 3); !strings.Contains(got, "UPDATE leaf_of_edge_group_d SET") {
		t.Errorf("ff_edge_group of key 3 not rewritten to its own leaf: %s", got)
	}
	for _, sql := range []string{hopImpossibleSQL, decidedSQL} {
		if got := lv.sql(sql, 3); !strings.Contains(got, "INSERT INTO ff_completion_event (") {
			t.Errorf("a skip event's insert does not go through the parent, which numbers it: %s", got)
		}
	}
	if got := lv.sql(hopSatisfiedCancelSQL, 3); !strings.Contains(got, "INSERT INTO ff_pending_cancel_groups (") {
		t.Errorf("an insert's target rewritten: %s", got)
	}
	var none *Leaves
	if got := none.sql(claimSQL, 3); got != claimSQL {
		t.Error("no leaves rewrote a statement")
	}
	if got := lv.sql(claimSQL, 256); got != claimSQL {
		t.Error("a partition key out of range was rewritten")
	}
}
