// Package apperr defines the kinds of failure that domain packages report and
// the HTTP layer maps to statuses. Domain packages wrap these kinds in their
// own sentinel errors (fmt.Errorf("mandate %w", apperr.ErrNotFound)) so that
// callers can match either the precise error or its kind with errors.Is.
package apperr

import (
	"errors"
	"strings"
)

var (
	// ErrNotFound: the object does not exist for this org (another org's
	// object is reported exactly the same way).
	ErrNotFound = errors.New("not found")
	// ErrConflict: the request contradicts the object's current state.
	ErrConflict = errors.New("conflict")
	// ErrForbidden: the caller may not do this to an object it can see.
	ErrForbidden = errors.New("forbidden")
)

// FieldError names one invalid input field by its dotted JSON path.
type FieldError struct {
	Field  string `json:"field"`
	Detail string `json:"detail"`
}

// InvalidError is bad input: one or more fields that fail validation.
type InvalidError struct {
	Fields []FieldError
}

// Invalid returns an InvalidError for one field.
func Invalid(field, detail string) *InvalidError {
	return &InvalidError{Fields: []FieldError{{Field: field, Detail: detail}}}
}

func (e *InvalidError) Error() string {
	parts := make([]string, len(e.Fields))
	for i, f := range e.Fields {
		parts[i] = f.Field + ": " + f.Detail
	}
	return "invalid input: " + strings.Join(parts, "; ")
}

// Add appends a field error.
func (e *InvalidError) Add(field, detail string) {
	e.Fields = append(e.Fields, FieldError{field, detail})
}

// OrNil returns e when it holds any field error, else nil (typed nil safe).
func (e *InvalidError) OrNil() error {
	if e == nil || len(e.Fields) == 0 {
		return nil
	}
	return e
}
