//! Compiles the agent's system-call policy (`seccomp/agent.json`, reviewed data) into BPF at
//! build time, so the guest neither parses JSON nor links a compiler at sandbox start.
//!
//! One program comes out, `agent.bpf`, as raw `sock_filter`s (8 bytes each, native endian). It
//! holds the whole policy: the allowlist (its default action is written in the JSON as `trace`
//! with Warren's marker, as seccompiler has no user-notify action; every such return becomes
//! `SECCOMP_RET_USER_NOTIF`, so the guest is told of each denial and answers EPERM), the system
//! calls that must look absent (the `enosys` filter: clone3) and ENOSYS for every call newer
//! than the policy was reviewed against.
//!
//! seccompiler writes a filter as a linear chain: five instructions per system call, tested one
//! after another (1,651 instructions; the kernel's cBPF conversion and JIT of that cost ~1 ms
//! per sandbox, and a call near the end of the chain ran ~330 comparisons). Here seccompiler
//! still compiles each system call's rule (its argument checks), one call at a time, and the
//! dispatch on the call's number becomes a binary search over number ranges (see `tree`). The
//! result is checked against seccompiler's own chain, stacked with the two ENOSYS filters as
//! the kernel would run them, by an interpreter over every call number and edge-case arguments
//! (see `verify`): the build fails on any difference.
//!
//! It also writes `syscall_names.rs` from the kernel headers when they are installed, so
//! incidents can name system calls (numbers otherwise).

use std::fs;
use std::path::PathBuf;

// The compiler itself: also compiled into the fuzz target `seccomp_policy` (fuzz/).
include!("seccomp/compile.rs");

fn main() {
    println!("cargo:rerun-if-changed=seccomp/agent.json");
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=seccomp/compile.rs");
    let out = PathBuf::from(std::env::var("OUT_DIR").unwrap());
    let arch = std::env::var("CARGO_CFG_TARGET_ARCH").unwrap();
    let target = seccompiler::TargetArch::try_from(arch.as_str())
        .unwrap_or_else(|_| panic!("no seccomp policy for architecture {arch}"));
    let text = fs::read("seccomp/agent.json").expect("seccomp/agent.json");
    let prog = compile_policy(&text, target)
        .unwrap_or_else(|e| panic!("seccomp/agent.json does not compile: {e}"));
    let mut bytes = Vec::with_capacity(prog.len() * 8);
    for insn in &prog {
        bytes.extend_from_slice(&insn.code.to_ne_bytes());
        bytes.push(insn.jt);
        bytes.push(insn.jf);
        bytes.extend_from_slice(&insn.k.to_ne_bytes());
    }
    fs::write(out.join("agent.bpf"), bytes).unwrap();

    // System-call names, for incidents.
    let header = format!("/usr/include/{arch}-linux-gnu/asm/unistd_64.h");
    println!("cargo:rerun-if-changed={header}");
    let mut table = String::from(
        "/// System-call numbers and names (from the kernel headers at build time).\npub const SYSCALL_NAMES: &[(u32, &str)] = &[\n",
    );
    if let Ok(h) = fs::read_to_string(&header) {
        for line in h.lines() {
            let mut w = line.split_whitespace();
            if let (Some("#define"), Some(name), Some(nr)) = (w.next(), w.next(), w.next())
                && let (Some(name), Ok(nr)) = (name.strip_prefix("__NR_"), nr.parse::<u32>())
            {
                table.push_str(&format!("    ({nr}, {name:?}),\n"));
            }
        }
    }
    table.push_str("];\n");
    fs::write(out.join("syscall_names.rs"), table).unwrap();
}
