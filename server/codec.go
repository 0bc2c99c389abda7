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
