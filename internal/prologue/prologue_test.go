package prologue

import (
	"testing"

	"github.com/cilium/ebpf/asm"
)

// TestResolve: jump offsets count 8-byte slots, and a map load takes two.
func TestResolve(t *testing.T) {
	insns := Resolve(
		Jump{asm.JEq.Imm(asm.R0, 0, ""), "end"},
		asm.LoadMapPtr(asm.R1, 0),
		Label("mid"),
		asm.Mov.Imm(asm.R0, 1),
		Jump{asm.Ja.Label(""), "mid"},
		Jump{asm.Ja.Label(""), "nowhere"},
		Label("end"),
		asm.Return(),
	)
	want := []int16{5, 0, 0, -2, 1, 0} // "nowhere" is past the end
	for i, ins := range insns {
		if ins.IsConstantLoad(asm.DWord) || ins.OpCode.JumpOp() == asm.InvalidJumpOp {
			continue
		}
		if ins.Offset != want[i] {
			t.Errorf("instruction %d (%v): offset %d, want %d", i, ins, ins.Offset, want[i])
		}
	}
}
