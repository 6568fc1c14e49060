package netguard

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"syscall"
)

// The kernel's socket diagnostics (netlink NETLINK_SOCK_DIAG, what `ss` uses) look
// one TCP socket up by its two ends, without reading the whole table as
// /proc/net/tcp does: on a busy machine that file holds thousands of sockets and
// takes milliseconds to generate, for each call judged.
const (
	netlinkSockDiag   = 4  // NETLINK_SOCK_DIAG
	sockDiagByFamily  = 20 // SOCK_DIAG_BY_FAMILY
	nlmsgError        = 2  // NLMSG_ERROR
	nlmsgHdrLen       = 16
	inetDiagReqV2Len  = 56
	inetDiagMsgInode  = 68 // offset of idiag_inode in struct inet_diag_msg
	inetDiagNoCookie  = ^uint32(0)
	inetDiagAllStates = ^uint32(0)
)

// errNoDiag: this kernel cannot answer (no sock_diag); fall back to /proc/net/tcp.
var errNoDiag = errors.New("socket diagnostics unavailable")

// diagInode asks the kernel for the inode of the TCP socket with this local and
// remote end.
func diagInode(local, remote netip.AddrPort) (uint64, error) {
	fd, err := syscall.Socket(syscall.AF_NETLINK, syscall.SOCK_DGRAM|syscall.SOCK_CLOEXEC, netlinkSockDiag)
	if err != nil {
		return 0, fmt.Errorf("%w: %v", errNoDiag, err)
	}
	defer syscall.Close(fd)
	family := byte(syscall.AF_INET)
	if !local.Addr().Unmap().Is4() {
		family = syscall.AF_INET6
	}
	req := make([]byte, nlmsgHdrLen+inetDiagReqV2Len)
	ne := binary.NativeEndian
	ne.PutUint32(req[0:], uint32(len(req)))
	ne.PutUint16(req[4:], sockDiagByFamily)
	ne.PutUint16(req[6:], syscall.NLM_F_REQUEST)
	ne.PutUint32(req[8:], 1) // sequence
	r := req[nlmsgHdrLen:]
	r[0], r[1] = family, syscall.IPPROTO_TCP
	ne.PutUint32(r[4:], inetDiagAllStates)
	id := r[8:] // struct inet_diag_sockid
	binary.BigEndian.PutUint16(id[0:], local.Port())
	binary.BigEndian.PutUint16(id[2:], remote.Port())
	putAddr(id[4:20], local.Addr(), family)
	putAddr(id[20:36], remote.Addr(), family)
	ne.PutUint32(id[40:], inetDiagNoCookie)
	ne.PutUint32(id[44:], inetDiagNoCookie)
	if err := syscall.Sendto(fd, req, 0, &syscall.SockaddrNetlink{Family: syscall.AF_NETLINK}); err != nil {
		return 0, fmt.Errorf("%w: send: %v", errNoDiag, err)
	}
	buf := make([]byte, 8192)
	n, _, err := syscall.Recvfrom(fd, buf, 0)
	if err != nil {
		return 0, fmt.Errorf("%w: receive: %v", errNoDiag, err)
	}
	if n < nlmsgHdrLen {
		return 0, fmt.Errorf("%w: short answer", errNoDiag)
	}
	switch typ := ne.Uint16(buf[4:]); typ {
	case nlmsgError:
		if n >= nlmsgHdrLen+4 {
			if errno := -int32(ne.Uint32(buf[nlmsgHdrLen:])); errno == int32(syscall.ENOENT) {
				return 0, errNoSocket
			} else if errno != 0 {
				return 0, fmt.Errorf("%w: %v", errNoDiag, syscall.Errno(errno))
			}
		}
		return 0, fmt.Errorf("%w: error answer", errNoDiag)
	case sockDiagByFamily:
		if n < nlmsgHdrLen+inetDiagMsgInode+4 {
			return 0, fmt.Errorf("%w: short answer", errNoDiag)
		}
		ino := uint64(ne.Uint32(buf[nlmsgHdrLen+inetDiagMsgInode:]))
		if ino == 0 {
			return 0, errNoSocket // being torn down
		}
		return ino, nil
	default:
		return 0, fmt.Errorf("%w: answer of type %d", errNoDiag, typ)
	}
}

// putAddr writes a in network order into a 16-byte inet_diag address field.
func putAddr(dst []byte, a netip.Addr, family byte) {
	if family == syscall.AF_INET {
		b := a.Unmap().As4()
		copy(dst, b[:])
		return
	}
	b := a.As16()
	copy(dst, b[:])
}
