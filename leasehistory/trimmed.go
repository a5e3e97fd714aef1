package leasehistory

import (
	"context"
	"fmt"

	"github.com/flowfabric/ffreconcile/store"
)

// TrimmedError says that events after a subscription's cursor may have
// been deleted by outbox retention (`worker run --outbox-retention`): the
// cursor is below the highest event id the trim deleted. Subscribe returns
// it for a cursor already behind the trim; a running subscription ends with
// it (Err) when a trim overtakes it. Nothing has been skipped: resume from
// Resume() to go on knowingly, or subscribe with Options.AcceptTrimmed.
type TrimmedError struct {
	// Cursor is the subscription's position: events after it were wanted.
	Cursor int64
	// TrimmedThrough is the highest event id outbox retention deleted;
	// any event from Cursor+1 up to it may be gone.
	TrimmedThrough int64
}

func (e *TrimmedError) Error() string {
	return fmt.Sprintf("leasehistory: lease events %d..%d may have been deleted by outbox retention (the cursor is behind the trim); "+
		"resume from cursor %s to go on after them, or accept the gap (Options.AcceptTrimmed, --accept-trimmed)",
		e.Cursor+1, e.TrimmedThrough, e.Resume())
}

// Resume is the cursor just after the trimmed events.
func (e *TrimmedError) Resume() Cursor { return EncodeCursor(e.TrimmedThrough) }

// EventTrimmed is not a lease event: with Options.AcceptTrimmed it tells
// the consumer that the events after the previous event's cursor, through
// EventID, may have been deleted by outbox retention (Err is the
// *TrimmedError). The stream goes on with what is left.
const EventTrimmed EventType = "trimmed"

// checkTrimmed reports a trim ahead of the cursor: an error, or with
// accept a notice through emit, after which holes up to the trim's mark
// are passed at once.
func (r *reader) checkTrimmed(ctx context.Context, db leaseEventDB, emit func(Event) error) error {
	through, err := store.LeaseEventsTrimmedThrough(ctx, db)
	if err != nil {
		return err
	}
	if through <= r.cursor || through <= r.trimmedThrough {
		return nil
	}
	te := &TrimmedError{Cursor: r.cursor, TrimmedThrough: through}
	if !r.acceptTrimmed {
		return te
	}
	r.logger.Warn("leasehistory: events may have been deleted by outbox retention; going on with what is left",
		"from", te.Cursor+1, "through", through)
	r.trimmedThrough = through
	return emit(Event{Type: EventTrimmed, EventID: through, Cursor: EncodeCursor(r.cursor), Err: te})
}
