package fleet

import (
	"context"
	"log/slog"
	"strings"
)

// riverLogger is the logger River's client gets: the fleet's, with River's
// periodic "Producer job counts" line (every 5 s per busy queue, at info)
// lowered to debug. It reports nothing a person acts on, and with four
// queues it was most of an idle process's log.
func riverLogger(l *slog.Logger) *slog.Logger {
	return slog.New(demoting{l.Handler()})
}

// demoting lowers River's routine records to debug.
type demoting struct{ slog.Handler }

func routine(msg string) bool { return strings.HasSuffix(msg, ": Producer job counts") }

func (h demoting) Handle(ctx context.Context, r slog.Record) error {
	if r.Level == slog.LevelInfo && routine(r.Message) {
		if !h.Handler.Enabled(ctx, slog.LevelDebug) {
			return nil
		}
		r.Level = slog.LevelDebug
	}
	return h.Handler.Handle(ctx, r)
}

func (h demoting) WithAttrs(attrs []slog.Attr) slog.Handler {
	return demoting{h.Handler.WithAttrs(attrs)}
}

func (h demoting) WithGroup(name string) slog.Handler { return demoting{h.Handler.WithGroup(name)} }
