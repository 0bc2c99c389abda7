package nativeapi

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// strictJSON is connect's JSON codec with stable output and without its
// tolerance of unknown fields: a curl user who misspells "ttl" as "ttl_" must get an error
// naming the field, not a session with the default TTL (DESIGN safety
// rule 9).
type strictJSON struct{ name string }

func (c strictJSON) Name() string { return c.name }

func (c strictJSON) Marshal(v any) ([]byte, error) {
	m, ok := v.(proto.Message)
	if !ok {
		return nil, fmt.Errorf("%T is not a proto.Message", v)
	}
	raw, err := protojson.MarshalOptions{}.Marshal(m)
	if err != nil {
		return nil, err
	}
	if raw, err = withAnswers(m, raw); err != nil {
		return nil, err
	}
	// protojson varies its spacing from build to build on purpose; curl
	// users and scripts get one stable, compact form.
	var out bytes.Buffer
	if err := json.Compact(&out, raw); err != nil {
		return nil, err
	}
	return out.Bytes(), nil
}

func (c strictJSON) Unmarshal(data []byte, v any) error {
	m, ok := v.(proto.Message)
	if !ok {
		return fmt.Errorf("%T is not a proto.Message", v)
	}
	if len(data) == 0 {
		return errors.New("empty body: send a JSON object, {} at least")
	}
	data, err := goDurations(data, m.ProtoReflect().Descriptor(), "")
	if err != nil {
		return err
	}
	if err := (protojson.UnmarshalOptions{}).Unmarshal(data, m); err != nil {
		// protojson's messages carry a deliberately unstable space.
		return errors.New(strings.ReplaceAll(err.Error(), "\u00a0", " "))
	}
	return nil
}

func strictJSONCodecs() []connect.HandlerOption {
	return []connect.HandlerOption{
		connect.WithCodec(strictJSON{"json"}),
		connect.WithCodec(strictJSON{"json; charset=utf-8"}),
	}
}

// withAnswers adds the message's own unset booleans and numbers to its
// JSON, which protojson leaves out as defaults. Those fields answer the
// question asked ("valid", "acquired", "deleted"), and a curl user who
// validates a released token must read "valid":false, not a silence
// that means the same thing only to someone who knows protobuf. Nested
// messages keep protojson's compact form: their zeros answer nothing.
func withAnswers(m proto.Message, raw []byte) ([]byte, error) {
	msg := m.ProtoReflect()
	fields := msg.Descriptor().Fields()
	var missing []protoreflect.FieldDescriptor
	for i := range fields.Len() {
		fd := fields.Get(i)
		if answerKind(fd) && !msg.Has(fd) {
			missing = append(missing, fd)
		}
	}
	if len(missing) == 0 {
		return raw, nil
	}
	var present map[string]json.RawMessage
	if err := json.Unmarshal(raw, &present); err != nil {
		return nil, err
	}
	// Rebuild in field-number order, protojson's own.
	var out bytes.Buffer
	out.WriteByte('{')
	for i := range fields.Len() {
		fd := fields.Get(i)
		name := fd.JSONName()
		v, ok := present[name]
		if !ok && answerKind(fd) && !msg.Has(fd) {
			v, ok = zeroJSON(fd), true
		}
		if !ok {
			continue
		}
		if out.Len() > 1 {
			out.WriteByte(',')
		}
		key, _ := json.Marshal(name)
		out.Write(key)
		out.WriteByte(':')
		out.Write(v)
	}
	out.WriteByte('}')
	return out.Bytes(), nil
}

// answerKind reports whether fd is a plain boolean or number, the kinds
// whose zero is an answer rather than an absence.
func answerKind(fd protoreflect.FieldDescriptor) bool {
	if fd.IsList() || fd.IsMap() || fd.ContainingOneof() != nil {
		return false
	}
	switch fd.Kind() {
	case protoreflect.BoolKind,
		protoreflect.Int32Kind, protoreflect.Sint32Kind, protoreflect.Sfixed32Kind,
		protoreflect.Uint32Kind, protoreflect.Fixed32Kind,
		protoreflect.Int64Kind, protoreflect.Sint64Kind, protoreflect.Sfixed64Kind,
		protoreflect.Uint64Kind, protoreflect.Fixed64Kind:
		return true
	}
	return false
}

// zeroJSON is fd's zero in protojson's spelling: 64-bit numbers are
// strings.
func zeroJSON(fd protoreflect.FieldDescriptor) json.RawMessage {
	switch fd.Kind() {
	case protoreflect.BoolKind:
		return json.RawMessage("false")
	case protoreflect.Int64Kind, protoreflect.Sint64Kind, protoreflect.Sfixed64Kind,
		protoreflect.Uint64Kind, protoreflect.Fixed64Kind:
		return json.RawMessage(`"0"`)
	}
	return json.RawMessage("0")
}

// durationForms is what a google.protobuf.Duration field takes in JSON,
// for the error that refuses anything else.
const durationForms = `a duration such as "1h", "90s", "1m30s" or "500ms" (Go's time.ParseDuration), or protobuf's "3600s"`

// protoDuration is protojson's own spelling of a Duration, passed
// through untouched so that its full range and precision stay, and so
// that what protojson refuses in it (more than nine decimals) is refused
// with its error rather than rounded by time.ParseDuration.
var protoDuration = regexp.MustCompile(`^-?[0-9]+(\.[0-9]+)?s$`)

// GoDurations is what the JSON codec does to a request body before it
// decodes it as a message of type md: Go durations ("1h") rewritten as
// protobuf JSON's ("3600s"). A test that reads a body as this API does
// (server's FuzzDecodeJSONRequests) reads it through this.
func GoDurations(data []byte, md protoreflect.MessageDescriptor) ([]byte, error) {
	return goDurations(data, md, "")
}

// goDurations rewrites, in the JSON object data decoded as md, every
// google.protobuf.Duration given as a Go duration ("1h", "1m30s") into
// protojson's seconds ("3600s"), so that curl users write TTLs as the
// CLI takes them. A value that is neither form is refused with an error
// naming the field (path is where data sits, "" at the top). Everything
// else is left byte for byte as it came, for protojson to judge: data
// that is not an object, unknown keys, malformed JSON. Output is not
// touched: responses keep protojson's "3600s".
func goDurations(data []byte, md protoreflect.MessageDescriptor, path string) ([]byte, error) {
	return eachValue(data, '{', func(key string, raw []byte) ([]byte, error) {
		fd := md.Fields().ByJSONName(key)
		if fd == nil {
			fd = md.Fields().ByTextName(key)
		}
		if fd == nil || fd.Kind() != protoreflect.MessageKind && !fd.IsMap() {
			return nil, nil
		}
		at := key
		if path != "" {
			at = path + "." + key
		}
		switch {
		case fd.IsMap():
			if fd.MapValue().Kind() != protoreflect.MessageKind {
				return nil, nil
			}
			return eachValue(raw, '{', func(k string, v []byte) ([]byte, error) {
				return durationsIn(v, fd.MapValue().Message(), at+"."+k)
			})
		case fd.IsList():
			i := 0
			return eachValue(raw, '[', func(_ string, v []byte) ([]byte, error) {
				i++
				return durationsIn(v, fd.Message(), fmt.Sprintf("%s[%d]", at, i-1))
			})
		}
		return durationsIn(raw, fd.Message(), at)
	})
}

// durationsIn is goDurations for one value of message type md: a
// Duration itself, or a message that may hold some. Other well-known
// types hold none.
func durationsIn(raw []byte, md protoreflect.MessageDescriptor, path string) ([]byte, error) {
	switch {
	case md.FullName() == "google.protobuf.Duration":
		return goDuration(raw, path)
	case md.ParentFile().Package() == "google.protobuf":
		return nil, nil
	}
	out, err := goDurations(raw, md, path)
	if err != nil || bytes.Equal(out, raw) {
		return nil, err
	}
	return out, nil
}

// goDuration is the protojson form of the Duration raw, nil when raw
// needs no change (protojson's own form, or null).
func goDuration(raw []byte, path string) ([]byte, error) {
	var s string
	if err := json.Unmarshal(raw, &s); err != nil {
		if string(raw) == "null" {
			return nil, nil
		}
		return nil, fmt.Errorf("%s: %s is not a string: want %s", path, raw, durationForms)
	}
	if protoDuration.MatchString(s) {
		return nil, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return nil, fmt.Errorf("%s: %q is not a duration: want %s", path, s, durationForms)
	}
	sign, abs := "", uint64(d)
	if d < 0 {
		sign, abs = "-", uint64(-d) // -minInt64 wraps back to its own magnitude as a uint64
	}
	secs, nanos := abs/uint64(time.Second), abs%uint64(time.Second)
	if nanos == 0 {
		return fmt.Appendf(nil, `"%s%ds"`, sign, secs), nil
	}
	frac := strings.TrimRight(fmt.Sprintf("%09d", nanos), "0")
	return fmt.Appendf(nil, `"%s%d.%ss"`, sign, secs, frac), nil
}

// eachValue calls fn with every member of the JSON object (open '{') or
// element of the array ('[') data, and returns data with each value for
// which fn returned bytes replaced by them. Data that is not such a
// value, or is malformed, comes back unchanged: protojson will say
// what is wrong with it.
func eachValue(data []byte, open byte, fn func(key string, raw []byte) ([]byte, error)) ([]byte, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	if tok, err := dec.Token(); err != nil || tok != json.Delim(open) {
		return data, nil
	}
	var out []byte // nil until a value changes
	last := 0
	for dec.More() {
		var key string
		if open == '{' {
			tok, err := dec.Token()
			if err != nil {
				return data, nil
			}
			key, _ = tok.(string)
		}
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return data, nil
		}
		// Decode leaves the offset just past the value, and raw holds
		// the value without the blanks before it.
		end := int(dec.InputOffset())
		repl, err := fn(key, raw)
		if err != nil {
			return nil, err
		}
		if repl != nil {
			out = append(append(out, data[last:end-len(raw)]...), repl...)
			last = end
		}
	}
	if out == nil {
		return data, nil
	}
	return append(out, data[last:]...), nil
}
