// Package lease is leasehold's lease service: time-bounded exclusive
// ownership of a named resource, stored in PostgreSQL.
//
// A lease on a resource moves through these states, every decision made by
// the database clock:
//
//	           Acquire (a new fence)
//	free ───────────────────────────▶ active ──┐
//	 ▲                                 │  │ ◀──┘ Renew by the holder:
//	 │                                 │  │      expires_at = now + TTL
//	 │               Release by holder │  │ expires_at passes
//	 │                                 ▼  ▼
//	 └──── (free again) ────────── released, expired
//	                                      │
//	                           the reaper announces an expiry:
//	                           an "expired" event and a NOTIFY
//
//	An Acquire by the holder of an active lease is an idempotent no-op.
//
// A released or expired lease is free: the next Acquire takes it over with a
// fence greater than every fence handed out before. Renew and Release are
// compare-and-set on (resource, holder, fence when given, still active), so a
// holder that lost its lease learns it as ErrNotHeld, never by overwriting
// the new holder. Every change is recorded in lease_events and NOTIFYed on
// the leasehold_lease channel by a trigger, in the same transaction.
//
// Store works on the database directly and is what the server, the reaper
// and the other in-process users call. Client is the Go client of the REST
// API, with auto-renew. Elector runs a function only while holding a lease.
package leasing
