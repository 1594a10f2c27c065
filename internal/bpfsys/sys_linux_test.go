package bpfsys

import (
	"testing"

	"golang.org/x/sys/unix"
)

func TestCommandNumbers(t *testing.T) {
	if cmdLinkCreate != unix.BPF_LINK_CREATE || cmdObjGetInfoByFD != unix.BPF_OBJ_GET_INFO_BY_FD {
		t.Fatalf("bpf(2) command numbers %d, %d; want %d, %d", cmdLinkCreate, cmdObjGetInfoByFD, unix.BPF_LINK_CREATE, unix.BPF_OBJ_GET_INFO_BY_FD)
	}
	if FlagUprobeMultiReturn != unix.BPF_F_UPROBE_MULTI_RETURN || StatsRunTime != unix.BPF_STATS_RUN_TIME {
		t.Fatalf("FlagUprobeMultiReturn %d, StatsRunTime %d; want %d, %d", FlagUprobeMultiReturn, StatsRunTime, unix.BPF_F_UPROBE_MULTI_RETURN, unix.BPF_STATS_RUN_TIME)
	}
}
