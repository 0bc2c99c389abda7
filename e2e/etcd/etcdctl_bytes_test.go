//go:build linux

package etcd

// ctlBytes is issue 28's report, as a user of etcdctl met it: keys and
// values that are not UTF-8 must come back as given (etcd's output, raw
// and base64 in JSON, is the reference), two keys that differ only in
// such a byte stay two, a compare of \xff with \xfe fails, and a prefix
// whose range end is not UTF-8 (п is d0 bf, its end d0 c0) deletes what
// it names and no more.
func ctlBytes(c *ctl) {
	c.run("put", "/b", "\xff\xfe")
	c.run("get", "/b")
	c.run("get", "/b", "-w", "json")
	c.run("put", "/c/\xff", "one")
	c.run("put", "/c/\xfe", "two")
	c.run("get", "--prefix", "/c/")
	c.run("get", "--prefix", "/c/", "-w", "json")
	c.run("put", "/cas", "\xff")
	txn := "value(\"/cas\") = \"\xfe\"\n\nput /cas swapped\n\nget /cas\n\n"
	c.runIn(txn, "txn")
	c.runIn(txn, "txn", "-w", "json")
	c.run("get", "/cas")
	for _, k := range []string{"/u/п", "/u/пример", "/u/рыба", "/u/日本", "/u/zebra"} {
		c.run("put", k, "v")
	}
	c.run("del", "--prefix", "/u/п")
	c.run("get", "--prefix", "/u/", "--keys-only")
	c.run("put", "\x00", "\x00")
	c.run("get", "\x00", "-w", "json")
	c.run("get", "--from-key", "\x00", "--keys-only")
}
