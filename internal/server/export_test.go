package server

import "time"

// SessionValue is the value of a session cookie for the token secret (as
// --api-token gives it), expiring at expires: what POST /api/session sets.
func SessionValue(secret string, expires time.Time) string {
	t := FullToken(secret)
	return sessionValue(&t, expires)
}

// SessionValid reports whether value is a live session of the token secret.
func SessionValid(secret, value string) bool {
	return tokens{FullToken(secret)}.sessionToken(value, time.Now()) != nil
}

// SessionCookie is the name of the session cookie.
const SessionCookie = sessionCookie
