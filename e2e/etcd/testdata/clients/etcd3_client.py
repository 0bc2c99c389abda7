"""Drives an etcd API with python-etcd3 (Debian's python3-etcd3), as
OpenStack and many tools do, and prints what it saw, one line per step,
bytes in hex: the Go test runs it against etcd and against Tenure and
requires the same lines. Usage: python3 etcd3_client.py HOST:PORT"""
import sys

import etcd3

host, port = sys.argv[1].rsplit(":", 1)
c = etcd3.client(host=host, port=int(port), timeout=10)


def show(label, *vals):
    out = []
    for v in vals:
        out.append(v.hex() if isinstance(v, bytes) else str(v))
    print(label, *out, flush=True)


# Keys and values of any bytes.
c.put(b"/py/\xff", b"\x00\xfe")
c.put(b"/py/\xfe", b"two")
value, meta = c.get(b"/py/\xff")
show("get", meta.key, value)
show("prefix", *[m.key for _, m in c.get_prefix(b"/py/")])

# A compare of \x00\xfe with \x00\xfd fails; with itself it holds.
ok, _ = c.transaction(
    compare=[c.transactions.value(b"/py/\xff") == b"\x00\xfd"],
    success=[c.transactions.put(b"/py/swapped", b"1")],
    failure=[c.transactions.get(b"/py/\xff")],
)
show("txn unequal", ok)
ok, _ = c.transaction(
    compare=[c.transactions.value(b"/py/\xff") == b"\x00\xfe"],
    success=[c.transactions.put(b"/py/swapped", b"1")],
    failure=[],
)
show("txn equal", ok)

# A prefix whose range end is not UTF-8 deletes what it names.
for k in ["/py/u/п", "/py/u/пример", "/py/u/рыба", "/py/u/日本", "/py/u/zebra"]:
    c.put(k.encode(), b"v")
show("delete prefix", c.delete_prefix("/py/u/п".encode()).deleted)
show("left", *[m.key for _, m in c.get_prefix(b"/py/u/")])

# The lock recipe stores a binary UUID and asks whether it is still its own.
lock = c.lock("job", ttl=30)
show("acquired", lock.acquire(timeout=5))
show("is_acquired", lock.is_acquired())
# (Debian's python3-etcd3 0.12 fails a contended acquire with a timeout:
# its retry helper predates the tenacity it runs on. The other lock only
# asks while it is held, and acquires once it is free.)
other = c.lock("job", ttl=30)
show("other is_acquired", other.is_acquired())
lock.release()
show("is_acquired after release", lock.is_acquired())
show("other acquired after release", other.acquire(timeout=5))
show("other is_acquired", other.is_acquired())
other.release()

# A lease with a key of bytes, and a watch that sees it.
lease = c.lease(60)
events, cancel = c.watch_prefix(b"/py/w/")
c.put(b"/py/w/\x80", b"\xc0\xaf", lease=lease)
for ev in events:
    show("watch", type(ev).__name__, ev.key, ev.value)
    break
cancel()
show("lease keys", *sorted(lease.keys))
lease.revoke()
show("after revoke", *[m.key for _, m in c.get_prefix(b"/py/w/")])
