package cli

import (
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/tenurehq/tenure/api"
	"github.com/tenurehq/tenure/client"
)

// leaseDoc is a lease as a Kubernetes-Lease-shaped document, for -o json
// and -o yaml: what people who know `kubectl get lease -o yaml` expect,
// plus Tenure's status.
type leaseDoc struct {
	APIVersion string        `json:"apiVersion"`
	Kind       string        `json:"kind"`
	Metadata   leaseMetadata `json:"metadata"`
	Spec       leaseSpec     `json:"spec"`
	Status     leaseStatus   `json:"status"`
}

type leaseMetadata struct {
	Name            string            `json:"name"`
	Namespace       string            `json:"namespace"`
	Labels          map[string]string `json:"labels,omitempty"`
	ResourceVersion string            `json:"resourceVersion"`
}

type leaseSpec struct {
	HolderIdentity       *string `json:"holderIdentity,omitempty"`
	LeaseDurationSeconds *int64  `json:"leaseDurationSeconds,omitempty"`
	AcquireTime          *string `json:"acquireTime,omitempty"`
	RenewTime            *string `json:"renewTime,omitempty"`
	LeaseTransitions     int64   `json:"leaseTransitions"`
	// PreferredHolder is Kubernetes 1.31's spec.preferredHolder.
	PreferredHolder *string `json:"preferredHolder,omitempty"`
}

type leaseStatus struct {
	// Phase is "held", "waiting", "released", "expired", "revoked" or
	// "free", as the API's Lease.status.
	Phase        string `json:"phase"`
	FencingToken int64  `json:"fencingToken"`
	Capacity     int    `json:"capacity"`
	Value        string `json:"value,omitempty"`
	// Kind and KeyPrefix are an etcd lock's (client.KindEtcdLock): the
	// prefix of its keys, bytes that are not UTF-8 as \xNN.
	Kind      string `json:"kind,omitempty"`
	KeyPrefix string `json:"keyPrefix,omitempty"`
	// Key and ResourceVersion are a Kubernetes Lease's
	// (client.KindKubernetes): its etcd key, and its resourceVersion.
	Key             string      `json:"key,omitempty"`
	ResourceVersion int64       `json:"resourceVersion,omitempty"`
	Holders         []holderDoc `json:"holders,omitempty"`
	Waiters         []waiterDoc `json:"waiters"`
	LockDelay       string      `json:"lockDelay,omitempty"`
	LockDelayActive bool        `json:"lockDelayActive,omitempty"`
	MaxHold         string      `json:"maxHold,omitempty"`
	LastGrant       *lastDoc    `json:"lastGrant,omitempty"`
	GCAfter         string      `json:"gcAfter,omitempty"`
	DeleteTime      string      `json:"deleteTime,omitempty"`
}

// lastDoc is the last grant that ended.
type lastDoc struct {
	HolderIdentity string `json:"holderIdentity"`
	SessionID      int64  `json:"sessionID"`
	FencingToken   int64  `json:"fencingToken"`
	AcquireTime    string `json:"acquireTime"`
	RenewTime      string `json:"renewTime"`
	EndTime        string `json:"endTime"`
	Ended          string `json:"ended"`
	Reason         string `json:"reason,omitempty"`
}

type holderDoc struct {
	HolderIdentity string `json:"holderIdentity"`
	SessionID      int64  `json:"sessionID"`
	FencingToken   int64  `json:"fencingToken"`
	// AcquireTime is empty only for an etcd lock whose holder took
	// over before the answering node could see it.
	AcquireTime string `json:"acquireTime,omitempty"`
	RenewTime   string `json:"renewTime,omitempty"`
	Value       string `json:"value,omitempty"`
	Exclusive   bool   `json:"exclusive,omitempty"`
	StepDown    string `json:"stepDown,omitempty"`
	// EtcdLeaseID is an etcd lock's holder's lease, in hex as etcdctl
	// prints it.
	EtcdLeaseID string `json:"etcdLeaseID,omitempty"`
}

type waiterDoc struct {
	HolderIdentity string `json:"holderIdentity"`
	SessionID      int64  `json:"sessionID"`
	Since          string `json:"since,omitempty"`
	Exclusive      bool   `json:"exclusive,omitempty"`
	EtcdLeaseID    string `json:"etcdLeaseID,omitempty"`
}

// microTime formats like a Kubernetes MicroTime.
func microTime(t time.Time) string { return t.UTC().Format("2006-01-02T15:04:05.000000Z07:00") }

func toLeaseDoc(l client.Lease) leaseDoc {
	d := leaseDoc{
		APIVersion: "coordination.tenure.dev/v1",
		Kind:       "Lease",
		Metadata:   leaseMetadata{Name: l.Name, Namespace: l.Namespace, Labels: l.Labels, ResourceVersion: strconv.FormatInt(l.ModRevision, 10)},
		Spec:       leaseSpec{LeaseTransitions: l.Transitions},
		Status:     leaseStatus{Phase: l.Status, FencingToken: l.Token, Capacity: l.Capacity, Value: l.Value, Waiters: []waiterDoc{}, LockDelayActive: l.LockDelayOn},
	}
	if l.PreferredHolder != "" {
		p := l.PreferredHolder
		d.Spec.PreferredHolder = &p
	}
	if l.GCAfter > 0 {
		d.Status.GCAfter = l.GCAfter.String()
	}
	if l.MaxHold > 0 {
		d.Status.MaxHold = l.MaxHold.String()
	}
	if !l.DeleteTime.IsZero() {
		d.Status.DeleteTime = microTime(l.DeleteTime)
	}
	if e := l.Last; e != nil {
		d.Status.LastGrant = &lastDoc{
			HolderIdentity: e.Holder, SessionID: e.SessionID, FencingToken: e.Token,
			AcquireTime: microTime(e.AcquireTime), RenewTime: microTime(e.RenewTime), EndTime: microTime(e.EndTime),
			Ended: e.Ended, Reason: e.Reason,
		}
	}
	if l.LockDelay > 0 {
		d.Status.LockDelay = l.LockDelay.String()
	}
	if l.Kind != "" {
		d.Status.Kind, d.Status.KeyPrefix = l.Kind, api.EscapeNonUTF8(string(l.KeyPrefix))
		d.Status.Key = api.EscapeNonUTF8(string(l.Key))
	}
	if l.Kind == client.KindKubernetes {
		d.Status.Phase = l.Status // no holders, no last grant: the server's word
		d.Metadata.ResourceVersion = strconv.FormatInt(l.ResourceVersion, 10)
	}
	if l.Holder != "" {
		holder := l.Holder
		secs := int64(l.LeaseDuration / time.Second)
		d.Spec.HolderIdentity, d.Spec.LeaseDurationSeconds = &holder, &secs
		if !l.AcquireTime.IsZero() {
			acq := microTime(l.AcquireTime)
			d.Spec.AcquireTime = &acq
		}
		if !l.RenewTime.IsZero() {
			renew := microTime(l.RenewTime)
			d.Spec.RenewTime = &renew
		}
	}
	for _, g := range l.Holders {
		h := holderDoc{HolderIdentity: g.Holder, SessionID: g.SessionID, FencingToken: g.Token, Value: g.Value, Exclusive: g.Exclusive, StepDown: g.StepDown, EtcdLeaseID: etcdLeaseHex(g.EtcdLease)}
		if !g.AcquireTime.IsZero() {
			h.AcquireTime = microTime(g.AcquireTime)
		}
		if !g.RenewTime.IsZero() {
			h.RenewTime = microTime(g.RenewTime)
		}
		d.Status.Holders = append(d.Status.Holders, h)
	}
	for _, w := range l.Waiters {
		wd := waiterDoc{HolderIdentity: w.Holder, SessionID: w.SessionID, Exclusive: w.Exclusive, EtcdLeaseID: etcdLeaseHex(w.EtcdLease)}
		if !w.Since.IsZero() {
			wd.Since = microTime(w.Since)
		}
		d.Status.Waiters = append(d.Status.Waiters, wd)
	}
	return d
}

// listDoc is kubectl's List wrapper for -o json/yaml of several items.
type listDoc struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Items      any    `json:"items"`
}

func printDoc(w io.Writer, format string, doc any) error {
	switch format {
	case "json":
		b, err := json.MarshalIndent(doc, "", "    ")
		if err != nil {
			return err
		}
		_, err = fmt.Fprintf(w, "%s\n", b)
		return err
	case "yaml":
		b, err := yaml.Marshal(doc)
		if err != nil {
			return err
		}
		_, err = w.Write(b)
		return err
	}
	return usage("unknown output format %q", format)
}

// printLeases prints leases as kubectl prints `get lease`: NAMESPACE only
// across namespaces, AGE as how long the current holder has held it.
func printLeases(w io.Writer, leases []client.Lease, format string, allNamespaces bool, now time.Time) error {
	switch format {
	case "json", "yaml":
		items := make([]leaseDoc, 0, len(leases))
		for _, l := range leases {
			items = append(items, toLeaseDoc(l))
		}
		return printDoc(w, format, listDoc{APIVersion: "v1", Kind: "List", Items: items})
	case "", "table", "wide":
	default:
		return usage("-o %q: use table, wide, json or yaml", format)
	}
	if len(leases) == 0 {
		_, err := fmt.Fprintln(w, "No leases found.")
		return err
	}
	wide := format == "wide"
	tw := tabwriter.NewWriter(w, 0, 8, 3, ' ', 0)
	var head []string
	if allNamespaces {
		head = append(head, "NAMESPACE")
	}
	head = append(head, "NAME", "HOLDER", "STATUS", "AGE")
	if wide {
		head = append(head, "TOKEN", "TTL", "EXPIRES-IN", "MAX-HOLD", "WAITERS", "TRANSITIONS", "VALUE")
	}
	fmt.Fprintln(tw, strings.Join(head, "\t"))
	for _, l := range leases {
		var row []string
		if allNamespaces {
			row = append(row, namespaceText(l))
		}
		holder, age := "<none>", "<none>"
		if l.Holder != "" {
			holder = holderList(l)
			age = "<unknown>" // an etcd lock taken over before this node saw it
			if !l.AcquireTime.IsZero() {
				age = humanDuration(now.Sub(l.AcquireTime))
			}
		}
		row = append(row, l.Name, holder, statusText(l, now), age)
		if wide {
			token, ttl, expires := "<none>", "<none>", "<none>"
			if l.Holder != "" {
				if l.Kind != client.KindKubernetes { // Kubernetes has no fencing token
					token = strconv.FormatInt(l.Token, 10)
				}
				ttl = l.LeaseDuration.String()
				if !l.RenewTime.IsZero() {
					expires = humanDuration(l.RenewTime.Add(l.LeaseDuration).Sub(now))
				}
			}
			value := l.Value
			if value == "" {
				value = "<none>"
			}
			row = append(row, token, ttl, expires, maxHoldText(l, now), strconv.Itoa(len(l.Waiters)), strconv.FormatInt(l.Transitions, 10), value)
		}
		fmt.Fprintln(tw, strings.Join(row, "\t"))
	}
	return tw.Flush()
}

// statusText is the STATUS column: Held (and how many wait), Waiting
// with the count of waiters when nobody holds it (a lock-delay), or how
// and how long ago the last grant ended, e.g. "Expired 35s ago".
func statusText(l client.Lease, now time.Time) string {
	if l.Kind == client.KindKubernetes {
		return kubernetesStatusText(l, now)
	}
	switch {
	case len(l.Holders) > 0 && len(l.Waiters) > 0:
		return fmt.Sprintf("Held, %d waiting", len(l.Waiters))
	case len(l.Holders) > 0:
		return "Held"
	case len(l.Waiters) > 0:
		return fmt.Sprintf("Waiting (%d)", len(l.Waiters))
	case l.Last != nil && l.Last.Ended != "":
		return strings.ToUpper(l.Last.Ended[:1]) + l.Last.Ended[1:] + " " + humanDuration(now.Sub(l.Last.EndTime)) + " ago"
	}
	return "Free"
}

// maxHoldText is the MAX-HOLD column: the first holder's max hold and
// how much of it is left, "exceeded" once it is past.
func maxHoldText(l client.Lease, now time.Time) string {
	if l.MaxHold <= 0 || l.Holder == "" {
		return "<none>"
	}
	left := l.AcquireTime.Add(l.MaxHold).Sub(now)
	if left <= 0 {
		return l.MaxHold.String() + " (exceeded)"
	}
	return fmt.Sprintf("%v (%s left)", l.MaxHold, humanDuration(left))
}

// holderList shows a semaphore's holders as "a,b (+2)" beyond two.
func holderList(l client.Lease) string {
	if l.Kind == client.KindEtcdLock && len(l.Holders) == 1 {
		// As etcdctl names a lock's owner: by its lease, in hex.
		return fmt.Sprintf("%s (lease %s)", l.Holder, etcdLeaseHex(l.Holders[0].EtcdLease))
	}
	if len(l.Holders) <= 1 {
		return l.Holder
	}
	names := make([]string, 0, len(l.Holders))
	for _, g := range l.Holders {
		names = append(names, g.Holder)
	}
	if len(names) > 2 {
		return fmt.Sprintf("%s (+%d)", strings.Join(names[:2], ","), len(names)-2)
	}
	return strings.Join(names, ",")
}

// kubernetesStatusText is the STATUS column of a Kubernetes Lease:
// Held; Expired and since when, once its holder let RenewTime +
// LeaseDuration pass (client-go would take it over); Released with no
// holder.
func kubernetesStatusText(l client.Lease, now time.Time) string {
	switch l.Status {
	case "held":
		return "Held"
	case "expired":
		return "Expired " + humanDuration(now.Sub(l.RenewTime.Add(l.LeaseDuration))) + " ago"
	case "released":
		return "Released"
	}
	return l.Status
}

// namespaceText is the NAMESPACE column: an etcd lock has none, and
// shows as "(etcd)", which no namespace can be called; a Kubernetes
// Lease shows its Kubernetes namespace under "(kubernetes)/", as the
// metrics label it, so that it is never read as a Tenure namespace.
func namespaceText(l client.Lease) string {
	switch l.Kind {
	case client.KindEtcdLock:
		return "(etcd)"
	case client.KindKubernetes:
		return "(kubernetes)/" + l.Namespace
	}
	return l.Namespace
}

// etcdLeaseHex is an etcd lease ID as etcdctl prints it (lease grant,
// lease list): 16 hex digits. "" for none.
func etcdLeaseHex(id int64) string {
	if id == 0 {
		return ""
	}
	return fmt.Sprintf("%016x", id)
}

// humanDuration is kubectl's short age (k8s.io/apimachinery's
// duration.HumanDuration): 90s, 3m12s, 15m, 5h30m, 2d3h.
func humanDuration(d time.Duration) string {
	if seconds := int(d.Seconds()); seconds < 0 {
		return "0s"
	} else if seconds < 60*2 {
		return fmt.Sprintf("%ds", seconds)
	}
	minutes := int(d / time.Minute)
	if minutes < 10 {
		if s := int(d/time.Second) % 60; s != 0 {
			return fmt.Sprintf("%dm%ds", minutes, s)
		}
		return fmt.Sprintf("%dm", minutes)
	} else if minutes < 60*3 {
		return fmt.Sprintf("%dm", minutes)
	}
	hours := int(d / time.Hour)
	switch {
	case hours < 8:
		if m := minutes % 60; m != 0 {
			return fmt.Sprintf("%dh%dm", hours, m)
		}
		return fmt.Sprintf("%dh", hours)
	case hours < 48:
		return fmt.Sprintf("%dh", hours)
	case hours < 24*8:
		if h := hours % 24; h != 0 {
			return fmt.Sprintf("%dd%dh", hours/24, h)
		}
		return fmt.Sprintf("%dd", hours/24)
	case hours < 24*365*2:
		return fmt.Sprintf("%dd", hours/24)
	}
	return fmt.Sprintf("%dy", hours/24/365)
}

type sessionDoc struct {
	ID            int64             `json:"id"`
	Identity      string            `json:"identity"`
	TTL           string            `json:"ttl"`
	Labels        map[string]string `json:"labels,omitempty"`
	OpenTime      string            `json:"openTime"`
	LastHeartbeat string            `json:"lastHeartbeat,omitempty"`
	Leases        []string          `json:"leases,omitempty"`
	Waiting       []string          `json:"waiting,omitempty"`
	Keys          int64             `json:"keys,omitempty"`
}

func printSessions(w io.Writer, sessions []client.SessionInfo, format string, now time.Time) error {
	switch format {
	case "json", "yaml":
		items := make([]sessionDoc, 0, len(sessions))
		for _, s := range sessions {
			d := sessionDoc{ID: s.ID, Identity: s.Identity, TTL: s.TTL.String(), Labels: s.Labels, OpenTime: microTime(s.OpenTime), Leases: s.Leases, Waiting: s.Waiting, Keys: s.Keys}
			if !s.LastHeartbeat.IsZero() {
				d.LastHeartbeat = microTime(s.LastHeartbeat)
			}
			items = append(items, d)
		}
		return printDoc(w, format, listDoc{APIVersion: "v1", Kind: "List", Items: items})
	case "", "table", "wide":
	default:
		return usage("-o %q: use table, wide, json or yaml", format)
	}
	if len(sessions) == 0 {
		_, err := fmt.Fprintln(w, "No sessions found.")
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 8, 3, ' ', 0)
	fmt.Fprintln(tw, "ID\tIDENTITY\tTTL\tAGE\tLAST-HEARTBEAT\tLEASES\tWAITING")
	for _, s := range sessions {
		hb := "<none>"
		if !s.LastHeartbeat.IsZero() {
			hb = humanDuration(now.Sub(s.LastHeartbeat)) + " ago"
		}
		leases, waiting := strings.Join(s.Leases, ","), strings.Join(s.Waiting, ",")
		if leases == "" {
			leases = "<none>"
		}
		if waiting == "" {
			waiting = "<none>"
		}
		fmt.Fprintf(tw, "%d\t%s\t%v\t%s\t%s\t%s\t%s\n", s.ID, s.Identity, s.TTL, humanDuration(now.Sub(s.OpenTime)), hb, leases, waiting)
	}
	return tw.Flush()
}
