package cli

import "golang.org/x/sys/unix"

// becomeSubreaper makes orphaned grandchildren reparent to tenure, not to
// init, so that it can reap them and know when the group is really gone.
func becomeSubreaper() { _ = unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) }
