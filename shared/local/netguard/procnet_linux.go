package netguard

import (
	"bufio"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// supported: this system has /proc/net/tcp and /proc/<pid>/fd.
func supported() error {
	if _, err := os.Stat("/proc/net/tcp"); err != nil {
		return fmt.Errorf("no /proc/net/tcp: %w", err)
	}
	return nil
}

// errNoSocket: no socket of this machine has these ends (the caller is already gone).
var errNoSocket = errors.New("no such socket")

// socketInode finds the inode of the TCP socket whose local end is local and whose
// remote end is remote: from the kernel's socket diagnostics, or where it has none,
// in /proc/net/tcp and /proc/net/tcp6.
func socketInode(local, remote netip.AddrPort) (uint64, error) {
	ino, err := diagInode(local, remote)
	if !errors.Is(err, errNoDiag) {
		return ino, err
	}
	return scanInode(local, remote)
}

func scanInode(local, remote netip.AddrPort) (uint64, error) {
	for _, f := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		ino, err := scanTCP(f, local, remote)
		if err == nil {
			return ino, nil
		}
		if !errors.Is(err, errNoSocket) {
			return 0, err
		}
	}
	return 0, errNoSocket
}

func scanTCP(path string, local, remote netip.AddrPort) (uint64, error) {
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return 0, errNoSocket // no IPv6 on this machine
	}
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Scan() // the header
	for sc.Scan() {
		// sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode …
		fs := strings.Fields(sc.Text())
		if len(fs) < 10 {
			continue
		}
		l, err1 := parseProcAddr(fs[1])
		r, err2 := parseProcAddr(fs[2])
		if err1 != nil || err2 != nil || !sameEnd(l, local) || !sameEnd(r, remote) {
			continue
		}
		ino, err := strconv.ParseUint(fs[9], 10, 64)
		if err != nil || ino == 0 {
			continue // a socket being torn down has inode 0
		}
		return ino, nil
	}
	if err := sc.Err(); err != nil {
		return 0, fmt.Errorf("read %s: %w", path, err)
	}
	return 0, errNoSocket
}

func sameEnd(a, b netip.AddrPort) bool {
	return a.Port() == b.Port() && a.Addr().Unmap() == b.Addr().Unmap()
}

// parseProcAddr parses "0100007F:1F90": the address as 32-bit words in the
// machine's byte order, then the port in hex.
func parseProcAddr(s string) (netip.AddrPort, error) {
	h, p, ok := strings.Cut(s, ":")
	if !ok {
		return netip.AddrPort{}, fmt.Errorf("address %q", s)
	}
	port, err := strconv.ParseUint(p, 16, 16)
	if err != nil {
		return netip.AddrPort{}, err
	}
	raw, err := hex.DecodeString(h)
	if err != nil || (len(raw) != 4 && len(raw) != 16) {
		return netip.AddrPort{}, fmt.Errorf("address %q", s)
	}
	// Each 32-bit word is printed as a number in host order: undo it word by word.
	b := make([]byte, len(raw))
	for i := 0; i < len(raw); i += 4 {
		binary.NativeEndian.PutUint32(b[i:], binary.BigEndian.Uint32(raw[i:]))
	}
	addr, _ := netip.AddrFromSlice(b)
	return netip.AddrPortFrom(addr, uint16(port)), nil
}

// holds reports whether process pid has the socket with inode open.
func holds(pid int, inode uint64) bool {
	dir := filepath.Join("/proc", strconv.Itoa(pid), "fd")
	ents, err := os.ReadDir(dir)
	if err != nil {
		return false // gone, or not ours to read
	}
	want := "socket:[" + strconv.FormatUint(inode, 10) + "]"
	for _, e := range ents {
		if l, err := os.Readlink(filepath.Join(dir, e.Name())); err == nil && l == want {
			return true
		}
	}
	return false
}

// children lists every process whose parent is in parents, and theirs, and so on.
func descendants(parents []int) []int {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	ppid := map[int]int{}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// pid (comm) state ppid …: comm may hold spaces and parentheses, so read
		// after the last ')'.
		s := string(b)
		i := strings.LastIndexByte(s, ')')
		if i < 0 {
			continue
		}
		fs := strings.Fields(s[i+1:])
		if len(fs) < 2 {
			continue
		}
		if pp, err := strconv.Atoi(fs[1]); err == nil {
			ppid[pid] = pp
		}
	}
	in := map[int]bool{}
	for _, p := range parents {
		in[p] = true
	}
	var out []int
	for grew := true; grew; {
		grew = false
		for pid, pp := range ppid {
			if in[pp] && !in[pid] {
				in[pid], grew = true, true
				out = append(out, pid)
			}
		}
	}
	return out
}
