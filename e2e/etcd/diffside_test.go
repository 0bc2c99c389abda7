//go:build linux

package etcd

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strconv"
	"strings"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
)

// --- sides ---

// side is one server as the runner talks to it: plain gRPC clients of
// its etcd API (no clientv3: what the script says is what is sent), its
// watch of every key from revision 1, the IDs it picked for auto leases,
// and the watches open on it.
type side struct {
	name    string
	conn    *grpc.ClientConn
	kv      pb.KVClient
	lease   pb.LeaseClient
	watcher pb.WatchClient
	all     *watchHandle
	autos   map[string]int64
	names   map[int64]string
	watches map[int]*watchHandle
}

// dialSide connects to tg and opens its watch of every key from
// revision 1, with prev_kv. The caller closes it.
func dialSide(tg target) (*side, error) {
	conn, err := grpc.NewClient(tg.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, err
	}
	s := &side{
		name: tg.name, conn: conn,
		kv: pb.NewKVClient(conn), lease: pb.NewLeaseClient(conn), watcher: pb.NewWatchClient(conn),
		autos: map[string]int64{}, names: map[int64]string{}, watches: map[int]*watchHandle{},
	}
	ws, err := openStream(s.watcher)
	if err == nil {
		s.all, err = ws.create(&pb.WatchCreateRequest{Key: []byte{0}, RangeEnd: []byte{0}, StartRevision: 1, PrevKv: true})
		if err != nil {
			ws.close()
		}
	}
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("%s: watch every key: %v", tg.name, err)
	}
	return s, nil
}

// close ends the side's watches and its connection.
func (s *side) close() {
	for _, h := range s.watches {
		h.done()
	}
	s.all.done()
	s.conn.Close()
}

// unknownAuto is the ID an auto lease has before (or without) its grant:
// one nobody grants.
const unknownAuto = firstLeaseID + 999

// leaseID is the ID l names on this side.
func (s *side) leaseID(l leaseRef) int64 {
	if l.auto == "" {
		return l.id
	}
	if id, ok := s.autos[l.auto]; ok {
		return id
	}
	return unknownAuto
}

// leaseName is how a lease ID is shown: an auto lease by its label, so
// that the two servers' IDs compare equal.
func (s *side) leaseName(id int64) string {
	if n, ok := s.names[id]; ok {
		return n
	}
	return strconv.FormatInt(id, 10)
}

// respond renders a response, or an error.
func (s *side) respond(resp any, h *pb.ResponseHeader, err error) answer {
	if err != nil {
		return answer{text: errText(err)}
	}
	return answer{text: s.render(resp), rev: h.GetRevision(), ok: true}
}

// errText is an error as the wire carries it: its gRPC code and message.
func errText(err error) string {
	st, _ := status.FromError(err)
	return fmt.Sprintf("error %s %q", st.Code(), st.Message())
}

// --- rendering ---

// render writes a response field by field, leaving out fields that are
// zero (as protobuf's text form does) and what names the server rather
// than the data: a header shows only its revision (not cluster or member
// ID, nor raft term), and a lease ID (fields ID and Lease) shows as the
// auto lease it is, where it is one. Byte strings are Go-quoted.
func (s *side) render(v any) string {
	var b strings.Builder
	s.renderValue(&b, reflect.ValueOf(v), "")
	return b.String()
}

var headerType = reflect.TypeOf(pb.ResponseHeader{})

func (s *side) renderValue(b *strings.Builder, v reflect.Value, field string) {
	switch v.Kind() {
	case reflect.Pointer, reflect.Interface:
		if v.IsNil() {
			b.WriteString("nil")
			return
		}
		s.renderValue(b, v.Elem(), field)
	case reflect.Struct:
		if v.Type() == headerType {
			fmt.Fprintf(b, "{Revision:%d}", v.FieldByName("Revision").Int())
			return
		}
		b.WriteByte('{')
		first := true
		for i := range v.NumField() {
			f := v.Type().Field(i)
			fv := v.Field(i)
			if !f.IsExported() || strings.HasPrefix(f.Name, "XXX_") || fv.IsZero() {
				continue
			}
			if !first {
				b.WriteByte(' ')
			}
			first = false
			b.WriteString(f.Name + ":")
			s.renderValue(b, fv, f.Name)
		}
		b.WriteByte('}')
	case reflect.Slice:
		if v.Type().Elem().Kind() == reflect.Uint8 {
			b.WriteString(quote(string(v.Bytes())))
			return
		}
		b.WriteByte('[')
		for i := range v.Len() {
			if i > 0 {
				b.WriteByte(' ')
			}
			s.renderValue(b, v.Index(i), field)
		}
		b.WriteByte(']')
	case reflect.String:
		b.WriteString(quote(v.String()))
	case reflect.Int64:
		if field == "ID" || field == "Lease" {
			b.WriteString(s.leaseName(v.Int()))
			return
		}
		b.WriteString(strconv.FormatInt(v.Int(), 10))
	case reflect.Int32:
		if st, ok := v.Interface().(fmt.Stringer); ok { // an enum
			b.WriteString(st.String())
			return
		}
		b.WriteString(strconv.FormatInt(v.Int(), 10))
	default:
		fmt.Fprint(b, v.Interface())
	}
}

// renderEvent is one watch event: its type, key-value and prev_kv.
func (s *side) renderEvent(ev *mvccpb.Event) string {
	out := fmt.Sprintf("%s %s", ev.Type, s.render(ev.Kv))
	if ev.PrevKv != nil {
		out += " prev=" + s.render(ev.PrevKv)
	}
	return out
}

// renderWatch is what a watch stream has received, one item a line: its
// created and canceled responses (header revision, watch ID, compact
// revision, cancel reason) and its events one by one. How events are
// batched into responses, and the header revision of a response that
// carries events, are left out: etcd promises neither.
func (s *side) renderWatch(resps []*pb.WatchResponse, err error) []string {
	var out []string
	for _, r := range resps {
		rest := *r
		rest.Events = nil
		if len(r.Events) > 0 {
			rest.Header = nil
		}
		if r.Created {
			out = append(out, "created "+s.render(&rest))
		}
		for _, ev := range r.Events {
			out = append(out, s.renderEvent(ev))
		}
		switch {
		case r.Canceled:
			out = append(out, "canceled "+s.render(&rest))
		case !r.Created && len(r.Events) == 0:
			out = append(out, "response "+s.render(&rest))
		}
	}
	if err != nil && status.Code(err) != codes.Canceled && !errors.Is(err, context.Canceled) {
		out = append(out, "stream ended: "+errText(err))
	}
	return out
}

// allItems is the side's watch of every key, rendered.
func (s *side) allItems() []string {
	return s.renderWatch(s.all.responses())
}
