// Package browsertest drives the dashboard in a real browser: headless
// Chromium against a `leasehold serve` replica on a fresh database. It has
// tests only; they install Debian's chromium package when it is missing and
// the test runs as root.
package browsertest
