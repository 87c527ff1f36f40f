// Package apitime writes times as leasehold's API does: RFC 3339, UTC,
// with milliseconds.
package apitime

import "time"

// Layout is the API's time format.
const Layout = "2006-01-02T15:04:05.000Z07:00"

// Format formats t as the API does.
func Format(t time.Time) string { return t.UTC().Format(Layout) }

// FormatPtr is Format of an optional time: nil stays nil.
func FormatPtr(t *time.Time) *string {
	if t == nil {
		return nil
	}
	s := Format(*t)
	return &s
}
