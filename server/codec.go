package server

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

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
