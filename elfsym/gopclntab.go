package elfsym

import (
	"debug/elf"
	"debug/gosym"
)

// scanGo reads the function table of a Go binary built with -ldflags=-s,
// which has no .symtab but keeps every function's name and address in
// .gopclntab for the runtime's tracebacks.
func (r *resolver) scanGo() {
	funcs := goFuncs(r.f.pclntab, r.f.textAddr)
	for _, fn := range funcs {
		off, ok := r.f.FileOffset(fn.Entry)
		if !ok || fn.Entry == 0 {
			continue
		}
		r.searched++
		if p := r.m.matches([]byte(fn.Name), nil, true); p >= 0 {
			r.add(hit{
				offset:  off,
				value:   fn.Entry,
				size:    fn.End - fn.Entry,
				pattern: int16(p),
				info:    byte(elf.STB_GLOBAL)<<4 | byte(elf.STT_FUNC),
				def:     true,
			}, []byte(fn.Name), nil)
		}
	}
}

// goFuncs decodes a .gopclntab. debug/gosym trusts the table it is given
// and can panic on a corrupt one; a corrupt table yields no functions here.
func goFuncs(pclntab []byte, textAddr uint64) (funcs []gosym.Func) {
	defer func() {
		if recover() != nil {
			funcs = nil
		}
	}()
	t, err := gosym.NewTable(nil, gosym.NewLineTable(pclntab, textAddr))
	if err != nil {
		return nil
	}
	return t.Funcs
}

// suggestions for the Go path: names of a stripped Go binary.
func (r *resolver) goNames(yield func([]byte) bool) {
	for _, fn := range goFuncs(r.f.pclntab, r.f.textAddr) {
		if !yield([]byte(fn.Name)) {
			return
		}
	}
}
