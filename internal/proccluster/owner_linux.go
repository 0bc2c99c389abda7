package proccluster

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// canIdentify reports whether socketOwner works on this system.
const canIdentify = true

// socketOwner returns the PID among pids whose process holds the
// 127.0.0.1 TCP socket with local port localPort connected to remotePort
// (the other end of a connection a proxy accepted), or 0 when none does.
func socketOwner(localPort, remotePort int, pids []int) (int, error) {
	inode, err := socketInode(localPort, remotePort)
	if err != nil || inode == 0 {
		return 0, err
	}
	want := "socket:[" + strconv.FormatUint(inode, 10) + "]"
	for _, pid := range pids {
		dir := "/proc/" + strconv.Itoa(pid) + "/fd"
		entries, err := os.ReadDir(dir)
		if err != nil {
			continue // the process is gone
		}
		for _, e := range entries {
			if link, err := os.Readlink(dir + "/" + e.Name()); err == nil && link == want {
				return pid, nil
			}
		}
	}
	return 0, nil
}

// socketInode finds the inode of the IPv4 socket 127.0.0.1:localPort →
// 127.0.0.1:remotePort in /proc/net/tcp; 0 when there is none.
func socketInode(localPort, remotePort int) (uint64, error) {
	data, err := os.ReadFile("/proc/net/tcp")
	if err != nil {
		return 0, err
	}
	local := fmt.Sprintf("0100007F:%04X", localPort)
	remote := fmt.Sprintf("0100007F:%04X", remotePort)
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Scan() // header
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		// sl local rem st tx:rx tr:when retrnsmt uid timeout inode ...
		if len(f) < 10 || f[1] != local || f[2] != remote {
			continue
		}
		return strconv.ParseUint(f[9], 10, 64)
	}
	return 0, sc.Err()
}
