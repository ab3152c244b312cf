package streams

import (
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/reveille/reveille/internal/apperr"
)

// MaxIDLength is the longest run id or stream name, in characters.
const MaxIDLength = 200

var (
	// ErrClosed is returned by appends to a closed stream.
	ErrClosed = fmt.Errorf("stream is closed: %w", apperr.ErrConflict)
	// ErrKeyReused is returned by AppendWithKey when the key was used on the
	// stream for other chunks.
	ErrKeyReused = fmt.Errorf("this idempotency key was used for a different append to this stream: %w", apperr.ErrConflict)
	// ErrStopped is returned by Tail when the live-tail hub is not running.
	ErrStopped = fmt.Errorf("streams: live tail hub is not running")
)

// ValidateID checks a run id or stream name: 1 to MaxIDLength printable
// characters, no "/", not "." or ".." (which URL clients — browsers,
// fetch, curl — collapse as path segments, so that such a stream could
// not be reached by its URL). field names the input in the returned
// *apperr.InvalidError ("run_id", "name").
func ValidateID(field, id string) error {
	switch {
	case id == "":
		return apperr.Invalid(field, "must not be empty")
	case !utf8.ValidString(id):
		return apperr.Invalid(field, "must be valid UTF-8")
	case utf8.RuneCountInString(id) > MaxIDLength:
		return apperr.Invalid(field, fmt.Sprintf("must be at most %d characters", MaxIDLength))
	case strings.Contains(id, "/"):
		return apperr.Invalid(field, `must not contain "/"`)
	case id == "." || id == "..":
		return apperr.Invalid(field, `must not be "." or ".." (URL clients collapse them as path segments)`)
	case strings.IndexFunc(id, func(r rune) bool { return !unicode.IsPrint(r) }) >= 0:
		return apperr.Invalid(field, "must hold only printable characters")
	}
	return nil
}

func validateKey(runID, name string) error {
	if err := ValidateID("run_id", runID); err != nil {
		return err
	}
	return ValidateID("name", name)
}

func validateRun(runID string) error { return ValidateID("run_id", runID) }
