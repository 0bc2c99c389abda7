package etcdapi

// ServerVersion is the version Maintenance Status reports for a Tenure
// build whose own version is tenure ("3.5.13+tenure.v1.4.0"), which
// etcd's /version answers as "etcdserver": the two must not disagree.
func ServerVersion(tenure string) string { return statusVersion(tenure) }

// ClusterVersion is the etcd cluster version every member speaks, as
// etcd's /version names it: major.minor.0 of APIVersion, as etcd's
// cluster versions are.
const ClusterVersion = "3.5.0"
