package client

import (
	"bytes"
	"encoding/json"
	"reflect"
)

// Nullable is a field of a PATCH that has three states: absent (the zero
// Nullable: the field is left as it is), null (Null: the field is cleared)
// and a value (Set). Declare such fields `json:",omitzero"`.
type Nullable[T any] struct {
	value T
	set   bool
	null  bool
}

// Set is a Nullable holding v.
func Set[T any](v T) Nullable[T] { return Nullable[T]{value: v, set: true} }

// Null is a Nullable sent as JSON null.
func Null[T any]() Nullable[T] { return Nullable[T]{set: true, null: true} }

// IsZero reports the absent state (omitzero leaves the field out).
func (n Nullable[T]) IsZero() bool { return !n.set }

// IsNull reports the null state.
func (n Nullable[T]) IsNull() bool { return n.set && n.null }

// Get returns the value and whether there is one.
func (n Nullable[T]) Get() (T, bool) { return n.value, n.set && !n.null }

// MarshalJSON writes null or the value. A set nil map or slice is an
// empty one: sent as null, it would ask for the clear only Null asks for
// (Set of a nil weights map, built only when some condition held, cleared
// every org's weight in the pool).
func (n Nullable[T]) MarshalJSON() ([]byte, error) {
	if !n.set || n.null {
		return []byte("null"), nil
	}
	switch v := reflect.ValueOf(n.value); {
	case v.Kind() == reflect.Map && v.IsNil():
		return []byte("{}"), nil
	case v.Kind() == reflect.Slice && v.IsNil():
		return []byte("[]"), nil
	}
	return json.Marshal(n.value)
}

// UnmarshalJSON reads null or a value (a present field is set).
func (n *Nullable[T]) UnmarshalJSON(b []byte) error {
	if bytes.Equal(bytes.TrimSpace(b), []byte("null")) {
		*n = Null[T]()
		return nil
	}
	var v T
	if err := json.Unmarshal(b, &v); err != nil {
		return err
	}
	*n = Set(v)
	return nil
}
