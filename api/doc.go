// Package api is the vocabulary the server and its clients share beyond
// the protobuf messages in tenure/v1: the names of wire errors, the
// default namespace, and what a lease name is.
//
// Why it is its own package: the server and the client must agree on
// these, and neither may import the other. The generated code cannot hold
// them (a proto enum would put "ERROR_REASON_NOT_HOLDER" on the wire
// where curl users read "not-holder"), and a copy in each side is how the
// two tables drifted before. It imports only the standard library, so the
// client's dependency list does not grow.
package api
