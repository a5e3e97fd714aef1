package migrations

import (
	"crypto/sha256"
	"encoding/hex"
	"testing"
)

// promoteFunctionDigests pins the SQL of each PromoteFunctionVersion (in
// River's default schema; its comment included).
var promoteFunctionDigests = map[int]string{
	1: "f372312118ef60f9",
}

// TestPromoteFunctionVersionPinsItsSQL: the function's SQL changes only
// with its version. A change left at the same version would never reach a
// database already migrated (fleets check the version, not the body): the
// test fails until PromoteFunctionVersion is bumped and the new digest
// pinned here.
func TestPromoteFunctionVersionPinsItsSQL(t *testing.T) {
	t.Parallel()
	ddl, err := PromoteFunctionSQL("river")
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256([]byte(ddl))
	got := hex.EncodeToString(sum[:])[:16]
	want, ok := promoteFunctionDigests[PromoteFunctionVersion]
	if !ok || got != want {
		t.Fatalf("the promote function's SQL (digest %s) is not version %d's (%q): bump PromoteFunctionVersion and pin %s for it",
			got, PromoteFunctionVersion, want, got)
	}
}
