//go:build linux

package etcd

import (
	"fmt"
	"strconv"
	"strings"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
)

// parseScript reads a sequence in the script form diffops_test.go
// describes. A line may start with its number, as the fuzzer prints a
// shrunk sequence; '#' starts a comment.
func parseScript(text string) ([]operation, error) {
	var ops []operation
	for n, line := range strings.Split(text, "\n") {
		if i := commentStart(line); i >= 0 {
			line = line[:i]
		}
		toks, err := tokenize(line)
		if err != nil {
			return nil, fmt.Errorf("line %d: %v", n+1, err)
		}
		if len(toks) > 0 {
			if _, err := strconv.Atoi(toks[0]); err == nil {
				toks = toks[1:]
			}
		}
		if len(toks) == 0 {
			continue
		}
		p := &parser{toks: toks}
		o, err := p.op(true)
		if err == nil && !p.done() {
			err = fmt.Errorf("unexpected %q", p.peek())
		}
		if err != nil {
			return nil, fmt.Errorf("line %d: %v", n+1, err)
		}
		ops = append(ops, o)
	}
	return ops, nil
}

// commentStart is the index of the '#' that starts a comment on line,
// outside quotes, or -1.
func commentStart(line string) int {
	for i := 0; i < len(line); i++ {
		switch line[i] {
		case '"':
			q, err := strconv.QuotedPrefix(line[i:])
			if err != nil {
				return -1 // tokenize reports it
			}
			i += len(q) - 1
		case '#':
			return i
		}
	}
	return -1
}

// tokenize splits a line into quoted strings (kept quoted), the
// punctuation ( ) , ; and words.
func tokenize(line string) ([]string, error) {
	var toks []string
	for i := 0; i < len(line); {
		c := line[i]
		switch {
		case c == ' ' || c == '\t' || c == '\r':
			i++
		case c == '"':
			q, err := strconv.QuotedPrefix(line[i:])
			if err != nil {
				return nil, fmt.Errorf("bad quoted string at %q", line[i:])
			}
			toks = append(toks, q)
			i += len(q)
		case strings.IndexByte("(),;", c) >= 0:
			toks = append(toks, string(c))
			i++
		default:
			j := i
			for j < len(line) && strings.IndexByte(" \t\r\"(),;", line[j]) < 0 {
				j++
			}
			toks = append(toks, line[i:j])
			i = j
		}
	}
	return toks, nil
}

type parser struct {
	toks []string
	i    int
}

func (p *parser) done() bool { return p.i >= len(p.toks) }

func (p *parser) peek() string {
	if p.done() {
		return ""
	}
	return p.toks[p.i]
}

func (p *parser) next() string {
	t := p.peek()
	p.i++
	return t
}

func (p *parser) expect(t string) error {
	if got := p.next(); got != t {
		return fmt.Errorf("expected %q, got %q", t, got)
	}
	return nil
}

func (p *parser) quoted() (string, error) {
	t := p.next()
	if !strings.HasPrefix(t, `"`) {
		return "", fmt.Errorf("expected a quoted string, got %q", t)
	}
	return strconv.Unquote(t)
}

// keyRange reads KEY [end=END | prefix | fromkey].
func (p *parser) keyRange() (keyRange, error) {
	k, err := p.quoted()
	if err != nil {
		return keyRange{}, err
	}
	r := keyRange{key: k}
	switch p.peek() {
	case "end=":
		p.next()
		r.kind = toEnd
		r.end, err = p.quoted()
	case "prefix":
		p.next()
		r.kind = prefix
	case "fromkey":
		p.next()
		r.kind = fromKey
	}
	return r, err
}

// options reads name and name=value words up to the end of the operation
// (a ; or ) or the line's end), calling set for each.
func (p *parser) options(set func(name, value string) error) error {
	for !p.done() && p.peek() != ";" && p.peek() != ")" {
		name, value, _ := strings.Cut(p.next(), "=")
		if err := set(name, value); err != nil {
			return err
		}
	}
	return nil
}

func unknown(verb, name string) error { return fmt.Errorf("%s: unknown option %q", verb, name) }

// op reads one operation; top is false inside a txn, where only range,
// put, delete and txn may appear.
func (p *parser) op(top bool) (operation, error) {
	verb := p.next()
	switch verb {
	case "range":
		r, err := p.keyRange()
		if err != nil {
			return nil, err
		}
		o := &rangeOp{r: r}
		return o, p.options(func(name, v string) (err error) {
			switch name {
			case "limit":
				o.limit, err = strconv.ParseInt(v, 10, 64)
			case "rev":
				o.rev, err = parseRev(v)
			case "sort":
				t, ord, _ := strings.Cut(v, "/")
				tv, ok1 := pb.RangeRequest_SortTarget_value[t]
				ov, ok2 := pb.RangeRequest_SortOrder_value[ord]
				if !ok1 || !ok2 {
					return fmt.Errorf("bad sort %q", v)
				}
				o.sorted, o.target, o.order = true, pb.RangeRequest_SortTarget(tv), pb.RangeRequest_SortOrder(ov)
			case "serializable":
				o.serializable = true
			case "keys_only":
				o.keysOnly = true
			case "count_only":
				o.countOnly = true
			case "min_mod":
				o.minMod, err = parseRev(v)
			case "max_mod":
				o.maxMod, err = parseRev(v)
			case "min_create":
				o.minCreate, err = parseRev(v)
			case "max_create":
				o.maxCreate, err = parseRev(v)
			default:
				return unknown(verb, name)
			}
			return err
		})
	case "put":
		k, err := p.quoted()
		if err != nil {
			return nil, err
		}
		v, err := p.quoted()
		if err != nil {
			return nil, err
		}
		o := &putOp{key: k, value: v}
		return o, p.options(func(name, v string) (err error) {
			switch name {
			case "prev_kv":
				o.prevKV = true
			case "ignore_value":
				o.ignoreValue = true
			case "ignore_lease":
				o.ignoreLease = true
			case "lease":
				o.lease, err = parseLease(v)
			default:
				return unknown(verb, name)
			}
			return err
		})
	case "delete":
		r, err := p.keyRange()
		if err != nil {
			return nil, err
		}
		o := &deleteOp{r: r}
		return o, p.options(func(name, v string) error {
			if name != "prev_kv" {
				return unknown(verb, name)
			}
			o.prevKV = true
			return nil
		})
	case "txn":
		return p.txn()
	}
	if !top {
		return nil, fmt.Errorf("%q cannot be inside a txn", verb)
	}
	switch verb {
	case "compact":
		r, err := parseRev(p.next())
		if err != nil {
			return nil, err
		}
		o := &compactOp{rev: r}
		return o, p.options(func(name, v string) error {
			if name != "physical" {
				return unknown(verb, name)
			}
			o.physical = true
			return nil
		})
	case "grant":
		l, err := parseLease(p.next())
		if err != nil {
			return nil, err
		}
		o := &grantOp{lease: l}
		return o, p.options(func(name, v string) (err error) {
			if name != "ttl" {
				return unknown(verb, name)
			}
			o.ttl, err = strconv.ParseInt(v, 10, 64)
			return err
		})
	case "leases":
		return &leaseOp{verb: verb}, nil
	case "revoke", "timetolive", "keepalive":
		l, err := parseLease(p.next())
		if err != nil {
			return nil, err
		}
		o := &leaseOp{verb: verb, lease: l}
		return o, p.options(func(name, v string) error {
			if name != "keys" || verb != "timetolive" {
				return unknown(verb, name)
			}
			o.keys = true
			return nil
		})
	case "watch":
		w, err := strconv.Atoi(p.next())
		if err != nil {
			return nil, fmt.Errorf("watch: bad watch number: %v", err)
		}
		r, err := p.keyRange()
		if err != nil {
			return nil, err
		}
		o := &watchOp{w: w, r: r}
		return o, p.options(func(name, v string) (err error) {
			switch name {
			case "from":
				o.from, err = parseRev(v)
			case "prev_kv":
				o.prevKV = true
			case "noput":
				o.noPut = true
			case "nodelete":
				o.noDelete = true
			case "id":
				o.id, err = strconv.ParseInt(v, 10, 64)
			case "once":
				o.once = true
			case "on":
				o.on, err = strconv.Atoi(v)
			default:
				return unknown(verb, name)
			}
			return err
		})
	case "cancel":
		w, err := strconv.Atoi(p.next())
		if err != nil {
			return nil, fmt.Errorf("cancel: bad watch number: %v", err)
		}
		return &cancelOp{w: w}, nil
	}
	return nil, fmt.Errorf("unknown operation %q", verb)
}

// txn reads if(CMP, ...) then(OP; ...) else(OP; ...) after "txn".
func (p *parser) txn() (operation, error) {
	o := &txnOp{}
	if err := p.expect("if"); err != nil {
		return nil, err
	}
	if err := p.expect("("); err != nil {
		return nil, err
	}
	for p.peek() != ")" {
		if len(o.cmps) > 0 {
			if err := p.expect(","); err != nil {
				return nil, err
			}
		}
		c, err := p.compare()
		if err != nil {
			return nil, err
		}
		o.cmps = append(o.cmps, c)
	}
	p.next()
	for _, b := range []string{"then", "else"} {
		if err := p.expect(b); err != nil {
			return nil, err
		}
		if err := p.expect("("); err != nil {
			return nil, err
		}
		var ops []operation
		for p.peek() != ")" {
			if len(ops) > 0 {
				if err := p.expect(";"); err != nil {
					return nil, err
				}
			}
			op, err := p.op(false)
			if err != nil {
				return nil, err
			}
			ops = append(ops, op)
		}
		p.next()
		if b == "then" {
			o.then = ops
		} else {
			o.els = ops
		}
	}
	return o, nil
}

// compare reads TARGET(KEY [range]) RESULT VALUE.
func (p *parser) compare() (compare, error) {
	var c compare
	name := p.next()
	found := false
	for t, n := range targetNames {
		if n == name {
			c.target, found = t, true
		}
	}
	if !found {
		return c, fmt.Errorf("unknown compare target %q", name)
	}
	if err := p.expect("("); err != nil {
		return c, err
	}
	r, err := p.keyRange()
	if err != nil {
		return c, err
	}
	c.r = r
	if err := p.expect(")"); err != nil {
		return c, err
	}
	res := p.next()
	found = false
	for r, n := range resultNames {
		if n == res {
			c.result, found = r, true
		}
	}
	if !found {
		return c, fmt.Errorf("unknown compare result %q", res)
	}
	v := p.next()
	switch c.target {
	case pb.Compare_VALUE:
		c.value, err = strconv.Unquote(v)
	case pb.Compare_VERSION:
		c.n, err = strconv.ParseInt(v, 10, 64)
	case pb.Compare_CREATE, pb.Compare_MOD:
		c.rev, err = parseRev(v)
	case pb.Compare_LEASE:
		c.lease, err = parseLease(v)
	}
	return c, err
}
