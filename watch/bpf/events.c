// SPDX-License-Identifier: (GPL-2.0-only OR MIT)
//
// The events behind package watch: a process that starts running a
// program (exec), maps a file executable (mmap with PROT_EXEC: ld.so
// loading a library, dlopen), or exits. User space reads the process's
// /proc/PID/maps on each, so the events carry only the process and, for a
// mapping, where it landed.
//
// The mappings come from the mmap system call (ld.so, dlopen): its entry
// says whether the mapping is executable and of a file, its exit where
// the mapping is, once it exists. The program and interpreter that exec
// maps itself are in /proc/PID/maps by the exec event. Raw tracepoints
// need neither tracefs, which a host may not mount, nor kprobes, which a
// kernel may be built without (this project's CI host is), and they exist
// from Linux 4.17.

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

// The mmap system call's number and where its arguments are in the user
// registers the kernel saved (struct pt_regs), which the raw tracepoints
// sys_enter and sys_exit hand over: prot (the third argument), fd (the
// fifth), and the call's number at the exit (where x86-64 and arm64 keep
// it apart from the registers the return value overwrites). x86-64 and
// arm64 run in the test VMs; s390x passes mmap's arguments in memory, so
// it gets exec and exit events only.
#if defined(__TARGET_ARCH_x86)
#define NR_MMAP 9
#define SYS_PROT 96 // rdx
#define SYS_FD 72   // r8
#define SYS_NR 120  // orig_ax
#elif defined(__TARGET_ARCH_arm64)
#define NR_MMAP 222
#define SYS_PROT 16 // x2
#define SYS_FD 32   // x4
#define SYS_NR 280  // syscallno, after user_pt_regs and orig_x0
#elif defined(__TARGET_ARCH_riscv)
#define NR_MMAP 222
#define SYS_PROT 96 // a2
#define SYS_FD 112  // a4
#define SYS_NR 136  // a7
#elif defined(__TARGET_ARCH_powerpc)
#define NR_MMAP 90
#define SYS_PROT 40 // r5
#define SYS_FD 56   // r7
#define SYS_NR 0    // r0
#else
#define NR_MMAP -1
#define SYS_PROT 0
#define SYS_FD 0
#define SYS_NR 0
#endif

#define PROT_EXEC 0x4

enum kind {
	EVENT_EXEC = 1,
	EVENT_MMAP = 2,
	EVENT_EXIT = 3,
};

struct event {
	__u32 pid;  // tgid: what user space calls the pid
	__u32 kind; // enum kind
	__u64 addr; // EVENT_MMAP: where the mapping starts
};

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 1 << 20);
} events SEC(".maps");

// Threads in an executable file mapping, between entry and return.
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384);
	__type(key, __u32);
	__type(value, __u8);
} mapping SEC(".maps");

// Events lost because the ring buffer was full: user space then scans
// /proc again.
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} lost SEC(".maps");

static __always_inline void emit(__u32 kind, __u64 addr)
{
	struct event *e = bpf_ringbuf_reserve(&events, sizeof(*e), 0);
	if (!e) {
		__u32 zero = 0;
		__u64 *n = bpf_map_lookup_elem(&lost, &zero);
		if (n)
			__sync_fetch_and_add(n, 1);
		return;
	}
	e->pid = bpf_get_current_pid_tgid() >> 32;
	e->kind = kind;
	e->addr = addr;
	bpf_ringbuf_submit(e, 0);
}

static __always_inline long user_reg(void *regs, int off)
{
	long v = 0;
	bpf_probe_read_kernel(&v, sizeof(v), (char *)regs + off);
	return v;
}

SEC("raw_tracepoint/sys_enter")
int sys_enter(struct bpf_raw_tracepoint_args *ctx)
{
	// Every system call comes here: leave the others at once.
	if ((long)ctx->args[1] != NR_MMAP)
		return 0;
	void *regs = (void *)ctx->args[0];
	if (!(user_reg(regs, SYS_PROT) & PROT_EXEC) || (int)user_reg(regs, SYS_FD) < 0)
		return 0;
	__u32 tid = bpf_get_current_pid_tgid();
	__u8 one = 1;
	bpf_map_update_elem(&mapping, &tid, &one, BPF_ANY);
	return 0;
}

SEC("raw_tracepoint/sys_exit")
int sys_exit(struct bpf_raw_tracepoint_args *ctx)
{
	if (NR_MMAP < 0 || (int)user_reg((void *)ctx->args[0], SYS_NR) != NR_MMAP)
		return 0;
	__u32 tid = bpf_get_current_pid_tgid();
	if (!bpf_map_lookup_elem(&mapping, &tid))
		return 0;
	bpf_map_delete_elem(&mapping, &tid);
	long ret = ctx->args[1];
	if (ret < 0 && ret > -4096)
		return 0; // failed
	emit(EVENT_MMAP, ret);
	return 0;
}

SEC("raw_tracepoint/sched_process_exec")
int process_exec(void *ctx)
{
	emit(EVENT_EXEC, 0);
	return 0;
}

SEC("raw_tracepoint/sched_process_exit")
int process_exit(void *ctx)
{
	__u64 id = bpf_get_current_pid_tgid();
	if ((__u32)id != id >> 32)
		return 0; // a thread, not the process
	emit(EVENT_EXIT, 0);
	return 0;
}

// The kernel's types file_vmas reads, as far as it reads them; CO-RE
// finds each field where the running kernel has it.
struct bpf_iter_meta {
	void *seq;
} __attribute__((preserve_access_index));

struct super_block {
	__u32 s_dev;
} __attribute__((preserve_access_index));

struct inode {
	unsigned long i_ino;
	struct super_block *i_sb;
} __attribute__((preserve_access_index));

struct file {
	struct inode *f_inode;
} __attribute__((preserve_access_index));

struct vm_area_struct {
	unsigned long vm_start;
	unsigned long vm_flags;
	struct file *vm_file;
} __attribute__((preserve_access_index));

struct bpf_iter__task_vma {
	struct bpf_iter_meta *meta;
	void *task;
	struct vm_area_struct *vma;
} __attribute__((preserve_access_index));

#define VM_EXEC 0x4

// One executable file mapping: where it starts and the file's device (the
// kernel's dev_t: major << 20 | minor) and inode.
struct vma {
	__u64 start;
	__u64 ino;
	__u32 dev;
	__u32 pad;
};

SEC("iter/task_vma")
int file_vmas(struct bpf_iter__task_vma *ctx)
{
	struct vm_area_struct *vma = ctx->vma;
	if (!vma || !(vma->vm_flags & VM_EXEC))
		return 0;
	struct file *f = vma->vm_file;
	if (!f)
		return 0;
	struct inode *inode = f->f_inode;
	struct vma out = {
		.start = vma->vm_start,
		.ino = inode->i_ino,
		.dev = inode->i_sb->s_dev,
	};
	bpf_seq_write(ctx->meta->seq, &out, sizeof(out));
	return 0;
}

char LICENSE[] SEC("license") = "Dual MIT/GPL";
