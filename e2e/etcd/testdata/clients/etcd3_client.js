// Drives an etcd API with the etcd3 package from npm (the Node client), and
// prints what it saw, one line per step, bytes in hex: the Go test runs it
// against etcd and against Tenure and requires the same lines.
// Usage: node etcd3_client.js HOST:PORT
'use strict';
const { Etcd3 } = require('etcd3');

const client = new Etcd3({ hosts: process.argv[2] });
const hex = (b) => Buffer.from(b).toString('hex');
const show = (label, ...vals) =>
  console.log(label, ...vals.map((v) => (Buffer.isBuffer(v) ? hex(v) : String(v))));

async function main() {
  // Keys and values of any bytes.
  await client.put(Buffer.from([0x2f, 0x6a, 0x73, 0x2f, 0xff])).value(Buffer.from([0x00, 0xfe]));
  await client.put(Buffer.from([0x2f, 0x6a, 0x73, 0x2f, 0xfe])).value('two');
  show('get', await client.get(Buffer.from([0x2f, 0x6a, 0x73, 0x2f, 0xff])).buffer());
  const keys = await client.getAll().prefix('/js/').keyBuffers();
  show('prefix', ...keys);

  // A compare of 00 fe with 00 fd fails.
  const r = await client
    .if(Buffer.from([0x2f, 0x6a, 0x73, 0x2f, 0xff]), 'Value', '==', Buffer.from([0x00, 0xfd]))
    .then(client.put('/js/swapped').value('1'))
    .commit();
  show('txn unequal', r.succeeded);

  // A prefix whose range end is not UTF-8 deletes what it names.
  for (const k of ['/js/u/п', '/js/u/пример', '/js/u/рыба', '/js/u/日本', '/js/u/zebra']) {
    await client.put(k).value('v');
  }
  const del = await client.delete().prefix('/js/u/п');
  show('delete prefix', del.deleted);
  show('left', ...(await client.getAll().prefix('/js/u/').keyBuffers()));

  // The lock recipe, and an election whose value is binary.
  await client.lock('js-job').ttl(30).do(async () => show('locked', 'yes'));
  const election = client.election('js-el', 30);
  const campaign = election.campaign(Buffer.from([0x9f, 0x00, 0xff]).toString('latin1'));
  await new Promise((resolve, reject) => {
    campaign.on('elected', resolve);
    campaign.on('error', reject);
  });
  show('leader', Buffer.from(await election.leader(), 'latin1'));
  await campaign.resign();

  // A watch sees a key of bytes.
  const watcher = await client.watch().prefix('/js/w/').create();
  const seen = new Promise((resolve) => watcher.on('put', (kv) => resolve(kv)));
  await client.put(Buffer.from([0x2f, 0x6a, 0x73, 0x2f, 0x77, 0x2f, 0x80])).value(Buffer.from([0xc0, 0xaf]));
  const kv = await seen;
  show('watch', kv.key, kv.value);
  await watcher.cancel();
}

main()
  .then(() => client.close())
  .catch((err) => {
    console.log('error', err.message);
    client.close();
    process.exitCode = 1;
  });
