package server

import (
	"bytes"
	"encoding/json"
	"reflect"
)

// opt is an optional field of a request body that, when sent, must not be
// null: leaving a field out is how a client asks for its default, and a
// null is far more likely a client's bug (an unset variable) than a wish.
// Decoding records whether it was sent; present checks it.
type opt[T any] struct {
	v    T
	set  bool // sent with a value
	null bool // sent as null
}

// UnmarshalJSON decodes the field's value, noting a null.
func (o *opt[T]) UnmarshalJSON(b []byte) error {
	if bytes.Equal(bytes.TrimSpace(b), []byte("null")) {
		o.null = true
		return nil
	}
	if err := json.Unmarshal(b, &o.v); err != nil {
		return err
	}
	o.set = true
	return nil
}

// MarshalJSON writes the value sent (null for a null), so that a decoded
// request encodes back to what it said; with the omitzero option, a field
// not sent stays out.
func (o opt[T]) MarshalJSON() ([]byte, error) {
	if o.null {
		return []byte("null"), nil
	}
	return json.Marshal(o.v)
}

// valueType is T, for checkMembers' messages.
func (opt[T]) valueType() reflect.Type { return reflect.TypeFor[T]() }

// IsZero reports a field not sent, for the omitzero option.
func (o opt[T]) IsZero() bool { return !o.set && !o.null }

// present refuses a null, then checks a value that was sent with check.
// (parseBody and decodeValue refuse a null before validation, with
// checkMembers; this keeps an opt safe wherever it is decoded.)
func (o opt[T]) present(field string, check func(v T) error) error {
	if o.null {
		return badRequestf("%q is null; leave it out for the default, or send a value", field)
	}
	if o.set && check != nil {
		return check(o.v)
	}
	return nil
}
