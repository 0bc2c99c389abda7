"""Drives etcd's JSON gateway with etcd3gw (Debian's python3-etcd3gw), as
OpenStack does, and prints what it saw, one line per step, bytes in hex:
the Go test runs it against etcd and against Tenure and requires the
same lines. Usage: python3 etcd3gw_client.py HOST:PORT"""
import sys

from etcd3gw.client import Etcd3Client

host, port = sys.argv[1].rsplit(":", 1)
# etcd3gw 2.0 defaults to /v3alpha/, which etcd 3.4 and 3.5 no longer
# serve; /v3/ is what both serve.
c = Etcd3Client(host=host, port=int(port), timeout=10, api_path="/v3/")


def show(label, *vals):
    out = []
    for v in vals:
        out.append(v.hex() if isinstance(v, bytes) else str(v))
    print(label, *out, flush=True)


# Keys and values of any bytes.
show("put", c.put(b"/gw/\xff", b"\x00\xfe"))
c.put(b"/gw/\xfe", b"two")
show("get", *c.get(b"/gw/\xff"))
value, meta = c.get(b"/gw/\xff", metadata=True)[0]
show("get meta", meta["key"], value, meta["version"], "lease" in meta)
show("prefix", *[m["key"] for _, m in c.get_prefix(b"/gw/")])
show("prefix descend", *[m["key"] for _, m in c.get_prefix(b"/gw/", sort_order="descend")])
show("missing", c.get(b"/gw/none"))

# create holds only for a key that is not there; replace compares.
show("create new", c.create(b"/gw/c", b"1"))
show("create again", c.create(b"/gw/c", b"2"))
show("replace unequal", c.replace(b"/gw/c", b"x", b"3"))
show("replace equal", c.replace(b"/gw/c", b"1", b"3"))
show("after replace", *c.get(b"/gw/c"))

# A prefix whose range end is not UTF-8 deletes what it names.
for k in ["/gw/u/п", "/gw/u/пример", "/gw/u/рыба", "/gw/u/zebra"]:
    c.put(k.encode(), b"v")
show("delete prefix", c.delete_prefix("/gw/u/п".encode()))
show("left", *[m["key"] for _, m in c.get_prefix(b"/gw/u/")])
show("delete", c.delete(b"/gw/c"), c.get(b"/gw/c"))

# A lease with keys: its TTL, its keys, a refresh, its end.
lease = c.lease(60)
c.put(b"/gw/l/\x80", b"\xc0\xaf", lease=lease)
show("lease ttl", 55 <= lease.ttl() <= 60)
show("lease keys", *lease.keys())
show("lease refresh", lease.refresh())
show("lease revoke", lease.revoke())
show("after revoke", *[m["key"] for _, m in c.get_prefix(b"/gw/l/")])
show("ttl after revoke", lease.ttl())

# etcd3gw's lock recipe: a key under /locks/ held by a lease.
lock = c.lock("job", ttl=30)
show("acquired", lock.acquire())
show("is_acquired", lock.is_acquired())
other = c.lock("job", ttl=30)
show("other acquired while held", other.acquire())
show("released", lock.release())
show("other acquired after release", other.acquire())
other.release()

# Watches stream: one event, then a prefix watch's events in order.
events, cancel = c.watch_prefix(b"/gw/w/")
c.put(b"/gw/w/a", b"\x01")
c.put(b"/gw/w/b", b"\x02")
c.delete(b"/gw/w/a")
seen = []
for ev in events:
    seen.append(ev)
    if len(seen) == 3:
        break
cancel()
for ev in seen:
    kv = ev["kv"]
    show("watch", ev.get("type", "PUT"), kv["key"], kv.get("value", b""))

# The member and status answers, in the fields both servers share.
members = c.members()
show("members", len(members), sorted(members[0].keys()))
status = c.status()
show("status", sorted(k for k in status.keys() if k not in ("raftAppliedIndex", "dbSizeInUse")), status["leader"] == status["header"]["member_id"])
