//! Compiles the agent's system-call policy (`seccomp/agent.json`, reviewed data) into BPF at
//! build time, so the guest neither parses JSON nor links a compiler at sandbox start.
//!
//! Two programs come out, as raw `sock_filter` arrays (8 bytes each, native endian):
//! - `agent.bpf`: the allowlist. Its default action is written in the JSON as `trace` with
//!   Warren's marker (seccompiler has no user-notify action); here every such return becomes
//!   `SECCOMP_RET_USER_NOTIF`, so the guest is told of each denial (and answers EPERM).
//! - `enosys.bpf`: system calls that must look absent (clone3), stacked beside it.
//!
//! It also writes `syscall_names.rs` from the kernel headers when they are installed, so
//! incidents can name system calls (numbers otherwise).

use std::fs;
use std::path::PathBuf;

/// `SECCOMP_RET_TRACE` and the marker `agent.json` uses for "tell the guest".
const RET_TRACE: u32 = 0x7ff0_0000;
const NOTIFY_MARKER: u32 = 0x5741;
/// `SECCOMP_RET_USER_NOTIF`.
const RET_USER_NOTIF: u32 = 0x7fc0_0000;
/// `BPF_RET | BPF_K`.
const BPF_RET_K: u16 = 0x06;

fn main() {
    println!("cargo:rerun-if-changed=seccomp/agent.json");
    println!("cargo:rerun-if-changed=build.rs");
    let out = PathBuf::from(std::env::var("OUT_DIR").unwrap());
    let arch = std::env::var("CARGO_CFG_TARGET_ARCH").unwrap();
    let target = seccompiler::TargetArch::try_from(arch.as_str())
        .unwrap_or_else(|_| panic!("no seccomp policy for architecture {arch}"));
    let json = fs::read("seccomp/agent.json").expect("seccomp/agent.json");
    let mut filters = seccompiler::compile_from_json(&json[..], target)
        .unwrap_or_else(|e| panic!("seccomp/agent.json does not compile: {e}"));
    for (name, rewrite) in [("agent", true), ("enosys", false)] {
        let prog = filters
            .remove(name)
            .unwrap_or_else(|| panic!("seccomp/agent.json has no `{name}` filter"));
        let mut bytes = Vec::with_capacity(prog.len() * 8);
        let mut marked = 0;
        for mut insn in prog {
            if rewrite && insn.code == BPF_RET_K && insn.k == RET_TRACE | NOTIFY_MARKER {
                insn.k = RET_USER_NOTIF;
                marked += 1;
            }
            bytes.extend_from_slice(&insn.code.to_ne_bytes());
            bytes.push(insn.jt);
            bytes.push(insn.jf);
            bytes.extend_from_slice(&insn.k.to_ne_bytes());
        }
        assert!(
            !rewrite || marked > 0,
            "the agent filter's default action must be the notify marker"
        );
        fs::write(out.join(format!("{name}.bpf")), bytes).unwrap();
    }

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
