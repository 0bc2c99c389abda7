package nativeapi

import (
	"strings"
	"unicode/utf8"

	"github.com/tenurehq/tenure/api"
	tenurev1 "github.com/tenurehq/tenure/api/tenure/v1"
	"github.com/tenurehq/tenure/statemachine"
)

// RecipeKind is Lease.kind for an etcd recipe's lock: a clientv3
// concurrency.Mutex or Election, etcd's Lock or Election service,
// etcdctl lock or elect, read back from its keys
// (statemachine.RecipeLocks). It is listed with the leases so that
// the page, `tenure get lease -A` and a program see who holds it, who
// waits, since when and with which fencing revision, which no etcd tool
// shows.
//
// It is told apart by kind, not by a namespace of its own: any name a
// namespace could take is one a user may own. Its namespace is empty,
// and its name is the recipe's name — key_prefix without its final
// "/" — made printable by RecipeName; key_prefix carries the bytes.
const RecipeKind = "etcd-lock"

// RecipeName is the printable name of the recipe lock whose keys share
// prefix: the prefix without its final "/", each byte that is not part
// of a UTF-8 character and each control character written as \xNN, and
// each backslash doubled, so that it reads back to the bytes
// unambiguously. The page, the CLI and the metrics' lease label show it.
func RecipeName(prefix string) string { return printable(strings.TrimSuffix(prefix, "/")) }

// printable is name with each byte that is not part of a UTF-8
// character and each control character written as \xNN, and each
// backslash doubled: RecipeName's escaping, which KubernetesName shares.
func printable(name string) string {
	plain := utf8.ValidString(name) && !strings.ContainsFunc(name, func(r rune) bool { return r < 0x20 || r == 0x7f || r == '\\' })
	if plain {
		return name
	}
	const hex = "0123456789abcdef"
	var b strings.Builder
	for i := 0; i < len(name); {
		r, n := utf8.DecodeRuneInString(name[i:])
		switch {
		case r == utf8.RuneError && n == 1, r < 0x20, r == 0x7f:
			b.WriteString(`\x`)
			b.WriteByte(hex[name[i]>>4])
			b.WriteByte(hex[name[i]&0xf])
		case r == '\\':
			b.WriteString(`\\`)
		default:
			b.WriteString(name[i : i+n])
		}
		i += n
	}
	return b.String()
}

// recipeLeaseProto renders l, read from m, as a Lease of kind
// RecipeKind: since is when its holder became the holder and joined when
// each contender's key was created, 0 where the node does not know
// (Backend.RecipeTimes). Its revisions are etcd's (KV revisions), so the
// record's create and mod revisions, which are Tenure's, stay unset.
func recipeLeaseProto(m *statemachine.Machine, l statemachine.RecipeLock, since int64, joined []int64, hb heartbeats) *tenurev1.Lease {
	out := &tenurev1.Lease{
		Kind:      RecipeKind,
		KeyPrefix: []byte(l.Prefix),
		Name:      RecipeName(l.Prefix),
		Capacity:  1,
	}
	for i, c := range l.Contenders {
		if i > 0 {
			out.Waiters = append(out.Waiters, &tenurev1.Waiter{SessionId: c.SessionID, HolderIdentity: c.Identity, Since: stamp(joined[i]), EtcdLeaseId: c.EtcdLease})
			continue
		}
		g := &tenurev1.Grant{
			SessionId:      c.SessionID,
			HolderIdentity: c.Identity,
			Token:          c.CreateRevision,
			AcquireTime:    stamp(since),
			Value:          api.EscapeNonUTF8(c.Value),
			EtcdLeaseId:    c.EtcdLease,
		}
		if t := hb.LastHeartbeat(c.SessionID); !t.IsZero() {
			g.RenewTime = stamp(t.UnixNano())
		}
		out.Holders = []*tenurev1.Grant{g}
		out.Status = statusHeld
		out.HolderIdentity = g.HolderIdentity
		out.FencingToken = g.Token
		out.AcquireTime = g.AcquireTime
		out.RenewTime = g.RenewTime
		out.Value = g.Value
		if s, ok := m.Session(c.SessionID); ok {
			out.LeaseDuration = dur(s.TTL)
		}
	}
	return out
}
