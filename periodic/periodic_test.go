package periodic_test

import (
	"slices"
	"testing"
	"time"

	"github.com/riverqueue/river"

	"github.com/flowfabric/ffreconcile/jobs"
	"github.com/flowfabric/ffreconcile/periodic"
)

// TestStartNow: a handoff inserts each tick as its periodic job would, with
// the same queue and uniqueness, plus the handoff's tag, and leaves the
// tick's own options alone. A regression either doubles ticks (uniqueness
// lost), or tags every later periodic insert of a tick with its own
// InsertOpts (the tag appended into a shared slice).
func TestStartNow(t *testing.T) {
	t.Parallel()
	own := &river.InsertOpts{Queue: "own", Tags: make([]string, 1, 4)}
	own.Tags[0] = "mine"
	ticks := []periodic.Tick{
		{Args: jobs.LeaseExpiryTickArgs{}, Interval: time.Second},
		{Args: jobs.OutboxTrimArgs{}, Interval: time.Minute, InsertOpts: own},
	}
	params := periodic.StartNow(ticks, "leader-takeover")
	if len(params) != 2 {
		t.Fatalf("%d params; want one per tick", len(params))
	}
	def := jobs.TickInsertOpts()
	if got := params[0].InsertOpts; got.Queue != def.Queue || got.MaxAttempts != def.MaxAttempts ||
		!slices.Equal(got.UniqueOpts.ByState, def.UniqueOpts.ByState) || !slices.Equal(got.Tags, []string{"leader-takeover"}) {
		t.Fatalf("default tick's opts %+v; want jobs.TickInsertOpts() tagged leader-takeover", got)
	}
	if params[0].Args.Kind() != ticks[0].Args.Kind() || params[1].Args.Kind() != ticks[1].Args.Kind() {
		t.Fatal("args not the ticks' own, in order")
	}
	if got := params[1].InsertOpts; got.Queue != "own" || !slices.Equal(got.Tags, []string{"mine", "leader-takeover"}) {
		t.Fatalf("own tick's opts %+v; want its own queue and tags plus leader-takeover", got)
	}
	if !slices.Equal(own.Tags, []string{"mine"}) || slices.Equal(own.Tags[:2], []string{"mine", "leader-takeover"}) {
		t.Fatalf("the tick's own tags were changed: %v (backing array %v)", own.Tags, own.Tags[:2])
	}
}
