package usdt

import (
	"testing"

	"github.com/multiprobe/multiprobe/internal/testprogs"
)

// targets are the C programs of testprogs' USDT fixtures (the sources are
// in internal/testprogs/c/usdt_fixture), built once and cached, so that a
// VM without a compiler runs them prebuilt.
type targets struct {
	lib      string // libmptest.so, -O2
	exe      string // probes, -O2, PIE
	exeO0    string // probes, -O0: every argument a memory operand
	exeNoPIE string // probes, -O2, -no-pie: addresses are runtime addresses
}

func buildTargets(t testing.TB) targets {
	t.Helper()
	fx := testprogs.USDTFixturesFor(t, "")
	return targets{lib: fx.Lib, exe: fx.Exe, exeO0: fx.ExeO0, exeNoPIE: fx.ExeNoPIE}
}
