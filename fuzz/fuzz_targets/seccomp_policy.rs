//! The compiler of the guest's system-call policy (warren-guest `seccomp/compile.rs`, which
//! `build.rs` includes the same way): a policy in `agent.json`'s format is refused (Err) or
//! compiled into a program that answers as seccompiler's own chain for every call number; a
//! panic is a difference, or a bug.
#![no_main]

#[allow(dead_code)]
mod policy {
    include!("../../crates/warren-guest/seccomp/compile.rs");

    /// The program's length, or why the policy is refused.
    pub fn compile(text: &[u8]) -> Result<usize, String> {
        compile_policy(text, seccompiler::TargetArch::x86_64).map(|p| p.len())
    }
}

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let _ = policy::compile(data);
});
