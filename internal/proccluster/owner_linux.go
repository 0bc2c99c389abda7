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

// socketOwners maps the 127.0.0.1 TCP sockets held by the processes
// pids to their owner: (local port, remote port) → PID.
func socketOwners(pids []int) (map[[2]int]int, error) {
	byInode := map[string]int{} // "socket:[inode]" → pid
	for _, pid := range pids {
		dir := "/proc/" + strconv.Itoa(pid) + "/fd"
		entries, err := os.ReadDir(dir)
		if err != nil {
			continue // the process is gone
		}
		for _, e := range entries {
			if link, err := os.Readlink(dir + "/" + e.Name()); err == nil && strings.HasPrefix(link, "socket:[") {
				byInode[link] = pid
			}
		}
	}
	data, err := os.ReadFile("/proc/net/tcp")
	if err != nil {
		return nil, err
	}
	out := map[[2]int]int{}
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Scan() // header
	for sc.Scan() {
		// sl local rem st tx:rx tr:when retrnsmt uid timeout inode ...
		f := strings.Fields(sc.Text())
		if len(f) < 10 {
			continue
		}
		pid, ok := byInode["socket:["+f[9]+"]"]
		if !ok {
			continue
		}
		local, lerr := loopbackPort(f[1])
		remote, rerr := loopbackPort(f[2])
		if lerr == nil && rerr == nil {
			out[[2]int{local, remote}] = pid
		}
	}
	return out, sc.Err()
}

// loopbackPort parses /proc/net/tcp's "0100007F:1F90" (127.0.0.1:8080).
func loopbackPort(s string) (int, error) {
	host, port, ok := strings.Cut(s, ":")
	if !ok || host != "0100007F" {
		return 0, fmt.Errorf("not a 127.0.0.1 address: %s", s)
	}
	p, err := strconv.ParseUint(port, 16, 16)
	return int(p), err
}
