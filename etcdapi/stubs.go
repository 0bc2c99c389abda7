package etcdapi

// Placeholders until each service is written; each file that implements
// a service deletes its line here.
