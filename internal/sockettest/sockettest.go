// Package sockettest holds checks on real sockets shared by the tests of
// several packages (the server's and the guard's connection caps).
package sockettest

import (
	"errors"
	"fmt"
	"net"
	"syscall"
	"time"
)

// ClosedAtOnce dials addr from the local address ip and reports an error
// unless the other side closes the connection at once (the reset may even
// reach the dial).
func ClosedAtOnce(ip, addr string) error {
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		if errors.Is(err, syscall.ECONNRESET) {
			return nil
		}
		return err
	}
	defer c.Close()
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	n, err := c.Read(make([]byte, 1))
	if n != 0 || err == nil || IsTimeout(err) {
		return fmt.Errorf("read %d, %v: want it closed at once", n, err)
	}
	return nil
}

// IsTimeout reports whether err is a network timeout.
func IsTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}
