package demo

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// Every window of DeckSize consecutive items, wherever a batch starts, must
// hold every kind and every timeout behaviour: --once and each second at
// the default rate promise a bit of everything.
func TestEveryDeckWindowHasEverything(t *testing.T) {
	suspensions := 0
	for _, k := range deck {
		if k == Suspension {
			suspensions++
		}
	}
	if suspensions != len(Behaviors) {
		t.Fatalf("deck has %d suspensions; want one per behaviour (%d) so each deck cycles through all", suspensions, len(Behaviors))
	}
	if DefaultRate < DeckSize {
		t.Fatalf("DefaultRate %d is below DeckSize %d: a second would miss kinds", DefaultRate, DeckSize)
	}
	for start := range deck {
		var seen [numKinds]bool
		for i := range DeckSize {
			seen[deck[(start+i)%len(deck)]] = true
		}
		for k, ok := range seen {
			if !ok {
				t.Errorf("window starting at %d lacks %s", start, Kind(k))
			}
		}
	}
}

// failingDB is a Beginner whose transactions never start.
type failingDB struct{}

func (failingDB) Begin(context.Context) (pgx.Tx, error) { return nil, context.Canceled }

// TestFeederCountsAndDeadlines: two decks hold every kind twice and every
// timeout behaviour twice; without Malformed the behaviour FlowFabric does
// not define is written as fail and an orphaned pending row as a stale one
// instead (so the worker's log has no warnings a newcomer should not read). A regression deals a kind or a
// behaviour too few times, or writes malformed rows unasked.
func TestFeederCountsAndDeadlines(t *testing.T) {
	for _, malformed := range []bool{true, false} {
		t.Run(map[bool]string{true: "Malformed", false: "WellFormed"}[malformed], func(t *testing.T) {
			feederCountsAndDeadlines(t, malformed)
		})
	}
}

func feederCountsAndDeadlines(t *testing.T, malformed bool) {
	f := NewFeeder(failingDB{}, 1)
	f.Malformed = malformed
	now := time.UnixMilli(1_000_000_000)
	var c Counts
	c.Behaviors = map[string]int{}
	b := &pgx.Batch{}
	for range 2 * DeckSize {
		k := f.deal()
		f.add(b, k, now.UnixMilli(), &c)
		c.Items[k]++
	}
	if c.Total() != 2*DeckSize {
		t.Fatalf("total %d; want %d", c.Total(), 2*DeckSize)
	}
	for _, bh := range Behaviors {
		want := 2
		switch {
		case malformed:
		case bh == UnknownBehavior:
			want = 0
		case bh == "fail":
			want = 4
		}
		if c.Behaviors[bh] != want {
			t.Errorf("behaviour %q: %d suspensions; want %d", bh, c.Behaviors[bh], want)
		}
	}
	wantOrphans, wantStale := 2, 2
	if !malformed {
		wantOrphans, wantStale = 0, 4
	}
	if c.Items[OrphanPending] != wantOrphans || c.Items[StalePending] != wantStale {
		t.Errorf("%d orphaned and %d stale pending rows; want %d and %d", c.Items[OrphanPending], c.Items[StalePending], wantOrphans, wantStale)
	}
	// Deadlines fall within a few seconds of now, so a fleet acts soon.
	if d := c.LastDueMs - now.UnixMilli(); d <= 0 || d > 5000 {
		t.Errorf("last deadline %d ms after now; want within 5 s", d)
	}
	if b.Len() != c.Rows {
		t.Errorf("%d statements for %d rows; want one statement per row", b.Len(), c.Rows)
	}
	if _, err := f.Insert(context.Background(), 1, now); err == nil {
		t.Error("Insert with a failing Begin: want an error")
	}
}
