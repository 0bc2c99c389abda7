package server

import (
	"fmt"
	"regexp"
	"slices"
	"strings"
)

// checkPromQL returns what is wrong with expr, a PromQL expression or a
// label_values() variable query, against metrics.
func checkPromQL(metrics map[string]metricInfo, expr string) []string {
	c := &promChecker{metrics: metrics, seen: map[string]bool{}}
	if m := labelValuesForm.FindStringSubmatch(expr); m != nil {
		c.parse(m[1])
		if v := c.last; v != nil && !v.labels[m[2]] {
			c.problem("label %q is not on %s", m[2], v.from())
		}
	} else {
		c.parse(expr)
	}
	// The parser must have met every Tenure name in the text: one it
	// skipped would go unchecked.
	for _, name := range tenureName.FindAllString(expr, -1) {
		if !c.seen[name] {
			c.problem("%s appears where this test does not read metrics; extend it", name)
		}
	}
	return c.problems
}

var (
	labelValuesForm = regexp.MustCompile(`^label_values\((.+),\s*([a-zA-Z_]\w*)\)$`)
	tenureName      = regexp.MustCompile(`\btenure_[a-z_]+\b`)
	grafanaInterval = regexp.MustCompile(`\$\{?__(rate_interval|interval|range)\}?`)
)

// targetLabels are added by Prometheus to every series it scrapes.
var targetLabels = []string{"instance", "job"}

// promValue is what an expression evaluates to: a scalar, a string, or
// a vector whose series carry labels (names only) and came from metrics.
type promValue struct {
	kind    string // "scalar", "string" or "vector"
	labels  map[string]bool
	metrics []string
}

func (v *promValue) from() string {
	if len(v.metrics) == 0 {
		return "this expression"
	}
	return strings.Join(v.metrics, ", ")
}

func (v *promValue) labelList() string {
	var ls []string
	for l := range v.labels {
		ls = append(ls, l)
	}
	slices.Sort(ls)
	return "{" + strings.Join(ls, ", ") + "}"
}

// promChecker is a recursive-descent parser for the PromQL the
// dashboard uses, which follows labels instead of computing values.
// What it does not know it reports, rather than let pass unchecked.
type promChecker struct {
	metrics  map[string]metricInfo
	toks     []string
	pos      int
	seen     map[string]bool // metric names selected
	last     *promValue
	problems []string
}

func (c *promChecker) problem(format string, args ...any) {
	c.problems = append(c.problems, fmt.Sprintf(format, args...))
}

func (c *promChecker) parse(expr string) {
	expr = grafanaInterval.ReplaceAllString(expr, "5m")
	toks, err := lexPromQL(expr)
	if err != nil {
		c.problem("%v", err)
		return
	}
	c.toks, c.pos = toks, 0
	c.last = c.expr(0)
	if c.pos < len(c.toks) {
		c.problem("unexpected %q after the expression", c.toks[c.pos])
	}
}

var promTok = regexp.MustCompile(`^(\s+|"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|` + "`[^`]*`" +
	`|[0-9.][0-9a-zA-Z.]*|[a-zA-Z_:][a-zA-Z0-9_:]*|==|!=|<=|>=|=~|!~|[-+*/%^<>=(){}\[\],@:])`)

func lexPromQL(s string) ([]string, error) {
	var toks []string
	for s != "" {
		m := promTok.FindString(s)
		if m == "" {
			return nil, fmt.Errorf("cannot read %q", s)
		}
		if strings.TrimSpace(m) != "" {
			toks = append(toks, m)
		}
		s = s[len(m):]
	}
	return toks, nil
}

func (c *promChecker) peek() string {
	if c.pos < len(c.toks) {
		return c.toks[c.pos]
	}
	return ""
}

func (c *promChecker) next() string {
	t := c.peek()
	if t != "" {
		c.pos++
	}
	return t
}

func (c *promChecker) want(tok string) bool {
	if c.peek() != tok {
		c.problem("expected %q, got %q", tok, c.peek())
		c.pos = len(c.toks)
		return false
	}
	c.pos++
	return true
}

// Binary operators by precedence, loosest first.
var binaryPrec = map[string]int{
	"or": 1, "and": 2, "unless": 2,
	"==": 3, "!=": 3, "<": 3, ">": 3, "<=": 3, ">=": 3,
	"+": 4, "-": 4, "*": 5, "/": 5, "%": 5, "atan2": 5, "^": 6,
}

func (c *promChecker) expr(minPrec int) *promValue {
	lhs := c.unary()
	for {
		op := c.peek()
		prec, ok := binaryPrec[op]
		if !ok || prec < minPrec {
			return lhs
		}
		c.next()
		if c.peek() == "bool" {
			c.next()
		}
		switch c.peek() {
		case "on", "ignoring", "group_left", "group_right":
			c.problem("%s(...) is not read by this test; extend it", c.peek())
			c.pos = len(c.toks)
			return lhs
		}
		next := prec + 1
		if op == "^" {
			next = prec // right-associative
		}
		rhs := c.expr(next)
		lhs = c.binary(op, lhs, rhs)
	}
}

func (c *promChecker) binary(op string, l, r *promValue) *promValue {
	if l == nil || r == nil {
		return nil
	}
	if l.kind != "vector" {
		return r
	}
	if r.kind != "vector" {
		return l
	}
	out := &promValue{kind: "vector", labels: l.labels, metrics: append(slices.Clone(l.metrics), r.metrics...)}
	switch op {
	case "and", "unless":
	case "or":
		out.labels = union(l.labels, r.labels)
	default:
		// Without on() or ignoring(), series match on all their labels.
		if !sameLabels(l.labels, r.labels) {
			c.problem("%s %s %s: the sides carry %s and %s, so no series match", l.from(), op, r.from(), l.labelList(), r.labelList())
		}
	}
	return out
}

func (c *promChecker) unary() *promValue {
	if t := c.peek(); t == "-" || t == "+" {
		c.next()
		return c.unary()
	}
	return c.postfix(c.primary())
}

// postfix reads a range or subquery, offset and @ after a value.
func (c *promChecker) postfix(v *promValue) *promValue {
	for {
		switch c.peek() {
		case "[":
			for c.pos < len(c.toks) && c.next() != "]" {
			}
		case "offset":
			c.next()
			if c.peek() == "-" {
				c.next()
			}
			c.next()
		case "@":
			c.next()
			if t := c.next(); t == "start" || t == "end" {
				c.want("(")
				c.want(")")
			}
		default:
			return v
		}
	}
}

var aggregations = map[string]int{ // how many arguments
	"sum": 1, "min": 1, "max": 1, "avg": 1, "group": 1, "stddev": 1, "stdvar": 1, "count": 1,
	"topk": 2, "bottomk": 2, "quantile": 2, "count_values": 2, "limitk": 2, "limit_ratio": 2,
}

// Functions whose result carries their vector argument's labels.
var sameLabelFuncs = map[string]bool{
	"rate": true, "irate": true, "increase": true, "delta": true, "idelta": true, "deriv": true,
	"changes": true, "resets": true, "abs": true, "ceil": true, "floor": true, "round": true,
	"exp": true, "ln": true, "log2": true, "log10": true, "sqrt": true, "clamp": true,
	"clamp_min": true, "clamp_max": true, "sort": true, "sort_desc": true, "timestamp": true,
	"predict_linear": true, "avg_over_time": true, "min_over_time": true, "max_over_time": true,
	"sum_over_time": true, "count_over_time": true, "last_over_time": true, "quantile_over_time": true,
	"stddev_over_time": true, "stdvar_over_time": true, "present_over_time": true,
}

func (c *promChecker) primary() *promValue {
	t := c.next()
	switch {
	case t == "(":
		v := c.expr(0)
		c.want(")")
		return v
	case t == "":
		c.problem("the expression ends early")
		return nil
	case t[0] == '"' || t[0] == '\'' || t[0] == '`':
		return &promValue{kind: "string"}
	case t[0] >= '0' && t[0] <= '9' || t[0] == '.' || t == "Inf" || t == "NaN":
		return &promValue{kind: "scalar"}
	case aggregations[t] > 0:
		return c.aggregation(t)
	case c.peek() == "(":
		return c.call(t)
	case t == "{":
		c.problem("a selector without a metric name is not read by this test")
		c.pos = len(c.toks)
		return nil
	default:
		return c.selector(t)
	}
}

func (c *promChecker) aggregation(op string) *promValue {
	var clause string
	var grouping []string
	readGrouping := func() {
		if t := c.peek(); t == "by" || t == "without" {
			clause = c.next()
			grouping = c.labelList()
		}
	}
	readGrouping()
	args := c.args()
	if clause == "" {
		readGrouping()
	}
	if len(args) != aggregations[op] {
		c.problem("%s takes %d argument(s), got %d", op, aggregations[op], len(args))
		return nil
	}
	in := args[len(args)-1]
	if in == nil {
		return nil
	}
	var missing []string
	for _, l := range grouping {
		if !in.labels[l] {
			missing = append(missing, l)
		}
	}
	if len(missing) > 0 {
		c.problem("%s %s (%s): %s not on %s, which carries %s", op, clause, strings.Join(grouping, ", "),
			strings.Join(missing, ", "), in.from(), in.labelList())
	}
	out := &promValue{kind: "vector", labels: map[string]bool{}, metrics: in.metrics}
	switch {
	case op == "topk" || op == "bottomk" || op == "limitk" || op == "limit_ratio":
		out.labels = in.labels
	case clause == "by":
		for _, l := range grouping {
			out.labels[l] = true
		}
	case clause == "without":
		for l := range in.labels {
			if !slices.Contains(grouping, l) {
				out.labels[l] = true
			}
		}
	}
	if op == "count_values" {
		c.problem("count_values is not read by this test; extend it")
	}
	return out
}

func (c *promChecker) call(fn string) *promValue {
	args := c.args()
	if slices.Contains(args, nil) {
		return nil
	}
	vector := func() *promValue {
		for _, a := range args {
			if a.kind == "vector" {
				return a
			}
		}
		c.problem("%s: got = no vector argument", fn)
		return nil
	}
	switch {
	case sameLabelFuncs[fn]:
		return vector()
	case fn == "histogram_quantile":
		v := vector()
		if v == nil {
			return nil
		}
		if !v.labels["le"] {
			c.problem("histogram_quantile over %s without le: its buckets were aggregated away", v.from())
		}
		out := &promValue{kind: "vector", labels: union(v.labels, nil), metrics: v.metrics}
		delete(out.labels, "le")
		return out
	case fn == "scalar" || fn == "time" || fn == "pi":
		return &promValue{kind: "scalar"}
	case fn == "vector" || fn == "absent" || fn == "absent_over_time":
		return &promValue{kind: "vector", labels: map[string]bool{}}
	default:
		c.problem("function %s is not read by this test; extend it", fn)
		return nil
	}
}

// args reads a parenthesised, comma-separated argument list.
func (c *promChecker) args() []*promValue {
	if !c.want("(") {
		return nil
	}
	var args []*promValue
	for c.peek() != ")" && c.pos < len(c.toks) {
		args = append(args, c.expr(0))
		if c.peek() == "," {
			c.next()
		}
	}
	c.want(")")
	return args
}

// labelList reads "(a, b, ...)" after by or without.
func (c *promChecker) labelList() []string {
	var ls []string
	if !c.want("(") {
		return nil
	}
	for t := c.next(); t != ")" && t != ""; t = c.next() {
		if t != "," {
			ls = append(ls, t)
		}
	}
	return ls
}

// selector resolves a metric name, a histogram's _bucket, _sum or
// _count and a summary's _sum or _count included, and checks the labels
// its matchers name.
func (c *promChecker) selector(name string) *promValue {
	c.seen[name] = true
	var matchers []string
	if c.peek() == "{" {
		c.next()
		for c.pos < len(c.toks) && c.peek() != "}" {
			label, op, val := c.next(), c.next(), c.next()
			if !slices.Contains([]string{"=", "!=", "=~", "!~"}, op) || val == "" || !strings.ContainsAny(val[:1], "\"'`") {
				c.problem("%s{...}: cannot read the matcher %s %s %s", name, label, op, val)
				c.pos = len(c.toks)
				return nil
			}
			matchers = append(matchers, label)
			if c.peek() == "," {
				c.next()
			}
		}
		c.want("}")
	}
	// go_ and process_ are the standard collectors the server registers,
	// grpc_server_ etcd's names for the etcd API's calls.
	if !strings.HasPrefix(name, "tenure_") && !strings.HasPrefix(name, "go_") && !strings.HasPrefix(name, "process_") && !strings.HasPrefix(name, "grpc_server_") {
		c.problem("%s is not a Tenure metric", name)
		return nil
	}
	info, ok := c.metrics[name]
	if ok && info.histogram {
		c.problem("%s is a histogram: Prometheus stores only its _bucket, _sum and _count series", name)
		return nil
	}
	labels := union(info.labels, nil)
	if !ok {
		for _, suffix := range []string{"_bucket", "_sum", "_count"} {
			base, cut := strings.CutSuffix(name, suffix)
			h, found := c.metrics[base]
			if !cut || !found {
				continue
			}
			if h.summary && suffix != "_bucket" {
				ok, labels = true, union(h.labels, nil)
				delete(labels, "quantile")
				break
			}
			if !h.histogram {
				if h.described {
					c.problem("%s: %s has no series yet, so the test cannot tell it is a histogram; give it one in exerciseMetrics", name, base)
				} else {
					c.problem("%s does not exist: %s is not a histogram", name, base)
				}
				return nil
			}
			ok, labels = true, union(h.labels, nil)
			if suffix == "_bucket" {
				labels["le"] = true
			}
			break
		}
	}
	if !ok {
		c.problem("%s does not exist in the server's registry", name)
		return nil
	}
	for _, l := range targetLabels {
		labels[l] = true
	}
	for _, l := range matchers {
		if !labels[l] && l != "__name__" {
			c.problem("%s{%s=...}: label %q is not on %s, which carries %s", name, l, l, name,
				(&promValue{labels: labels}).labelList())
		}
	}
	return &promValue{kind: "vector", labels: labels, metrics: []string{name}}
}

func union(a, b map[string]bool) map[string]bool {
	out := map[string]bool{}
	for l := range a {
		out[l] = true
	}
	for l := range b {
		out[l] = true
	}
	return out
}

func sameLabels(a, b map[string]bool) bool {
	if len(a) != len(b) {
		return false
	}
	for l := range a {
		if !b[l] {
			return false
		}
	}
	return true
}
