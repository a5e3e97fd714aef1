package leasehistory

import (
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
)

// cursorPrefix is FlowFabric's POSTGRES_CURSOR_PREFIX: it marks a cursor as a
// Postgres event id (Valkey cursors use other prefixes).
const cursorPrefix = 0x02

// cursorLen is the prefix byte plus a big-endian int64 event id.
const cursorLen = 9

// ErrMalformedCursor is wrapped by every cursor decoding error.
var ErrMalformedCursor = errors.New("malformed lease history cursor")

// Cursor is a position in the lease history: byte 0x02 followed by an
// event_id as a big-endian int64, byte for byte the cursor FlowFabric's
// Postgres backend hands out, so cursors can be exchanged with it.
//
// Its one text form (String, ParseCursor, and JSON via MarshalText) is the
// lowercase hex of the 9 bytes, e.g. "02000000000000002a" for event 42. A
// subscription resumed from a cursor delivers the events strictly after it.
//
// The empty (nil) Cursor means "from now" when given to Subscribe; it has
// the empty string as text form.
type Cursor []byte

// EncodeCursor returns the cursor positioned just after eventID. Event ids
// are never negative; EncodeCursor(0) is the beginning of the history.
func EncodeCursor(eventID int64) Cursor {
	c := make(Cursor, cursorLen)
	c[0] = cursorPrefix
	binary.BigEndian.PutUint64(c[1:], uint64(eventID))
	return c
}

// DecodeCursor checks that b is a well-formed cursor and returns its event
// id. The error wraps ErrMalformedCursor and names the problem: empty, wrong
// length, wrong prefix or negative event id.
func DecodeCursor(b []byte) (int64, error) {
	switch {
	case len(b) == 0:
		return 0, fmt.Errorf("%w: empty", ErrMalformedCursor)
	case len(b) != cursorLen:
		return 0, fmt.Errorf("%w: %d bytes, want %d (0x02 then a big-endian int64 event id)",
			ErrMalformedCursor, len(b), cursorLen)
	case b[0] != cursorPrefix:
		return 0, fmt.Errorf("%w: prefix byte 0x%02x, want 0x02 (a FlowFabric Postgres event cursor)",
			ErrMalformedCursor, b[0])
	}
	id := int64(binary.BigEndian.Uint64(b[1:]))
	if id < 0 {
		return 0, fmt.Errorf("%w: negative event id %d", ErrMalformedCursor, id)
	}
	return id, nil
}

// ParseCursor parses the text form of a cursor (hex of its 9 bytes; upper
// case is accepted too). The empty string yields the empty Cursor.
func ParseCursor(s string) (Cursor, error) {
	if s == "" {
		return nil, nil
	}
	b, err := hex.DecodeString(s)
	if err != nil {
		return nil, fmt.Errorf("%w: %q is not hex (want 18 hex digits such as 02000000000000002a)",
			ErrMalformedCursor, s)
	}
	if _, err := DecodeCursor(b); err != nil {
		return nil, err
	}
	return Cursor(b), nil
}

// EventID returns the event id the cursor is positioned after. It fails for
// the empty cursor and for malformed ones.
func (c Cursor) EventID() (int64, error) { return DecodeCursor(c) }

// IsZero reports whether c is the empty cursor ("from now").
func (c Cursor) IsZero() bool { return len(c) == 0 }

// String returns the text form: lowercase hex, or "" for the empty cursor.
func (c Cursor) String() string { return hex.EncodeToString(c) }

// MarshalText implements encoding.TextMarshaler with the hex text form.
func (c Cursor) MarshalText() ([]byte, error) { return []byte(c.String()), nil }

// UnmarshalText implements encoding.TextUnmarshaler; it accepts what
// ParseCursor accepts.
func (c *Cursor) UnmarshalText(text []byte) error {
	parsed, err := ParseCursor(string(text))
	if err != nil {
		return err
	}
	*c = parsed
	return nil
}
