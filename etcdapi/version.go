package etcdapi

// ServerVersion is the version Maintenance Status reports for a Tenure
// build whose own version is tenure ("3.5.0+tenure.v1.4.0"), which
// etcd's /version answers as "etcdserver": the two must not disagree.
func ServerVersion(tenure string) string { return statusVersion(tenure) }
