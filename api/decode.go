package api

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"mime"
	"net"
	"net/http"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"unicode/utf8"

	"github.com/labstack/echo/v4"

	"github.com/reveille/reveille/internal/apperr"
	"github.com/reveille/reveille/internal/jsonb"
)

// bind decodes a JSON request body into dst strictly: unknown fields, wrong
// types, trailing data and malformed JSON are 400 problems naming the field.
// An empty body decodes as {} so that all-optional bodies may be omitted.
func bind(c echo.Context, dst any) error {
	body, err := readJSONBody(c)
	if err != nil {
		return err
	}
	return decodeJSON(body, dst)
}

// bindBody reads a JSON request body and hands it to decode, which decodes
// and validates it without the request: the fuzz targets call the same
// decoders.
func bindBody[T any](c echo.Context, decode func(body []byte) (T, error)) (T, error) {
	body, err := readJSONBody(c)
	if err != nil {
		var zero T
		return zero, err
	}
	return decode(body)
}

// readJSONBody checks the media type and reads the body ("{}" when empty).
func readJSONBody(c echo.Context) ([]byte, error) {
	if ct := c.Request().Header.Get(echo.HeaderContentType); ct != "" {
		mt, _, err := mime.ParseMediaType(ct)
		if err != nil || (mt != echo.MIMEApplicationJSON && !strings.HasSuffix(mt, "+json")) {
			return nil, unsupportedMediaType("the body must be application/json")
		}
	}
	body, err := io.ReadAll(c.Request().Body)
	if err != nil {
		return nil, readError(err)
	}
	if len(bytes.TrimSpace(body)) == 0 {
		body = []byte("{}")
	}
	return body, nil
}

// decodeJSON is bind without the request: strict decoding of body into dst.
// The body must be UTF-8 (RFC 8259) and hold nothing Postgres cannot store
// (unstorableJSON): a field kept as raw JSON (args) would otherwise reach
// the database unchecked.
func decodeJSON(body []byte, dst any) error {
	if !utf8.Valid(body) {
		return invalidJSON(fmt.Sprintf("the body is not UTF-8 (byte %d)", invalidUTF8At(body)))
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(dst); err != nil {
		if name, ok := unknownField(err); ok {
			// (the decoder names the key, not where it is)
			if path, found := unknownFieldPath(body, reflect.TypeOf(dst), name); found {
				return Invalid(path, "unknown field")
			}
		}
		var typeErr *json.UnmarshalTypeError
		if errors.As(err, &typeErr) && typeErr.Field != "" {
			// (the decoder names the field without the array indices on
			// its way: "chunks.n" for the second chunk's n)
			if path, found := typeErrorPath(body, typeErr); found {
				return Invalid(path, typeErrorDetail(typeErr))
			}
		}
		return jsonProblem(err)
	}
	if !restIsSpace(dec, body) {
		return invalidJSON("the body holds more than one JSON value")
	}
	// (json.Decoder takes null for any type, leaving dst as it was: a body
	// of null would read as {} — for a PATCH, as "no field given")
	if string(bytes.TrimSpace(body)) == "null" {
		return Invalid("body", "must be a JSON object")
	}
	if field, detail, found := unstorableJSON(body); found {
		return Invalid(field, detail)
	}
	if jsonb.NumberGrowth(body) > jsonb.MaxNumberGrowth {
		return Invalid("body", fmt.Sprintf("its numbers, as stored and given back in plain notation (1e5000 is 5001 digits), "+
			"make it more than %d bytes longer than sent: write them as they are (1000…) or as strings", jsonb.MaxNumberGrowth))
	}
	if field, detail, found := misnamedKey(body, reflect.TypeOf(dst)); found {
		return Invalid(field, detail)
	}
	return nil
}

// restIsSpace reports whether only white space follows the value dec read
// from body. (dec.More is false before a stray "}" or "]", which would let
// `{"pool":"p"}}` pass as `{"pool":"p"}`.)
func restIsSpace(dec *json.Decoder, body []byte) bool {
	return len(bytes.TrimLeft(body[dec.InputOffset():], " \t\r\n")) == 0
}

// invalidJSON is a 400 for a body that is not the JSON asked for as a
// whole: the field it names is "body".
func invalidJSON(detail string) *Problem {
	p := NewProblem(http.StatusBadRequest, "invalid-json", detail)
	p.Errors = []apperr.FieldError{{Field: "body", Detail: detail}}
	return p
}

func invalidUTF8At(b []byte) int {
	for i := 0; i < len(b); {
		r, size := utf8.DecodeRune(b[i:])
		if r == utf8.RuneError && size <= 1 {
			return i
		}
		i += size
	}
	return len(b)
}

func readError(err error) error {
	var maxErr *http.MaxBytesError
	if errors.As(err, &maxErr) {
		return tooLargeProblem("body-too-large", "body", fmt.Sprintf("request body exceeds %d bytes", maxErr.Limit))
	}
	var he *echo.HTTPError
	if errors.As(err, &he) {
		return he
	}
	var netErr net.Error
	if errors.As(err, &netErr) && netErr.Timeout() {
		return NewProblem(http.StatusRequestTimeout, "request-timeout", "the request body was not sent within the server's read timeout")
	}
	return NewProblem(http.StatusBadRequest, "unreadable-body", "could not read the request body")
}

func jsonProblem(err error) error {
	var typeErr *json.UnmarshalTypeError
	var syntaxErr *json.SyntaxError
	switch {
	case errors.As(err, &typeErr):
		field := typeErr.Field
		if field == "" {
			return Invalid("body", "must be a JSON object")
		}
		return Invalid(field, typeErrorDetail(typeErr))
	case errors.As(err, &syntaxErr):
		return invalidJSON(fmt.Sprintf("malformed JSON at byte %d: %v", syntaxErr.Offset, err))
	case errors.Is(err, io.ErrUnexpectedEOF):
		return invalidJSON("malformed JSON: unexpected end of input")
	case strings.HasPrefix(err.Error(), "json: unknown field "):
		name, ok := unknownField(err)
		if !ok {
			return Invalid("body", "has an unknown field "+strings.TrimPrefix(err.Error(), "json: unknown field "))
		}
		return Invalid(name, "unknown field")
	}
	var maxErr *http.MaxBytesError
	if errors.As(err, &maxErr) {
		return readError(err)
	}
	return invalidJSON("malformed JSON: " + err.Error())
}

func typeErrorDetail(typeErr *json.UnmarshalTypeError) string {
	return fmt.Sprintf("must be %s, not %s", jsonTypeName(typeErr.Type.Kind().String()), typeErr.Value)
}

// typeErrorPath finds where in body the value of a type error of the
// decoder stands, as the dotted path a problem names, with the indices
// the decoder's Field leaves out ("chunks[1].n"): the value whose token
// ends at the error's Offset (a scalar's end, or just past a container's
// opening bracket). The path must agree with Field once its indices are
// dropped — or extend it, as a map's key does for a map of scalars
// ("weights.b"); a map of objects (Field "m.y" for "m.k.y") does not agree,
// and the problem names Field. Bounded as unknownFieldPath is.
func typeErrorPath(body []byte, typeErr *json.UnmarshalTypeError) (string, bool) {
	if len(body) > maxPathWalk {
		return "", false
	}
	type frame struct {
		path    string
		array   bool
		next    int  // an array's next index
		wantKey bool // an object's next token is a key (or its end)
		key     string
	}
	var stack []*frame
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	for {
		tok, err := dec.Token()
		if err != nil {
			return "", false
		}
		d, isDelim := tok.(json.Delim)
		var top *frame
		if len(stack) > 0 {
			top = stack[len(stack)-1]
		}
		switch {
		case isDelim && (d == '}' || d == ']'):
			stack = stack[:len(stack)-1]
			continue
		case top != nil && top.wantKey:
			top.key, top.wantKey = tok.(string), false
			continue
		}
		path := ""
		switch {
		case top != nil && top.array:
			path = top.path + "[" + strconv.Itoa(top.next) + "]"
			top.next++
		case top != nil:
			path = top.key
			if top.path != "" {
				path = top.path + "." + top.key
			}
			top.wantKey = true
		}
		if dec.InputOffset() == typeErr.Offset {
			field, want := foldKey(withoutIndices(path)), foldKey(typeErr.Field)
			return path, path != "" && (field == want || strings.HasPrefix(field, want+"."))
		}
		if isDelim {
			stack = append(stack, &frame{path: path, array: d == '[', wantKey: d == '{'})
		}
	}
}

// withoutIndices is path without its array indices ("chunks[1].n" →
// "chunks.n").
func withoutIndices(path string) string {
	var b strings.Builder
	for {
		i := strings.IndexByte(path, '[')
		j := strings.IndexByte(path[max(i, 0):], ']')
		if i < 0 || j < 0 {
			b.WriteString(path)
			return b.String()
		}
		b.WriteString(path[:i])
		path = path[i+j+1:]
	}
}

func jsonTypeName(kind string) string {
	switch kind {
	case "int", "int8", "int16", "int32", "int64", "uint", "uint8", "uint16", "uint32", "uint64":
		return "an integer in range"
	case "float32", "float64":
		return "a number"
	case "string":
		return "a string"
	case "bool":
		return "a boolean"
	case "slice", "array":
		return "an array"
	case "map", "struct":
		return "an object"
	}
	return "a valid value"
}

// unknownField is the key an unknown-field error of the decoder names.
func unknownField(err error) (string, bool) {
	quoted, ok := strings.CutPrefix(err.Error(), "json: unknown field ")
	if !ok {
		return "", false
	}
	name, uerr := strconv.Unquote(quoted)
	return name, uerr == nil && name != ""
}

// unknownFieldPath finds where in body a key name that no field of t takes
// stands, as the dotted path a problem names ("work.extra",
// "chunks[2].x"), matching keys to fields as the decoder does (tag or
// field name, case-insensitively). Objects' keys are tried in sorted
// order, so the path is the same on every call.
//
// Only for bodies up to maxPathWalk bytes: the walk decodes the body again,
// and a large one (a stream append of thousands of chunks) would cost far
// more than the strict decode did; such a body's problem names the key.
func unknownFieldPath(body []byte, t reflect.Type, name string) (string, bool) {
	if len(body) > maxPathWalk {
		return "", false
	}
	var v any
	if json.Unmarshal(body, &v) != nil {
		return "", false
	}
	return findUnknown(v, t, name, "")
}

// maxPathWalk bounds the bodies unknownFieldPath walks.
const maxPathWalk = 64 << 10

func findUnknown(v any, t reflect.Type, name, path string) (string, bool) {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	join := func(key string) string {
		if path == "" {
			return key
		}
		return path + "." + key
	}
	switch x := v.(type) {
	case map[string]any:
		keys := slices.Sorted(maps.Keys(x))
		switch t.Kind() {
		case reflect.Struct:
			fields := foldedFields(t)
			for _, k := range keys {
				f, ok := fields[foldKey(k)]
				if !ok {
					if k == name {
						return join(k), true
					}
					continue
				}
				if p, ok := findUnknown(x[k], f, name, join(k)); ok {
					return p, true
				}
			}
		case reflect.Map:
			for _, k := range keys {
				if p, ok := findUnknown(x[k], t.Elem(), name, join(k)); ok {
					return p, true
				}
			}
		}
	case []any:
		if t.Kind() == reflect.Slice || t.Kind() == reflect.Array {
			for i, e := range x {
				if p, ok := findUnknown(e, t.Elem(), name, path+"["+strconv.Itoa(i)+"]"); ok {
					return p, true
				}
			}
		}
	}
	return "", false
}

// jsonFields maps the JSON names, as written (tag or field name), of t's
// fields (embedded structs' promoted ones included, the outer one winning)
// to their types; seen holds the embedded structs on the way down (a struct
// embedding itself through a pointer would recurse for ever).
func jsonFields(t reflect.Type, seen []reflect.Type) map[string]reflect.Type {
	out := map[string]reflect.Type{}
	if slices.Contains(seen, t) {
		return out
	}
	seen = append(seen, t)
	for f := range t.Fields() {
		tag, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if tag == "-" || (!f.IsExported() && !f.Anonymous) {
			continue
		}
		ft := f.Type
		for ft.Kind() == reflect.Pointer {
			ft = ft.Elem()
		}
		if f.Anonymous && tag == "" && ft.Kind() == reflect.Struct {
			for k, v := range jsonFields(ft, seen) {
				if _, taken := out[k]; !taken {
					out[k] = v
				}
			}
			continue
		}
		out[cmp.Or(tag, f.Name)] = f.Type
	}
	return out
}

// foldedFields is jsonFields keyed as encoding/json matches keys to fields:
// case-insensitively (foldKey: "ſ" matching "s").
func foldedFields(t reflect.Type) map[string]reflect.Type {
	out := map[string]reflect.Type{}
	for k, v := range jsonFields(t, nil) {
		out[foldKey(k)] = v
	}
	return out
}

// misnamedKey finds, in a body the decoder accepted into t, the first key
// the document does not take as written: a key that names a field only
// case-insensitively ("Pool" for "pool", which encoding/json accepts), and
// a key repeated within one object, anywhere (encoding/json keeps the last;
// a proxy or a log that reads the first would see another request — I-JSON,
// RFC 7493 §2.3, forbids them) — and a null the document does not allow
// (encoding/json takes null for any field, as if it were left out: a
// field takes it only when tagged `nullable:"true"` or read as raw JSON).
// It returns the key's path and what is wrong. One pass over the bytes;
// values whose type decodes itself (raw JSON) are checked for repeats only.
func misnamedKey(body []byte, t reflect.Type) (path, detail string, found bool) {
	w := keyWalk{b: body}
	if detail, found = w.value(t); found {
		return w.pathString(), detail, true
	}
	return "", "", false
}

// keyWalk is misnamedKey's walk over a body the decoder accepted (so it
// is valid JSON, and the walk need not check it): i is the next byte;
// path holds the keys and indices on the way to the value being read
// (made a string only for the key found). It allocates little: it runs on
// every request body.
type keyWalk struct {
	b    []byte
	i    int
	path []pathSegment
}

// pathSegment is an object's key, or an array's index when key is nil.
type pathSegment struct {
	key   []byte
	index int
}

// value reads one value; t is the type it decodes into (nil: any, or a
// type that decodes itself).
func (w *keyWalk) value(t reflect.Type) (detail string, found bool) {
	w.space()
	if w.i >= len(w.b) {
		return "", false
	}
	switch w.b[w.i] {
	case '{':
		w.i++
		wt := walkTypeOf(t)
		fields, elem := wt.fields, wt.elem
		var few [16][]byte // the keys seen, while they are few
		seen, many := few[:0], map[string]bool(nil)
		for w.space(); w.i < len(w.b) && w.b[w.i] != '}'; w.space() {
			key := w.key()
			w.path = append(w.path, pathSegment{key: key})
			switch {
			case many != nil:
				if many[string(key)] {
					return "is given twice", true
				}
				many[string(key)] = true
			case slices.ContainsFunc(seen, func(k []byte) bool { return bytes.Equal(k, key) }):
				return "is given twice", true
			case len(seen) < len(few):
				seen = append(seen, key)
			default:
				many = make(map[string]bool, 2*len(few))
				for _, k := range seen {
					many[string(k)] = true
				}
				many[string(key)] = true
			}
			valueType := elem
			if fields != nil {
				ft, ok := fields[string(key)]
				if !ok {
					for name := range fields {
						if foldKey(name) == foldKey(string(key)) {
							return fmt.Sprintf("unknown field (names are case-sensitive: %q)", name), true
						}
					}
				}
				valueType = ft
			}
			w.space()
			w.i++ // ':'
			if w.null() && !takesNull(valueType) && !wt.nullable[string(key)] {
				if wt.required[string(key)] {
					return requiredNullDetail, true
				}
				return nullDetail, true
			}
			if detail, found := w.value(valueType); found {
				return detail, true
			}
			w.path = w.path[:len(w.path)-1]
			if w.space(); w.i < len(w.b) && w.b[w.i] == ',' {
				w.i++
			}
		}
		w.i++ // '}'
	case '[':
		w.i++
		_, elem := walkTypes(t)
		for n := 0; ; n++ {
			if w.space(); w.i >= len(w.b) || w.b[w.i] == ']' {
				break
			}
			w.path = append(w.path, pathSegment{index: n})
			if elem != nil && w.null() && !takesNull(elem) {
				return nullDetail, true
			}
			if detail, found := w.value(elem); found {
				return detail, true
			}
			w.path = w.path[:len(w.path)-1]
			if w.space(); w.i < len(w.b) && w.b[w.i] == ',' {
				w.i++
			}
		}
		w.i++ // ']'
	case '"':
		w.str()
	default: // a number, true, false or null
		for w.i < len(w.b) && !isJSONDelimiter(w.b[w.i]) {
			w.i++
		}
	}
	return "", false
}

// nullDetail is the problem of a null where the document allows none.
const nullDetail = "must not be null: leave the field out for its default"

// requiredNullDetail is the problem of a null for a required field (tagged
// `required:"true"`, as the document's required lists): it has no default
// to leave it out for.
const requiredNullDetail = "is required; null is not a value"

// null reports whether the next value is null (after white space).
func (w *keyWalk) null() bool {
	w.space()
	return bytes.HasPrefix(w.b[w.i:], []byte("null"))
}

func isJSONDelimiter(c byte) bool {
	switch c {
	case ',', ']', '}', ' ', '\t', '\r', '\n':
		return true
	}
	return false
}

func (w *keyWalk) space() {
	for w.i < len(w.b) && (w.b[w.i] == ' ' || w.b[w.i] == '\t' || w.b[w.i] == '\r' || w.b[w.i] == '\n') {
		w.i++
	}
}

// str skips a string at i, returning it as written, quotes included, and
// whether it holds an escape.
func (w *keyWalk) str() (quoted []byte, escaped bool) {
	start := w.i
	for w.i++; w.i < len(w.b) && w.b[w.i] != '"'; w.i++ {
		if w.b[w.i] == '\\' {
			escaped = true
			w.i++ // (the escaped byte: a quote does not end the string)
		}
	}
	w.i++
	return w.b[start:min(w.i, len(w.b))], escaped
}

// key reads an object's key, unescaped.
func (w *keyWalk) key() []byte {
	quoted, escaped := w.str()
	if !escaped {
		return quoted[1 : len(quoted)-1]
	}
	var key string
	_ = json.Unmarshal(quoted, &key) // (valid: the decoder read it)
	return []byte(key)
}

func (w *keyWalk) pathString() string {
	var b strings.Builder
	for _, seg := range w.path {
		if seg.key == nil {
			b.WriteString("[" + strconv.Itoa(seg.index) + "]")
			continue
		}
		if b.Len() > 0 {
			b.WriteByte('.')
		}
		b.Write(seg.key)
	}
	return b.String()
}

var unmarshalerType = reflect.TypeFor[json.Unmarshaler]()

// walkTypes says how keyWalk reads a value of type t: a struct's fields by
// their exact names (fields), or the type of a map's values or a slice's
// elements (elem); both nil for a type that decodes itself and for any.
// Kept per type: the request types are few, and a walk meets each often.
func walkTypes(t reflect.Type) (fields map[string]reflect.Type, elem reflect.Type) {
	wt := walkTypeOf(t)
	return wt.fields, wt.elem
}

func walkTypeOf(t reflect.Type) walkType {
	if t == nil {
		return walkType{}
	}
	if cached, ok := walkTypeCache.Load(t); ok {
		return cached.(walkType)
	}
	var wt walkType
	d := t
	for d.Kind() == reflect.Pointer {
		d = d.Elem()
	}
	if !decodesItself(d) {
		switch d.Kind() {
		case reflect.Struct:
			wt.fields = jsonFields(d, nil)
			wt.nullable = taggedFields(d, "nullable", nil)
			wt.required = taggedFields(d, "required", nil)
		case reflect.Map, reflect.Slice, reflect.Array:
			wt.elem = d.Elem()
		}
	}
	walkTypeCache.Store(t, wt)
	return wt
}

type walkType struct {
	fields map[string]reflect.Type
	// nullable are the fields tagged `nullable:"true"`: those whose
	// document says null (as the same as leaving them out).
	nullable map[string]bool
	// required are the fields tagged `required:"true"`: those the
	// document's schema lists as required (TestRequiredTagsMatchTheDocument).
	required map[string]bool
	elem     reflect.Type
}

func decodesItself(t reflect.Type) bool {
	return t.Implements(unmarshalerType) || reflect.PointerTo(t).Implements(unmarshalerType)
}

// takesNull reports whether null is a value of a field of type t to
// which no tag speaks: raw JSON (json.RawMessage; the handler reads its
// null, as a PATCH's "clear") and any. Anything else would take null as
// absent — a zero string, a nil pointer — where the document allows no
// null.
func takesNull(t reflect.Type) bool {
	return t == nil || t.Kind() == reflect.Interface || (t.Kind() != reflect.Pointer && decodesItself(t))
}

// taggedFields is jsonFields' names of the fields tagged `<tag>:"true"`
// (nullable, required).
func taggedFields(t reflect.Type, tag string, seen []reflect.Type) map[string]bool {
	out := map[string]bool{}
	if slices.Contains(seen, t) {
		return out
	}
	seen = append(seen, t)
	for f := range t.Fields() {
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		ft := f.Type
		for ft.Kind() == reflect.Pointer {
			ft = ft.Elem()
		}
		if f.Anonymous && name == "" && ft.Kind() == reflect.Struct {
			maps.Copy(out, taggedFields(ft, tag, seen))
			continue
		}
		if f.Tag.Get(tag) == "true" {
			out[cmp.Or(name, f.Name)] = true
		}
	}
	return out
}

var walkTypeCache sync.Map // reflect.Type → walkType
