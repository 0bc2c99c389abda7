//go:build !linux

package cli

// becomeSubreaper is Linux-only; elsewhere orphans go to init, and the
// group is known gone once kill(-pgid, 0) fails.
func becomeSubreaper() {}
