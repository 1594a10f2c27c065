package usdt

import (
	"fmt"
	"strconv"
	"strings"
)

// MaxArgs is the most arguments a probe can have: <sys/sdt.h> stops at 12.
const MaxArgs = 12

// ArgKind says where an argument's value is.
type ArgKind uint8

// The values are part of the Spec layout shared with bpf/usdt.bpf.h
// (MP_USDT_ARG_*); zero is left invalid so that an unfilled spec never
// reads as a constant.
const (
	// ArgConst: the value is Value itself.
	ArgConst ArgKind = 1
	// ArgReg: the value is in register Reg.
	ArgReg ArgKind = 2
	// ArgMem: the value is in memory at Reg + Value (Value alone when
	// Reg is empty, an absolute address).
	ArgMem ArgKind = 3
	// ArgSIB: the value is in memory at Reg + Index*Scale + Value, the
	// x86 scaled-index form; Reg may be empty.
	ArgSIB ArgKind = 4
)

// String returns "const", "reg", "mem" or "sib".
func (k ArgKind) String() string {
	switch k {
	case ArgConst:
		return "const"
	case ArgReg:
		return "reg"
	case ArgMem:
		return "mem"
	case ArgSIB:
		return "sib"
	}
	return "ArgKind(" + strconv.Itoa(int(k)) + ")"
}

// MarshalText makes ArgKind print by name in JSON listings.
func (k ArgKind) MarshalText() ([]byte, error) { return []byte(k.String()), nil }

// UnmarshalText reads what MarshalText wrote.
func (k *ArgKind) UnmarshalText(text []byte) error {
	for v := ArgConst; v <= ArgSIB; v++ {
		if v.String() == string(text) {
			*k = v
			return nil
		}
	}
	return fmt.Errorf("usdt: %q is not an argument kind", text)
}

// Arg is one decoded argument of a probe site, such as "-4@8(%rbp)".
type Arg struct {
	// Spec is the text the argument was decoded from.
	Spec string `json:"spec"`
	// Size is the argument's size in bytes: 1, 2, 4 or 8.
	Size int `json:"size"`
	// Signed reports a negative size in the spec: the value is
	// sign-extended from Size bytes, not zero-extended.
	Signed bool    `json:"signed"`
	Kind   ArgKind `json:"kind"`
	// Value is the constant of an ArgConst, or the displacement of an
	// ArgMem or ArgSIB argument.
	Value int64 `json:"value"`
	// Reg is the canonical name of the (base) register, "" if none.
	Reg string `json:"reg,omitempty"`
	// RegOffset is the offset of Reg in the kernel's struct pt_regs of
	// the binary's architecture, -1 if there is no register.
	RegOffset int16 `json:"reg_offset"`
	// Index and IndexOffset are the index register of an ArgSIB
	// argument, as for Reg and RegOffset.
	Index       string `json:"index,omitempty"`
	IndexOffset int16  `json:"index_offset"`
	// Scale multiplies Index: 1, 2, 4 or 8.
	Scale uint8 `json:"scale,omitempty"`
}

// String describes where the argument is, such as "s32 *(rbp+8)".
func (a Arg) String() string {
	t := "u"
	if a.Signed {
		t = "s"
	}
	t += strconv.Itoa(a.Size * 8)
	switch a.Kind {
	case ArgConst:
		return fmt.Sprintf("%s %d", t, a.Value)
	case ArgReg:
		return t + " " + a.Reg
	case ArgMem, ArgSIB:
		var b strings.Builder
		b.WriteString(t + " *(")
		sep := ""
		if a.Reg != "" {
			b.WriteString(a.Reg)
			sep = "+"
		}
		if a.Kind == ArgSIB {
			fmt.Fprintf(&b, "%s%s*%d", sep, a.Index, a.Scale)
			sep = "+"
		}
		switch {
		case a.Value < 0 && sep != "":
			fmt.Fprintf(&b, "%d", a.Value)
		case a.Value != 0 || sep == "":
			fmt.Fprintf(&b, "%s%#x", sep, a.Value)
		}
		return b.String() + ")"
	}
	return t + " ?"
}

// symbolResolver returns the address of a symbol named in an argument
// string, such as the "counter" of "-4@counter(%rip)".
type symbolResolver func(name string) (uint64, bool)

// argParser holds what decoding one site's argument string needs beyond
// the string: the architecture, and for symbolic operands the symbol
// table and the site's own address.
type argParser struct {
	arch    Arch
	resolve symbolResolver
	site    uint64 // the probe's virtual address, which %rip holds at the probe
}

// ParseArgs decodes an argument string such as "8@%rdi -4@-20(%rbp)" for
// arch. Symbolic operands (a global variable, "counter(%rip)") need the
// binary's symbol table and decode only through Open. Errors wrap
// ErrBadArgSpec and quote the offending argument.
func ParseArgs(arch Arch, s string) ([]Arg, error) {
	return argParser{arch: arch}.parse(s)
}

func (p argParser) parse(s string) ([]Arg, error) {
	if p.arch == ArchUnknown || int(p.arch) >= len(archNames) {
		return nil, fmt.Errorf("%w: %s", ErrUnsupportedArch, p.arch)
	}
	var args []Arg
	for {
		s = strings.TrimLeft(s, " \t")
		if s == "" {
			return args, nil
		}
		spec := nextArg(s)
		s = s[len(spec):]
		if len(args) == MaxArgs {
			return nil, fmt.Errorf("%w %q: more than %d arguments", ErrBadArgSpec, spec, MaxArgs)
		}
		a, err := p.parseOne(spec)
		if err != nil {
			return nil, fmt.Errorf("%w %q: %s", ErrBadArgSpec, spec, err)
		}
		args = append(args, a)
	}
}

// nextArg returns the argument at the start of s. Arguments are separated
// by blanks, but arm64 memory operands have one inside brackets ("[sp, 8]").
func nextArg(s string) string {
	depth := 0
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case '[', '(':
			depth++
		case ']', ')':
			depth--
		case ' ', '\t':
			if depth <= 0 {
				return s[:i]
			}
		}
	}
	return s
}

// argError is an error message without the sentinel; parse adds it.
type argError string

func (e argError) Error() string { return string(e) }

func (p argParser) parseOne(spec string) (Arg, error) {
	at := strings.IndexByte(spec, '@')
	if at < 0 {
		return Arg{}, argError("no SIZE@ prefix")
	}
	size, err := strconv.Atoi(spec[:at])
	if err != nil {
		return Arg{}, argError("bad size")
	}
	a := Arg{Spec: spec, Size: size, RegOffset: -1, IndexOffset: -1}
	if size < 0 {
		a.Signed, a.Size = true, -size
	}
	switch a.Size {
	case 1, 2, 4, 8:
	default:
		return Arg{}, argError("size must be 1, 2, 4 or 8")
	}
	loc := spec[at+1:]
	if loc == "" {
		return Arg{}, argError("no location")
	}
	switch p.arch {
	case ArchX86_64:
		err = p.x86(&a, loc)
	case ArchARM64:
		err = p.arm64(&a, loc)
	case ArchRISCV64:
		err = p.parenForm(&a, loc, riscvReg)
	case ArchS390X:
		err = p.parenForm(&a, loc, s390Reg)
	case ArchPPC64LE:
		err = p.ppc(&a, loc)
	}
	if err != nil {
		return Arg{}, err
	}
	return a, nil
}

func (a *Arg) setReg(r register) {
	a.Reg, a.RegOffset = r.name, r.off
}

func (a *Arg) setIndex(r register) {
	a.Index, a.IndexOffset = r.name, r.off
}

func x86Reg(s string) (register, error) {
	if !strings.HasPrefix(s, "%") {
		return register{}, argError(fmt.Sprintf("%q is not a register", s))
	}
	r, ok := x86Regs()[s[1:]]
	if !ok {
		return register{}, argError(fmt.Sprintf("unknown register %q", s))
	}
	return r, nil
}

// x86 decodes AT&T operands: %reg, $imm, disp(%base), (%base),
// disp(%base,%index,scale) with every part but the parentheses optional,
// and a bare displacement (an absolute address).
func (p argParser) x86(a *Arg, loc string) error {
	switch loc[0] {
	case '%':
		r, err := x86Reg(loc)
		if err != nil {
			return err
		}
		a.Kind = ArgReg
		a.setReg(r)
		return nil
	case '$':
		v, err := parseInt(loc[1:])
		if err != nil {
			return argError("bad immediate")
		}
		a.Kind, a.Value = ArgConst, v
		return nil
	}
	open := strings.IndexByte(loc, '(')
	if open < 0 {
		// An absolute memory operand: GCC emits one for a global in a
		// non-PIE binary.
		v, err := p.displacement(loc, false)
		if err != nil {
			return err
		}
		a.Kind, a.Value = ArgMem, v
		return nil
	}
	if !strings.HasSuffix(loc, ")") {
		return argError("unbalanced parentheses")
	}
	inner := loc[open+1 : len(loc)-1]
	parts := strings.Split(inner, ",")
	for i := range parts {
		parts[i] = strings.TrimSpace(parts[i])
	}
	if len(parts) > 3 {
		return argError("too many parts in memory operand")
	}
	if parts[0] != "" {
		r, err := x86Reg(parts[0])
		if err != nil {
			return err
		}
		a.setReg(r)
	} else if len(parts) == 1 {
		return argError("empty memory operand")
	}
	ripRel := a.Reg == "rip"
	disp, err := p.displacement(loc[:open], ripRel)
	if err != nil {
		return err
	}
	a.Value, a.Kind = disp, ArgMem
	if len(parts) == 1 {
		return nil
	}
	if ripRel {
		return argError("%rip cannot have an index")
	}
	r, err := x86Reg(parts[1])
	if err != nil {
		return err
	}
	if r.name == "rsp" || r.name == "rip" {
		return argError(fmt.Sprintf("%s cannot be an index", parts[1]))
	}
	a.Kind, a.Scale = ArgSIB, 1
	a.setIndex(r)
	if len(parts) == 3 && parts[2] != "" {
		switch parts[2] {
		case "1", "2", "4", "8":
			a.Scale = parts[2][0] - '0'
		default:
			return argError("scale must be 1, 2, 4 or 8")
		}
	}
	return nil
}

// displacement decodes the displacement before "(": empty, a number, or a
// symbol with an optional +N/-N addend. A symbol becomes its address, or
// for a %rip-relative operand its distance from the probe, since %rip holds
// the probe's address when the uprobe fires (the kernel rewinds it to the
// breakpoint before running handlers).
func (p argParser) displacement(s string, ripRel bool) (int64, error) {
	if s == "" {
		return 0, nil
	}
	if v, err := parseInt(s); err == nil {
		return v, nil
	}
	name, addend := s, int64(0)
	if i := strings.LastIndexAny(s, "+-"); i > 0 {
		v, err := parseInt(s[i:])
		if err != nil {
			return 0, argError(fmt.Sprintf("bad displacement %q", s))
		}
		name, addend = s[:i], v
	}
	if !isSymbol(name) {
		return 0, argError(fmt.Sprintf("bad displacement %q", s))
	}
	if p.resolve == nil {
		return 0, argError(fmt.Sprintf("symbol %q needs the binary's symbol table", name))
	}
	addr, ok := p.resolve(name)
	if !ok {
		return 0, argError(fmt.Sprintf("symbol %q not in the binary's symbol table", name))
	}
	v := int64(addr) + addend
	if ripRel {
		v -= int64(p.site)
	}
	return v, nil
}

func isSymbol(s string) bool {
	if s == "" || (s[0] >= '0' && s[0] <= '9') {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c == '_' || c == '.' || c == '$' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9') {
			return false
		}
	}
	return true
}

// arm64 decodes xN, wN, sp, [reg], [reg, off] ("#off" too), [reg, reg] and
// a bare immediate.
func (p argParser) arm64(a *Arg, loc string) error {
	if loc[0] != '[' {
		if r, ok := arm64Reg(loc); ok {
			a.Kind = ArgReg
			a.setReg(r)
			return nil
		}
		v, err := parseInt(strings.TrimPrefix(loc, "#"))
		if err != nil {
			return argError(fmt.Sprintf("%q is neither a register nor a constant", loc))
		}
		a.Kind, a.Value = ArgConst, v
		return nil
	}
	if !strings.HasSuffix(loc, "]") {
		return argError("unbalanced brackets")
	}
	base, rest, hasOff := strings.Cut(loc[1:len(loc)-1], ",")
	r, ok := arm64Reg(strings.TrimSpace(base))
	if !ok {
		return argError(fmt.Sprintf("unknown register %q", strings.TrimSpace(base)))
	}
	a.Kind = ArgMem
	a.setReg(r)
	if !hasOff {
		return nil
	}
	rest = strings.TrimSpace(rest)
	if idx, ok := arm64Reg(rest); ok && idx.name != "sp" {
		a.Kind, a.Scale = ArgSIB, 1
		a.setIndex(idx)
		return nil
	}
	v, err := parseInt(strings.TrimPrefix(rest, "#"))
	if err != nil {
		return argError(fmt.Sprintf("bad offset %q", rest))
	}
	a.Value = v
	return nil
}

// parenForm decodes the GNU assembler forms of riscv64 and s390x: reg,
// off(reg), off(index,base) (s390x) and a bare immediate.
func (p argParser) parenForm(a *Arg, loc string, reg func(string) (register, bool)) error {
	// RISC-V reaches a global of a non-PIE binary in two instructions:
	// lui puts the upper 20 bits of its address, rounded, in a register,
	// and the operand adds %lo(symbol), the low 12 bits sign-extended:
	// "-4@%lo(counter)(a5)".
	lo, hasLo := "", false
	if rest, ok := strings.CutPrefix(loc, "%lo("); ok {
		i := strings.IndexByte(rest, ')')
		if i < 0 {
			return argError("unbalanced parentheses")
		}
		lo, loc, hasLo = rest[:i], rest[i+1:], true
		if !strings.HasPrefix(loc, "(") {
			return argError(fmt.Sprintf("%%lo(%s) without a base register", lo))
		}
	}
	open := strings.IndexByte(loc, '(')
	if open < 0 {
		if r, ok := reg(loc); ok {
			a.Kind = ArgReg
			a.setReg(r)
			return nil
		}
		v, err := parseInt(loc)
		if err != nil {
			return argError(fmt.Sprintf("%q is neither a register nor a constant", loc))
		}
		a.Kind, a.Value = ArgConst, v
		return nil
	}
	if !strings.HasSuffix(loc, ")") {
		return argError("unbalanced parentheses")
	}
	v, err := p.displacement(loc[:open], false)
	if err != nil {
		return err
	}
	if hasLo {
		addr, err := p.displacement(lo, false)
		if err != nil {
			return err
		}
		v = (addr&0xfff ^ 0x800) - 0x800
	}
	a.Kind, a.Value = ArgMem, v
	inner := loc[open+1 : len(loc)-1]
	first, second, indexed := strings.Cut(inner, ",")
	if !indexed {
		r, ok := reg(strings.TrimSpace(inner))
		if !ok {
			return argError(fmt.Sprintf("unknown register %q", inner))
		}
		a.setReg(r)
		return nil
	}
	// s390x D(X,B): index first, base second.
	x, ok1 := reg(strings.TrimSpace(first))
	b, ok2 := reg(strings.TrimSpace(second))
	if !ok1 || !ok2 {
		return argError(fmt.Sprintf("unknown register in %q", inner))
	}
	a.Kind, a.Scale = ArgSIB, 1
	a.setReg(b)
	a.setIndex(x)
	return nil
}

// ppc decodes what GCC prints for the "nZr" constraint: a register as a
// bare number (or rN, %rN), a constant with an "i" prefix (from %I),
// off(reg), and the indexed form "ra,rb".
func (p argParser) ppc(a *Arg, loc string) error {
	if strings.HasPrefix(loc, "i") {
		v, err := parseInt(loc[1:])
		if err != nil {
			return argError("bad immediate")
		}
		a.Kind, a.Value = ArgConst, v
		return nil
	}
	if first, second, ok := strings.Cut(loc, ","); ok && !strings.Contains(loc, "(") {
		b, ok1 := ppcReg(strings.TrimSpace(first))
		x, ok2 := ppcReg(strings.TrimSpace(second))
		if !ok1 || !ok2 {
			return argError(fmt.Sprintf("unknown register in %q", loc))
		}
		a.Kind, a.Scale = ArgSIB, 1
		a.setReg(b)
		a.setIndex(x)
		return nil
	}
	open := strings.IndexByte(loc, '(')
	if open < 0 {
		r, ok := ppcReg(loc)
		if !ok {
			return argError(fmt.Sprintf("%q is not a register", loc))
		}
		a.Kind = ArgReg
		a.setReg(r)
		return nil
	}
	if !strings.HasSuffix(loc, ")") {
		return argError("unbalanced parentheses")
	}
	v, err := p.displacement(loc[:open], false)
	if err != nil {
		return err
	}
	r, ok := ppcReg(strings.TrimSpace(loc[open+1 : len(loc)-1]))
	if !ok {
		return argError(fmt.Sprintf("unknown register in %q", loc))
	}
	a.Kind, a.Value = ArgMem, v
	a.setReg(r)
	return nil
}

// parseInt accepts decimal and 0x hex with an optional sign; compilers
// never print octal in these strings.
func parseInt(s string) (int64, error) {
	neg := false
	switch {
	case strings.HasPrefix(s, "-"):
		neg, s = true, s[1:]
	case strings.HasPrefix(s, "+"):
		s = s[1:]
	}
	base := 10
	if strings.HasPrefix(s, "0x") || strings.HasPrefix(s, "0X") {
		base, s = 16, s[2:]
	}
	if s == "" || s[0] == '+' || s[0] == '-' {
		return 0, strconv.ErrSyntax
	}
	u, err := strconv.ParseUint(s, base, 64)
	if err != nil {
		return 0, err
	}
	if neg {
		// -0x8000000000000000 and the like: two's complement, as an
		// assembler would wrap.
		return -int64(u), nil
	}
	return int64(u), nil
}
