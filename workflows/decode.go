package workflows

import "encoding/json"

// decodeWake reads a wake from a signal's JSON; ok is false when it is not
// an object with the fields every wake carries.
func decodeWake(raw json.RawMessage) (Wake, bool) {
	var w Wake
	if err := json.Unmarshal(raw, &w); err != nil || w.WakeupID == "" || w.Outcome == "" {
		return Wake{}, false
	}
	return w, true
}
