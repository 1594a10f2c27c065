/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* <asm/bitsperlong.h> lives in the host's multiarch directory (for example
 * /usr/include/x86_64-linux-gnu), which clang does not search for the BPF
 * target. The BPF programs need only the generic definitions. */
#include <asm-generic/bitsperlong.h>
