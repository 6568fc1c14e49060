//go:build !linux

package netguard

import (
	"errors"
	"net/netip"
	"runtime"
)

func supported() error {
	return errors.New("finding the process behind a local connection needs Linux's /proc; not on " + runtime.GOOS)
}

var errNoSocket = errors.New("no such socket")

func socketInode(local, remote netip.AddrPort) (uint64, error) { return 0, supported() }

func holds(pid int, inode uint64) bool { return false }

func descendants(parents []int) []int { return nil }
