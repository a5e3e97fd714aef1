package leasehistory

import (
	"bytes"
	"encoding/json"
	"errors"
	"math"
	"strings"
	"testing"
)

func TestCursorByteLayout(t *testing.T) {
	t.Parallel()
	// FlowFabric: POSTGRES_CURSOR_PREFIX (0x02) + event_id as a big-endian i64.
	got := EncodeCursor(0x0102030405060708)
	want := []byte{0x02, 0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08}
	if !bytes.Equal(got, want) {
		t.Fatalf("EncodeCursor = % x; want % x", got, want)
	}
	if s := EncodeCursor(42).String(); s != "02000000000000002a" {
		t.Fatalf("EncodeCursor(42).String() = %q", s)
	}
}

func TestCursorRoundTrip(t *testing.T) {
	t.Parallel()
	for _, id := range []int64{0, 1, 42, 1 << 40, math.MaxInt64} {
		c := EncodeCursor(id)
		got, err := DecodeCursor(c)
		if err != nil || got != id {
			t.Errorf("DecodeCursor(EncodeCursor(%d)) = %d, %v", id, got, err)
		}
		parsed, err := ParseCursor(c.String())
		if err != nil || !bytes.Equal(parsed, c) {
			t.Errorf("ParseCursor(%q) = % x, %v", c.String(), parsed, err)
		}
		if got, err := c.EventID(); err != nil || got != id {
			t.Errorf("EventID = %d, %v", got, err)
		}

		// JSON uses the text form.
		b, err := json.Marshal(struct{ C Cursor }{c})
		if err != nil || string(b) != `{"C":"`+c.String()+`"}` {
			t.Errorf("json.Marshal = %s, %v", b, err)
		}
		var back struct{ C Cursor }
		if err := json.Unmarshal(b, &back); err != nil || !bytes.Equal(back.C, c) {
			t.Errorf("json.Unmarshal = % x, %v", back.C, err)
		}
	}
	if c, err := ParseCursor(""); err != nil || !c.IsZero() || c.String() != "" {
		t.Errorf(`ParseCursor("") = % x, %v; want the empty cursor`, c, err)
	}
	if c, err := ParseCursor("02000000000000002A"); err != nil || c.String() != "02000000000000002a" {
		t.Errorf("upper-case hex: %v, %v", c, err)
	}
}

func TestCursorMalformed(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, text, wantMsg string
	}{
		{"not hex", "zz", "is not hex"},
		{"odd length hex", "020", "is not hex"},
		{"too short", "0200", "2 bytes, want 9"},
		{"too long", "02000000000000002a00", "10 bytes, want 9"},
		{"wrong prefix", "01000000000000002a", "prefix byte 0x01, want 0x02"},
		{"negative id", "02ffffffffffffffff", "negative event id -1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ParseCursor(tt.text)
			if !errors.Is(err, ErrMalformedCursor) || !strings.Contains(err.Error(), tt.wantMsg) {
				t.Fatalf("ParseCursor(%q) = %v; want ErrMalformedCursor mentioning %q", tt.text, err, tt.wantMsg)
			}
		})
	}
	if _, err := DecodeCursor(nil); !errors.Is(err, ErrMalformedCursor) {
		t.Errorf("DecodeCursor(nil) = %v", err)
	}
}

// FuzzDecodeCursor checks that decoding never panics, that whatever decodes
// re-encodes to the same bytes, and that the text form round-trips.
func FuzzDecodeCursor(f *testing.F) {
	f.Add([]byte{0x02, 0, 0, 0, 0, 0, 0, 0, 42})
	f.Add([]byte{})
	f.Add([]byte{0x01, 0, 0, 0, 0, 0, 0, 0, 42})
	f.Fuzz(func(t *testing.T, b []byte) {
		id, err := DecodeCursor(b)
		if err != nil {
			if !errors.Is(err, ErrMalformedCursor) {
				t.Fatalf("error does not wrap ErrMalformedCursor: %v", err)
			}
			if _, perr := ParseCursor(Cursor(b).String()); perr == nil && len(b) > 0 {
				t.Fatalf("ParseCursor accepted % x that DecodeCursor refused", b)
			}
			return
		}
		if id < 0 {
			t.Fatalf("decoded negative id %d", id)
		}
		if enc := EncodeCursor(id); !bytes.Equal(enc, b) {
			t.Fatalf("EncodeCursor(%d) = % x; decoded from % x", id, enc, b)
		}
		parsed, err := ParseCursor(Cursor(b).String())
		if err != nil || !bytes.Equal(parsed, b) {
			t.Fatalf("text round trip of % x: % x, %v", b, parsed, err)
		}
	})
}
