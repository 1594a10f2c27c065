package target

import (
	"regexp"
	"strconv"

	"golang.org/x/sys/unix"
)

// mismatchRE is the kernel's line when it refuses a uprobe for another
// ref-counter offset at the same place (uprobes.c, ref_ctr_mismatch_warn).
var mismatchRE = regexp.MustCompile(`ref_ctr_offset mismatch\. inode: 0x([0-9a-f]+) offset: 0x([0-9a-f]+) ref_ctr_offset\(old\): 0x([0-9a-f]+)`)

// refCtrInLog finds in the kernel's log the ref-counter offset of the
// uprobe that holds t's file at off, which the kernel names as it refuses
// another: ok is false where the log does not say (or cannot be read,
// without CAP_SYSLOG).
func refCtrInLog(t *Target, off uint64) (uint64, bool) {
	var st unix.Stat_t
	var err error
	if t.File != nil {
		err = unix.Fstat(int(t.File.Fd()), &st)
	} else {
		err = unix.Stat(t.Path, &st)
	}
	if err != nil {
		return 0, false
	}
	size, err := unix.Klogctl(unix.SYSLOG_ACTION_SIZE_BUFFER, nil)
	if err != nil || size <= 0 {
		return 0, false
	}
	buf := make([]byte, size)
	n, err := unix.Klogctl(unix.SYSLOG_ACTION_READ_ALL, buf)
	if err != nil {
		return 0, false
	}
	ino, at := strconv.FormatUint(uint64(st.Ino), 16), strconv.FormatUint(off, 16)
	var other uint64
	found := false
	for _, m := range mismatchRE.FindAllSubmatch(buf[:n], -1) {
		if string(m[1]) == ino && string(m[2]) == at {
			other, err = strconv.ParseUint(string(m[3]), 16, 64)
			found = err == nil
		}
	}
	return other, found
}
