package auth_test

import (
	"fmt"

	"github.com/tenurehq/tenure/auth"
)

// A policy that lets the scheduler take locks in team-a and keep its
// configuration under the key prefix "team-a/", as itself or as
// "scheduler/<anything>", at most 10 requests a second and 5 sessions.
func ExamplePolicy_For() {
	p, err := auth.Parse([]byte(`
roles:
  team-a:
    - namespaces: [team-a]
      verbs: [read, lock]
    - keys: ["team-a/"]
      verbs: [read, write]
principals:
  - name: scheduler
    roles: [team-a]
    limits: {requests_per_second: 10, sessions: 5, waits: 50, watches: 10}
`))
	if err != nil {
		fmt.Println(err)
		return
	}
	g := p.For("scheduler")
	fmt.Println("lock in team-a:", g.Namespace(auth.Lock, "team-a"))
	fmt.Println("lock in team-b:", g.Namespace(auth.Lock, "team-b"))
	fmt.Println("validate in team-a:", g.Namespace(auth.Validate, "team-a"))
	fmt.Println("revoke in team-a:", g.Namespace(auth.Admin, "team-a"))
	fmt.Println("write team-a/config:", g.Key(auth.Write, "team-a/config"))
	fmt.Println("write team-b/config:", g.Key(auth.Write, "team-b/config"))
	fmt.Println("hold as scheduler/pod-1:", g.Identity("scheduler/pod-1"))
	fmt.Println("hold as billing:", g.Identity("billing"))
	fmt.Println("cluster admin:", g.ClusterAdmin())
	fmt.Printf("limits: %+v\n", g.Limits)
	fmt.Println("a stranger is known:", p.For("stranger").Known())
	// Output:
	// lock in team-a: true
	// lock in team-b: false
	// validate in team-a: true
	// revoke in team-a: false
	// write team-a/config: true
	// write team-b/config: false
	// hold as scheduler/pod-1: true
	// hold as billing: false
	// cluster admin: false
	// limits: {RequestsPerSecond:10 Burst:20 Sessions:5 Waits:50 Watches:10}
	// a stranger is known: false
}

// Parse refuses a policy that stores a token itself rather than its
// hash, and says where; the error does not repeat the token.
func ExampleParse() {
	_, err := auth.Parse([]byte(`
principals:
  - name: scheduler
    tokens:
      - sha256: tnr_6bW1pV9sQe0u8kXz
`))
	fmt.Println(err)
	// Output:
	// invalid policy: principals[0] (scheduler): tokens[0]: sha256 holds a token, not its hash: store what "tenure auth token" prints as sha256 and give the token only to its holder
}
