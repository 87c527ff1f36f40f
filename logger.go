package leasehold

import (
	"context"
	"encoding/json"
	"log/slog"
	"sort"
	"time"

	"github.com/rs/zerolog"
)

// zerologOf returns a zerolog logger (what leasehold's engine logs with)
// whose events go to l's handler as slog records: the level, the message,
// and every other field as an attribute. A nil l discards everything.
func zerologOf(l *slog.Logger) zerolog.Logger {
	if l == nil {
		return zerolog.Nop()
	}
	h := l.Handler()
	level := zerolog.Disabled
	ctx := context.Background()
	for _, lv := range []struct {
		z zerolog.Level
		s slog.Level
	}{{zerolog.ErrorLevel, slog.LevelError}, {zerolog.WarnLevel, slog.LevelWarn}, {zerolog.InfoLevel, slog.LevelInfo}, {zerolog.DebugLevel, slog.LevelDebug}} {
		if h.Enabled(ctx, lv.s) {
			level = lv.z
		}
	}
	return zerolog.New(slogWriter{h: h}).Level(level)
}

// slogWriter turns zerolog's JSON lines into slog records.
type slogWriter struct{ h slog.Handler }

func (w slogWriter) Write(p []byte) (int, error) {
	var fields map[string]any
	if err := json.Unmarshal(p, &fields); err != nil {
		return len(p), nil // not an event: nothing to say
	}
	level := slog.LevelInfo
	switch fields[zerolog.LevelFieldName] {
	case "debug", "trace":
		level = slog.LevelDebug
	case "warn":
		level = slog.LevelWarn
	case "error", "fatal", "panic":
		level = slog.LevelError
	}
	msg, _ := fields[zerolog.MessageFieldName].(string)
	delete(fields, zerolog.LevelFieldName)
	delete(fields, zerolog.MessageFieldName)
	r := slog.NewRecord(time.Now(), level, msg, 0)
	keys := make([]string, 0, len(fields))
	for k := range fields {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		r.AddAttrs(slog.Any(k, fields[k]))
	}
	if w.h.Enabled(context.Background(), level) {
		_ = w.h.Handle(context.Background(), r)
	}
	return len(p), nil
}
